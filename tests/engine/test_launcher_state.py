"""The launcher's own RunState: the latest figures of a run, no curves unless asked."""

from __future__ import annotations

from pathlib import Path

from engine.contract import config as config_mod
from engine.contract.events import make
from engine.control.launcher import Run
from engine.observe.telemetry import RunState
from tests.conftest import PRESETS


def feed(state: RunState) -> None:
    for step in range(1, 6):
        state.apply(make("step", "worker:0", replica=0, step=step, loss=1.0 / step, examples_per_sec=100.0,
                         step_time=0.01))
    state.apply(make("device", "worker:0", cpu_percent=50.0, rss_bytes=1 << 20))


def test_a_launcher_keeps_figures_but_no_curves_unless_asked(tmp_path: Path) -> None:
    config = config_mod.load(PRESETS / "data-2workers.yaml")
    plain, drawn = Run(config, runs_root=tmp_path), Run(config, runs_root=tmp_path, keep_history=True)
    for run in (plain, drawn):
        feed(run.state)
    assert plain.state.history.total_points() == 0 and plain.state.history.series == {}
    assert drawn.state.history.total_points() == 5 * 3 + 2
    for run in (plain, drawn):  # the figures a headless run prints are the same either way
        rep = run.state.replicas[0]
        assert (rep.step, rep.loss, rep.first_loss) == (5, 0.2, 1.0)
        assert run.state.tasks["worker:0"].cpu_percent == 50.0


def test_a_run_not_started_has_nothing_to_restart(tmp_path: Path) -> None:
    run = Run(config_mod.load(PRESETS / "data-2workers.yaml"), runs_root=tmp_path)
    assert run.restart("asked") is False and run.restarts_used == 0


def test_a_requested_restart_starts_every_task_again_without_using_the_fault_budget(tmp_path: Path) -> None:
    import threading

    from tests.engine.test_faults import fake_run, start_and_wait_for_steps

    run = fake_run(tmp_path, worker_0="forever", worker_1="forever")
    again = threading.Event()
    run.add_listener(lambda e: again.set() if e["kind"] == "step" and e.get("generation") == 1 else None)
    start_and_wait_for_steps(run, 30, ("worker:0", "worker:1"))
    try:
        before = {name: t.pid for name, t in run.state.tasks.items()}
        assert run.restart("asked by the test")
        assert again.wait(30), "no step of the restarted run"
        assert run.restarts_used == 0 and run.state.state == "running"  # training.restarts is 0: not used up
        assert all(run.state.tasks[name].pid != pid for name, pid in before.items())
    finally:
        run.stop()
    assert run.wait(10) == "stopped"


def test_no_class_of_engine_or_gui_grows_past_300_lines() -> None:
    """The design rule: no class over ~300 lines in engine/ or gui/ (the launcher, its driver, the supervisor, the
    lifecycle, the window, the plots, …)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    big = []
    for path in sorted([*(root / "engine").rglob("*.py"), *(root / "gui").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > 300:
                big.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert big == [], big
