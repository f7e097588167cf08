"""Signals during a command that starts a run: before the start they end the command, after it they stop
the run (as the app's Stop does)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any


class Interrupted(BaseException):
    """A stop signal before a run started: the command ends with 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_signals() -> list[int]:
    return [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class StopOnSignal:
    """Ctrl-C, SIGTERM and SIGHUP during ``clusterdeck run``.

    Before the run starts (loading TensorFlow-free modules, the data and script checks) a signal ends
    the command at once (:class:`Interrupted`; nothing was started). While :meth:`Run.start` runs it is
    held, and afterwards it stops the run with :meth:`Run.stop`, as the app's Stop does; the command
    then exits with 128 + the signal.
    """

    def __init__(self, *, ignore: tuple[int, ...] = ()) -> None:
        self.ignore = ignore  # signals that mean nothing here (SIGHUP to a detached launcher)
        self.signum: int | None = None
        self._run: Any = None
        self._holding = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        for s in stop_signals():
            self._previous[s] = signal.signal(s, signal.SIG_IGN if s in self.ignore else self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self._run is not None:
            self._run.stop(reason=f"interrupted ({signal_name(signum)})", wait=False)
        elif not self._holding:
            raise Interrupted(signum)

    def start(self, run: Any) -> Path:
        """``run.start()`` with signals held; a signal that came meanwhile stops the run at once."""
        self._holding = True
        try:
            run_dir: Path = run.start()
        finally:
            self._holding = False
        self._run = run
        if self.signum is not None:
            run.stop(reason=f"interrupted ({signal_name(self.signum)})", wait=False)
        return run_dir

    def exit_code(self, run: Any) -> int:
        if self.signum is not None:
            return 128 + self.signum
        return 0 if run.state.state == "finished" else 1
