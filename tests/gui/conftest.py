"""GUI test fixtures: offscreen Qt, settings in a temp folder, dialogs that never block, a ready window."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import gc  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QCoreApplication, QEvent, QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

import gui  # noqa: E402,F401 - first: guards the Qt binding before any Qt call
from tests import kit  # noqa: E402
from tests.conftest import wait_gone  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "presets"


@dataclass
class Dialogs:
    """Records message boxes; ``answers`` holds what the next questions return (in order)."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)
    answers: list[QMessageBox.StandardButton] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.calls]


@pytest.fixture(autouse=True)
def dialogs(monkeypatch: pytest.MonkeyPatch) -> Dialogs:
    """No modal box may block a test: informative boxes are recorded, questions answered from a queue."""
    rec = Dialogs()

    def informative(kind: str) -> Any:
        def show(parent: Any, title: str, text: str, *args: Any, **kwargs: Any) -> QMessageBox.StandardButton:
            rec.calls.append((kind, title, text))
            return QMessageBox.StandardButton.Ok
        return show

    def question(parent: Any, title: str, text: str, *args: Any, **kwargs: Any) -> QMessageBox.StandardButton:
        rec.calls.append(("question", title, text))
        if not rec.answers:
            raise AssertionError(f"unexpected question box: {title}: {text}")
        return rec.answers.pop(0)

    for kind in ("critical", "warning", "information", "about"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(informative(kind)))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    return rec


@pytest.fixture(autouse=True)
def collect_between_tests() -> Iterator[None]:
    """Each test's widgets are deleted and its garbage collected when it ends, where no Qt call is
    running. Left to a collection that starts inside the next test's Qt calls, a previous window's
    garbage can deadlock the GUI thread: pyqtgraph disconnecting a signal while building a plot holds
    one of Qt's signal-slot locks and calls back into Python, the collection that allocation starts
    frees a QObject whose destructor needs that same lock (seen as a window that hung being built)."""
    yield
    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


@pytest.fixture(autouse=True)
def qt_settings(tmp_path: Path) -> Path:
    """QSettings (window layout, recent files) go to a fresh folder per test."""
    folder = tmp_path / "settings"
    folder.mkdir()
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(folder))
    from gui.preferences import set_keep_runs_going

    set_keep_runs_going(False)  # answered: Run starts runs in the window (tests of the question clear it)
    return folder


@pytest.fixture
def window(qtbot: Any, runs_root: Path) -> Iterator[Any]:
    """The main window, shown and active, with a controller writing runs under ``runs_root``."""
    from gui.controller import Controller
    from gui.main_window import MainWindow

    win = MainWindow(Controller(runs_root=runs_root))
    win.show()  # not qtbot.addWidget: pytest-qt would close it before this fixture stops the run
    qtbot.waitExposed(win)
    win.activateWindow()
    qtbot.waitUntil(win.isActiveWindow, timeout=5000)
    yield win
    c = win.controller
    run = c.run
    if run is not None:
        pids = run.pids()
        c.stop_run()
        qtbot.waitUntil(lambda: c.run is None, timeout=30_000)
        wait_gone(pids, 10.0)
    c.undo_stack.setClean()
    win.close()
    assert win.isHidden(), "the window refused to close"
    active = [t.objectName() or repr(t) for t in win.findChildren(QTimer) if t.isActive()]
    assert not active, f"timers left running after close: {active}"
    win.deleteLater()


#: the scripted run the gui tests watch (tests/kit.py): events checked by the real decoder
ReplayRun = kit.ScriptedRun
