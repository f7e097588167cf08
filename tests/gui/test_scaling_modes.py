"""The Scaling Report measures the preset's own mode: an async preset runs async runs (its chief and
servers kept, 1, 2, 4 workers), a model-parallel one is refused with the reason; the figure's legends
never cover a point."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QPointF, Qt

import gui.scaling_dialog as scaling_dialog
from engine.control.scaling import ScalingPoint, ScalingReport, ScalingSession
from tests.engine.test_scaling import FakeRun
from tests.gui.conftest import PRESETS
from tests.gui.test_scaling import menu_action


def test_an_async_preset_is_measured_with_async_runs(qtbot: Any, window: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ScalingSession] = []

    def session(*args: Any, **kwargs: Any) -> ScalingSession:
        made.append(ScalingSession(*args, run_factory=FakeRun, **kwargs))
        return made[-1]

    monkeypatch.setattr(scaling_dialog, "ScalingSession", session)
    window.open_path(PRESETS / "async-1ps.yaml", ask=False)
    menu_action(window, "Run", "Scaling Report…").trigger()
    dialog = window.scaling_dialog
    qtbot.waitExposed(dialog)
    assert "asynchronous run" in dialog.status.text()
    FakeRun.made = []
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.report is not None, timeout=10_000)
    runs = [r.config for r in FakeRun.made]
    assert [len(c.cluster.tasks_of("worker")) for c in runs] == [1, 2, 4]
    assert all(c.parallelism.mode == "async" and c.cluster.tasks_of("chief") and c.cluster.tasks_of("ps")
               for c in runs)
    assert dialog.report.mode == "async" and "asynchronous" in dialog.plot.subtitle.text


def test_a_model_parallel_preset_is_refused_with_the_reason(qtbot: Any, window: Any, dialogs: Any) -> None:
    window.open_path(PRESETS / "model-2x2.yaml", ask=False)
    menu_action(window, "Run", "Scaling Report…").trigger()
    dialog = window.scaling_dialog
    qtbot.waitExposed(dialog)
    assert "cannot be scaled by workers" in dialog.status.text()
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialogs.calls[-1][0] == "warning" and "mesh" in dialogs.calls[-1][2]
    assert dialog.session is None


def test_the_legends_cover_no_point(qtbot: Any, window: Any) -> None:
    dialog = window.open_scaling_dialog()
    qtbot.waitExposed(dialog)
    points = (ScalingPoint(1, 1, 64, 100, 20000.0, "window", "finished"),
              ScalingPoint(2, 2, 128, 100, 26000.0, "window", "finished"),
              ScalingPoint(4, 4, 256, 100, 28000.0, "window", "finished"))
    report = ScalingReport(preset="async-1ps", scaling="weak", cpu_count=2, points=points, mode="async")
    dialog.plot.set_report(report)
    qtbot.wait(50)
    plot = dialog.plot
    for item, legend, values in ((plot.throughput, plot.throughput_legend, [p.examples_per_sec for p in points]),
                                 (plot.efficiency, plot.efficiency_legend,
                                  [100 * (report.efficiency(p) or 0) for p in points])):
        assert len(legend.items) >= 2
        box = legend.sceneBoundingRect()
        for p, y in zip(points, values, strict=True):
            where = item.getViewBox().mapViewToScene(QPointF(float(p.workers), float(y or 0)))
            assert not box.contains(where), f"the legend covers the {p.workers}-worker point"
