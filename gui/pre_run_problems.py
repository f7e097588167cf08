"""What stops a run beyond the config's own rules, known before Run is pressed: the data files and
the program a config names, read off the GUI thread a moment after each edit (and when the window
comes back to the front: a file may have been put in place meanwhile), and what the last pre-launch
check found (until the next edit). Shown with the config's problems, before Run is pressed; Run stays
enabled (a file may be fixed outside the app), and its own check says what still stands in the way."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.contract import datasets
from engine.contract.config import Problem, RunConfig, validate
from engine.control import preflight

FileChecker = Callable[[RunConfig], list[Problem]]
#: The quiet time after an edit before the files are read again.
SETTLE_MS = 400


def names_files(config: RunConfig) -> bool:
    """Whether ``config`` reads files this machine can check (a data file or folder, a program)."""
    return config.data.source not in ("synthetic", "script") or config.program is not None


def file_problems(config: RunConfig) -> list[Problem]:
    """The config's data files and program, read as the launcher will (no script imported, no TF)."""
    if validate(config):
        return []  # the config's own problems come first; the files are read once they are fixed
    return datasets.check(datasets.absolute_paths(config)) + preflight.program_problems(config)


class PreRunProblems(QObject):
    """The problems found before a launch; ``changed(list)`` on the GUI thread when they change."""

    changed = Signal(list)  # list[Problem]
    _done = Signal(int, list)  # (generation, problems): worker thread -> GUI thread

    def __init__(self, checker: FileChecker = file_problems, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.checker = checker
        self.problems: list[Problem] = []  # what is shown: the files' problems, then the launch's (once each)
        self._files: list[Problem] = []
        self._found: list[Problem] = []
        self._config: RunConfig | None = None
        self._generation = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="file-check")
        self._timer = QTimer(self)
        self._timer.setObjectName("preRunCheckTimer")
        self._timer.setSingleShot(True)
        self._timer.setInterval(SETTLE_MS)
        self._timer.timeout.connect(self._start)
        self._done.connect(self._deliver)

    def config_changed(self, config: RunConfig) -> None:
        """The edited config changed: what a check found of the old one no longer holds."""
        self._config = config
        self._generation += 1
        self._found = []
        if names_files(config):
            self._timer.start()  # the files' problems stay until they are read again (no flicker)
        else:
            self._timer.stop()
            self._files = []
        self._publish()

    def recheck(self) -> None:
        """Read the files again (the window is active again: the user may have fixed one elsewhere)."""
        if self._config is not None and names_files(self._config) and not self._timer.isActive():
            self._timer.start()

    def found(self, problems: list[Problem]) -> None:
        """What a pre-launch check of the current config found (a failed Run)."""
        self._found = list(problems)
        self._publish()

    def shutdown(self) -> None:
        self._timer.stop()
        self._generation += 1
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> None:
        config = self._config
        if config is None:
            return
        generation = self._generation

        def work() -> None:
            try:
                problems = self.checker(config)
            except Exception as exc:  # noqa: BLE001 - a check that cannot run is said, never raised into Qt
                problems = [Problem("data.path", f"the data could not be checked: {exc}")]
            self._done.emit(generation, problems)

        try:
            self._pool.submit(work)
        except RuntimeError:  # shut down
            pass

    def _deliver(self, generation: int, problems: list[Problem]) -> None:
        if generation == self._generation:
            self._files = problems
            self._publish()

    def _publish(self) -> None:
        shown: list[Problem] = []
        for p in self._files + self._found:
            if str(p) not in {str(q) for q in shown}:  # a missing file found twice is said once
                shown.append(p)
        if [str(p) for p in shown] != [str(p) for p in self.problems]:
            self.problems = shown
            self.changed.emit(shown)
