"""The cluster canvas from the keyboard, on the real window: arrows select hosts and tasks, Ctrl+arrows
move a task to the next or previous host, Delete removes, the focus shows, and Tab goes from the
cluster to the settings, then the tasks, then the plots."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task
from gui import canvas_keys


def two_hosts() -> config_mod.RunConfig:
    base = config_mod.default_config()
    hosts = (Host(name="a", tasks=(Task("worker", 0), Task("worker", 1))), Host(name="b", tasks=(Task("worker", 2),)))
    return config_mod.replace(base, cluster=Cluster(hosts=hosts))


def test_the_order_of_items_and_where_a_move_goes() -> None:
    assert canvas_keys.item_order([2, 0]) == [("host", 0), ("task", 0, 0), ("task", 0, 1), ("host", 1)]
    assert canvas_keys.step_selection([1], None, 1) == ("host", 0)
    assert canvas_keys.step_selection([1], None, -1) == ("task", 0, 0)
    assert canvas_keys.step_selection([1], ("task", 0, 0), 1) == ("host", 0)  # wraps round
    assert canvas_keys.step_selection([], None, 1) is None
    assert canvas_keys.move_target(2, ("task", 0, 1), 1) == 1
    assert canvas_keys.move_target(2, ("task", 1, 0), 1) is None
    assert canvas_keys.move_target(2, ("host", 0), 1) is None


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_select_move_and_delete_tasks_from_the_keyboard(qtbot: Any, window: Any, size: tuple[int, int],
                                                        tmp_path: Any) -> None:
    window.resize(*size)
    doc = window.controller.document
    window.controller.new_document(two_hosts())
    view = window.canvas.view
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    qtbot.keyClick(view, Qt.Key.Key_Right)
    assert doc.selection == ("host", 0)
    qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Down)
    assert doc.selection == ("task", 0, 1)
    assert window.canvas.chip(0, 1).isSelected()
    window.grab().save(str(tmp_path / f"canvas-focus-{size[0]}.png"))
    # the focus shows: the view draws a frame and a ring in the highlight colour
    shot = view.viewport().grab().toImage()
    highlight = view.palette().highlight().color().rgb()
    assert shot.pixelColor(1, shot.height() // 2).rgb() == highlight or \
        shot.pixelColor(2, shot.height() // 2).rgb() == highlight
    qtbot.keyClick(view, Qt.Key.Key_Right, Qt.KeyboardModifier.ControlModifier)  # worker:1 to host b
    qtbot.waitUntil(lambda: len(doc.config.cluster.hosts[1].tasks) == 2)
    assert [t.name for t in doc.config.cluster.hosts[1].tasks] == ["worker:2", "worker:1"]
    assert doc.selection == ("task", 1, 1)
    qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.ControlModifier)  # and back
    qtbot.waitUntil(lambda: len(doc.config.cluster.hosts[0].tasks) == 2)
    assert doc.selection == ("task", 0, 1)
    qtbot.keyClick(view, Qt.Key.Key_Delete)
    qtbot.waitUntil(lambda: len(doc.config.cluster.hosts[0].tasks) == 1)
    assert view.hasFocus()
    qtbot.keyClick(view, Qt.Key.Key_Left)
    qtbot.keyClick(view, Qt.Key.Key_Left)
    assert doc.selection == ("host", 1) or doc.selection is not None


def test_tab_goes_from_the_cluster_to_the_settings_then_tasks_then_plots(qtbot: Any, window: Any) -> None:
    window.resize(1366, 768)
    view = window.canvas.view
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    visited: list[str] = []
    for _ in range(400):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        w = QApplication.focusWidget()
        if w is view:
            break
        for name, root in (("settings", window.settings_dock), ("tasks", window.tasks_dock),
                           ("plots", window.plots), ("canvas", window.canvas)):
            if root.isAncestorOf(w):
                if not visited or visited[-1] != name:
                    visited.append(name)
                break
        else:
            if not visited or visited[-1] != "other":
                visited.append("other")
    assert QApplication.focusWidget() is view, "Tab never came back to the cluster"
    assert visited[0] == "settings"
    assert visited.index("settings") < visited.index("tasks") < visited.index("plots")
    assert visited.count("settings") == 1 and visited.count("plots") == 1  # each region visited once, in one go
