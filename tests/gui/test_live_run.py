"""A real local 2-worker run launched, watched and stopped from the window."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt

from tests.conftest import alive, wait_gone
from tests.gui.conftest import PRESETS


@pytest.mark.cluster
def test_launch_watch_and_stop_a_two_worker_run(qtbot: Any, window: Any, runs_root: Any) -> None:
    c = window.controller
    assert window.open_path(PRESETS / "data-2workers.yaml")
    steps = window.settings_panel.steps
    steps.selectAll()
    qtbot.keyClicks(steps, "3000")
    qtbot.keyClick(steps, Qt.Key.Key_Return)
    assert c.config.training.steps == 3000
    assert window.commands["run"].isEnabled() and not window.commands["stop"].isEnabled()

    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert c.run is not None, "F5 starts the run"
    assert c.run_dir is not None and c.run_dir.parent == runs_root
    assert not window.commands["run"].isEnabled() and window.commands["stop"].isEnabled()
    assert window.run_status.badge.text() in ("Starting…", "Running")

    loss = window.plots.loss
    qtbot.waitUntil(lambda: loss.points("replica/0/loss") >= 5 and loss.points("replica/1/loss") >= 5,
                    timeout=60_000)
    assert window.run_status.badge.text() == "Running"
    assert "step" in window.run_status.detail.text() and "of 3000" in window.run_status.detail.text()
    assert c.state.step > 0
    model = window.task_table.model
    assert {model.text(t, "State") for t in model.rows} == {"running"}
    assert all(t.pid for t in model.rows)
    chip = window.canvas.chip(0, 0)
    assert chip.run_state is not None and chip.run_state.state == "running"
    qtbot.waitUntil(lambda: "Created" in window.logs.text.toPlainText() or
                    "starting worker:0" in window.logs.text.toPlainText(), timeout=10_000)

    pids = c.run.pids()
    assert len(pids) >= 3  # the host's supervisor and two tasks
    assert alive(pids)
    stop = window.toolbar.widgetForAction(window.commands["stop"])
    qtbot.mouseClick(stop, Qt.MouseButton.LeftButton, pos=QPoint(8, stop.height() // 2))
    assert window.run_status.badge.text() == "Stopping…"
    qtbot.waitUntil(lambda: c.run is None, timeout=30_000)
    assert c.state.state == "stopped"
    assert window.run_status.badge.text() == "Stopped"
    assert window.commands["run"].isEnabled() and not window.commands["stop"].isEnabled()
    assert wait_gone(pids, 10.0) == [], "every process of the run has ended"
    assert (c.run_dir / "events.jsonl").stat().st_size > 0
