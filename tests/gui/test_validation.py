"""Live validation: an invalid config disables Run and says why; bad files give a message, not a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from tests.gui.conftest import PRESETS


def test_invalid_cluster_disables_run_and_shows_why(qtbot: Any, window: Any) -> None:
    c = window.controller
    assert window.commands["run"].isEnabled()
    # 3 GPUs cannot be split over the host's 2 workers
    c.document.select(("host", 0))
    gpus = window.properties.host_gpus
    gpus.selectAll()
    qtbot.keyClicks(gpus, "3")
    qtbot.keyClick(gpus, Qt.Key.Key_Return)
    assert c.config.cluster.hosts[0].gpus == 3
    assert not window.commands["run"].isEnabled()
    assert "cannot be split evenly" in window.commands["run"].toolTip()
    button = window.toolbar.widgetForAction(window.commands["run"])
    assert not button.isEnabled() and "cluster.hosts[0].gpus" in button.toolTip()
    # visible: the problems list, the summary, the host box on the canvas and the selection panel
    assert window.problems.list.count() == 1
    assert "cluster.hosts[0].gpus" in window.problems.list.item(0).text()
    assert "1 problem" in window.problems.summary.text()
    assert window.canvas.hosts[0].problems and "cannot be split" in window.canvas.hosts[0].toolTip()
    assert window.properties.problems.isVisibleTo(window) and "split" in window.properties.problems.text()
    assert "problem" in window.run_status.detail.text()
    # F5 does nothing while invalid
    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert c.run is None
    # fixing it enables Run again
    gpus.selectAll()
    qtbot.keyClicks(gpus, "2")
    qtbot.keyClick(gpus, Qt.Key.Key_Return)
    assert window.commands["run"].isEnabled()
    assert not window.canvas.hosts[0].problems
    assert window.problems.list.count() == 0


def test_task_problems_mark_the_chip_and_settings_mark_their_field(qtbot: Any, window: Any) -> None:
    c = window.controller
    c.document.select(("task", 0, 1))
    port = window.properties.task_port
    port.selectAll()
    qtbot.keyClicks(port, "2222")
    qtbot.keyClick(port, Qt.Key.Key_Return)
    c.document.select(("task", 0, 0))
    port.selectAll()
    qtbot.keyClicks(port, "2222")
    qtbot.keyClick(port, Qt.Key.Key_Return)
    assert c.config.cluster.hosts[0].tasks[0].port == 2222
    chip = window.canvas.chip(0, 1)
    assert chip.problems and "already used" in chip.toolTip()
    assert not window.commands["run"].isEnabled()
    port.selectAll()
    qtbot.keyClicks(port, "0")  # 0 reads as 'auto'
    qtbot.keyClick(port, Qt.Key.Key_Return)
    assert c.config.cluster.hosts[0].tasks[0].port is None
    assert window.commands["run"].isEnabled()
    # a training field: 3 workers cannot share a global batch of 128
    c.document.add_task(0, "worker")
    batch = window.settings_panel.widgets["training.global_batch_size"]
    assert "divisible" in batch.toolTip() and batch.styleSheet()
    assert not window.commands["run"].isEnabled()
    batch.selectAll()
    qtbot.keyClicks(batch, "129")
    qtbot.keyClick(batch, Qt.Key.Key_Return)
    assert c.config.training.global_batch_size == 129
    assert window.commands["run"].isEnabled() and not batch.styleSheet()
    # the cluster as a whole: a banner over the canvas
    c.document.remove_host(0)
    assert window.canvas.banner.isVisibleTo(window)
    assert "at least one host" in window.commands["run"].toolTip()


def test_malformed_preset_gives_a_message_box(qtbot: Any, window: Any, tmp_path: Path, dialogs: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    before = window.controller.config
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("cluster: [unclosed\n", encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(bad_yaml), "")))
    qtbot.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier)
    assert dialogs.calls and dialogs.calls[-1][0] == "critical"
    assert "not valid YAML" in dialogs.calls[-1][2] and "bad.yaml" in dialogs.calls[-1][2]
    assert "Traceback" not in dialogs.calls[-1][2]
    assert window.controller.config == before
    # a field with a wrong value: the message names the field
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text((PRESETS / "data-2workers.yaml").read_text().replace("gpus: 0", "gpus: -2"), encoding="utf-8")
    assert not window.open_path(wrong)
    assert "cluster.hosts[0].gpus" in dialogs.calls[-1][2]
    assert window.controller.path is None


def test_switching_parallelism_offers_to_fix_the_cluster(qtbot: Any, window: Any, dialogs: Any) -> None:
    c = window.controller
    panel = window.settings_panel
    dialogs.answers.append(QMessageBox.StandardButton.Yes)
    panel.mode.setCurrentText("async")
    panel.mode.activated.emit(panel.mode.currentIndex())
    assert dialogs.kinds() == ["question"] and "ps" in dialogs.calls[0][2]
    roles = [t.role for _, t in c.config.cluster.tasks()]
    assert roles.count("chief") == 1 and roles.count("ps") == 1
    assert c.problems == [] and window.commands["run"].isEnabled()
    assert panel.partitioner.isVisibleTo(panel) and not panel.mesh_batch.isVisibleTo(panel)
    # back to data, refusing the fix: Run is disabled and the reason is the ps task
    dialogs.answers.append(QMessageBox.StandardButton.No)
    panel.mode.setCurrentText("data")
    panel.mode.activated.emit(panel.mode.currentIndex())
    assert c.config.parallelism.mode == "data"
    assert any("ps" in p.message for p in c.problems)
    assert not window.commands["run"].isEnabled()
    # one undo brings async back with its valid cluster
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert c.config.parallelism.mode == "async" and c.problems == []
    assert panel.mode.currentText() == "async"


def test_settings_edits_are_undoable_and_merge_per_field(qtbot: Any, window: Any) -> None:
    c = window.controller
    steps = window.settings_panel.steps
    steps.selectAll()
    qtbot.keyClicks(steps, "500")
    qtbot.keyClick(steps, Qt.Key.Key_Return)
    qtbot.keyClick(steps, Qt.Key.Key_Up)
    assert c.config.training.steps == 501
    lr = window.settings_panel.learning_rate
    lr.selectAll()
    qtbot.keyClicks(lr, "0.1")
    qtbot.keyClick(lr, Qt.Key.Key_Return)
    assert c.config.training.learning_rate == pytest.approx(0.1)
    hidden = window.settings_panel.hidden
    hidden.selectAll()
    qtbot.keyClicks(hidden, "128, 64")
    qtbot.keyClick(hidden, Qt.Key.Key_Return)
    assert c.config.model.hidden == (128, 64)
    assert c.undo_stack.count() == 3  # steps typed and stepped merge into one edit
    c.undo_stack.undo()
    c.undo_stack.undo()
    assert c.config.training.learning_rate == pytest.approx(0.05)
    assert lr.value() == pytest.approx(0.05)
    c.undo_stack.undo()
    assert c.config.training.steps == 200 and steps.value() == 200
