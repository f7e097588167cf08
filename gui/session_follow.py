"""A run folder opened while its launcher still writes it (another process's run, not attached): read on every
:data:`FOLLOW_INTERVAL_MS`, its new events folded into the shown state until the run's end is read.

:class:`~gui.run_session.RunSession` owns one; following stops whenever the session shows something else.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from engine.observe.run_reader import ENDED, EventFileReader
from engine.observe.telemetry import RunState

FOLLOW_INTERVAL_MS = 500


class FolderFollower(QObject):
    """Follows one opened folder at a time through its :class:`EventFileReader`."""

    updated = Signal()  # new events folded into the state
    ended = Signal()  # the run's end was read (and following stopped)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._reader: EventFileReader | None = None
        self._state: RunState | None = None
        self._timer = QTimer(self)
        self._timer.setObjectName("followTimer")
        self._timer.setInterval(FOLLOW_INTERVAL_MS)
        self._timer.timeout.connect(self._tick)

    def follow(self, reader: EventFileReader, state: RunState) -> None:
        """Read on from where ``reader`` stopped, folding into ``state`` (the one the folder was read into)."""
        self._reader, self._state = reader, state
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        self._reader = self._state = None

    def _tick(self) -> None:
        reader, state = self._reader, self._state
        if reader is None or state is None:
            self._timer.stop()
            return
        new = reader.read_new()
        for event in new:
            state.apply(event)
        if new:
            self.updated.emit()
            if state.state in ENDED:
                self.stop()
                self.ended.emit()
