"""Starting a run from the window, and quitting while one is in progress: what cannot start is told in a
message box; a quit asks to stop the run first and closes the window once the run has ended.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.contract.config import ConfigError, Problem
from gui.controller import Controller


class RunActions(QObject):
    """The run commands of ``window`` (the parent of their message boxes) over ``controller``."""

    message = Signal(str, int)  # for the status bar: text, milliseconds (0: until the next one)
    closeReady = Signal()  # the run stopped for quitting has ended: the window closes now

    def __init__(self, controller: Controller, window: QWidget) -> None:
        super().__init__(window)
        self.controller = controller
        self.window = window
        self.quitting = False  # the user chose to stop the run and quit
        controller.startFailed.connect(self.show_start_failed)
        controller.runStateChanged.connect(self._run_state_changed)

    def start(self) -> None:
        """Start the document's config (a problem is told; a run already in progress is said so)."""
        try:
            self.controller.start_run()
        except ConfigError as exc:
            QMessageBox.warning(self.window, "Cannot run", str(exc))
        except RuntimeError as exc:
            self.message.emit(str(exc), 5000)

    def show_start_failed(self, problems: list[Problem]) -> None:
        QMessageBox.warning(self.window, "Cannot run", str(ConfigError(problems)))

    def may_close(self) -> bool:
        """True when no run is in progress. With one, asks whether to stop it and quit: then the run is
        stopped and ``closeReady`` follows once it has ended."""
        c = self.controller
        if not c.is_running:
            return True
        if not self.quitting:
            buttons = QMessageBox.StandardButton
            answer = QMessageBox.question(self.window, "A run is in progress",
                                          "Stop the run and quit? Every task of the run will end.",
                                          buttons.Yes | buttons.No, buttons.No)
            if answer != buttons.Yes:
                return False
            self.quitting = True
            c.stop_run()
            self.message.emit("Stopping the run before quitting…", 0)
        return False

    def quit_on_signal(self) -> None:
        """SIGINT, SIGTERM or SIGHUP (a terminal closed, a session ended): stop the run as Stop does and close
        once it has ended, without asking (nobody may be there to answer)."""
        self.quitting = True
        if self.controller.is_running:
            self.controller.stop_run()
            self.message.emit("Stopping the run before quitting (a signal asked to quit)…", 0)
        else:
            QTimer.singleShot(0, self.closeReady.emit)

    def _run_state_changed(self, _state: str) -> None:
        if self.quitting and not self.controller.is_running:
            QTimer.singleShot(0, self.closeReady.emit)
