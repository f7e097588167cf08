"""Waiting for a cluster's servers before connecting to them.

A task that connects to a TensorFlow server not up yet fails gRPC's first attempt, and gRPC tries
again only after its reconnect backoff (about a second, growing). Every task of a local run imports
TensorFlow at the same moment, so some are always first: the async chief connects to every worker
and ps when it creates the strategy, and a MultiWorkerMirrored worker registers with the
coordination service's leader (the chief, else worker 0) when it creates its. Looking at a port
until it accepts a connection costs milliseconds; measured on stamped single runs, the strategies
were ready 0.66 s (async) and 0.8-0.9 s (data) after the server they needed came up, and 0.05-0.15 s
after it with the wait (docs/benchmarks.md, section 1c).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.runtime.context import TaskContext
from engine.runtime.stop import Stopped

#: Seconds to wait for the servers' ports to accept connections (then the caller connects anyway,
#: and TensorFlow's own wait and errors take over), and how often to look.
WAIT_S = 120.0
POLL_S = 0.02
#: After this many seconds of waiting, say which servers are awaited.
SAY_AFTER_S = 5.0


def wait_for_servers(addresses: Mapping[str, str], *, timeout_s: float = WAIT_S, poll_s: float = POLL_S,
                     say: Callable[[str], object] | None = None, say_after_s: float = SAY_AFTER_S,
                     stopped: Callable[[], bool] | None = None) -> list[str]:
    """Wait until every server (``{"worker:0": "host:port", ...}``) accepts a TCP connection; the
    tasks still not accepting when it returns (none: all are up).

    It returns after ``timeout_s`` seconds, or as soon as ``stopped()`` is true. ``say(message)`` is
    called once if the wait lasts ``say_after_s`` seconds, naming what is missing.
    """
    start = time.monotonic()
    missing = dict(addresses)
    said = False
    while missing and not (stopped is not None and stopped()):
        for task, address in list(missing.items()):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=max(poll_s, 0.2)):
                    del missing[task]
            except (OSError, ValueError):
                pass
        waited = time.monotonic() - start
        if not missing or waited >= timeout_s:
            break
        if say is not None and not said and waited >= say_after_s:
            said = True
            say("waiting for " + ", ".join(f"{t} at {a}" for t, a in sorted(missing.items())) + " to serve")
        time.sleep(poll_s)
    return sorted(missing)


def await_before_connecting(ctx: TaskContext, addresses: Mapping[str, str], *, timeout_s: float = WAIT_S) -> None:
    """A task's wait for the servers it is about to connect to (:func:`wait_for_servers`).

    It says what it waits for after :data:`SAY_AFTER_S` seconds; a stop asked meanwhile ends the
    task's start (:class:`engine.runtime.stop.Stopped` at step 0, nothing trained, nothing saved);
    servers still not up after ``timeout_s`` seconds are named, and the task connects anyway.
    """
    if not addresses:
        return
    missing = wait_for_servers(addresses, timeout_s=timeout_s, say=ctx.emitter.info,
                               stopped=lambda: ctx.stop.requested)
    if ctx.stop.requested:
        raise Stopped(0, None)
    if missing:
        ctx.emitter.info(f"{', '.join(missing)} not serving after {timeout_s:.0f} s: connecting anyway")


def addresses_of(cluster_spec: Mapping[str, Any], jobs: Sequence[str]) -> dict[str, str]:
    """The addresses of the tasks of ``jobs`` in a cluster spec: ``{"worker:0": "host:port", ...}``.

    A job is a list of addresses, or (a sparse job, as ``ClusterSpec.as_dict()`` gives it) a dict of
    task index to address.
    """
    out: dict[str, str] = {}
    for job in jobs:
        tasks = cluster_spec.get(job) or ()
        pairs = tasks.items() if isinstance(tasks, Mapping) else enumerate(tasks)
        out.update({f"{job}:{index}": str(address) for index, address in pairs})
    return out


def coordination_leader(cluster_spec: Mapping[str, Any]) -> str:
    """The task the coordination service of a ``tf.distribute`` cluster runs on: ps 0, else the chief,
    else worker 0 (the rule of ``tensorflow.python.distribute.multi_worker_util.coordination_leader``);
    '' for an empty spec."""
    for job in ("ps", "chief", "worker"):
        if cluster_spec.get(job):
            return f"{job}:0"
    return ""


def leader_to_await(cluster_spec: Mapping[str, Any], task: str) -> dict[str, str]:
    """What a task of a MultiWorkerMirrored cluster waits for before it creates its strategy: the
    coordination leader's address, unless the task is the leader or the spec does not list it."""
    leader = coordination_leader(cluster_spec)
    if not leader or leader == task:
        return {}
    address = addresses_of(cluster_spec, (leader.partition(":")[0],)).get(leader)
    return {leader: address} if address else {}
