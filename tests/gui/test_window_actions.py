"""The window's actions, menus and toolbar as built from their tables, used as a user does."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu

from gui.window_actions import ACTIONS, MENUS, TOOLBAR
from tests.gui.conftest import PRESETS


def menu(window: Any, title: str) -> QMenu:
    found = [a.menu() for a in window.menuBar().actions() if a.text() == title]
    assert found, f"no {title} menu in {[a.text() for a in window.menuBar().actions()]}"
    return found[0]


def texts(m: QMenu) -> list[str]:
    return [a.text() for a in m.actions() if not a.isSeparator()]


def test_menus_and_toolbar_show_every_action(window: Any) -> None:
    assert [a.text() for a in window.menuBar().actions()] == [title for title, _ in MENUS]
    shown = {a for title, _ in MENUS for a in menu(window, title).actions()}
    shown |= set(window.toolbar.actions())
    for spec in ACTIONS:
        action = window.commands[spec.name]
        assert action in shown, f"{spec.name} is in no menu and not on the toolbar"
        assert action.toolTip() and action in window.actions(), spec.name  # its shortcut works anywhere
    file_menu = texts(menu(window, "&File"))
    assert file_menu[:4] == ["&New", "&Open…", "Open &Recent", "&Presets"]
    assert texts(menu(window, "&View"))[:4] == ["Settings", "Tasks", "Logs", "Messages"]
    theme = [a.menu() for a in menu(window, "&View").actions() if a.text() == "&Theme"][0]
    assert texts(theme) == ["Follow the System", "Light", "Dark"]
    on_bar = [a for a in window.toolbar.actions() if not a.isSeparator()]
    assert on_bar[:3] == [window.commands["new"], window.commands["open"], window.commands["save"]]
    assert len(on_bar) == len([e for e in TOOLBAR if e != "-"])


def test_edit_actions_follow_the_selection(qtbot: Any, window: Any) -> None:
    doc = window.controller.document
    assert doc.selection is None and not window.commands["delete"].isEnabled()
    hosts = len(doc.config.cluster.hosts)
    window.commands["add_host"].trigger()
    assert len(doc.config.cluster.hosts) == hosts + 1 and doc.selection == ("host", hosts)
    assert window.commands["delete"].isEnabled()
    roles = [a for a in menu(window, "&Edit").actions() if a.text() == "Add task"][0].menu()
    add_ps = [a for a in roles.actions() if a.text() == "Add ps"][0]
    assert isinstance(add_ps, QAction) and add_ps.toolTip() == "Add a ps task to the selected host"
    assert "Add an evaluator task to the selected host" in [a.toolTip() for a in roles.actions()]
    add_ps.trigger()
    assert [t.role for t in doc.config.cluster.hosts[hosts].tasks][-1] == "ps"
    window.commands["delete"].trigger()  # the new task is selected: it goes
    assert [t.role for t in doc.config.cluster.hosts[hosts].tasks] == []
    assert doc.selection is None and not window.commands["delete"].isEnabled()
    window.commands["undo"].trigger()
    assert [t.role for t in doc.config.cluster.hosts[hosts].tasks] == ["ps"]


def test_a_bundled_preset_saves_as_a_new_file(window: Any) -> None:
    assert window.commands["save"].text() == "&Save"
    assert window.open_path(PRESETS / "data-2workers.yaml")
    assert window.commands["save"].text() == "&Save As…" and "never overwritten" in window.commands["save"].toolTip()
    assert "read-only" in window.windowTitle()


def test_help_about(window: Any, dialogs: Any) -> None:
    window.commands["about"].trigger()
    assert dialogs.kinds() == ["about"]
