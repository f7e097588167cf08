"""What the Runs panel's buttons do: open or attach, stop, compare, delete, each with the question or message
it needs. Stopping a run the window does not show, and deleting a folder, happen off the GUI thread; a run on
another machine is attached to and stopped over ssh (:mod:`gui.runs_remote`)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.contract.run_folder import LIVE_STATES, RunFolder
from engine.control import control_socket
from engine.control.detach import launcher_alive, run_state
from gui.controller import Controller
from gui.file_actions import FileActions
from gui.runs_follow import STOP_TIMEOUT_S
from gui.runs_panel import RunsPanel
from gui.runs_remote import stop_remote
from gui.runs_scan import RunEntry

_Buttons = QMessageBox.StandardButton


def stop_through_channel(folder: RunFolder) -> tuple[str, str]:
    """Ask ``folder``'s launcher to stop its run (blocks until it has ended): ``(kind, text)`` where ``kind`` is
    ``stopped``, ``ended`` (nothing to stop) or ``refused`` (another user's run, no channel, no answer)."""
    name = folder.path.name
    try:
        reply = control_socket.request(folder.control_socket, "stop", timeout=STOP_TIMEOUT_S,
                                       by=f"ClusterDeck app (pid {os.getpid()})")
    except control_socket.ChannelRefused as exc:
        return "refused", f"Cannot stop {name}: {exc}"
    except control_socket.ChannelGone:
        if launcher_alive(folder) and run_state(folder) in LIVE_STATES:
            return "refused", (f"Cannot stop {name}: it has no control channel (it was started by an older "
                               "ClusterDeck); stop it where it was started")
        return "ended", f"{name} had already ended; nothing to stop"
    except control_socket.ControlError as exc:
        return "refused", f"Cannot stop {name}: {exc}"
    if reply.get("already_ended"):
        return "ended", f"{name} had already ended; nothing to stop"
    step, total = reply.get("step"), reply.get("total_steps")
    return "stopped", f"{name}: {reply.get('state')} at step {step}" + (f" of {total}" if total else "")


#: windows opened by "Open in New Window" (held here: a window no one refers to would be collected)
OPEN_WINDOWS: set[QWidget] = set()


class RunsCommands(QObject):
    """The Runs panel's requests over ``controller`` (``files`` opens runs; ``window`` parents the questions)."""

    message = Signal(str, int)  # for the status bar: text, milliseconds
    _done = Signal(str, str, str, str)  # from a worker thread: what (stop, delete), the run's path, kind, text

    def __init__(self, controller: Controller, files: FileActions, panel: RunsPanel, window: QWidget,
                 make_window: Callable[[Controller], QWidget] | None = None) -> None:
        super().__init__(window)
        self.make_window = make_window  # a new window of the app's kind, for "Open in New Window"
        self.controller = controller
        self.files = files
        self.panel = panel
        self.window = window
        self.busy: set[str] = set()  # runs being stopped or deleted from here (RunEntry.key)
        self._threads: list[threading.Thread] = []
        panel.openRequested.connect(self.show)
        panel.remoteRequested.connect(lambda target: self.files.open_remote_run(target))
        panel.attachRequested.connect(self.attach)
        panel.windowRequested.connect(self.new_window)
        panel.stopRequested.connect(self.stop)
        panel.compareRequested.connect(self.compare)
        panel.deleteRequested.connect(self.delete)
        panel.folderRequested.connect(lambda: self.files.open_run_folder())
        self._done.connect(self._finished)

    # ------------------------------------------------------------------ showing

    def show(self, path: Path) -> bool:
        """Show the run at ``path``: a past one from disk, a running one attached to (followed live)."""
        session = self.controller.session
        if Path(path) == session.run_dir and session.is_running:
            self.message.emit(f"{Path(path).name} is the run shown", 4000)
            return True
        return self.files.open_run_folder(path)

    def attach(self, path: Path) -> bool:
        folder = RunFolder(path)
        state = run_state(folder)
        if state not in LIVE_STATES:
            self.message.emit(f"{folder.path.name} is not running ({state or 'no state'}): shown as it ended", 6000)
        return self.show(path)

    def new_window(self, path: Path) -> QWidget:
        """A new window showing the run at ``path`` (followed live if it runs), beside this one: several runs
        watched at once. It lives until it is closed (the app ends with its last window)."""
        if self.make_window is None:
            self.message.emit("this window cannot open others", 4000)
            return self.window
        window = self.make_window(Controller(runs_root=self.controller.runs_root))
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        OPEN_WINDOWS.add(window)
        window.destroyed.connect(lambda: OPEN_WINDOWS.discard(window))
        window.show()
        if not getattr(window, "open_run_folder", lambda _path: False)(path):
            self.message.emit(f"{Path(path).name} could not be shown in a new window", 6000)
        return window

    # ------------------------------------------------------------------ stopping

    def stop(self, entries: list[RunEntry]) -> None:
        """Stop each running run: the shown one as Stop does; others through their control channel."""
        session = self.controller.session
        others: list[RunEntry] = []
        for entry in entries:
            if self.panel.is_shown(entry) and session.is_running:
                if session.is_stopping:
                    self.message.emit(f"Already stopping {entry.path.name}…", 4000)
                else:
                    self.controller.stop_run()
            elif entry.key in self.busy:
                self.message.emit(f"Already stopping {entry.path.name}…", 4000)
            elif not entry.mine:
                QMessageBox.warning(self.window, "Cannot stop this run",
                                    f"{entry.path.name} belongs to another user (uid {entry.owner_uid}; you are uid "
                                    f"{os.getuid()}): only its owner may stop it.")
            else:
                others.append(entry)
        if not others:
            return
        names = "\n".join(f"• {e.path.name}" for e in others)
        if QMessageBox.question(self.window, "Stop runs" if len(others) > 1 else "Stop the run",
                                f"Stop {'these runs' if len(others) > 1 else 'this run'}? Every task ends; the "
                                f"history is kept.\n{names}", _Buttons.Yes | _Buttons.No, _Buttons.No) != _Buttons.Yes:
            return
        for entry in others:
            self.busy.add(entry.key)
            self._start(lambda e=entry: self._done.emit("stop", e.key, *(stop_remote(e.remote) if e.remote else
                                                                         stop_through_channel(RunFolder(e.path)))))
            self.message.emit(f"Stopping {entry.path.name}…", 0)

    # ------------------------------------------------------------------ comparing

    def compare(self, paths: list[Path]) -> None:
        if not paths:
            self.message.emit("Pick a run other than the one shown to compare with it", 5000)
        for path in paths:
            self.files.compare_with_run(path)

    # ------------------------------------------------------------------ deleting

    def delete(self, entries: list[RunEntry]) -> None:
        """Delete the runs' folders after asking; never a running run, nor another user's, nor one on another
        machine (deleted there)."""
        entries = [e for e in entries if not e.remote]
        running = [e for e in entries if e.live or run_state(RunFolder(e.path)) in LIVE_STATES]
        if running:
            QMessageBox.warning(self.window, "Cannot delete a running run",
                                f"{running[0].path.name} is running: stop it first. A running run is never deleted.")
            return
        theirs = [e for e in entries if not e.mine]
        if theirs:
            QMessageBox.warning(self.window, "Cannot delete this run",
                                f"{theirs[0].path.name} belongs to another user (uid {theirs[0].owner_uid}): only its "
                                "owner may delete it.")
            return
        entries = [e for e in entries if e.key not in self.busy]
        if not entries:
            return
        names = "\n".join(f"• {e.path}" for e in entries[:8]) + ("\n…" if len(entries) > 8 else "")
        what = f"these {len(entries)} runs" if len(entries) > 1 else "this run"
        if QMessageBox.question(self.window, "Delete runs" if len(entries) > 1 else "Delete the run",
                                f"Delete {what}? Their folders are removed with their checkpoints, logs and curves; "
                                f"this cannot be undone.\n{names}", _Buttons.Yes | _Buttons.No,
                                _Buttons.No) != _Buttons.Yes:
            return
        session = self.controller.session
        for entry in entries:
            if entry.path == session.run_dir and not session.is_running:
                self.controller.reset_run_view()  # its folder is going: the window shows the config again
            self.busy.add(entry.key)
            self._start(lambda e=entry: self._done.emit("delete", e.key, *_remove(e.path)))

    # ------------------------------------------------------------------ threads

    def _start(self, work: object) -> None:
        thread = threading.Thread(target=work, name="runs-command", daemon=True)  # type: ignore[arg-type]
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _finished(self, what: str, key: str, kind: str, text: str) -> None:
        self.busy.discard(key)
        if kind == "refused":
            QMessageBox.warning(self.window, "Cannot stop the run" if what == "stop" else "Cannot delete the run",
                                text)
        else:
            self.message.emit(text, 8000)
        self.panel.refresh()

    def wait(self, timeout: float = 5.0) -> None:
        """Wait for stops and deletions under way (tests, closing)."""
        for t in list(self._threads):
            t.join(timeout)


def _remove(path: Path) -> tuple[str, str]:
    try:
        if path.is_symlink() or not RunFolder(path).is_run_folder() and not (path / "run.json").is_file():
            return "refused", f"Not deleted: {path} is no run folder any more"
        shutil.rmtree(path)
    except OSError as exc:
        return "refused", f"Cannot delete {path.name}: {exc.strerror or exc}"
    return "deleted", f"Deleted {path.name}"
