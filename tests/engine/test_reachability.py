"""Reachability before launch: every task's address and port, checked from here in seconds (127.0.0.1 only)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task
from engine.control import reachability
from engine.control.reachability import Target
from tests.conftest import PRESETS


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lab_config(port0: int | None, port1: int | None) -> config_mod.RunConfig:
    """A two-host cluster: this machine and a 'remote' host whose address is 127.0.0.1 (reached by ssh)."""
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    return replace(cfg, cluster=Cluster(hosts=(
        Host(name="here", tasks=(Task("worker", 0, port=port0),)),
        Host(name="lab1", address="127.0.0.1", ssh_host="lab1", tasks=(Task("worker", 1, port=port1),)))))


def test_a_cluster_of_this_machine_only_is_not_checked() -> None:
    assert reachability.targets(config_mod.load(PRESETS / "data-2workers.yaml")) == []


def test_a_free_port_on_a_reachable_host_passes() -> None:
    cfg = lab_config(closed_port(), closed_port())
    assert [t.local for t in reachability.targets(cfg)] == [True, False]
    assert reachability.problems(cfg) == []


def test_a_taken_port_is_named_with_its_host_and_port(listening: int) -> None:
    t0 = time.monotonic()
    problems = reachability.problems(lab_config(None, listening))
    assert time.monotonic() - t0 < 3.5
    (problem,) = problems
    assert problem.field == "cluster"
    assert f"worker:1 on host 'lab1' (127.0.0.1:{listening})" in problem.message
    assert "already taken" in problem.message and "expected a free port" in problem.message


def test_a_port_of_this_machine_that_cannot_be_bound_is_named(listening: int) -> None:
    (problem,) = reachability.check([Target("worker:0", "here", "127.0.0.1", listening, local=True)])
    assert f"port {listening} cannot be bound on this machine" in problem


def test_an_address_that_does_not_resolve_is_named() -> None:
    def unknown(address: str) -> str:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    (problem,) = reachability.check([Target("worker:1", "lab1", "lab1.invalid", 4000)], resolver=unknown)
    assert "the address 'lab1.invalid' does not resolve" in problem and "host 'lab1'" in problem


def test_the_check_is_bounded_by_its_timeout() -> None:
    def slow(address: str) -> str:
        time.sleep(5)
        return "127.0.0.1"

    t0 = time.monotonic()
    (problem,) = reachability.check([Target("worker:1", "lab1", "lab1", 4000)], timeout=0.5, resolver=slow)
    assert time.monotonic() - t0 < 1.5
    assert "no answer within 0.5 s" in problem
