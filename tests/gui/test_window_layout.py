"""Design and watch layouts: each keeps the splitter sizes the user gave it, also across sessions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow, QWidget

from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from gui.preferences import app_settings
from gui.window_layout import LAYOUT_SHARES, WindowLayout, screen_fit_size


def share(window: Any) -> float:
    sizes = window.splitter.sizes()
    return sizes[0] / sum(sizes)


def drag_splitter(window: Any, fraction: float) -> None:
    """As the user drags the handle (moveSplitter emits splitterMoved, as a drag does)."""
    splitter = window.splitter
    splitter.moveSplitter(int(sum(splitter.sizes()) * fraction), 1)


def test_each_layout_keeps_the_users_sizes(qtbot: Any, window: Any, tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "past-run")
    run.path.mkdir()
    run.write_config(config_mod.default_config())
    run.write_meta(state="finished")
    assert window.layout_mode == "design"
    assert share(window) == pytest.approx(LAYOUT_SHARES["design"], abs=0.02)
    drag_splitter(window, 0.46)
    design = share(window)
    assert design == pytest.approx(0.46, abs=0.03)

    assert window.open_run_folder(run.path)  # watching a run: the plots get the room
    assert window.layout_mode == "watch" and window.canvas.compact
    assert share(window) == pytest.approx(LAYOUT_SHARES["watch"], abs=0.02)
    drag_splitter(window, 0.5)
    watch = share(window)
    assert watch == pytest.approx(0.5, abs=0.03)

    window.commands["add_host"].trigger()  # editing the cluster is designing again
    assert window.layout_mode == "design" and not window.canvas.compact
    assert share(window) == pytest.approx(design, abs=0.02)
    window.controller.undo_stack.undo()
    assert window.open_run_folder(run.path)
    assert share(window) == pytest.approx(watch, abs=0.02)

    window.save_settings()
    saved = app_settings().value("window/splitter/watch")
    assert [int(v) for v in saved] == window.window_layout.sizes("watch")


def _dock(main: QMainWindow) -> QDockWidget:
    dock = QDockWidget("dock", main)
    dock.setObjectName(f"dock{len(main.findChildren(QDockWidget))}")
    main.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
    return dock


def test_sizes_come_back_in_a_new_session(qtbot: Any) -> None:
    def layout() -> tuple[QMainWindow, WindowLayout]:
        main = QMainWindow()
        qtbot.addWidget(main)
        part = WindowLayout(main, QWidget(), QWidget())
        part.restore(app_settings(), *[_dock(main) for _ in range(2)])
        main.show()
        qtbot.waitExposed(main)
        part.shown()
        return main, part

    _, first = layout()
    first.set_mode("watch")
    first.splitter.moveSplitter(int(sum(first.splitter.sizes()) * 0.5), 1)
    kept = first.sizes("watch")
    assert kept is not None and first.sizes("design") is not None  # leaving design kept its sizes
    first.save(app_settings())
    _, second = layout()
    assert second.mode == "design" and second.sizes("watch") == kept
    second.set_mode("watch")
    sizes = second.splitter.sizes()
    assert sizes[0] / sum(sizes) == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError, match="mode: expected one of"):
        second.set_mode("sideways")


def test_window_fits_the_screen() -> None:
    assert screen_fit_size(QSize(1500, 940), QSize(1366, 768)) == QSize(int(1366 * 0.96), int(768 * 0.94))
    assert screen_fit_size(QSize(800, 600), QSize(1920, 1080)) == QSize(800, 600)
