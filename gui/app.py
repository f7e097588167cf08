"""Entry point of the desktop app: ``gui.app.main(argv)`` (what ``clusterdeck`` with no arguments runs).

The GUI process imports the engine's control half only, never TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from engine.contract.presets import resolve_preset
from engine.contract.run_folder import RUNS_ENV, RunFolder
from engine.control.memory import tune_allocator
from gui import theme
from gui.controller import Controller
from gui.main_window import APPLICATION, ORGANIZATION, MainWindow, app_icon, app_settings


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterdeck gui", description="Open the ClusterDeck desktop app.")
    parser.add_argument("preset", nargs="?", help="a YAML preset (or a bundled preset's name) or a run folder to open")
    parser.add_argument("--run", action="store_true", help="start the preset at once")
    parser.add_argument("--run-folder", dest="run_folder", default=None, help="a run folder to open")
    return parser.parse_args(list(argv))


def application() -> QApplication:
    """The QApplication (created once, with the app's names, icon and the system's colour scheme)."""
    tune_allocator()  # before the history's arrays grow: see engine.control.memory
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("ClusterDeck")
    app.setWindowIcon(app_icon())
    app.setDesktopFileName("clusterdeck")  # matches resources/clusterdeck.desktop
    return app


def create_window(argv: Sequence[str] = ()) -> MainWindow:
    """Build and show the main window, open the preset of ``argv`` and start it with ``--run``."""
    args = parse_args(argv)
    app = application()
    choice = str(app_settings().value("theme", "system"))
    theme.apply_palette(app, None if choice not in ("light", "dark") else choice == "dark")
    stored = app_settings().value("runsRoot")
    runs_root = Path(str(stored)) if stored and not os.environ.get(RUNS_ENV) else None
    window = MainWindow(Controller(runs_root=runs_root))
    window.show()
    if args.run_folder:
        window.open_run_folder(args.run_folder)
    elif args.preset:
        target = args.preset
        if not Path(target).exists():
            target = str(resolve_preset(target))
        if RunFolder(target).is_run_folder():
            window.open_run_folder(target)
        elif window.open_path(target, ask=False) and args.run:
            QTimer.singleShot(0, window.start_run)
    return window


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_on_signals(app: QApplication, window: MainWindow) -> dict[str, int]:
    """Ctrl-C, SIGTERM and SIGHUP stop the run as Stop does and then close the window; the returned dict
    gets the signal's number. A timer lets Python run its handlers while Qt waits for events."""
    received: dict[str, int] = {}

    def handler(signum: int, _frame: object) -> None:
        received.setdefault("signal", signum)
        QTimer.singleShot(0, window.runs.quit_on_signal)

    for s in STOP_SIGNALS:
        signal.signal(s, handler)
    wake = QTimer(app)
    wake.setObjectName("signalWake")
    wake.timeout.connect(lambda: None)
    wake.start(200)
    return received


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app until its window closes; returns the exit status (128 + the signal when one ended it)."""
    argv = sys.argv[1:] if argv is None else argv
    app = application()
    window = create_window(argv)
    received = stop_on_signals(app, window)
    code = app.exec()
    del window
    return 128 + received["signal"] if "signal" in received else int(code)


if __name__ == "__main__":
    sys.exit(main())
