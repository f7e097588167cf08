"""How long a run's remaining tasks get between SIGTERM and SIGKILL when it ends (Run.stop_grace)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from engine.contract import config as config_mod
from engine.control import lifecycle as lc
from engine.control.launcher import Run
from engine.control.supervisor import TASK_STOP_GRACE
from tests.conftest import PRESETS


def run_with(tmp_path: Path, states: dict[str, str]) -> Run:
    run = Run(config_mod.load(PRESETS / "async-1ps.yaml"), runs_root=tmp_path)
    for name, state in states.items():
        run.state.apply({"v": 1, "kind": "status", "task": name, "t": 1.0, "state": state})
    return run


def test_servers_left_by_a_finished_run_get_no_grace(tmp_path: Path) -> None:
    run = run_with(tmp_path, {"chief:0": "finished", "worker:0": "running", "ps:0": "running"})
    sup = SimpleNamespace(tasks=["chief:0", "worker:0", "ps:0"])
    assert run.stop_grace(sup, lc.TaskPhase.FINISHED) == 0.0  # type: ignore[arg-type]


def test_a_stopped_run_gives_every_task_its_grace_to_checkpoint(tmp_path: Path) -> None:
    run = run_with(tmp_path, {"chief:0": "running", "worker:0": "running", "ps:0": "running"})
    sup = SimpleNamespace(tasks=["chief:0", "worker:0", "ps:0"])
    assert run.stop_grace(sup, lc.TaskPhase.STOPPED) == TASK_STOP_GRACE  # type: ignore[arg-type]


def test_an_evaluator_still_running_keeps_its_grace_to_finish_the_final_evaluation(tmp_path: Path) -> None:
    run = run_with(tmp_path, {"chief:0": "finished", "ps:0": "running", "evaluator:0": "running"})
    assert run.stop_grace(SimpleNamespace(tasks=["ps:0", "evaluator:0"]),  # type: ignore[arg-type]
                           lc.TaskPhase.FINISHED) == TASK_STOP_GRACE
    # another host's supervisor, with servers only, still ends them at once
    assert run.stop_grace(SimpleNamespace(tasks=["worker:1"]), lc.TaskPhase.FINISHED) == 0.0  # type: ignore[arg-type]
