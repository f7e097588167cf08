"""The faults tests inject into tasks are read in one place, and bad values inject nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.runtime import fault_hooks


def test_each_hook_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not fault_hooks.should_fail("worker:1") and fault_hooks.start_delay() == 0.0
    monkeypatch.setenv(fault_hooks.FAIL, "worker:1")
    monkeypatch.setenv(fault_hooks.START_DELAY, "2.5")
    monkeypatch.setenv(fault_hooks.STEP_DELAY, "worker:1=0.03")
    monkeypatch.setenv(fault_hooks.LEAVE_DELAY, "1")
    assert fault_hooks.should_fail("worker:1") and not fault_hooks.should_fail("worker:0")
    assert not fault_hooks.should_fail("")
    assert fault_hooks.start_delay() == 2.5 and fault_hooks.leave_delay() == 1.0
    assert fault_hooks.step_delay("worker:1") == 0.03 and fault_hooks.step_delay("worker:0") == 0.0


@pytest.mark.parametrize("text", ["", "soon", "-3", "nan-ish"])
def test_a_bad_value_injects_nothing(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(fault_hooks.START_DELAY, text)
    monkeypatch.setenv(fault_hooks.STEP_DELAY, f"worker:0={text}")
    assert fault_hooks.start_delay() == 0.0 and fault_hooks.step_delay("worker:0") == 0.0


def test_no_other_module_reads_a_test_variable() -> None:
    from pathlib import Path

    root = Path(fault_hooks.__file__).parents[2]
    readers = [p.relative_to(root).as_posix() for folder in ("engine", "gui", "clusterdeck")
               for p in (root / folder).rglob("*.py")
               if "CLUSTERDECK_TEST_" in p.read_text(encoding="utf-8") and p.name != "fault_hooks.py"]
    assert readers in ([], ["engine/runtime/model_parallel.py"]), readers


def test_the_simulate_hook_reads_seconds_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fault_hooks.simulated_step() == 0.0
    monkeypatch.setenv(fault_hooks.SIMULATE, "0.05")
    assert fault_hooks.simulated_step() == 0.05
    monkeypatch.setenv(fault_hooks.SIMULATE, "-1")
    assert fault_hooks.simulated_step() == 0.0


def _simulated_run(tmp_path: Path, runs_root: Path, steps: int, warm: bool) -> Any:
    """A local run of two simulated tasks whose every import of TensorFlow fails (a ``tensorflow`` package that
    raises, first on their path): a task or template that imported it would fail the run."""
    from engine.contract import config as config_mod
    from engine.contract.warm_start import WARM_START_ENV
    from engine.control.launcher import Run
    from tests.conftest import PRESETS

    poison = tmp_path / "poison" / "tensorflow"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('a simulated task imported tensorflow')\n")
    config = config_mod.load(PRESETS / "data-2workers.yaml")
    config = config_mod.replace(config, training=config_mod.replace(config.training, steps=steps, epochs=None,
                                                                     checkpoint_every=0, restarts=0))
    env = {fault_hooks.SIMULATE: "0.01", "PYTHONPATH": str(poison.parent), WARM_START_ENV: "1" if warm else "0"}
    return Run(config, runs_root=runs_root, task_env=env, keep_history=True)


@pytest.mark.parametrize("warm", [True, False], ids=["warm-start", "cold"])
def test_a_simulated_run_steps_and_finishes_without_tensorflow(tmp_path: Path, runs_root: Path, warm: bool) -> None:
    from tests.conftest import EventRecorder, run_story

    run = _simulated_run(tmp_path, runs_root, 30, warm)
    rec = EventRecorder()
    run.add_listener(rec)
    run.start()
    try:
        assert run.wait(60) == "finished", run_story(run.run_dir)
    finally:
        run.stop()
    for task, replica in (("worker:0", 0), ("worker:1", 1)):
        states = [e["state"] for e in rec.of("status", task=task)]
        assert states[:2] == ["starting", "running"] and states[-1] == "finished", states
        steps = [e["step"] for e in rec.of("step", task=task)]
        assert steps == list(range(1, 31)), steps
        assert {e["replica"] for e in rec.of("step", task=task)} == {replica}
    forked = [e for e in rec.of("info") if "tasks start cold" in str(e.get("message", ""))]
    assert not forked, forked  # the template (where on) imported nothing that failed


def test_a_simulated_task_stops_as_a_training_task_does(tmp_path: Path, runs_root: Path) -> None:
    from tests.conftest import EventRecorder, run_story

    run = _simulated_run(tmp_path, runs_root, 1_000_000, True)
    rec = EventRecorder()
    run.add_listener(rec)
    run.start()
    try:
        deadline = time.monotonic() + 60
        while len({e["task"] for e in rec.of("step")}) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len({e["task"] for e in rec.of("step")}) == 2, run_story(run.run_dir)
    finally:
        run.stop()
    assert run.state.state == "stopped", run_story(run.run_dir)
    for task in ("worker:0", "worker:1"):
        last = rec.of("status", task=task)[-1]
        assert last["state"] == "stopped" and last.get("exit_code") == 143, last  # its own exit, not SIGKILL's
