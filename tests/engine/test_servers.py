"""Waiting for a cluster's servers before connecting (engine.runtime.servers): real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

from engine.runtime import servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_waits_until_every_server_accepts_then_returns_at_once() -> None:
    ports = [_free_port(), _free_port()]
    listeners = [socket.socket() for _ in ports]

    def serve_later() -> None:  # the first server comes up after 0.2 s, the second 0.1 s later
        for listener, port in zip(listeners, ports, strict=True):
            time.sleep(0.2 if listener is listeners[0] else 0.1)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen()

    thread = threading.Thread(target=serve_later)
    start = time.monotonic()
    thread.start()
    try:
        missing = servers.wait_for_servers({"worker:0": f"127.0.0.1:{ports[0]}", "ps:0": f"127.0.0.1:{ports[1]}"},
                                           timeout_s=20, poll_s=0.01)
        waited = time.monotonic() - start
    finally:
        thread.join()
        for listener in listeners:
            listener.close()
    assert missing == []
    assert 0.25 <= waited < 5  # it waited for both servers, and returned soon after the last came up


def test_a_server_that_never_comes_is_named_and_said_once() -> None:
    said: list[str] = []
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    missing = servers.wait_for_servers({"ps:0": f"127.0.0.1:{port}"}, timeout_s=0.3, poll_s=0.01,
                                       say=said.append, say_after_s=0.05)
    assert missing == ["ps:0"]
    assert said == [f"waiting for ps:0 at 127.0.0.1:{port} to serve"]
    assert time.monotonic() - start < 5  # gave up after its timeout


def test_addresses_of_the_jobs_asked() -> None:
    spec = {"chief": ["a:1"], "worker": ["b:2", "c:3"], "ps": ["d:4"], "evaluator": ["e:5"]}
    assert servers.addresses_of(spec, ("worker", "ps")) == {"worker:0": "b:2", "worker:1": "c:3", "ps:0": "d:4"}
    assert servers.addresses_of(spec, ("chief",)) == {"chief:0": "a:1"}


def test_the_coordination_leader_follows_tensorflows_rule() -> None:
    assert servers.coordination_leader({"worker": ["a:1", "b:2"]}) == "worker:0"
    assert servers.coordination_leader({"chief": ["c:0"], "worker": ["a:1"]}) == "chief:0"
    assert servers.coordination_leader({"ps": ["p:0"], "chief": ["c:0"], "worker": ["a:1"]}) == "ps:0"


def test_the_rule_is_tensorflows() -> None:
    import pytest

    multi_worker_util = pytest.importorskip("tensorflow.python.distribute.multi_worker_util")
    for spec in ({"worker": ["a:1", "b:2"]}, {"chief": ["c:0"], "worker": ["a:1"]},
                 {"ps": ["p:0"], "chief": ["c:0"], "worker": ["a:1"]}):
        job, _, index = servers.coordination_leader(spec).partition(":")
        assert multi_worker_util.coordination_leader(spec) == f"/job:{job}/replica:0/task:{index}"
