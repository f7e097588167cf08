"""Waiting for a cluster's servers before connecting (engine.runtime.servers): real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.plan import free_port
from engine.runtime import servers
from engine.runtime.context import TaskContext
from engine.runtime.emitter import Emitter
from engine.runtime.stop import Stopped


def test_waits_until_every_server_accepts_then_returns_at_once() -> None:
    ports = [free_port(), free_port()]
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
    port = free_port()  # nothing listens there
    start = time.monotonic()
    missing = servers.wait_for_servers({"ps:0": f"127.0.0.1:{port}"}, timeout_s=0.3, poll_s=0.01,
                                       say=said.append, say_after_s=0.05)
    assert missing == ["ps:0"]
    assert said == [f"waiting for ps:0 at 127.0.0.1:{port} to serve"]
    assert time.monotonic() - start < 5  # gave up after its timeout


def _ctx(tmp_path: Path) -> tuple[TaskContext, list[dict[str, object]]]:
    seen: list[dict[str, object]] = []
    emitter = Emitter("worker:1", tmp_path / "events.jsonl")
    emitter.emit = lambda kind, **fields: seen.append({"kind": kind, **fields})  # type: ignore[method-assign]
    ctx = TaskContext(config=config_mod.default_config(), task="worker:1", role="worker", index=1,
                      run_dir=tmp_path, emitter=emitter, devices=1, gpus_assigned=False)
    return ctx, seen


def test_a_stop_asked_during_the_wait_ends_the_start_at_once(tmp_path: Path) -> None:
    ctx, _ = _ctx(tmp_path)
    threading.Timer(0.2, ctx.stop.request).start()
    start = time.monotonic()
    with pytest.raises(Stopped) as stopped:
        servers.await_before_connecting(ctx, {"worker:0": f"127.0.0.1:{free_port()}"}, timeout_s=60)
    assert time.monotonic() - start < 5  # not the 60 s of the timeout
    assert stopped.value.step == 0 and stopped.value.checkpoint is None


def test_servers_still_down_after_the_timeout_are_named_and_the_task_goes_on(tmp_path: Path) -> None:
    ctx, seen = _ctx(tmp_path)
    servers.await_before_connecting(ctx, {"worker:0": f"127.0.0.1:{free_port()}"}, timeout_s=0.2)
    assert [e["message"] for e in seen] == ["worker:0 not serving after 0 s: connecting anyway"]
    servers.await_before_connecting(ctx, {})  # nothing to wait for: returns, says nothing
    assert len(seen) == 1


def test_addresses_of_the_jobs_asked_dense_or_sparse() -> None:
    spec = {"chief": ["a:1"], "worker": ["b:2", "c:3"], "ps": ["d:4"], "evaluator": ["e:5"]}
    assert servers.addresses_of(spec, ("worker", "ps")) == {"worker:0": "b:2", "worker:1": "c:3", "ps:0": "d:4"}
    assert servers.addresses_of(spec, ("chief",)) == {"chief:0": "a:1"}
    assert servers.addresses_of({"worker": {0: "b:2", 3: "f:6"}}, ("worker",)) == {"worker:0": "b:2", "worker:3": "f:6"}


def test_the_coordination_leader_and_who_waits_for_it() -> None:
    two = {"worker": ["a:1", "b:2"]}
    with_chief = {"chief": ["c:0"], "worker": ["a:1"]}
    assert servers.coordination_leader(two) == "worker:0"
    assert servers.coordination_leader(with_chief) == "chief:0"
    assert servers.coordination_leader({"ps": ["p:0"], **with_chief}) == "ps:0"
    assert servers.coordination_leader({}) == ""
    assert servers.leader_to_await(two, "worker:1") == {"worker:0": "a:1"}
    assert servers.leader_to_await(two, "worker:0") == {}  # the leader waits for no one
    assert servers.leader_to_await(with_chief, "worker:0") == {"chief:0": "c:0"}
    assert servers.leader_to_await({}, "worker:0") == {}  # no cluster: nothing to wait for


def test_the_rule_is_tensorflows() -> None:
    multi_worker_util = pytest.importorskip("tensorflow.python.distribute.multi_worker_util")
    for spec in ({"worker": ["a:1", "b:2"]}, {"chief": ["c:0"], "worker": ["a:1"]},
                 {"ps": ["p:0"], "chief": ["c:0"], "worker": ["a:1"]}, {}):
        job, _, index = servers.coordination_leader(spec).partition(":")
        expected = f"/job:{job}/replica:0/task:{index}" if job else ""
        assert multi_worker_util.coordination_leader(spec) == expected
