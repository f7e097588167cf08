"""Export a drawn cluster for running it elsewhere: ``TF_CONFIG`` files, bash launch scripts, a Kubeflow TFJob.

Nothing here starts a process; everything is derived from one :class:`~engine.contract.config.RunConfig`.

Ports. A live run picks free ports at launch; an export cannot see the target machines, so every
``auto`` port becomes a fixed, deterministic one: on each machine (hosts with the same address, and all
local hosts, are one machine) auto ports count up from :data:`DEFAULT_BASE_PORT` in task order, skipping
ports fixed anywhere on that machine. Fixed ports stay as drawn.

Launch scripts. One bash script per host, ``launch-<host>.sh``, self-contained: it writes the resolved
config into the run folder (``$CLUSTERDECK_RUN_DIR``, default ``<workdir>/runs/<run name>``), starts
``python -m engine.runtime.task --run-dir <run folder>`` for each task of the host in the background
with its ``TF_CONFIG`` and ``CUDA_VISIBLE_DEVICES`` (and ``TF_NUM_INTRAOP_THREADS``, the host's cores shared
evenly by its tasks, and each training task on cores of its own where there are enough, with ``taskset``:
the supervisor's placement, :func:`engine.contract.task_plan.share_cores`), and stops them all on SIGINT/SIGTERM. It ends when
the host's tasks that finish by themselves have finished (chief and workers; in ``async`` mode only the
chief), then stops its servers (ps, async workers), which never finish on their own; a host with no
such task runs until it is stopped. The evaluator reads checkpoints from the run folder, so the run
folder must be shared between hosts where one is used.

TFJob. A manifest for the Kubeflow training operator (``kubeflow.org/v1``). The operator writes each
pod's ``TF_CONFIG``; the container command derives ``CLUSTERDECK_TASK`` from it and writes the config
(carried in the ``CLUSTERDECK_CONFIG`` variable) into the run folder. Restart policies:

- ``async`` workers: ``OnFailure`` always: a restarted worker rejoins with the same ``TF_CONFIG``
  (the launcher restarts them too).
- every other role: ``OnFailure`` when ``training.restarts > 0``, else ``Never``. In synchronous modes
  one lost task fails its peers, so restarting means every task restarts from the last checkpoint;
  in ``async`` a lost ps makes the chief fail, and both restart from the last checkpoint.
- ``runPolicy.backoffLimit`` caps the restarts (``training.restarts``, and at least
  :data:`ASYNC_WORKER_RESTARTS` in ``async`` mode; omitted when nothing restarts);
  ``cleanPodPolicy: Running`` removes the servers (ps) still running once the job is done.

The run folder in the containers is :data:`TFJOB_RUN_DIR`; mount a volume shared by all pods there
so the chief's checkpoints outlive a restart and the evaluator can read them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import ConfigError, Host, Problem, RunConfig, replace
from engine.contract.plan import gpu_assignment, plan_tasks, primary_roles, tf_config
from engine.contract.run_folder import task_folder_name

#: First port given to ``auto`` tasks on each machine (TF's customary gRPC port).
DEFAULT_BASE_PORT = 2222
#: The port TFJob pods listen on (the operator's default) and the name it requires for it.
TFJOB_PORT = 2222
TFJOB_PORT_NAME = "tfjob-port"
#: The container name the TFJob operator requires.
TFJOB_CONTAINER = "tensorflow"
#: Where the TFJob containers keep the run folder (mount a shared volume here for checkpoints).
TFJOB_RUN_DIR = "/clusterdeck/run"
#: TFJob replica types, in manifest order, for each ClusterDeck role.
TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
#: The volume of the run folder in every TFJob pod (a PersistentVolumeClaim, when one is named).
RUN_VOLUME = "run-folder"
#: Annotations of every TFJob pod: no Istio sidecar (Kubeflow's advice: it keeps pods from finishing
#: and intercepts the tasks' gRPC traffic).
POD_ANNOTATIONS = {"sidecar.istio.io/inject": "false"}
#: Where the image holds the user's files (script, data) named by the config.
IMAGE_USER_DIR = "/opt/clusterdeck-user"
#: What a task process imports besides TensorFlow (pyproject's dependencies, less the app's).
IMAGE_DEPENDENCIES = ("tensorboard>=2.16", "pyyaml>=6.0", "numpy>=1.26", "psutil>=5.9", "platformdirs>=3.0")
#: Restarts allowed in ``async`` mode even when ``training.restarts`` is 0 (as the launcher allows).
ASYNC_WORKER_RESTARTS = 10

_DNS_MAX = 63
#: Room left in a TFJob name for the operator's pod and service suffixes (``-evaluator-0``...).
_TFJOB_NAME_MAX = 47


# --------------------------------------------------------------------------- checks and ports


def _checked(config: RunConfig) -> RunConfig:
    problems = config_mod.validate(config)
    if problems:
        raise ConfigError(problems, "export")
    return config


def _machine(host: Host) -> str:
    return "127.0.0.1" if host.is_local else host.address.strip().lower()


def export_ports(config: RunConfig) -> RunConfig:
    """A copy of ``config`` with every ``auto`` port fixed deterministically (see the module docstring)."""
    taken: dict[str, set[int]] = {}
    for h, t in config.cluster.tasks():
        if t.port is not None:
            taken.setdefault(_machine(h), set()).add(t.port)
    hosts = []
    for h in config.cluster.hosts:
        used = taken.setdefault(_machine(h), set())
        tasks = []
        for t in h.tasks:
            if t.port is None:
                port = DEFAULT_BASE_PORT
                while port in used:
                    port += 1
                if port > 65535:
                    raise ConfigError([Problem("cluster", f"no free port left from {DEFAULT_BASE_PORT} to 65535 "
                                                          f"on {h.address!r} for task {t.name}")], "export")
                used.add(port)
                t = replace(t, port=port)
            tasks.append(t)
        hosts.append(replace(h, tasks=tuple(tasks)))
    return replace(config, cluster=replace(config.cluster, hosts=tuple(hosts)))


def _check_reachable(config: RunConfig) -> None:
    """A local address in a cluster that also spans other machines could not be dialled from them."""
    if config.cluster.is_local or all(not h.is_local for h in config.cluster.hosts):
        return
    problems = [Problem(f"cluster.hosts[{i}].address",
                        f"{h.address!r} names this machine, which the other hosts of the cluster cannot dial; "
                        "expected the machine's network name or IP address")
                for i, h in enumerate(config.cluster.hosts) if h.is_local]
    raise ConfigError(problems, "export")


def _resolved(config: RunConfig) -> RunConfig:
    config = _checked(config)
    slurm = [Problem(f"cluster.hosts[{i}].kind", f"host {h.name!r} is a Slurm group: its nodes are known only once "
                                                 "Slurm allocates them, so no launch script or TF_CONFIG can be "
                                                 "written ahead; run it with `clusterdeck run` (salloc/srun), or draw "
                                                 "machines (kind: machine) to export scripts")
             for i, h in enumerate(config.cluster.hosts) if h.is_slurm]
    if slurm:
        raise ConfigError(slurm, "export")
    _check_reachable(config)
    return export_ports(config)


def tf_configs(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Each task's ``TF_CONFIG`` (``{"worker:0": {"cluster": ..., "task": ...}, ...}``), ports fixed for export."""
    resolved = _resolved(config)
    return {t.name: tf_config(resolved.cluster, t) for _, t in resolved.cluster.tasks()}


# --------------------------------------------------------------------------- launch scripts


def _file_part(name: str) -> str:
    part = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return part or "host"


def script_names(config: RunConfig) -> dict[str, str]:
    """The launch script file name of each host: ``launch-<host>.sh``, made file-safe and unique."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for h in config.cluster.hosts:
        base = f"launch-{_file_part(h.name)}"
        name, n = f"{base}.sh", 2
        while name in used:
            name, n = f"{base}-{n}.sh", n + 1
        used.add(name)
        names[h.name] = name
    return names


_SCRIPT_HEAD = """\
#!/usr/bin/env bash
# ClusterDeck launch script: run {run} ({mode}), host {host} ({address}), {count} task(s).
# Generated from the run's config; start it on that host from a ClusterDeck checkout or install.
# Environment overrides: CLUSTERDECK_WORKDIR, CLUSTERDECK_RUN_DIR, CLUSTERDECK_PYTHON, TF_NUM_INTRAOP_THREADS.
# Ctrl-C or SIGTERM stops every task of this host.
# TensorFlow's gRPC ports listen on every interface without authentication: use a trusted network.
set -o pipefail

WORKDIR=${{CLUSTERDECK_WORKDIR:-{workdir}}}
RUN_DIR=${{CLUSTERDECK_RUN_DIR:-{run_dir}}}
PYTHON=${{CLUSTERDECK_PYTHON:-{python}}}
cd "$WORKDIR" || exit 1
mkdir -p "$RUN_DIR/checkpoints" || exit 1
RUN_DIR=$(cd "$RUN_DIR" && pwd) || exit 1
export PYTHONPATH="$WORKDIR${{PYTHONPATH:+:$PYTHONPATH}}"
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=${{TF_CPP_MIN_LOG_LEVEL:-1}}
# this host's {count} task(s) share its cores evenly (TensorFlow would give each task all of them), and where
# there are enough cores its {trainers} training task(s) each run on cores of their own (unless
# TF_NUM_INTRAOP_THREADS is set: the placement is then the kernel's)
cpu_list() {{  # the CPUs this script may use (its affinity), one per word: "0-2,8" gives "0 1 2 8"
  local spec part c out=()
  spec=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status 2>/dev/null)
  IFS=, read -ra parts <<< "$spec"
  for part in "${{parts[@]}}"; do
    for ((c = ${{part%-*}}; c <= ${{part#*-}}; c++)); do out+=("$c"); done
  done
  echo "${{out[@]}}"
}}
CPUS=($(cpu_list))
CORES=${{#CPUS[@]}}
[ "$CORES" -gt 0 ] || CORES=$(nproc 2>/dev/null || echo 1)
PER=0  # cores of each training task's own (0: none pinned)
if [ -z "${{TF_NUM_INTRAOP_THREADS:-}}" ] && [ {trainers} -ge 2 ] && [ "$CORES" -ge {trainers} ]; then
  command -v taskset >/dev/null 2>&1 && PER=$(( ${{#CPUS[@]}} / {trainers} ))
fi
export TF_NUM_INTRAOP_THREADS=${{TF_NUM_INTRAOP_THREADS:-$(( CORES / {count} > 0 ? CORES / {count} : 1 ))}}
run_task() {{  # run_task K: the task, as the K-th training task of this host on cores of its own (-1: anywhere)
  if [ "$1" -ge 0 ] && [ "$PER" -gt 0 ]; then
    local own
    own=$(echo "${{CPUS[@]:$(( $1 * PER )):$PER}}" | tr ' ' ,)
    exec env TF_NUM_INTRAOP_THREADS="$PER" TF_NUM_INTEROP_THREADS="${{TF_NUM_INTEROP_THREADS:-$CORES}}" \\
      taskset -c "$own" "$PYTHON" -m engine.runtime.task --run-dir "$RUN_DIR"
  fi
  exec "$PYTHON" -m engine.runtime.task --run-dir "$RUN_DIR"
}}

# the resolved config every task reads
printf '%s' {config_yaml} > "$RUN_DIR/config.yaml" || exit 1

pids=()     # every task of this host
primary=()  # tasks that finish by themselves; the others are servers
stop_all() {{
  local pid alive
  for pid in "${{pids[@]}}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 100); do  # up to 10 s of grace, then SIGKILL
    alive=0
    for pid in "${{pids[@]}}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${{pids[@]}}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
}}
on_signal() {{
  trap - INT TERM
  echo "clusterdeck: stopping the tasks of this host" >&2
  stop_all
  exit 130
}}
trap on_signal INT TERM
"""

_SCRIPT_TASK = """
# {name}{gpus}
mkdir -p "$RUN_DIR/tasks/{task_dir}"
(
  {exports}
  run_task {trainer}
) >>"$RUN_DIR/tasks/{task_dir}/log.txt" 2>&1 &
pids+=("$!")
{primary}echo "started {name} (pid $!)"
"""

_SCRIPT_TAIL = """
code=0
if [ "${#primary[@]}" -gt 0 ]; then
  for pid in "${primary[@]}"; do
    wait "$pid"
    rc=$?
    if [ "$rc" != 0 ] && [ "$code" = 0 ]; then code=$rc; fi
  done
  stop_all  # servers never finish by themselves
else
  wait  # servers only: they run until this script is stopped
fi
exit "$code"
"""


def launch_scripts(config: RunConfig, *, python: str = "python3", workdir: str | None = None,
                   run_dir: str | None = None) -> dict[str, str]:
    """One bash launch script per host with tasks, keyed by file name (:func:`script_names`).

    ``python`` is used for hosts whose ``python`` is the default ``python3``; a host's own setting wins.
    ``workdir`` is where ClusterDeck lives on the hosts (default: the directory the script is started
    from); ``run_dir`` is the run folder (default ``<workdir>/runs/<run name>``). Every value is
    shell-quoted, so no host name, address or path can inject a command.
    """
    resolved = _resolved(config)
    config_yaml = config_mod.dumps(resolved)
    plans = {p.name: p for p in plan_tasks(resolved)}
    primary = primary_roles(resolved.parallelism.mode)
    names = script_names(resolved)
    scripts: dict[str, str] = {}
    for h in resolved.cluster.hosts:
        if not h.tasks:
            continue  # nothing to start there
        host_python = h.python if h.python != "python3" else python
        trainers = [t.name for t in h.tasks if plans[t.name].trains]  # in order: the K-th takes the K-th share
        head = _SCRIPT_HEAD.format(
            run=_comment(resolved.name), mode=resolved.parallelism.mode, host=_comment(h.name),
            address=_comment(h.address), count=len(h.tasks),
            trainers=len(trainers),
            workdir="$PWD" if workdir is None else shlex.quote(workdir),
            run_dir=("$WORKDIR/runs/" + shlex.quote(_file_part(resolved.name))) if run_dir is None
            else shlex.quote(run_dir),
            python=shlex.quote(host_python),
            config_yaml=shlex.quote(config_yaml),
        )
        parts = [head]
        for t in h.tasks:
            plan = plans[t.name]
            env = dict(plan.env)
            exports = "\n  ".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())
            gpus = f" on GPU {','.join(map(str, plan.gpu_ids))}" if plan.gpu_ids else ""
            parts.append(_SCRIPT_TASK.format(
                name=t.name, gpus=gpus, task_dir=task_folder_name(t.name), exports=exports,
                trainer=trainers.index(t.name) if t.name in trainers else -1,
                primary='primary+=("$!")\n' if t.role in primary else "",
            ))
        parts.append(_SCRIPT_TAIL)
        scripts[names[h.name]] = "".join(parts)
    return scripts


def _comment(text: str) -> str:
    """Text safe inside a bash comment: one line, printable."""
    return "".join(c if c.isprintable() else "?" for c in text)[:200]


# --------------------------------------------------------------------------- Kubeflow TFJob


def dns1123_name(name: str, max_len: int = _TFJOB_NAME_MAX) -> str:
    """A DNS-1123 label (and DNS-1035: it starts with a letter) derived from ``name``.

    Lower-cased, runs of other characters become ``-``; a name that had to be shortened keeps a
    short hash of the original, so two long names stay apart.
    """
    max_len = min(max_len, _DNS_MAX)
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label:
        label = "clusterdeck-run"
    if not label[0].isalpha():
        label = f"run-{label}"
    if len(label) > max_len:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:6]
        label = f"{label[: max_len - 7].rstrip('-')}-{digest}"
    return label


def _role_gpus(config: RunConfig, role: str) -> int:
    """GPUs of each task of ``role``; a TFJob gives every replica of a role the same, so they must agree."""
    counts: dict[str, int] = {}
    for h in config.cluster.hosts:
        assigned: dict[str, list[int]] = {}
        for group in h.node_tasks():  # a Slurm group: GPUs per node
            if group:
                assigned.update(gpu_assignment(h.node_of(group[0]), config.parallelism.mode))
        for t in h.tasks:
            if t.role == role:
                counts[t.name] = len(assigned.get(t.name, []))
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{name}: {n}" for name, n in sorted(counts.items()))
        raise ConfigError([Problem("cluster", f"{role} tasks have different GPU counts ({shown}); a TFJob gives "
                                              f"every {role} replica the same resources, so expected one count")],
                          "export")
    return next(iter(counts.values()), 0)


def _restart_policy(config: RunConfig, role: str) -> str:
    if config.parallelism.mode == "async" and role == "worker":
        return "OnFailure"
    return "OnFailure" if config.training.restarts > 0 else "Never"


#: Run inside each TFJob container: prints ``export`` lines for what a task needs beyond the
#: operator's ``TF_CONFIG``: its name and, in ``model`` mode, the DTensor client variables
#: (as :func:`engine.contract.plan.dtensor_env` gives them on a local launch).
_TASK_ENV_FROM_TF_CONFIG = """\
import json, os, shlex
c = json.loads(os.environ["TF_CONFIG"])
t = c["task"]
env = {"CLUSTERDECK_TASK": "%s:%s" % (t["type"], t["index"])}
workers = c.get("cluster", {}).get("worker", [])
if os.environ.get("CLUSTERDECK_DTENSOR") == "1" and t["type"] == "worker" and len(workers) > 1:
    env.update(DTENSOR_CLIENT_ID=str(t["index"]), DTENSOR_NUM_CLIENTS=str(len(workers)),
               DTENSOR_JOB_NAME="worker", DTENSOR_JOBS=",".join(workers))
print("".join("export %s=%s\\n" % (k, shlex.quote(v)) for k, v in env.items()))
"""


def default_command(python: str = "python3") -> list[str]:
    """The container command of a TFJob: name the task from ``TF_CONFIG``, write the config, run the task."""
    py = shlex.quote(python)
    script = "\n".join([
        "set -e",
        f"task_env=\"$({py} -c {shlex.quote(_TASK_ENV_FROM_TF_CONFIG)})\"",
        'eval "$task_env"',
        'mkdir -p "$CLUSTERDECK_RUN_DIR/checkpoints"',
        "printf '%s' \"$CLUSTERDECK_CONFIG\" > \"$CLUSTERDECK_RUN_DIR/config.yaml\"",
        f'exec {py} -m engine.runtime.task --run-dir "$CLUSTERDECK_RUN_DIR"',
    ]) + "\n"
    return ["/bin/sh", "-c", script]


def _check_claim(pvc: str) -> None:
    if pvc and not (len(pvc) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", pvc)):
        raise ConfigError([Problem("pvc", f"expected the name of a PersistentVolumeClaim (lower-case letters, digits, "
                                          f"'-' and '.'), got {pvc!r}")], "export")


def tfjob_manifest(config: RunConfig, *, image: str, command: Sequence[str] | None = None,
                   namespace: str = "default", pvc: str = "", python: str = "python3") -> dict[str, Any]:
    """A Kubeflow ``TFJob`` for ``config`` (see the module docstring for the restart policies).

    One replica spec per role present (Chief, Worker, PS, Evaluator), ``replicas`` = its task count,
    ``nvidia.com/gpu`` limit = GPUs per task of that role (omitted when 0; roles without GPUs also get
    an empty ``CUDA_VISIBLE_DEVICES``). Every pod carries ``sidecar.istio.io/inject: "false"`` (an Istio
    sidecar keeps the pods from ending and from reaching each other's gRPC ports). ``pvc`` names a
    PersistentVolumeClaim (ReadWriteMany) mounted at :data:`TFJOB_RUN_DIR` in every replica, the run's
    own folder of the claim (``subPath``: the job's name): checkpoints, logs and events outlive the pods
    and the evaluator reads the chief's checkpoints. Without it the run folder dies with each container.
    ``python`` runs the task in the image (:func:`dockerfile` installs ClusterDeck for it); the user's
    files (``model.script``, ``data.path``) are read from :data:`IMAGE_USER_DIR`, where the image
    recipe puts them. ``command`` replaces :func:`default_command`.
    """
    config = _checked(config)
    if not image.strip():
        raise ConfigError([Problem("image", "expected a container image name, got ''")], "export")
    _check_claim(pvc)
    if not python.strip() or any(c.isspace() or not c.isprintable() for c in python.strip()):
        raise ConfigError([Problem("python", f"expected a Python command (one word), got {python!r}")], "export")
    name = dns1123_name(config.name)
    config_yaml = config_mod.dumps(config_in_image(export_ports(config)))
    cmd = list(command) if command is not None else default_command(python.strip())
    specs: dict[str, Any] = {}
    for role, replica_type in TFJOB_REPLICA_TYPES.items():
        count = len(config.cluster.tasks_of(role))
        if count == 0:
            continue
        gpus = _role_gpus(config, role)
        devices = max(1, gpus) if role in ("chief", "worker") else 0
        env = [
            {"name": "CLUSTERDECK_CONFIG", "value": config_yaml},
            {"name": "CLUSTERDECK_RUN_DIR", "value": TFJOB_RUN_DIR},
            {"name": "CLUSTERDECK_DEVICES", "value": str(devices)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ]
        if config.parallelism.mode == "model":
            env.append({"name": "CLUSTERDECK_DTENSOR", "value": "1"})
        container: dict[str, Any] = {
            "name": TFJOB_CONTAINER,
            "image": image,
            "command": list(cmd),
            "env": env,
            "ports": [{"name": TFJOB_PORT_NAME, "containerPort": TFJOB_PORT}],
        }
        if gpus > 0:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        else:
            env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})  # never grab a GPU's memory
        pod: dict[str, Any] = {"containers": [container]}
        if pvc:
            container["volumeMounts"] = [{"name": RUN_VOLUME, "mountPath": TFJOB_RUN_DIR, "subPath": name}]
            pod["volumes"] = [{"name": RUN_VOLUME, "persistentVolumeClaim": {"claimName": pvc}}]
        specs[replica_type] = {
            "replicas": count,
            "restartPolicy": _restart_policy(config, role),
            "template": {"metadata": {"annotations": dict(POD_ANNOTATIONS)}, "spec": pod},
        }
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running"}
    backoff = config.training.restarts
    if config.parallelism.mode == "async":
        backoff = max(backoff, ASYNC_WORKER_RESTARTS)
    if backoff > 0:
        run_policy["backoffLimit"] = backoff
    annotations = {"clusterdeck/run-name": config.name}
    if pvc:
        annotations["clusterdeck/run-folder"] = f"pvc {pvc}, folder {name}"
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "runPolicy": run_policy,
            "tfReplicaSpecs": specs,
        },
    }


def tfjob_yaml(config: RunConfig, *, image: str, command: Sequence[str] | None = None,
               namespace: str = "default", pvc: str = "", python: str = "python3") -> str:
    """:func:`tfjob_manifest` as YAML text."""
    manifest = tfjob_manifest(config, image=image, command=command, namespace=namespace, pvc=pvc, python=python)
    return _yaml(manifest)


def pvc_manifest(name: str, *, namespace: str = "default", size: str = "10Gi", storage_class: str = "") -> dict[str, Any]:
    """A PersistentVolumeClaim for run folders (``ReadWriteMany``: every replica mounts it at once)."""
    _check_claim(name)
    if not re.fullmatch(r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", size):
        raise ConfigError([Problem("pvc size", f"expected a Kubernetes quantity such as 10Gi, got {size!r}")], "export")
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


# --------------------------------------------------------------------------- the image


def _files_read(config: RunConfig) -> list[tuple[str, str]]:
    """``(field, value)`` of each file or folder the run reads: only fields the config uses (a ``data.path``
    left in a config whose ``data.source`` reads no file, or a ``model.script`` of a built-in model, is never
    read, so never copied)."""
    if config.program is not None:  # the user's program runs instead of ClusterDeck's loop: it reads no data.*
        return [("program.script", config.program.script)] if config.program.script.strip() else []
    named: list[tuple[str, str]] = []
    if config.model.name == "script":
        named.append(("model.script", config.model.script))
    if config.data.source in config_mod.FILE_SOURCES:
        named.append(("data.path", config.data.path))
        if config.data.source != "script":
            named.append(("validation.path", config.validation.path))
    return [(f, v) for f, v in named if v.strip()]


def user_files(config: RunConfig) -> dict[str, str]:
    """The user's files and folders the run reads (``model.script`` of a script model, ``data.path`` and
    ``validation.path`` of a file source, ``program.script``): local path -> path in the image."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for _, value in _files_read(config):
        if value in out:
            continue
        base = _file_part(Path(value).name) or "file"
        name, n = base, 2
        while name in used:
            name, n = f"{n}-{base}", n + 1
        used.add(name)
        out[value] = f"{IMAGE_USER_DIR}/{name}"
    return out


def config_in_image(config: RunConfig) -> RunConfig:
    """``config`` with the user's files named where the image holds them (:func:`user_files`)."""
    files = user_files(config)
    if not files:
        return config
    data = replace(config.data, path=files.get(config.data.path, config.data.path))
    model = replace(config.model, script=files.get(config.model.script, config.model.script))
    validation = replace(config.validation, path=files.get(config.validation.path, config.validation.path))
    program = config.program
    if program is not None:
        program = replace(program, script=files.get(program.script, program.script))
    return replace(config, data=data, model=model, validation=validation, program=program)


def dockerfile(config: RunConfig, *, python: str = "python3", base_image: str = "python:3.11-slim") -> str:
    """A Dockerfile for the TFJob's image: ClusterDeck's engine (from ``clusterdeck/engine`` of the build
    folder :func:`write_export` writes) with its task dependencies installed for ``python``, and the
    user's files of the run (from ``user/``) where the manifest's config names them."""
    gpus = any(_role_gpus(config, role) for role in TFJOB_REPLICA_TYPES if config.cluster.tasks_of(role))
    tensorflow = "tensorflow[and-cuda]==2.21.*" if gpus else "tensorflow==2.21.*"
    deps = " ".join(shlex.quote(d) for d in (tensorflow, *IMAGE_DEPENDENCIES))
    py = shlex.quote(python)
    lines = [
        f"# Image of ClusterDeck's tasks for run {_comment(config.name)}. Build it in the export folder:",
        "#   docker build -t <registry>/<image>:<tag> .   then push it and apply tfjob.yaml",
        f"FROM {base_image}",
        "ENV PYTHONUNBUFFERED=1 PYTHONPATH=/opt/clusterdeck",
        f"RUN {py} -m pip install --no-cache-dir {deps}",
        "COPY clusterdeck/engine /opt/clusterdeck/engine",
    ]
    if user_files(config):
        lines.append(f"COPY user/ {IMAGE_USER_DIR}/")
    lines += [
        "WORKDIR /opt/clusterdeck",
        f"RUN {py} -c 'import engine.runtime.task'",
        "",
    ]
    return "\n".join(lines)


def _yaml(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=120)


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (the config, the command) as readable ``|`` blocks; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _represent_str)


# --------------------------------------------------------------------------- what the image's build folder holds

#: Folders of credentials: nothing inside one is ever copied into an image's build folder.
SECRET_FOLDERS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".password-store"})
#: Files of credentials, by name.
SECRET_NAMES = frozenset({".netrc", "_netrc", ".pgpass", ".git-credentials", ".pypirc", ".npmrc", ".env"})
#: Keys and certificates, by ending.
SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx")
_SSH_KEY = re.compile(r"id_(rsa|dsa|ecdsa|ed25519|xmss)(_sk)?(\.pub)?")
#: The summary of what an image export copied (beside ``Dockerfile``; the CLI lists it with the paths).
IMAGE_FILES_NOTE = "image-files.txt"


class UnsafeCopy(ConfigError):
    """A file the image would hold that must never be copied (a secret, a link out of its folder, a loop):
    the whole export is refused, nothing is written."""


@dataclass(frozen=True)
class ImageCopy:
    """One field's file or folder as the image's build folder holds it (``target``, under the export
    folder): each file read (``files``: the real file and its path under ``target``, ``""`` for a single
    file) and their total ``size`` in bytes."""

    field: str
    source: Path
    target: str
    files: tuple[tuple[Path, str], ...]
    size: int

    def describe(self) -> str:
        count = len(self.files)
        what = "1 file" if count == 1 and not self.files[0][1] else f"{count} file{'s' if count != 1 else ''}"
        return f"{self.target}: {what}, {_size_text(self.size)}, from {self.field} {str(self.source)!r}"


def _size_text(size: int) -> str:
    value, unit = float(size), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def secret_reason(path: Path) -> str | None:
    """Why ``path`` looks like credentials (inside ``~/.ssh``, a ``.netrc``, an ``id_rsa``, a ``.pem``), or None."""
    parts = path.parts
    for i, part in enumerate(parts[:-1]):
        if part in SECRET_FOLDERS or (part == "gcloud" and i > 0 and parts[i - 1] == ".config"):
            return f"it is inside {part}/, a folder of credentials"
    name = parts[-1] if parts else ""
    if name in SECRET_FOLDERS:
        return f"{name} is a folder of credentials"
    if name in SECRET_NAMES:
        return f"{name} holds credentials"
    if _SSH_KEY.fullmatch(name):
        return "it is named as an SSH key"
    if name.lower().endswith(SECRET_SUFFIXES):
        return f"a {Path(name).suffix} file holds a key or certificate"
    return None


def _refuse_secret(field: str, named: Path, real: Path) -> None:
    for path in (named, real):
        why = secret_reason(path)
        if why is not None:
            shown = repr(str(named)) + ("" if real == named else f" (through a link, {str(real)!r})")
            raise UnsafeCopy([Problem(field, f"{shown} looks like a secret ({why}); an image's build folder "
                                             "never holds credentials: point the field at the data or script "
                                             "the run reads")], "export")


def _real_file(field: str, named: Path, root: Path | None) -> tuple[Path, int]:
    """The real file behind ``named`` and its size: a regular file, inside ``root`` (the folder the field
    names, resolved) where there is one, and not a secret."""
    real = Path(os.path.realpath(named))
    try:
        st = os.stat(named)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeCopy([Problem(field, f"{str(named)!r} is a loop of symbolic links; expected a file")],
                             "export") from None
        raise ConfigError([Problem(field, f"{str(named)!r} does not exist ({exc.strerror}); the image needs it")],
                          "export") from None
    if root is not None and os.path.commonpath([root, real]) != str(root):
        raise UnsafeCopy([Problem(field, f"{str(named)!r} leads to {str(real)!r} through a symbolic link, outside "
                                         f"{str(root)!r}; only files inside the folder are copied into the image "
                                         "(copy the file into the folder instead of linking it)")], "export")
    _refuse_secret(field, named, real)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError([Problem(field, f"{str(named)!r} is {datasets.file_kind(st.st_mode)}, not a regular "
                                          "file; the image needs the file itself")], "export")
    return real, st.st_size


def _folder_files(config: RunConfig, field: str, folder: Path) -> list[Path]:
    """The files the run reads in ``folder`` (a TFRecord folder's records, an image folder's images), as
    the readers find them: no hidden class folder, no folder reached through a link (so no loop)."""
    try:
        if config.data.source == "tfrecord":
            return datasets.tfrecord_files(str(folder))
        return [f for _, files in datasets.image_folder_files(str(folder)) for f in files]
    except datasets.DataFileError as exc:
        raise ConfigError([Problem(field, exc.problem.message)], "export") from None


def _copy_plan(config: RunConfig, field: str, value: str, target: str) -> ImageCopy:
    named = datasets.resolve_path(value)
    try:
        mode = os.stat(named).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeCopy([Problem(field, f"{str(named)!r} is a loop of symbolic links; expected a file "
                                             "or folder")], "export") from None
        raise ConfigError([Problem(field, f"{value!r} does not exist; the image needs it")], "export") from None
    folder_source = field in ("data.path", "validation.path") and config.data.source in ("tfrecord", "image_folder")
    if not (folder_source and stat.S_ISDIR(mode)):
        real, size = _real_file(field, named, None)
        return ImageCopy(field, named, target, ((real, ""),), size)
    _refuse_secret(field, named, Path(os.path.realpath(named)))
    root = Path(os.path.realpath(named))
    files: list[tuple[Path, str]] = []
    total = 0
    for f in _folder_files(config, field, named):
        real, size = _real_file(field, f, root)
        files.append((real, os.path.relpath(f, named)))
        total += size
    return ImageCopy(field, named, target, tuple(files), total)


def image_copies(config: RunConfig) -> list[ImageCopy]:
    """What the image's build folder holds of the user's: exactly the files the run reads (:func:`user_files`),
    never a whole folder named by a field the run does not use. Raises :class:`UnsafeCopy` for a file that
    must never be copied (credentials, a link leading out of the folder, a loop of links) and
    :class:`ConfigError` for one the image cannot have (missing, not a regular file)."""
    fields: dict[str, str] = {}
    for name, value in _files_read(config):
        fields.setdefault(value, name)
    return [_copy_plan(config, fields[value], value, f"user/{Path(in_image).name}")
            for value, in_image in user_files(config).items()]


def _copy_file(real: Path, target: Path) -> None:
    """Copy one checked file's bytes: opened without following a link swapped in since, never blocking on
    a FIFO swapped in, and refused unless it is still a regular file."""
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeCopy([Problem("export", f"{str(real)!r} is no longer a regular file")], "export")
        os.set_blocking(fd, True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.dup(fd), "rb") as src, open(target, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755 | 0o644)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- files


#: Written in place of the Kubernetes files when they cannot be made: why, in the export folder itself.
SKIPPED_NOTE = "tfjob-skipped.txt"


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote, why the Kubernetes files (TFJob, Dockerfile) were skipped if they were, and
    what of the user's the image's build folder holds (``copied``)."""

    paths: list[Path]
    skipped: list[Problem] = field(default_factory=list)
    copied: list[ImageCopy] = field(default_factory=list)


def _kubernetes_files(config: RunConfig, image: str, python: str, namespace: str, pvc: str,
                      pvc_size: str) -> tuple[dict[str, str], list[ImageCopy]]:
    """The TFJob's files and what of the user's its image's build folder holds (ConfigError when impossible,
    :class:`UnsafeCopy` when it must not be)."""
    copies = image_copies(config)
    files = {"tfjob.yaml": tfjob_yaml(config, image=image, namespace=namespace, pvc=pvc, python=python),
             "Dockerfile": dockerfile(config, python=python)}
    if pvc and pvc_size:
        files["pvc.yaml"] = _yaml(pvc_manifest(pvc, namespace=namespace, size=pvc_size))
    if copies:
        files[IMAGE_FILES_NOTE] = _image_files_note(copies)
    return files, copies


def _image_files_note(copies: list[ImageCopy]) -> str:
    lines = ["What the image's build folder holds of yours (the Dockerfile copies user/ into "
             f"{IMAGE_USER_DIR}): only the files the run reads.", ""]
    lines += [c.describe() for c in copies]
    lines += ["", "Files:"]
    lines += [f"  {c.target}{'/' + rel if rel else ''}  <-  {real}" for c in copies for real, rel in c.files]
    return "\n".join(lines) + "\n"


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new, empty folder in ``parent`` (created with the umask's mode, as a plain ``mkdir``)."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent}")


def _move_into_place(built: Path, out: Path) -> None:
    """Each entry of ``built`` renamed to its place in ``out`` (a file over an old one in one rename; an old
    folder of the same name, say the ``user/`` of an earlier export, moved aside first: it is replaced, so
    no stale file of it ends up in an image)."""
    old = _new_folder(built, ".replaced-")
    for entry in sorted(os.listdir(built)):
        if entry == old.name:
            continue
        here = out / entry
        if here.is_dir() and not here.is_symlink():
            os.rename(here, old / entry)
        os.replace(built / entry, here)


def write_export_report(config: RunConfig, out_dir: str | os.PathLike[str], *, image: str | None = None,
                        python: str = "python3", workdir: str | None = None, run_dir: str | None = None,
                        namespace: str = "default", pvc: str = "", pvc_size: str = "") -> ExportReport:
    """Write ``config.yaml`` (ports fixed), ``tf_config/<role>-<index>.json``, ``launch-<host>.sh``
    (executable) into ``out_dir``; given an ``image``, also Kubernetes' files: ``tfjob.yaml`` (the run
    folder on claim ``pvc`` when named), ``Dockerfile`` with its build folder (``clusterdeck/engine``,
    ``user/`` with exactly the files the run reads: :func:`image_copies`, listed with their sizes in
    :data:`IMAGE_FILES_NOTE`) and, with ``pvc_size``, ``pvc.yaml`` creating the claim. Return the paths
    written (a copied folder counts as one).

    Everything is computed and checked before the first file is written, so an invalid config, or a file
    that must never be copied (:class:`UnsafeCopy`: credentials, a link out of its folder, a loop of links),
    writes nothing. The files are written into a new hidden folder and renamed into place once all are
    there: a failure midway (a full disk) leaves no partial export. What only a TFJob cannot have (unequal
    GPU counts per role, a file its image needs that is missing, a bad image or claim name) skips the
    Kubernetes files alone: the rest is written, with the reason in the report and in :data:`SKIPPED_NOTE`.
    """
    resolved = _resolved(config)
    files: dict[str, str] = {"config.yaml": config_mod.dumps(resolved)}
    for name, tfc in tf_configs(config).items():
        files[f"tf_config/{name.replace(':', '-')}.json"] = json.dumps(tfc, indent=2, sort_keys=True) + "\n"
    scripts = launch_scripts(config, python=python, workdir=workdir, run_dir=run_dir)
    files.update(scripts)
    copies: list[ImageCopy] = []
    skipped: list[Problem] = []
    if image is not None:
        try:
            kube, copies = _kubernetes_files(config, image, python, namespace, pvc, pvc_size)
            files.update(kube)
        except UnsafeCopy:
            raise
        except ConfigError as exc:
            skipped = list(exc.problems)
            files[SKIPPED_NOTE] = ("No TFJob, Dockerfile or image build folder was written: a Kubeflow TFJob of this "
                                   "config is not possible.\n" + "".join(f"- {p}\n" for p in skipped)
                                   + "The TF_CONFIG files and launch scripts beside this note run it on machines.\n")
    out = Path(out_dir)
    fresh = not out.exists() and not out.is_symlink()
    if fresh:
        out.parent.mkdir(parents=True, exist_ok=True)
        built = _new_folder(out.parent, f".{out.name}.partial-")
    else:
        built = _new_folder(out, ".clusterdeck-export-")
    try:
        for rel, text in files.items():
            path = built / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if rel in scripts:
                path.chmod(0o755)
        if image is not None and not skipped:
            shutil.copytree(Path(__file__).resolve().parents[1], built / "clusterdeck" / "engine",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for copy in copies:
            for real, rel in copy.files:
                _copy_file(real, built / copy.target / rel if rel else built / copy.target)
        if fresh:
            os.rename(built, out)
        else:
            _move_into_place(built, out)
    finally:
        if built.exists():
            shutil.rmtree(built, ignore_errors=True)
    paths = [out / rel for rel in files]
    if image is not None and not skipped:
        paths.append(out / "clusterdeck" / "engine")
    paths += [out / copy.target for copy in copies]
    return ExportReport(paths, skipped, copies)


def write_export(config: RunConfig, out_dir: str | os.PathLike[str], *, image: str | None = None,
                 python: str = "python3", workdir: str | None = None, run_dir: str | None = None,
                 namespace: str = "default", pvc: str = "", pvc_size: str = "") -> list[Path]:
    """:func:`write_export_report`'s paths (a skipped TFJob leaves :data:`SKIPPED_NOTE` among them)."""
    return write_export_report(config, out_dir, image=image, python=python, workdir=workdir, run_dir=run_dir,
                               namespace=namespace, pvc=pvc, pvc_size=pvc_size).paths


__all__ = [
    "DEFAULT_BASE_PORT", "IMAGE_FILES_NOTE", "SKIPPED_NOTE", "TFJOB_PORT", "ExportReport", "ImageCopy", "UnsafeCopy",
    "config_in_image", "default_command", "dns1123_name", "dockerfile", "image_copies", "secret_reason",
    "export_ports", "launch_scripts", "primary_roles", "pvc_manifest", "script_names", "tf_configs",
    "tfjob_manifest", "tfjob_yaml", "user_files", "write_export", "write_export_report",
]
