"""The "Why slow" panel's long jobs, off the GUI thread: a profile of every task
(:func:`engine.control.profiling.capture`, seconds) and a dump of every task's stacks
(:func:`engine.control.doctor.dump_stacks`, up to a few seconds). One job at a time; its outcome comes back
as a queued signal on the GUI thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.control import doctor, profiling

#: The capture's length of the panel's button.
PROFILE_MS = 2000


class DoctorJobs(QObject):
    """``profiled(ProfileCapture | str)`` and ``dumped(dict | str)``: the result, or why there is none."""

    profiled = Signal(object)
    dumped = Signal(object)
    busyChanged = Signal(str)  # what runs now ("" when idle)
    _done = Signal(int, str, object)  # (generation, kind, outcome): worker thread -> GUI thread

    def __init__(self, parent: QObject | None = None,
                 capture: Callable[..., profiling.ProfileCapture] = profiling.capture,
                 dump: Callable[..., dict[str, Any]] = doctor.dump_stacks) -> None:
        super().__init__(parent)
        self._capture, self._dump = capture, dump
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="why-slow")
        self._cancel = threading.Event()
        self._generation = 0
        self.busy = ""
        self._done.connect(self._deliver)

    def profile(self, run_dir: Path, ms: int = PROFILE_MS) -> None:
        self._start("profile", lambda: self._capture(run_dir, ms, cancelled=self._cancel.is_set),
                    f"Profiling every task for {ms / 1000:g} s…")

    def dump_stacks(self, run_dir: Path) -> None:
        self._start("stacks", lambda: self._dump(run_dir), "Asking every task for its stacks…")

    def _start(self, kind: str, work: Callable[[], Any], what: str) -> None:
        if self.busy:
            raise RuntimeError(f"a job is running: {self.busy}")
        self._generation += 1
        generation = self._generation
        self._cancel.clear()

        def run() -> None:
            try:
                outcome: Any = work()
            except profiling.ProfileError as exc:
                outcome = str(exc)
            except Exception as exc:  # noqa: BLE001 - any failure is shown, never raised into Qt
                outcome = f"{type(exc).__name__}: {exc}"
            try:
                self._done.emit(generation, kind, outcome)
            except RuntimeError:  # the panel is gone: nobody to tell
                pass

        self.busy = what
        self.busyChanged.emit(what)
        self._pool.submit(run)

    def _deliver(self, generation: int, kind: str, outcome: Any) -> None:
        if generation != self._generation:
            return
        self.busy = ""
        self.busyChanged.emit("")
        (self.profiled if kind == "profile" else self.dumped).emit(outcome)

    def shutdown(self, wait: bool = True) -> None:
        """Cancel a capture under way (it returns within a poll) and forget any job's outcome."""
        self._generation += 1
        self._cancel.set()
        self.busy = ""
        self._pool.shutdown(wait=wait, cancel_futures=True)
