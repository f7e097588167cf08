"""The shown run as a Qt model: a live run, a run folder opened from disk, or the config's tasks before any.

Owns the :class:`~engine.control.launcher.Run` and the :class:`~engine.observe.telemetry.RunState`
it is folded into (or the run followed through its folder, :class:`~gui.runs_follow.FolderRun`, or on another
machine over ssh, :class:`~gui.runs_remote.RemoteFollow`, opened off the GUI thread by its
:class:`~gui.session_remote.RemoteOpener`). Events reach it on the run's dispatcher thread (only enqueued there) and are
folded on the GUI thread by a timer at <= 30 Hz (its :class:`~gui.session_feed.EventFeed`); views connect
to ``runUpdated`` and read :attr:`RunSession.state`. Opened folders still written by a live launcher are
followed (its :class:`~gui.session_follow.FolderFollower`); other runs' curves are overlaid for comparison (its
:class:`~gui.session_compare.RunComparisons`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, Signal

from engine.contract.config import ConfigError, Problem, RunConfig
from engine.control.detach import RunHost
from engine.control.launcher import Run
from engine.observe.run_reader import ENDED, read_run_folder, run_state_for
from engine.observe.telemetry import RunState
from gui.runs_follow import FolderRun, attach_folder
from gui.runs_remote import RemoteFollow
from gui.session_compare import RunComparisons
from gui.session_feed import EventFeed
from gui.session_follow import FolderFollower
from gui.session_remote import RemoteOpener


class WatchedRun(Protocol):
    """What the session needs of a launched run (the launcher's :class:`Run`, or a replay)."""

    @property
    def done(self) -> bool: ...

    def add_listener(self, listener: Any) -> None: ...

    def stop(self, reason: str = ..., wait: bool = ...) -> None: ...

    def pids(self) -> list[int]: ...


def describe_end(s: RunState) -> str:
    """What the app says when a run has ended: how, after how many steps, or which task failed and why."""
    if s.state == "finished":
        return f"Run finished: {s.step} steps"
    if s.state == "lost":
        return "Run lost: the connection to its machine was given up; it may go on there (attach again to see)"
    if s.state == "failed":
        # the launcher's reason leaves the task out (it is in failed_task); older run folders include it
        task = s.failed_task or ""
        reason = s.reason.removeprefix(f"{task}: ") if task else s.reason
        return f"Run failed: {task}: {reason}" if task else f"Run failed: {reason}"
    return f"Run {s.state}" + (f": {s.reason}" if s.reason else "")


def serve_channel(run: Run) -> RunHost | None:
    """The control socket of a run started in the window: `clusterdeck stop`, the Runs panel and other windows reach
    it as they reach a detached run (None where it cannot be served: then only this window stops the run)."""
    try:
        return RunHost(run, detached=False).start()
    except OSError:
        return None


class RunSession(QObject):
    """The run on screen and its folded state."""

    runLoaded = Signal()  # ``state`` is a new RunState (new run, opened folder, reset)
    runUpdated = Signal()  # new events folded into ``state``
    runStateChanged = Signal(str)  # "starting", "running", "stopping", "finished", "failed", "stopped", ...
    comparisonsChanged = Signal()
    runsRootChanged = Signal(object)  # Path
    message = Signal(str)
    startRefused = Signal(list)  # list[Problem]: a detached start its launcher refused (nothing runs)
    stopRefused = Signal(str)  # an attached run's launcher refused to stop (another user's run), or cannot
    runReleased = Signal(object)  # Path: an attached run was let go; it runs on
    remoteConfig = Signal(object)  # RunConfig: a remote run connected, about to be shown (the document follows)

    def __init__(self, runs_root: Path, config: RunConfig, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runs_root = Path(runs_root)
        self.state: RunState = run_state_for(config)
        self.config: RunConfig = config  # the shown run's config (or the edited one while no run is shown)
        self.run_dir: Path | None = None
        self.run: WatchedRun | None = None
        self.user_stopped = False
        self._compared = RunComparisons(self)
        self._compared.changed.connect(self.comparisonsChanged)
        self.comparisons = self._compared.runs  # by label: the runs overlaid on the curves
        self._stopping = False
        self._shows_run = False
        self._feed = EventFeed(self)  # the live run's events, folded at <= 30 Hz
        self._feed.due.connect(self._drain)
        self._follower = FolderFollower(self)  # an opened folder its launcher still writes
        self._follower.updated.connect(self.runUpdated)
        self._follower.ended.connect(lambda: self.runStateChanged.emit(self.state.state))
        self._host: RunHost | None = None  # the control socket of the app's own live run
        self.remote_run: str | None = None  # the shown run's ``user@host:/path`` when it is on another machine
        self.remote_opener = RemoteOpener(self)  # ``failed``: a remote run that could not be opened, in one line
        self.remote_opener.opened.connect(self._remote_opened)

    # ------------------------------------------------------------------ reading

    @property
    def runs_root(self) -> Path:
        return self._runs_root

    @runs_root.setter
    def runs_root(self, path: Path) -> None:
        path = Path(path)
        if path != self._runs_root:
            self._runs_root = path
            self.runsRootChanged.emit(path)

    @property
    def is_running(self) -> bool:
        """A launched run whose end has not been folded in yet."""
        return self.run is not None

    @property
    def is_stopping(self) -> bool:
        return self._stopping and self.run is not None

    @property
    def attached(self) -> FolderRun | RemoteFollow | None:
        """The live run when it is followed through its folder or over ssh (it outlives the app), else None."""
        return self.run if isinstance(self.run, (FolderRun, RemoteFollow)) else None

    @property
    def shows_run(self) -> bool:
        """A run (live, ended, or from a folder) is shown, not just the config's tasks."""
        return self._shows_run

    # ------------------------------------------------------------------ live runs

    def launch(self, config: RunConfig, *, checked: bool) -> Path:
        """Start ``config`` under :attr:`runs_root`; returns its folder (ConfigError when it cannot start)."""
        if self.run is not None:
            raise RuntimeError("a run is in progress; stop it first")
        run = Run(config, runs_root=self._runs_root, checked=checked)
        run.add_listener(self._feed.listener())  # called on the run's dispatcher thread: only enqueue there
        try:
            run_dir = run.start()
        except OSError as exc:
            raise ConfigError([Problem("", f"the run could not start: {exc}")]) from None
        self._host = serve_channel(run)
        self._watch(run, config, run_dir, "starting")
        self.message.emit(f"Run started in {run_dir}")
        return run_dir

    def launch_detached(self, config: RunConfig) -> None:
        """Start ``config`` in a launcher of its own under :attr:`runs_root` (it outlives the app) and follow it.
        Returns at once; a refusal comes as ``startRefused``."""
        self.release()
        if self.run is not None:
            raise RuntimeError("a run is in progress; stop it first")
        run = FolderRun.spawn(config, self._runs_root)
        self.watch(run, config, None, "starting")
        run.start()
        self.message.emit("Starting the run in a launcher of its own (it keeps going when ClusterDeck closes)…")

    def attach(self, path: str | Path) -> RunConfig:
        """Follow a running run's folder live (its history first): Stop goes through its control socket.
        Returns its config (ConfigError when the folder is no run)."""
        path = Path(path)
        self.release()
        if self.run is not None:
            raise RuntimeError("a run is in progress; stop it first")
        config, state, reader = read_run_folder(path)
        run = attach_folder(path, reader)
        run.add_listener(self._feed.listener())
        self._watch(run, config, path, state.state, folded=state)  # the thread reads on from there
        run.start()
        self.message.emit(f"Attached to {path.name}: {state.state}, {state.step} steps")
        return config

    def attach_remote(self, target: str) -> None:
        """Follow a run on another machine (``user@host:/path``) over ssh: connects off the GUI thread, then shows its
        history and live steps (the run shown until then is let go); ``remote_opener.failed`` when it cannot."""
        self.remote_opener.open(target)

    def _remote_opened(self, run: RemoteFollow) -> None:
        self.release()
        if self.run is not None:  # a run of this window started meanwhile: it keeps the screen
            return run.close()
        self.remoteConfig.emit(run.config)
        self._feed.listener()  # a fresh queue: nothing an earlier run left is taken for this one's
        self._watch(run, run.config, None, run.state.state, folded=run.state, remote=run.where)
        self.message.emit(f"Attached to {run.name} on {run.login} over ssh: {run.state.state}, {run.state.step} steps")

    def release(self) -> None:
        """Let an attached run go (it runs on) or call off one being connected to; the screen keeps what it shows."""
        self.remote_opener.cancel()
        run = self.attached
        if run is None:
            return
        run.close()
        self._drop_run()
        self.runStateChanged.emit(self.state.state)
        if isinstance(run, RemoteFollow):
            self.message.emit(f"Detached from {run.name} on {run.login}: it keeps going there")
        elif run.run_dir is not None:
            self.runReleased.emit(run.run_dir)

    def watch(self, run: WatchedRun, config: RunConfig, run_dir: Path | None = None, state: str = "starting") -> None:
        """Show an already started run (the launcher's, or a replay of events) as the live run."""
        if self.run is not None:
            raise RuntimeError("a run is in progress; stop it first")
        run.add_listener(self._feed.listener())
        self._watch(run, config, run_dir, state)

    def _watch(self, run: WatchedRun, config: RunConfig, run_dir: Path | None, state: str,
               folded: RunState | None = None, remote: str | None = None) -> None:
        """Show ``run``, whose events already go to the feed (or which folds them itself), as the live run."""
        self._show(folded if folded is not None else run_state_for(config), config, run_dir, remote=remote)
        self.state.state = state
        self._stopping = False
        # a detached start: the screen clears now, and the views take the run (a listener on it) once its launcher
        # says where it is, with one runLoaded as for any other run
        later = run_dir is None and isinstance(run, FolderRun)
        if later:
            self.runLoaded.emit()
        self.run = run
        self._feed.start()
        if not later:
            self.runLoaded.emit()
        self.runStateChanged.emit(state)

    def add_listener(self, listener: Any) -> bool:
        """Also give ``listener`` the live run's events (on the run's thread); False without a live run."""
        if self.run is None:
            return False
        self.run.add_listener(listener)
        return True

    def stop(self) -> None:
        """Ask the live run to stop; returns at once (the end arrives as a ``run`` event)."""
        if self.run is None or self._stopping:
            return
        self._stopping = True
        self.user_stopped = True
        self.run.stop(wait=False)
        self.runStateChanged.emit("stopping")
        self.message.emit("Stopping the run…")

    def _drain(self) -> None:
        """Fold queued events into ``state`` (GUI thread, timer-driven)."""
        run = self.run
        if run is None:
            self._feed.stop()
            return
        if isinstance(run, (FolderRun, RemoteFollow)) and self._attached_news(run):
            return
        was = self.state.state
        done = run.done  # read before draining: every event precedes ``done``
        # a remote run folds into its own state, the one shown, here on the GUI thread
        if run.poll() if isinstance(run, RemoteFollow) else self._feed.fold_into(self.state):
            self.runUpdated.emit()
        if self.state.state != was and not self._stopping:
            self.runStateChanged.emit(self.state.state)
        if done and self._feed.empty():
            self._drop_run()
            final = getattr(run, "final_state", None)
            if final and self.state.state not in ENDED:  # its launcher is gone without an end of its own
                self.state.state = final
            self.runStateChanged.emit(self.state.state)
            self.message.emit(self.end_message())

    def _attached_news(self, run: FolderRun | RemoteFollow) -> bool:
        """What an attached run's threads learnt: its folder (a detached start), a refused stop, a refused start
        (then the run is dropped: True), its connection's notes (a remote run)."""
        if isinstance(run, FolderRun) and self.run_dir is None and run.run_dir is not None:
            self.run_dir = run.run_dir
            self.runLoaded.emit()  # the logs and the status now have a folder
            self.message.emit(f"Run started detached in {run.run_dir}: it keeps going when ClusterDeck closes")
        for notice in run.take_notices():
            if notice.kind == "refused" and self._stopping:
                self._stopping = False
                self.user_stopped = False
                self.runStateChanged.emit(self.state.state)
                self.stopRefused.emit(notice.text)
            else:
                self.message.emit(notice.text)
        if isinstance(run, FolderRun) and run.done and run.run_dir is None:  # the launcher never started the run
            self._drop_run()
            if run.cancelled:
                self.message.emit("Run cancelled before it started")
            self.startRefused.emit(list(run.start_problems or []))
            return True
        return False

    def _drop_run(self) -> None:
        """No live run any more (ended, let go, or never started); the screen keeps what it showed last. The app's own
        run's control socket closes with it."""
        self._feed.stop()
        self.run = None
        self._stopping = False
        if self._host is not None:
            self._host.close()
            self._host = None

    def end_message(self) -> str:
        return describe_end(self.state)

    # ------------------------------------------------------------------ run folders

    def open_folder(self, path: str | Path) -> RunConfig:
        """Show a past (or still running) run folder; returns its config (ConfigError when it is none). An
        attached run shown is let go (it runs on)."""
        if self.run is not None and self.attached is None:
            raise RuntimeError("a run is in progress; stop it first")
        path = Path(path)
        config, state, reader = read_run_folder(path)
        self.release()
        self._show(state, config, path)
        self.runLoaded.emit()
        self.runStateChanged.emit(state.state)
        if state.state not in ENDED:
            self._follower.follow(reader, state)
        self.message.emit(f"Opened run {path.name}: {state.state}, {state.step} steps")
        return config

    def show_config(self, config: RunConfig) -> None:
        """Forget the shown run (not while one is live): the config's tasks, nothing run yet."""
        if self.run is not None:
            return
        self._show(run_state_for(config), config, None, shows_run=False)
        self.runLoaded.emit()
        self.runStateChanged.emit(self.state.state)

    def _show(self, state: RunState, config: RunConfig, run_dir: Path | None, shows_run: bool = True,
              remote: str | None = None) -> None:
        """What the screen shows from now on (an opened folder is no longer followed); the caller tells the views."""
        self._follower.stop()
        self.state, self.config, self.run_dir = state, config, run_dir
        self.remote_run = remote
        self._shows_run = shows_run
        self.user_stopped = False

    def follow_config(self, config: RunConfig) -> None:
        """The config changed: while no run is shown, the task list follows it."""
        if not self.shows_run:
            self.state = run_state_for(config)
            self.config = config
            self.runLoaded.emit()

    # ------------------------------------------------------------------ comparison

    def compare_with(self, path: str | Path) -> str:
        """Overlay another run's curves; returns its label (ConfigError when it recorded no steps)."""
        return self._compared.add(path)

    def clear_comparisons(self) -> None:
        self._compared.clear()

    def shutdown(self) -> None:
        """Stop the timers, and the app's own run if any (without waiting for it); an attached run is let go."""
        self._follower.stop()
        self.release()
        if self.run is not None:
            self.stop()
        else:
            self._drop_run()
