"""File commands as the user meets them: Save As and Open fill Open Recent, a dropped file opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox

from gui.file_actions import RecentFiles, first_sentence
from tests.gui.conftest import PRESETS


def test_saved_and_opened_files_fill_open_recent(qtbot: Any, window: Any, tmp_path: Path, monkeypatch: Any,
                                                  dialogs: Any) -> None:
    c = window.controller
    answers = iter([str(tmp_path / "first"), str(tmp_path / "second.yaml")])
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (next(answers), "")))
    window.commands["save_as"].trigger()
    assert c.path == tmp_path / "first.yaml" and (tmp_path / "first.yaml").exists()  # .yaml added
    c.document.set_value("name", "second")
    window.commands["save_as"].trigger()
    assert window.recent_files() == [str(tmp_path / "second.yaml"), str(tmp_path / "first.yaml")]

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(tmp_path / "first.yaml"),
                                                                                   "")))
    window.commands["open"].trigger()  # no question: nothing unsaved
    assert c.config.name != "second" and c.path == tmp_path / "first.yaml"
    assert window.recent_files()[0] == str(tmp_path / "first.yaml")
    assert window.statusBar().currentMessage() == f"Opened {tmp_path / 'first.yaml'}"

    recent = window.commands.recent_menu
    recent.aboutToShow.emit()  # as the menu opens
    entries = recent.actions()
    assert [a.text() for a in entries] == ["first.yaml", "second.yaml"]
    c.document.set_value("name", "edited")  # unsaved: opening another file asks first
    dialogs.answers.append(QMessageBox.StandardButton.Discard)
    entries[1].trigger()
    assert c.config.name == "second" and dialogs.kinds() == ["question"]


def test_open_recent_keeps_the_newest(qt_settings: Path, tmp_path: Path) -> None:
    recent = RecentFiles(limit=3)
    assert recent.paths() == []
    for name in ("a", "b", "c", "d", "b"):
        recent.add(tmp_path / f"{name}.yaml")
    assert recent.paths() == [str(tmp_path / n) + ".yaml" for n in ("b", "d", "c")]


def test_presets_menu_lists_the_bundled_presets(window: Any) -> None:
    presets = window.presets_menu
    presets.aboutToShow.emit()
    names = [a.text().split(" — ")[0] for a in presets.actions()]
    assert names == sorted(p.stem for p in PRESETS.glob("*.yaml"))
    first = presets.actions()[0]
    first.trigger()
    assert window.controller.path == sorted(PRESETS.glob("*.yaml"))[0] and window.controller.document.read_only
    assert first_sentence("Two workers. More text") == "Two workers"
    assert first_sentence("x" * 100, limit=10) == "x" * 9 + "…"


def drag(window: Any, kind: type, urls: list[QUrl]) -> Any:
    mime = QMimeData()
    mime.setUrls(urls)
    event = kind(QPoint(20, 20), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                 Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, event)
    return event


def test_a_dropped_preset_opens(qtbot: Any, window: Any) -> None:
    preset = PRESETS / "data-2workers.yaml"
    assert not drag(window, QDragEnterEvent, [QUrl("https://example.org/a.yaml")]).isAccepted()
    two = [QUrl.fromLocalFile(str(preset)), QUrl.fromLocalFile(str(preset))]
    assert not drag(window, QDragEnterEvent, two).isAccepted()
    assert drag(window, QDragEnterEvent, [QUrl.fromLocalFile(str(preset))]).isAccepted()
    drag(window, QDropEvent, [QUrl.fromLocalFile(str(preset))])
    qtbot.waitUntil(lambda: window.controller.path == preset)
    assert window.layout_mode == "design"
