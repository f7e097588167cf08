"""Run and quit with runs that may outlive the window.

The preference "keep runs going when the app closes" (:data:`gui.preferences.KEEP_RUNS_GOING`) is asked at
the first Run a person presses that would start (the moment it matters: a run started in the window cannot be
handed over later; a start from the command line asks nothing) and remembered; Edit ▸ Preferences and Run ▸ Keep Runs Going After Closing change it. When it is on,
Run starts the run detached (``clusterdeck run --detach``: a launcher in a session of its own) and the window
follows it through its folder; closing the window lets it run on, and the Runs panel finds it again. When it
is off, Run starts the run in the window as before, and quitting asks "Stop the run and quit?".
"""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.contract.config import ConfigError, Problem
from engine.control.launcher import launch_problems
from gui import preferences
from gui.run_actions import RunActions

_Buttons = QMessageBox.StandardButton
ASK_TITLE = "Keep runs going after ClusterDeck closes?"
ASK_TEXT = (
    "Should runs keep going when you close ClusterDeck?\n\n"
    "Yes: each run starts in a launcher of its own. Close the app whenever you like; the Runs panel (or "
    "clusterdeck ls in a terminal) finds the run again to watch or stop it.\n\n"
    "No: runs live in this window, and closing it asks to stop the run first.\n\n"
    "Change it any time under Edit ▸ Preferences or Run ▸ Keep Runs Going After Closing.")


def ask_keep_going(parent: QWidget) -> bool | None:
    """Ask once whether runs should outlive the app; the answer is remembered. None: cancelled."""
    answer = QMessageBox.question(parent, ASK_TITLE, ASK_TEXT, _Buttons.Yes | _Buttons.No | _Buttons.Cancel,
                                  _Buttons.Yes)
    if answer not in (_Buttons.Yes, _Buttons.No):
        return None
    keep = answer == _Buttons.Yes
    preferences.set_keep_runs_going(keep)
    return keep


class WindowRunActions(RunActions):
    """:class:`RunActions` with runs that outlive the window: Run starts one detached when the user wants
    runs to keep going, and quitting with such a run shown lets it go (nothing is asked, nothing stops)."""

    keepGoingChanged = Signal(bool)

    def start(self, ask: bool = True) -> None:
        """Run: detached when runs should keep going. ``ask``: a person pressed Run, and the preference is asked
        if it never was; a start from the command line (``clusterdeck gui PRESET --run``) asks nothing and,
        unasked, starts the run in the window as ever."""
        c = self.controller
        session = c.session
        if session.attached is None and c.is_running:
            super().start()  # a run of this window is in progress: said so
            return
        if launch_problems(c.config):
            super().start()  # said in the same words as ever
            return
        keep = preferences.keep_runs_going()
        if keep is None and ask:
            keep = ask_keep_going(self.window)
            if keep is None:
                return
            self.keepGoingChanged.emit(keep)
        if not keep:  # off, or never asked and not to be asked now
            session.release()  # an attached run shown runs on
            super().start()
            return
        try:
            session.launch_detached(c.config)
        except RuntimeError as exc:
            self.message.emit(str(exc), 5000)

    def refused(self, problems: list[Problem]) -> None:
        """A detached start its launcher refused: listed with the config's problems, told in a box."""
        c = self.controller
        if problems:
            c.pre_run.found(problems)
        c.session.show_config(c.config)
        if problems:
            QMessageBox.warning(self.window, "Cannot run", str(ConfigError(problems)))
            n = len(problems)
            self.message.emit(f"Run not started: {n} problem{'s' if n != 1 else ''} found before the launch "
                              "(listed under Settings)", 10000)

    def may_close(self) -> bool:
        if self.controller.session.attached is not None and not self.controller.checks.busy:
            return True  # it runs on: the window lets it go as it closes
        return super().may_close()

    def quit_on_signal(self) -> None:
        if self.controller.session.attached is not None:
            self.quitting = True
            QTimer.singleShot(0, self.closeReady.emit)
            return
        super().quit_on_signal()
