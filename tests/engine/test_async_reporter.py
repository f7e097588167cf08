"""The async chief's per-worker figures from a sample of the steps (engine.runtime.async_ps.WorkerReporter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.runtime import async_ps
from engine.runtime.context import TaskContext
from engine.runtime.emitter import Emitter


def reporter(tmp_path: Path, hz: float = 0.0) -> tuple[Any, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    emitter = Emitter("chief:0", tmp_path / "events.jsonl")
    emitter.emit = lambda kind, **fields: seen.append({"kind": kind, **fields})  # type: ignore[method-assign]
    ctx = TaskContext(config=config_mod.default_config(), task="chief:0", role="chief", index=0,
                      run_dir=tmp_path, emitter=emitter, devices=1, gpus_assigned=False)
    return async_ps.WorkerReporter(ctx, per_worker_batch=64, total=100, hz=hz), seen


def steps_of(seen: list[dict[str, Any]], worker: int) -> list[dict[str, Any]]:
    return [e for e in seen if e["kind"] == "step" and e["worker"] == worker]


def test_sampled_steps_give_exact_step_time_and_count_every_step_once(tmp_path: Path) -> None:
    rep, seen = reporter(tmp_path)
    # worker 0 read batches 0..9 at 0.1 s each; the chief copied the figures of batches 2, 5 and 9
    rep.step_done(3, 2.0, 0, 10.2, 2)
    rep.maybe_report(3, 3)
    rep.step_done(9, 1.0, 0, 10.5, 5)
    rep.step_done(19, 0.5, 0, 10.9, 9)
    rep.maybe_report(19, 19)
    first, second = steps_of(seen, 0)
    assert first["steps"] == 3 and first["step_time"] is None  # nothing before it to time against
    assert second["steps"] == 7 and second["sampled"] == 2
    assert second["step_time"] == pytest.approx(0.7 / 7)
    assert second["examples_per_sec"] == pytest.approx(64 / 0.1)
    assert second["loss"] == pytest.approx(0.75) and second["step"] == 19
    assert first["steps"] + second["steps"] == 10  # batches 0..9: every step of the worker counted once


def test_a_restarted_worker_counts_from_its_first_batch_again(tmp_path: Path) -> None:
    rep, seen = reporter(tmp_path)
    rep.step_done(10, 1.0, 1, 5.0, 7)
    rep.maybe_report(10, 10)
    rep.step_done(30, 0.9, 1, 20.0, 2)  # a fresh process: its dataset counts from 0 again
    rep.step_done(32, 0.8, 1, 20.2, 4)
    rep.maybe_report(32, 32)
    after = steps_of(seen, 1)[-1]
    assert after["steps"] == 3 + 2
    assert after["step_time"] == pytest.approx(0.1)  # timed only within the new process
    assert rep.final_losses() == [0.8]


def test_figures_are_kept_per_worker(tmp_path: Path) -> None:
    rep, seen = reporter(tmp_path)
    for i, (worker, ts) in enumerate([(0, 1.0), (1, 1.0), (0, 1.2), (1, 1.5)]):
        rep.step_done(i + 1, 1.0 + worker, worker, ts, i // 2)
    rep.maybe_report(4, 4, force=True)
    w0, w1 = steps_of(seen, 0)[0], steps_of(seen, 1)[0]
    assert w0["step_time"] == pytest.approx(0.2) and w1["step_time"] == pytest.approx(0.5)
    assert w0["loss"] == 1.0 and w1["loss"] == 2.0
    assert [e for e in seen if e["kind"] == "progress"][-1]["completed"] == 4


def test_a_workers_step_is_broken_down_into_input_own_work_and_waiting_for_the_chief(tmp_path: Path) -> None:
    rep, seen = reporter(tmp_path)
    rep.step_done(5, 1.0, 0, 10.0, 4, busy_s=0.04, input_s=0.03)
    rep.step_done(10, 1.0, 0, 11.0, 9, busy_s=0.06, input_s=0.01)  # 5 steps in 1 s: 0.2 s a step
    rep.maybe_report(10, 10)
    last = steps_of(seen, 0)[-1]
    assert last["own_time"] == pytest.approx(0.05) and last["input_wait"] == pytest.approx(0.02)
    assert last["dispatch_wait"] == pytest.approx(0.2 - 0.05)
