"""Pre-launch checks that take seconds (data files, the user's script imported in a subprocess),
run on a worker thread so the window stays live; the outcome comes back as a Qt signal.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from engine.contract.config import Problem, RunConfig
from engine.control.launcher import launch_problems

Checker = Callable[[RunConfig], list[Problem]]


def deep_problems(config: RunConfig) -> list[Problem]:
    """Every check the launcher runs, the slow ones included."""
    return launch_problems(config, deep=True)


class LaunchChecks(QObject):
    """Runs one deep check at a time off the GUI thread.

    ``finished(config, problems)`` arrives on the GUI thread (a queued signal from the worker);
    a check cancelled or superseded before it ends reports nothing.
    """

    finished = Signal(object, list)  # (RunConfig, list[Problem])
    busyChanged = Signal(bool)
    _done = Signal(int, object, list)  # (generation, config, problems): worker thread -> GUI thread

    def __init__(self, checker: Checker = deep_problems, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.checker = checker
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
        self._generation = 0
        self._pending: RunConfig | None = None
        self._done.connect(self._deliver)

    @property
    def busy(self) -> bool:
        return self._pending is not None

    @property
    def pending(self) -> RunConfig | None:
        """The config being checked (None when idle)."""
        return self._pending

    def check(self, config: RunConfig) -> None:
        """Start checking ``config``; raises RuntimeError when a check is already running."""
        if self._pending is not None:
            raise RuntimeError("a check is already running")
        self._generation += 1
        generation = self._generation
        self._pending = config

        def work() -> None:
            try:
                problems = self.checker(config)
            except Exception as exc:  # noqa: BLE001 - any failure of the check is shown, never raised into Qt
                problems = [Problem("", f"the check could not run: {exc}")]
            self._done.emit(generation, config, problems)

        self._pool.submit(work)
        self.busyChanged.emit(True)

    def cancel(self) -> bool:
        """Forget the running check (its thread ends on its own); True when there was one."""
        if self._pending is None:
            return False
        self._generation += 1
        self._pending = None
        self.busyChanged.emit(False)
        return True

    def shutdown(self) -> None:
        self.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _deliver(self, generation: int, config: RunConfig, problems: list[Problem]) -> None:
        if generation != self._generation or self._pending is None:
            return
        self._pending = None
        self.busyChanged.emit(False)
        self.finished.emit(config, problems)
