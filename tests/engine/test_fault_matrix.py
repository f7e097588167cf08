"""The fault matrix beyond data parallelism: model (DTensor) and async (parameter-server) runs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.config import replace
from engine.control.launcher import Run
from tests.conftest import PRESETS, run_story, wait_gone, wait_while_live

pytestmark = pytest.mark.cluster


def long_run(name: str) -> config_mod.RunConfig:
    cfg = config_mod.load(PRESETS / name)
    return replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0, restarts=0))


def start_and_wait_for_steps(run: Run, tasks: set[str]) -> None:
    seen: set[str] = set()
    ready = threading.Event()

    def on_event(e: dict) -> None:
        if e["kind"] == "step":
            seen.add(e["task"])
            if e.get("worker") is not None:
                seen.add(f"worker:{e['worker']}")
            if tasks <= seen:
                ready.set()

    run.add_listener(on_event)
    run.start()
    assert wait_while_live(run, ready, 120), f"no steps from {tasks - seen} within 120 s: {run.state.summary()}"


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_model_parallel_client_lost_fails_the_run_naming_it(runs_root: Path, fault: str) -> None:
    run = Run(long_run("model-2clients.yaml"), runs_root=runs_root)
    start_and_wait_for_steps(run, {"worker:0", "worker:1"})
    pids = run.pids()
    victim = run.state.tasks["worker:1"].pid or 0
    os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "worker:1", run.state.reason
    assert ("frozen" in run.state.reason) == (fault == "freeze")
    assert wait_gone(pids, 3) == []


def test_async_frozen_worker_is_survived(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "async-1ps.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))
    run = Run(cfg, runs_root=runs_root)
    start_and_wait_for_steps(run, {"worker:0", "worker:1"})
    frozen_pid = run.state.tasks["worker:1"].pid or 0
    back = threading.Event()
    after: list[dict] = []

    def on_event(e: dict) -> None:
        if e["kind"] == "status" and e["task"] == "worker:1" and e.get("state") == "starting":
            back.set()
        if back.is_set() and e["kind"] == "step":
            after.append(e)

    run.add_listener(on_event)
    os.kill(frozen_pid, signal.SIGSTOP)
    assert back.wait(30), "the frozen worker was not replaced"
    assert wait_gone([frozen_pid], 3) == []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(e.get("worker") == 1 for e in after):
        time.sleep(0.2)
    assert any(e.get("worker") == 1 for e in after), "the restarted worker never ran a step"
    assert run.state.state == "running"
    pids = run.pids()
    run.stop()
    assert wait_gone(pids, 3) == []


def test_model_parallel_run_restarts_from_its_checkpoint(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "model-2clients.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=120, checkpoint_every=40, restarts=1))
    run = Run(cfg, runs_root=runs_root)
    seen: list[dict] = []
    killed = threading.Event()

    def on_event(e: dict) -> None:
        seen.append(e)
        if e["kind"] == "step" and e["step"] >= 50 and not killed.is_set():
            killed.set()
            os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGKILL)

    run.add_listener(on_event)
    run.start()
    assert run.wait(200) == "finished", run_story(run.run_dir)
    restart = next(i for i, e in enumerate(seen) if e["kind"] == "run" and e["state"] == "restarting")
    after = [e["step"] for e in seen[restart:] if e["kind"] == "step"]
    assert min(after) == 41 and max(after) == 120  # carried on from ckpt-40 on both clients
    restored = {e["task"] for e in seen[restart:] if e["kind"] == "info" and "restored" in e.get("message", "")}
    assert restored == {"worker:0", "worker:1"}
