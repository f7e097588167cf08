"""Restarts and stops of real multi-worker runs: every replica resumes from the run's checkpoint, and a
stopped task writes a final checkpoint and its last step events."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract.config import RunConfig, replace
from engine.contract.run_folder import RunFolder
from engine.control.launcher import Run
from tests.conftest import PRESETS, EventRecorder, run_story, wait_gone, wait_while_live

pytestmark = pytest.mark.cluster

#: the first step after the restart runs on the checkpoint's variables with another batch of the same
#: data: its loss is within this fraction of the loss of the same step before the kill, and the mean of
#: the first 10 steps after the restart within RESUME_MEAN_TOLERANCE of the same steps before it
RESUME_TOLERANCE = 0.35
RESUME_MEAN_TOLERANCE = 0.15


def small(cfg: RunConfig, steps: int, **training: Any) -> RunConfig:
    return replace(cfg, training=replace(cfg.training, steps=steps, epochs=None, **training))


Recorder = EventRecorder


def test_two_worker_restart_resumes_every_replica_from_the_checkpoint(runs_root: Path) -> None:
    # every step its own function, so that each step's loss can be compared before and after the restart
    cfg = small(config_mod.load(PRESETS / "data-2workers.yaml"), 260, checkpoint_every=100, restarts=1,
                metrics_hz=1e6, steps_per_execution=1)
    run = Run(cfg, runs_root=runs_root)
    rec = Recorder()
    killed: dict[str, Any] = {}

    reached: dict[int, int] = {}

    def kill_after_checkpoint(event: dict[str, Any]) -> None:
        # replicas run in lock-step: a step >= 110 means worker:0 has written ckpt-100 before step 101;
        # both replicas' steps up to 110 must have arrived (their events race each other to the launcher)
        if event["kind"] == "step":
            reached[event["replica"]] = max(reached.get(event["replica"], 0), event["step"])
        if not killed and len(reached) == 2 and min(reached.values()) >= 110:
            killed["at"] = len(rec.snapshot())
            pid = run.state.tasks["worker:1"].pid
            assert pid
            killed["pid"] = pid
            os.kill(pid, signal.SIGKILL)

    run.add_listener(rec)
    run.add_listener(kill_after_checkpoint)
    run.start()
    assert run.wait(240) == "finished", run_story(run.run_dir)
    assert killed and run.restarts_used == 1
    seen = rec.snapshot()
    restart = next(i for i, e in enumerate(seen) if e["kind"] == "run" and e["state"] == "restarting")
    before, after = seen[:restart], seen[restart:]

    resumed = [e for e in after if e["kind"] == "info" and "resumed from checkpoint" in e.get("message", "")]
    assert {e["task"] for e in resumed} == {"worker:0", "worker:1"}, "every worker must restore the checkpoint"
    (step,) = {e["step"] for e in resumed}  # the same checkpoint for both
    # ckpt-100, or the final checkpoint worker:0 writes when the restart stops it, where it finished a step
    # the killed worker took part in (its all-reduce needs both: a consistent state; a race of the kill)
    last_step = max(e["step"] for e in before if e["kind"] == "step")
    assert step == 100 or 110 <= step <= last_step + 1, (step, last_step)
    assert all(f"ckpt-{step} at step {step}" in e["message"] for e in resumed)

    for replica in (0, 1):
        old = {e["step"]: e["loss"] for e in before if e["kind"] == "step" and e["replica"] == replica}
        new = [e for e in after if e["kind"] == "step" and e["replica"] == replica]
        assert new[0]["step"] == step + 1, f"replica {replica} resumed at step {new[0]['step']}, not {step + 1}"
        assert new[-1]["step"] == 260
        last_before_kill = old[max(old)]
        first = new[0]["loss"]
        assert abs(first - last_before_kill) <= RESUME_TOLERANCE * last_before_kill, (replica, first, last_before_kill)
        # the steps after the checkpoint train as they did before the kill (same data, same weights)
        again = [s for s in range(step + 1, step + 11) if s in old]
        if step == 100:
            assert len(again) == 10
        if again:
            assert abs(first - old[step + 1]) <= RESUME_TOLERANCE * old[step + 1], (replica, first, old[step + 1])
            new_by_step = {e["step"]: e["loss"] for e in new}
            old_mean = mean(old[s] for s in again)
            new_mean = mean(new_by_step[s] for s in again)
            assert abs(new_mean - old_mean) <= RESUME_MEAN_TOLERANCE * old_mean, (replica, new_mean, old_mean)

    folder = RunFolder(run.run_dir)
    assert (folder.checkpoints / "ckpt-260.index").exists()
    # the other worker saved into its scratch folder, removed at the end; nothing of it elsewhere
    assert not folder.scratch("worker:1").exists()
    assert not wait_gone(run.pids() + [killed["pid"]], 3)


def test_stop_writes_a_final_checkpoint_and_the_last_steps(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-2workers.yaml"), 100_000, checkpoint_every=0, metrics_hz=2.0)
    run = Run(cfg, runs_root=runs_root)
    rec = Recorder()
    got_steps = threading.Event()
    run.add_listener(rec)
    run.add_listener(lambda e: got_steps.set() if e["kind"] == "step" and e["step"] >= 30 else None)
    run.start()
    assert wait_while_live(run, got_steps, 120), f"no step 30 within 120 s: {run.state.summary()}"
    pids = run.pids()
    t0 = time.monotonic()
    run.stop()
    assert wait_gone(pids, 4.0) == []
    assert time.monotonic() - t0 <= 4.0
    assert run.wait(5) == "stopped"
    seen = rec.snapshot()
    stopped = [e for e in seen if e["kind"] == "info" and "stopped_step" in e]
    assert {e["task"] for e in stopped} >= {"worker:0"}, [e.get("message") for e in seen if e["kind"] == "info"]
    note = next(e for e in stopped if e["task"] == "worker:0")
    step = note["stopped_step"]
    assert step >= 30 and f"final checkpoint ckpt-{step} written" in note["message"]
    assert (RunFolder(run.run_dir).checkpoints / f"ckpt-{step}.index").exists()
    # the last steps were reported, though at 2 reports per second the next report was not yet due
    last = max(e["step"] for e in seen if e["kind"] == "step" and e["task"] == "worker:0")
    assert last == step
