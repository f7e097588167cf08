"""The app's composition root: the edited document, the run session and the pre-launch checks.

Each part is a Qt model of its own (:class:`~gui.document_model.DocumentModel`,
:class:`~gui.run_session.RunSession`, :class:`~gui.launch_checks.LaunchChecks`); views take the
one they show. The controller holds what spans them: starting a run (quick checks, the deep
ones off the GUI thread, then the launch), opening a config or a run folder (the document and
the shown run change together) and shutting down. It never shows a dialog: methods raise
(:class:`~engine.contract.config.ConfigError` for anything a user can fix).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from engine.contract.config import ConfigError, Problem, RunConfig, replace
from engine.contract.run_folder import default_runs_root
from engine.control import script_check
from engine.control.launcher import launch_problems
from engine.observe.telemetry import RunState
from gui.document_model import DocumentModel, Selection, problem_target
from gui.launch_checks import Checker, LaunchChecks, deep_problems
from gui.pre_run_problems import FileChecker, PreRunProblems, file_problems
from gui.run_session import RunSession, WatchedRun

__all__ = ["Controller", "Selection", "problem_target"]


class Controller(QObject):
    """Holds ``document``, ``session`` and ``checks`` and what spans them."""

    runStateChanged = Signal(str)  # the session's states, plus "checking" and "idle" around the deep checks
    startFailed = Signal(list)  # list[Problem]: a run checked in the background could not start
    message = Signal(str)  # for the status bar

    def __init__(self, config: RunConfig | None = None, *, runs_root: Path | None = None,
                 checker: Checker = deep_problems, file_checker: FileChecker = file_problems,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.document = DocumentModel(config, self)
        root = Path(runs_root) if runs_root is not None else default_runs_root()
        self.session = RunSession(root, self.document.config, self)
        self.checks = LaunchChecks(checker, self)
        self.pre_run = PreRunProblems(file_checker, self)
        self.document.changed.connect(lambda: self.session.follow_config(self.document.config))
        self.document.changed.connect(lambda: self.pre_run.config_changed(self.document.config))
        self.pre_run.config_changed(self.document.config)
        self._edits_told: object | None = None  # the run already told that edits wait for the next one
        self.document.changed.connect(self._edited_during_run)
        self.document.message.connect(self.message)
        self.session.message.connect(self.message)
        self.session.runStateChanged.connect(self.runStateChanged)
        self.checks.finished.connect(self._checked)

    # ------------------------------------------------------------------ reading (what the window shows)

    @property
    def config(self) -> RunConfig:
        return self.document.config

    @property
    def undo_stack(self) -> QUndoStack:
        return self.document.undo_stack

    @property
    def problems(self) -> list[Problem]:
        return self.document.problems

    @property
    def path(self) -> Path | None:
        return self.document.path

    @property
    def selection(self) -> Selection:
        return self.document.selection

    @property
    def state(self) -> RunState:
        return self.session.state

    @property
    def run(self) -> WatchedRun | None:
        return self.session.run

    @property
    def run_dir(self) -> Path | None:
        return self.session.run_dir

    @property
    def runs_root(self) -> Path:
        return self.session.runs_root

    @property
    def is_running(self) -> bool:
        """A run in progress, or its pre-launch check."""
        return self.session.is_running or self.checks.busy

    @property
    def run_state(self) -> str:
        if self.checks.busy:
            return "checking"
        if self.session.is_stopping:
            return "stopping"
        return self.session.state.state

    # ------------------------------------------------------------------ documents and run folders

    def new_document(self, config: RunConfig | None = None) -> None:
        """A fresh config; the previous run leaves the screen (unless one is live)."""
        self.document.new(config)
        self.session.show_config(self.document.config)

    def open_preset(self, path: str | Path) -> RunConfig:
        """Open a YAML preset (ConfigError naming the field); the previous run leaves the screen."""
        config = self.document.open(path)
        self.session.show_config(config)
        return config

    def open_run(self, path: str | Path) -> None:
        """Show a past (or still running) run folder: its config, task states and curves."""
        if self.is_running:
            raise RuntimeError("a run is in progress; stop it first")
        config = self.session.open_folder(path)
        # the run's ports were fixed at its launch: the copy to edit takes new ones again (a later Export or
        # run would otherwise carry that run's ports); the run itself is shown as it ran
        self.document.replace(auto_ports(config), None)

    def _edited_during_run(self) -> None:
        run = self.session.run
        if run is not None and self.session.is_running and self._edits_told is not run:
            self._edits_told = run
            self.message.emit("Edits apply to the next run; the run in progress keeps the config it started with")

    # ------------------------------------------------------------------ runs

    def start_run(self) -> Path | None:
        """Launch the current config; returns the run folder. Raises ConfigError when it cannot start.

        A config naming the user's script or data files is checked first off the GUI thread (the
        check imports TensorFlow in a subprocess: seconds); then None is returned, and the run
        starts when the check passes, or ``startFailed`` reports its problems.
        """
        if self.is_running:
            raise RuntimeError("a run is in progress; stop it first")
        problems = launch_problems(self.config)
        if problems:
            raise ConfigError(problems)
        if script_check.uses_script(self.config):
            self.checks.check(self.config)
            self.runStateChanged.emit("checking")
            self.message.emit("Checking your script before the run starts…")
            return None
        try:
            return self.session.launch(self.config, checked=False)
        except ConfigError as exc:
            self._not_started(exc.problems)
            raise

    def _checked(self, config: RunConfig, problems: list[Problem]) -> None:
        if problems:
            self._not_started(problems, config)
            self.runStateChanged.emit("idle")
            self.startFailed.emit(problems)
            return
        try:
            self.session.launch(config, checked=True)
        except ConfigError as exc:
            self._not_started(exc.problems, config)
            self.runStateChanged.emit("idle")
            self.startFailed.emit(exc.problems)

    def _not_started(self, problems: list[Problem], config: RunConfig | None = None) -> None:
        """A launch refused before any task started: its problems join the config's, the previous run's
        state leaves the screen, and the status bar says so (not "Checking…" any more)."""
        if config is None or config == self.document.config:  # not of a config edited since
            self.pre_run.found(problems)
        self.session.show_config(self.config)
        n = len(problems)
        self.message.emit(f"Run not started: {n} problem{'s' if n != 1 else ''} found before the launch "
                          "(listed under Settings)")

    def stop_run(self) -> None:
        """Stop the run (or forget its pending check); returns at once."""
        if self.checks.cancel():
            self.session.show_config(self.config)  # the previous run's state does not come back
            self.runStateChanged.emit("idle")
            self.message.emit("Run cancelled before it started")
            return
        self.session.stop()

    def reset_run_view(self) -> None:
        """Forget the shown run (not while one is in progress)."""
        self.session.show_config(self.config)

    def shutdown(self) -> None:
        """Stop timers and checks, and the run if any (without waiting for it)."""
        self.checks.shutdown()
        self.pre_run.shutdown()
        self.session.shutdown()


def auto_ports(config: RunConfig) -> RunConfig:
    """``config`` with every task's port back to ``auto`` (a run folder's config has the ports it ran on)."""
    hosts = tuple(replace(h, tasks=tuple(replace(t, port=None) for t in h.tasks)) for h in config.cluster.hosts)
    return replace(config, cluster=replace(config.cluster, hosts=hosts))
