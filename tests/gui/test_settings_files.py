"""Choosing the user's own data file in the settings, as a person would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog


def test_pick_an_npz_file_and_its_keys_then_undo(window: Any, qtbot: Any, tmp_path: Path,
                                                 monkeypatch: Any) -> None:
    data = tmp_path / "mine.npz"
    np.savez(data, inputs=np.zeros((256, 784), np.float32), labels=np.zeros(256, np.int64))
    panel = window.settings_panel
    source = panel.widgets["data.source"]
    assert not panel._rows["data.path"].isVisible() or window.controller.config.data.source == "synthetic"
    source.setCurrentText("npz")
    source.activated.emit(source.currentIndex())
    assert window.controller.config.data.source == "npz"
    assert panel._rows["data.path"].isVisibleTo(panel)

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(data), ""))
    browse = [w for w in panel._rows["data.path"].children() if hasattr(w, "text") and w.text() == "Browse…"][0]
    qtbot.mouseClick(browse, Qt.MouseButton.LeftButton)
    assert window.controller.config.data.path == str(data)

    for key, value in (("data.x_key", "inputs"), ("data.y_key", "labels")):
        edit = panel.widgets[key]
        edit.clear()
        qtbot.keyClicks(edit, value)
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert (window.controller.config.data.x_key, window.controller.config.data.y_key) == ("inputs", "labels")

    window.controller.undo_stack.undo()
    assert window.controller.config.data.y_key != "labels"


def test_choosing_a_known_data_set_fills_its_shape_and_classes(window: Any) -> None:
    source = window.settings_panel.widgets["data.source"]
    source.setCurrentText("digits")
    source.activated.emit(source.currentIndex())
    data = window.controller.config.data
    assert (data.source, data.shape, data.classes) == ("digits", (8, 8), 10)
    window.controller.undo_stack.undo()
    assert window.controller.config.data.source == "synthetic"
    assert window.controller.config.data.shape == (784,)
