"""Habits: layout remembered, standard shortcuts, tooltips, palettes, closing with a run stops it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractButton, QApplication, QComboBox, QLineEdit, QSlider, QSpinBox

from gui import theme
from gui.controller import Controller
from gui.main_window import MainWindow, app_settings


def test_window_layout_is_remembered(qtbot: Any, runs_root: Path, qt_settings: Path) -> None:
    first = MainWindow(Controller(runs_root=runs_root))
    first.show()
    qtbot.waitExposed(first)
    first.logs_dock.hide()
    first.splitter.setSizes([300, 450])
    sizes = first.splitter.sizes()
    first.close()
    assert (qt_settings / "clusterdeck" / "clusterdeck.ini").exists()
    assert not app_settings().value("window/geometry").isEmpty()
    second = MainWindow(Controller(runs_root=runs_root))
    second.show()
    qtbot.waitExposed(second)
    try:
        # (the offscreen screen is smaller than the window, so its size is clamped there: not compared)
        assert second.logs_dock.isHidden() and not second.tasks_dock.isHidden()
        restored = second.splitter.sizes()  # scaled with the clamped window: compare proportions
        assert abs(restored[0] / sum(restored) - sizes[0] / sum(sizes)) < 0.02
    finally:
        second.close()


def test_a_remembered_geometry_qt_cannot_restore_gives_the_first_starts_size(qtbot: Any, runs_root: Path,
                                                                             qt_settings: Path) -> None:
    """A geometry saved on another screen may be refused by Qt (restoreGeometry is False): the window then takes the
    size a first start gives on this screen, not Qt's default of a few hundred pixels."""
    from PySide6.QtCore import QByteArray

    from gui.window_layout import first_size

    app_settings().setValue("window/geometry", QByteArray(b"not a geometry Qt can read"))
    window = MainWindow(Controller(runs_root=runs_root))
    window.show()
    qtbot.waitExposed(window)
    try:
        wanted = first_size(window.screen().availableGeometry().size())
        # (this offscreen screen is narrower than the window's least width: the height is the one to compare)
        assert window.height() == wanted.height() and window.width() >= wanted.width(), (window.size(), wanted)
    finally:
        window.close()


def test_standard_shortcuts_and_tooltips(window: Any) -> None:
    assert window.commands["new"].shortcut() == QKeySequence(QKeySequence.StandardKey.New)
    assert window.commands["open"].shortcut() == QKeySequence(QKeySequence.StandardKey.Open)
    assert window.commands["save"].shortcut() == QKeySequence(QKeySequence.StandardKey.Save)
    assert window.commands["save_as"].shortcut() == QKeySequence(QKeySequence.StandardKey.SaveAs)
    assert not window.commands["quit"].shortcut().isEmpty()
    assert window.commands["undo"].shortcut() == QKeySequence(QKeySequence.StandardKey.Undo)
    assert QKeySequence("Ctrl+Shift+Z") in window.commands["redo"].shortcuts()
    assert window.commands["run"].shortcut() == QKeySequence("F5")
    assert window.commands["stop"].shortcut() == QKeySequence("Shift+F5")
    controls = [w for kind in (QAbstractButton, QLineEdit, QSpinBox, QComboBox, QSlider)
                for w in window.findChildren(kind)
                if w.isVisibleTo(window) and w.objectName() != "qt_toolbar_ext_button"
                and not w.objectName().startswith("qt_")]
    assert len(controls) > 30
    missing = [f"{type(w).__name__}:{w.objectName() or getattr(w, 'text', lambda: '')()}" for w in controls
               if not w.toolTip() and not (w.parent() is not None and hasattr(w.parent(), "toolTip")
                                           and isinstance(w.parent(), (QSpinBox, QComboBox)))]
    assert not missing, f"controls without a tooltip: {missing}"


def test_dark_and_light_palettes(qtbot: Any, window: Any) -> None:
    window.set_theme("dark")
    assert theme.is_dark(QApplication.palette())
    qtbot.waitUntil(lambda: theme.is_dark(window.plots.loss.palette()))
    window.set_theme("light")
    assert not theme.is_dark(QApplication.palette())
    window.set_theme("system")
    assert str(app_settings().value("theme")) == "system"
    assert theme.is_dark(QApplication.palette()) == theme.system_prefers_dark()


def test_quit_shortcut_closes_the_window(qtbot: Any, window: Any) -> None:
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert window.isHidden()
