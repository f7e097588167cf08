"""The one training loop, driven by a recording adapter: restore, cadence, final checkpoint, stop."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import replace
from engine.runtime.context import TaskContext
from engine.runtime.emitter import Emitter
from engine.runtime.loop import Groups, Restored, StopAgreement, TrainingLoop
from engine.runtime.stop import Stopped


class Recording:
    """An adapter that records what the loop asks of it."""

    global_batch = 32

    def __init__(self, restored: Restored | None = None, stop_at: int | None = None,
                 ctx: TaskContext | None = None, per_execution: int = 1, lockstep: bool = False,
                 held_ahead: int = 0) -> None:
        self.held_ahead = held_ahead  # steps the state holds beyond what the loop counted
        self.per_execution = per_execution
        self.lockstep = lockstep
        self.restored = restored
        self.stop_at = stop_at
        self.ctx = ctx
        self.calls: list[tuple[str, Any]] = []

    def restore(self) -> Restored | None:
        return self.restored

    def run_step(self, step: int, *, last: bool) -> None:
        self.calls.append(("step", step))
        if last:
            self.calls.append(("group", step))
        if self.stop_at == step and self.ctx is not None:
            self.ctx.stop.request()  # as the SIGTERM watcher does, while the step runs

    def report(self, step: int, *, force: bool) -> None:
        if force:
            self.calls.append(("forced", step))

    def settle(self) -> None:
        self.calls.append(("settle", None))

    def steps_held(self, counted: int) -> int:
        return counted + self.held_ahead

    def flush(self, step: int) -> None:
        self.calls.append(("flush", step))

    def save(self, step: int) -> str | None:
        self.calls.append(("save", step))
        return f"/run/checkpoints/ckpt-{step}"

    def final_losses(self) -> list[float]:
        return [0.5]

    def close(self) -> None:
        self.calls.append(("close", None))

    def of(self, kind: str) -> list[Any]:
        return [v for k, v in self.calls if k == kind]


def context(tmp_path: Path, steps: int, every: int) -> tuple[TaskContext, Path]:
    cfg = config_mod.default_config()
    cfg = replace(cfg, training=replace(cfg.training, steps=steps, checkpoint_every=every))
    path = tmp_path / "events.jsonl"
    ctx = TaskContext(config=cfg, task="worker:0", role="worker", index=0, run_dir=tmp_path,
                      emitter=Emitter("worker:0", path), devices=1, gpus_assigned=False)
    return ctx, path


def test_a_fresh_run_steps_reports_and_checkpoints_on_cadence(tmp_path: Path) -> None:
    ctx, path = context(tmp_path, steps=25, every=10)
    adapter = Recording()
    summary = TrainingLoop(ctx, adapter).run()
    assert adapter.of("step") == list(range(1, 26))
    assert adapter.of("group") == list(range(1, 26))  # one step per group
    assert adapter.of("forced") == [1, 25]
    assert adapter.of("save") == [10, 20, 25]  # the cadence, then the final checkpoint
    assert adapter.of("close") == [None]
    assert summary["steps"] == 25 and summary["start"] == 0 and summary["final_loss"] == [0.5]
    ctx.emitter.close()
    running = [e for e in events.read_file(path) if e["kind"] == "status"]
    assert running and running[0]["state"] == "running" and running[0]["step"] == 0


def test_a_restored_run_says_where_it_resumed_and_carries_on(tmp_path: Path) -> None:
    ctx, path = context(tmp_path, steps=30, every=10)
    adapter = Recording(Restored(20, "/run/checkpoints/ckpt-20"))
    TrainingLoop(ctx, adapter).run()
    assert adapter.of("step") == list(range(21, 31))
    assert adapter.of("forced")[0] == 21
    ctx.emitter.close()
    (note,) = [e for e in events.read_file(path) if e["kind"] == "info"]
    assert note["message"].startswith("resumed from checkpoint ckpt-20 at step 20")
    assert note["step"] == note["resumed_step"] == 20


def test_a_stop_reports_the_last_steps_and_writes_a_checkpoint_even_without_a_cadence(tmp_path: Path) -> None:
    ctx, path = context(tmp_path, steps=1000, every=0)
    adapter = Recording(stop_at=7, ctx=ctx)
    with pytest.raises(Stopped) as stopped:
        TrainingLoop(ctx, adapter).run()
    assert stopped.value.step == 7 and stopped.value.checkpoint == "/run/checkpoints/ckpt-7"
    assert adapter.of("step") == list(range(1, 8))
    assert adapter.of("flush") == [7] and adapter.of("save") == [7]
    ctx.emitter.close()
    notes = [e["message"] for e in events.read_file(path) if e["kind"] == "info"]
    assert "stopped at step 7: final checkpoint ckpt-7 written" in notes


def test_a_stop_names_its_checkpoint_by_the_steps_the_state_holds(tmp_path: Path) -> None:
    """A peer lost after a step's update: the loop saw the step fail, the optimizer counted it. The final
    checkpoint and the stop say the step the state is at, so that a resumed run numbers its steps right."""
    ctx, path = context(tmp_path, steps=1000, every=0)
    adapter = Recording(stop_at=7, ctx=ctx, held_ahead=1)
    with pytest.raises(Stopped) as stopped:
        TrainingLoop(ctx, adapter).run()
    assert stopped.value.step == 8 and stopped.value.checkpoint == "/run/checkpoints/ckpt-8"
    assert adapter.of("flush") == [8] and adapter.of("save") == [8]
    ctx.emitter.close()
    notes = [e["message"] for e in events.read_file(path) if e["kind"] == "info"]
    assert "stopped at step 8: final checkpoint ckpt-8 written" in notes


def test_lockstep_tasks_agree_on_the_step_to_stop_after(tmp_path: Path) -> None:
    path = tmp_path / "scratch" / "stop" / "step"
    first, second = StopAgreement(path), StopAgreement(path)
    assert first.stop_after(False, 10) is None and second.stop_after(False, 10) is None
    assert first.stop_after(True, 12) == 13  # asked first, after step 12: everyone runs step 13 too
    assert second.stop_after(False, 12) == 13  # not asked yet: it reads the proposal
    late = StopAgreement(path)
    assert late.stop_after(True, 13) == 13
    # a previous start's file is ignored and replaced
    old = time.time() - 3600
    os.utime(path, (old, old))
    fresh = StopAgreement(path)
    assert fresh.stop_after(False, 3) is None
    assert fresh.stop_after(True, 3) == 4
    assert StopAgreement(None).stop_after(True, 5) == 5  # alone: at once


def test_groups_end_every_size_steps_and_at_every_cut() -> None:
    groups = Groups(16, 100, cuts=(20,), every=30)
    ends = sorted({groups.end_of(step) for step in range(1, 101)})
    assert ends == [16, 20, 30, 46, 60, 76, 90, 100]
    resumed = Groups(16, 100, cuts=(36,), every=30)  # a run resumed at step 30: groups count from there
    assert sorted({resumed.end_of(step) for step in range(31, 101)}) == [36, 52, 60, 76, 90, 100]
    assert sorted({Groups(1, 5).end_of(step) for step in range(1, 6)}) == [1, 2, 3, 4, 5]


def test_the_loop_cuts_groups_at_warm_up_and_checkpoints(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, steps=100, every=30)  # warm-up: 20 steps
    adapter = Recording(per_execution=16)
    TrainingLoop(ctx, adapter).run()
    assert adapter.of("step") == list(range(1, 101))
    assert adapter.of("group") == [16, 20, 30, 46, 60, 76, 90, 100]
    assert adapter.of("save") == [30, 60, 90, 100]


def test_a_lockstep_stop_mid_group_is_agreed_at_the_group_end(tmp_path: Path) -> None:
    """Peers run a group as one function with collectives inside: a stop asked in the middle of a
    group must let every task run that group whole, so the step agreed is the group's end."""
    ctx, path = context(tmp_path, steps=1000, every=0)
    adapter = Recording(stop_at=5, ctx=ctx, per_execution=4, lockstep=True)  # asked in the group 5..8
    with pytest.raises(Stopped) as stopped:
        TrainingLoop(ctx, adapter).run()
    assert adapter.of("step") == list(range(1, 9)) and adapter.of("group") == [4, 8]
    assert stopped.value.step == 8 and adapter.of("save") == [8]
    # the step, the proposer and whether its SIGTERM was someone else's (0: ClusterDeck's stop)
    assert (tmp_path / "scratch" / "stop" / "step").read_text().split() == ["8", ctx.task, "0"]
    peer = StopAgreement(tmp_path / "scratch" / "stop" / "step")
    peer.since = 0  # the file is this run's
    assert peer.stop_after(False, 5, 8) == 8


def test_the_adapter_outlives_the_loop_until_the_task_exits(tmp_path: Path) -> None:
    """Dropping a strategy's iterators at the end blocked a worker for seconds on a peer that had
    left; the task now exits (``os._exit``) with its adapter still alive."""
    import gc
    import weakref

    ctx, _ = context(tmp_path, steps=3, every=0)
    adapter = Recording()
    alive = weakref.ref(adapter)
    TrainingLoop(ctx, adapter).run()
    del adapter
    gc.collect()
    assert alive() is not None
    ctx.kept.clear()
    gc.collect()
    assert alive() is None  # nothing else holds it: the context is what keeps it


def test_a_group_report_counts_every_step_of_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step time and throughput of a group of 8 steps: its time over 8 steps, not over one."""
    from engine.runtime import context as context_mod

    now = [100.0]
    monkeypatch.setattr(context_mod.time, "perf_counter", lambda: now[0])
    path = tmp_path / "events.jsonl"
    emitter = Emitter("worker:0", path)
    reporter = context_mod.StepReporter(emitter, [0], per_replica_batch=64, hz=1e6)
    now[0] = 100.8
    reporter.step_done(8, lambda: [(1.5, 0.02)], steps=8)
    now[0] = 101.0
    reporter.step_done(12, lambda: [(1.25, 0.01)], steps=4)
    emitter.close()
    first, second = [e for e in events.read_file(path) if e["kind"] == "step"]
    assert first["step"] == 8 and first["loss"] == 1.5 and first["sync_wait"] == 0.02
    assert first["step_time"] == pytest.approx(0.1) and first["examples_per_sec"] == pytest.approx(640)
    assert second["step"] == 12 and second["step_time"] == pytest.approx(0.05)
