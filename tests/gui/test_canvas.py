"""Editing the cluster as a person would: toolbar, canvas clicks, properties, shortcuts, files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog, QToolButton

from engine.contract import config as config_mod


def click_action(qtbot: Any, window: Any, action: Any) -> None:
    button = window.toolbar.widgetForAction(action)
    assert isinstance(button, QToolButton) and button.isEnabled()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton, pos=QPoint(8, button.height() // 2))


def click_item(qtbot: Any, window: Any, item: Any) -> None:
    view = window.canvas.view
    pos = view.mapFromScene(item.sceneBoundingRect().center())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def names(config: config_mod.RunConfig) -> list[tuple[str, list[str]]]:
    return [(h.name, [t.name for t in h.tasks]) for h in config.cluster.hosts]


def test_add_host_and_workers_undo_redo_save_and_reopen(qtbot: Any, window: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    c = window.controller
    assert names(c.config) == [("local", ["worker:0", "worker:1"])]

    click_action(qtbot, window, window.commands["add_host"])
    assert len(window.canvas.hosts) == 2
    assert c.selection == ("host", 1)
    click_action(qtbot, window, window.commands["add_task"])
    click_action(qtbot, window, window.commands["add_task"])
    assert names(c.config) == [("local", ["worker:0", "worker:1"]), ("host1", ["worker:2", "worker:3"])]
    assert len(window.canvas.hosts[1].chips) == 2

    # rename the new host and give it GPUs through the properties panel
    click_item(qtbot, window, window.canvas.hosts[1])
    assert c.selection == ("host", 1)
    name = window.properties.host_name
    name.selectAll()
    qtbot.keyClicks(name, "gpu-box")
    qtbot.keyClick(name, Qt.Key.Key_Return)
    gpus = window.properties.host_gpus
    gpus.selectAll()
    qtbot.keyClicks(gpus, "2")
    qtbot.keyClick(gpus, Qt.Key.Key_Return)
    assert c.config.cluster.hosts[1].name == "gpu-box"
    assert c.config.cluster.hosts[1].gpus == 2
    assert c.problems == []
    assert window.commands["run"].isEnabled()

    # undo the GPUs and the second worker, then redo one step
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert c.config.cluster.hosts[1].gpus == 0
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert c.config.cluster.hosts[1].name == "host1"
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert names(c.config)[1] == ("host1", ["worker:2"])
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert names(c.config)[1] == ("host1", ["worker:2", "worker:3"])
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert c.config.cluster.hosts[1] == config_mod.Host("gpu-box", "localhost", 2, c.config.cluster.hosts[1].tasks)
    assert window.isWindowModified()
    expected = c.config

    # save as, start a new document, reopen the file
    target = tmp_path / "mine.yaml"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert target.exists()
    assert not window.isWindowModified()
    assert c.path == target
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert names(c.config) == [("local", ["worker:0", "worker:1"])]
    assert c.path is None
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier)
    assert c.config == expected
    assert names(c.config) == [("local", ["worker:0", "worker:1"]), ("gpu-box", ["worker:2", "worker:3"])]
    assert len(window.canvas.hosts) == 2 and len(window.canvas.hosts[1].chips) == 2
    assert window.recent_files()[0] == str(target.resolve())
    assert not c.undo_stack.canUndo()


def test_unsaved_edits_prompt_before_new(qtbot: Any, window: Any, dialogs: Any) -> None:
    from PySide6.QtWidgets import QMessageBox

    c = window.controller
    c.document.add_host()
    dialogs.answers.append(QMessageBox.StandardButton.Cancel)
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert len(c.config.cluster.hosts) == 2, "cancel keeps the edits"
    dialogs.answers.append(QMessageBox.StandardButton.Discard)
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert len(c.config.cluster.hosts) == 1
    assert dialogs.kinds() == ["question", "question"]


def test_context_menu_roles_delete_and_move(qtbot: Any, window: Any) -> None:
    c = window.controller
    canvas = window.canvas
    c.document.add_host()
    # a chip's menu changes its role
    menu = canvas.context_menu(canvas.chip(0, 1))
    role_menu = next(a.menu() for a in menu.actions() if a.text() == "Role")
    next(a for a in role_menu.actions() if a.text() == "chief").trigger()
    qtbot.waitUntil(lambda: c.config.cluster.hosts[0].tasks[1].role == "chief")
    assert names(c.config)[0] == ("local", ["worker:0", "chief:0"])
    # ...and moves it to the other host
    menu = canvas.context_menu(canvas.chip(0, 1))
    move_menu = next(a.menu() for a in menu.actions() if a.text() == "Move to host")
    move_menu.actions()[0].trigger()
    qtbot.waitUntil(lambda: len(c.config.cluster.hosts[1].tasks) == 1)
    assert names(c.config) == [("local", ["worker:0"]), ("host1", ["chief:0"])]
    # a host's menu adds GPUs and tasks
    menu = canvas.context_menu(canvas.hosts[1])
    next(a for a in menu.actions() if a.text() == "Add GPU").trigger()
    qtbot.waitUntil(lambda: c.config.cluster.hosts[1].gpus == 1)
    menu = canvas.context_menu(canvas.hosts[1])
    next(a for a in menu.actions() if a.text() == "Add ps task").trigger()
    qtbot.waitUntil(lambda: len(c.config.cluster.hosts[1].tasks) == 2)
    # Delete on the canvas removes the selected task
    click_item(qtbot, window, canvas.chip(1, 1))
    assert c.selection == ("task", 1, 1)
    qtbot.keyClick(canvas.view, Qt.Key.Key_Delete)
    assert names(c.config)[1] == ("host1", ["chief:0"])
    # the empty canvas's menu adds a host
    menu = canvas.context_menu(None)
    menu.actions()[0].trigger()
    qtbot.waitUntil(lambda: len(c.config.cluster.hosts) == 3)


def test_drag_a_chip_onto_another_host(qtbot: Any, window: Any) -> None:
    c = window.controller
    canvas = window.canvas
    c.document.add_host()
    view = canvas.view
    chip = canvas.chip(0, 1)
    start = view.mapFromScene(chip.sceneBoundingRect().center())
    end = view.mapFromScene(canvas.hosts[1].sceneBoundingRect().center())
    qtbot.mousePress(view.viewport(), Qt.MouseButton.LeftButton, pos=start)
    for k in range(1, 11):
        qtbot.mouseMove(view.viewport(), start + (end - start) * k / 10)
    qtbot.mouseRelease(view.viewport(), Qt.MouseButton.LeftButton, pos=end)
    qtbot.waitUntil(lambda: len(c.config.cluster.hosts[1].tasks) == 1)
    assert names(c.config) == [("local", ["worker:0"]), ("host1", ["worker:1"])]
    c.undo_stack.undo()
    assert names(c.config) == [("local", ["worker:0", "worker:1"]), ("host1", [])]
