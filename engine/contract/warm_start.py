"""Warm start: a host's tasks forked from one process that imported TensorFlow once.

Importing TensorFlow and Keras takes a task process about 3.4 CPU-seconds before it does anything of
its own; a host's tasks all import the same modules. The supervisor therefore starts one *template*
per host (``python -m engine.runtime.task --template-fd FD --run-dir DIR``), which imports the runtime
and then forks each task on request. A restarted task (a lost async worker, a restart command) starts
from the same template, without importing anything again.

A forked task must be the process a cold start would have given. So:

- every variable it reads when TensorFlow is *imported* must be what the template saw: a task is forked
  only when its environment differs from the template's in variables read later (:func:`can_fork`):
  the cluster (``TF_CONFIG``, DTensor's), thread pool sizes (read when the first op runs), ClusterDeck's
  own; otherwise it starts cold;
- no task that may see a GPU is forked (CUDA must not be initialised before a fork; the template hides
  every GPU), so the GPU tasks of a machine with NVIDIA's driver start cold; where the GPUs are emulated
  (no driver) every task may be forked;
- the task is forked twice over, so its parent is the supervisor (made a *child subreaper*,
  :func:`engine.contract.parent_death.become_subreaper`), which waits on it, signals its process group
  and is the parent whose death kills it, as for a cold start.

The protocol, on a ``SOCK_SEQPACKET`` Unix socket (one message per datagram, UTF-8 JSON):

- template to supervisor, once: ``{"ready": true}`` when everything is imported;
- supervisor to template, per task: :func:`fork_request` with three file descriptors attached (the task's
  log, its event pipe's write end, its lifeline's read end);
- template to supervisor, per request: ``{"pid": N}`` (the task, already reparented to the supervisor)
  or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: Set to ``0`` to start every task cold (a process of its own that imports TensorFlow itself).
WARM_START_ENV = "CLUSTERDECK_WARM_START"
#: The template's command-line flag (of ``engine.runtime.task``): the socket's file descriptor.
TEMPLATE_FLAG = "--template-fd"
#: Variables read after TensorFlow is imported (when the cluster, the devices or the first op are set up):
#: a task whose environment differs from the template's in these only may be forked.
READ_AFTER_IMPORT = frozenset({"TF_CONFIG", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"})
READ_AFTER_IMPORT_PREFIXES = ("CLUSTERDECK_", "DTENSOR_")
#: Largest message (a task's whole environment travels in one).
MAX_MESSAGE = 1 << 20
#: File descriptors sent with a fork request, in this order.
FDS = ("log", "event", "lifeline")


def enabled(env: Mapping[str, str]) -> bool:
    return env.get(WARM_START_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def read_after_import(name: str) -> bool:
    return name in READ_AFTER_IMPORT or name.startswith(READ_AFTER_IMPORT_PREFIXES)


def can_fork(template_env: Mapping[str, str], task_env: Mapping[str, str], *, gpu_driver: bool = True) -> bool:
    """Whether a task with ``task_env`` may be forked from a template started with ``template_env``:
    they differ only in variables read after TensorFlow is imported, and the task can see no GPU (on a
    machine without NVIDIA's driver, ``gpu_driver`` False, no process can: the GPUs are emulated after
    the import, and ``CUDA_VISIBLE_DEVICES`` is read by nothing)."""
    if gpu_driver and (task_env.get("CUDA_VISIBLE_DEVICES", "") != ""
                       or template_env.get("CUDA_VISIBLE_DEVICES") != ""):
        return False
    names = set(template_env) | set(task_env)
    return all(read_after_import(n) or (n == "CUDA_VISIBLE_DEVICES" and not gpu_driver)
               for n in names if template_env.get(n) != task_env.get(n))


def template_useful(env: Mapping[str, str], task_gpus: Sequence[Sequence[int]], *, gpu_driver: bool) -> bool:
    """Whether a host's supervisor should start a template: warm start is on (``env``), and some task
    (``task_gpus``: each task's GPU ids) could be forked, one without a GPU or any where the GPUs are
    emulated (no NVIDIA driver)."""
    return enabled(env) and any(not gpu_driver or not gpus for gpus in task_gpus)


def fork_request(args: Sequence[str], env: Mapping[str, str], cwd: str, cores: Sequence[int],
                 parent: int) -> bytes:
    """One task to fork: its ``engine.runtime.task`` arguments (the file descriptors are added where it
    runs), its whole environment, working folder, CPU affinity (``[]``: inherited) and the pid that
    must be its parent once it is reparented (the supervisor)."""
    return json.dumps({"args": list(args), "env": dict(env), "cwd": cwd, "cores": list(cores),
                       "parent": int(parent)}).encode("utf-8")


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(message)).encode("utf-8")


def decode(data: bytes) -> dict[str, Any] | None:
    """A message, or None for anything that is not a JSON object (a closed socket reads as b"")."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None
