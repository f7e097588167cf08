"""Waiting for a cluster's servers before connecting to them.

A task that connects to a TensorFlow server not up yet fails gRPC's first attempt, and gRPC tries
again only after its reconnect backoff (about a second, growing). Every task of a local run imports
TensorFlow at the same moment, so some are always first: the async chief connects to every worker
and ps when it creates the strategy, and a MultiWorkerMirrored worker registers with the
coordination service's leader (the chief, else worker 0) when it creates its. Looking at a port
until it accepts a connection costs milliseconds; measured, it took 0.6-0.9 s off every async start.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence

#: Seconds to wait for the servers' ports to accept connections (then the caller connects anyway,
#: and TensorFlow's own wait and errors take over), and how often to look.
WAIT_S = 120.0
POLL_S = 0.02
#: After this many seconds of waiting, say which servers are awaited.
SAY_AFTER_S = 5.0


def wait_for_servers(addresses: Mapping[str, str], *, timeout_s: float = WAIT_S, poll_s: float = POLL_S,
                     say: Callable[[str], object] | None = None, say_after_s: float = SAY_AFTER_S) -> list[str]:
    """Wait until every server (``{"worker:0": "host:port", ...}``) accepts a TCP connection; the
    tasks still not accepting after ``timeout_s`` seconds (none: all are up).

    ``say(message)`` is called once if the wait lasts ``say_after_s`` seconds, naming what is missing.
    """
    start = time.monotonic()
    missing = dict(addresses)
    said = False
    while missing:
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


def addresses_of(cluster_spec: Mapping[str, Sequence[str]], jobs: Sequence[str]) -> dict[str, str]:
    """The addresses of the tasks of ``jobs`` in a cluster spec: ``{"worker:0": "host:port", ...}``."""
    return {f"{job}:{i}": address for job in jobs for i, address in enumerate(cluster_spec.get(job, ()))}


def coordination_leader(cluster_spec: Mapping[str, Sequence[str]]) -> str:
    """The task the coordination service of a ``tf.distribute`` cluster runs on: ps 0, else the chief,
    else worker 0 (the rule of ``tensorflow.python.distribute.multi_worker_util.coordination_leader``)."""
    for job in ("ps", "chief"):
        if cluster_spec.get(job):
            return f"{job}:0"
    return "worker:0"
