"""Opening a run on another machine off the GUI thread: ``ssh`` connects, ``clusterdeck follow`` starts there and the
run's history comes (seconds), then the session shows it.

:class:`~gui.run_session.RunSession` owns one :class:`RemoteOpener`. One opening at a time: a newer one, another run
shown or the window closing calls the pending one off, and a run that opens after it was called off is closed at
once, so nothing is left running there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from engine.control.remote import RemoteError
from gui.runs_remote import RemoteFollow


@dataclass(eq=False)
class _Opening:
    target: str
    cancelled: bool = False


class RemoteOpener(QObject):
    """Opens remote runs on a worker thread; what came of it is said on the GUI thread."""

    opened = Signal(object)  # RemoteFollow: connected, its history folded
    failed = Signal(str)  # one line naming the host and what is wrong
    _said = Signal(object, object, str)  # from the worker: the opening, its run (or None), the problem

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pending: _Opening | None = None
        self._said.connect(self._delivered)

    @property
    def pending(self) -> str | None:
        """The target being connected to, or None."""
        return self._pending.target if self._pending is not None else None

    def open(self, target: str) -> None:
        """Connect to ``target`` (returns at once); ``opened`` or ``failed`` follows, unless called off first."""
        self.cancel()
        job = self._pending = _Opening(target)
        threading.Thread(target=self._work, args=(job,), name="remote-open", daemon=True).start()

    def cancel(self) -> None:
        """Call the pending opening off (its run, once open, is closed there and then)."""
        job, self._pending = self._pending, None
        if job is not None:
            job.cancelled = True

    def _work(self, job: _Opening) -> None:
        try:
            run: RemoteFollow | None = RemoteFollow.open(job.target)
            problem = ""
        except RemoteError as exc:
            run, problem = None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failure to open is told, never raised into a thread's void
            run, problem = None, f"{job.target}: cannot open the run ({exc!r})"
        if job.cancelled:
            if run is not None:
                run.remote.close()  # here, on this thread: nothing stays running there
            return
        try:
            self._said.emit(job, run, problem)
        except RuntimeError:  # the window went away meanwhile
            if run is not None:
                run.remote.close()

    def _delivered(self, job: _Opening, run: RemoteFollow | None, problem: str) -> None:
        if job is not self._pending:  # called off while it opened
            if run is not None:
                run.close()
            return
        self._pending = None
        if run is None:
            self.failed.emit(problem)
        else:
            self.opened.emit(run)
