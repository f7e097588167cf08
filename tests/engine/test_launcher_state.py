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
