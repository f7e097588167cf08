"""Faults in synchronous runs: killed and frozen tasks, blame, and stop storms."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, Task, replace
from engine.control.launcher import Run, blame
from tests.conftest import PRESETS, wait_gone


def long_run(cfg: config_mod.RunConfig) -> config_mod.RunConfig:
    return replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))


def start_and_wait_for_steps(run: Run) -> None:
    got = threading.Event()
    run.add_listener(lambda e: got.set() if e["kind"] == "step" else None)
    run.start()
    assert got.wait(90), f"no step within 90 s: {run.state.summary()}"


def test_blame_names_the_task_tensorflow_found_unhealthy() -> None:
    reason = ("UnavailableError: Collective ops is aborted by: Error reported from /job:worker/task:1: The "
              "following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1")
    task, why = blame("worker:0", reason)
    assert task == "worker:1"
    assert "stopped responding" in why and "reported by worker:0" in why
    assert blame("worker:0", "ValueError: bad shape") == ("worker:0", "ValueError: bad shape")


@pytest.mark.cluster
def test_frozen_worker_fails_the_run_naming_it(runs_root: Path) -> None:
    run = Run(long_run(config_mod.load(PRESETS / "data-2workers.yaml")), runs_root=runs_root)
    start_and_wait_for_steps(run)
    pids = run.pids()
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGSTOP)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "worker:1"
    assert "frozen" in run.state.reason
    assert wait_gone(pids, 3) == []
    assert any(e["kind"] == "step" for e in events.read_file(run.run_dir / "events.jsonl"))


@pytest.mark.cluster
def test_killed_chief_fails_the_run_and_stops_the_worker(runs_root: Path) -> None:
    cfg = long_run(config_mod.default_config())
    cfg = replace(cfg, cluster=Cluster(hosts=(Host(name="local", tasks=(Task("chief", 0), Task("worker", 0))),)))
    run = Run(cfg, runs_root=runs_root)
    start_and_wait_for_steps(run)
    pids = run.pids()
    os.kill(run.state.tasks["chief:0"].pid or 0, signal.SIGKILL)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "chief:0"
    assert wait_gone(pids, 3) == []


def _listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


@pytest.mark.cluster
def test_stop_storm_leaves_no_process_fd_or_port(runs_root: Path) -> None:
    """A short stop storm (the benchmark bench/stop_storm.py runs 100 cycles)."""
    cfg = long_run(config_mod.load(PRESETS / "data-2workers.yaml"))
    me = psutil.Process()
    ports_before = _listening_ports()
    fds_before = me.num_fds()
    for cycle in range(6):
        run = Run(cfg, runs_root=runs_root)
        run.start()
        # stop at different moments: at once, while TF imports, after the first steps
        if cycle % 3 == 1:
            time.sleep(1.0)
        elif cycle % 3 == 2:
            got = threading.Event()
            run.add_listener(lambda e, got=got: got.set() if e["kind"] == "step" else None)
            got.wait(90)
        pids = run.pids()
        run.stop()
        assert run.wait(5) in ("stopped", "failed")
        assert wait_gone(pids, 3) == [], f"cycle {cycle}: processes left"
    assert me.num_fds() <= fds_before + 2, "file descriptors leak across runs"
    assert _listening_ports() <= ports_before | set(), "a run left a listening port"
