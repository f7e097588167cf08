"""A live run's events on their way to the screen: enqueued on the run's dispatcher thread (nothing else is done
there) and folded into the shown :class:`~engine.observe.telemetry.RunState` on the GUI thread, a batch each time
the feed is ``due`` (at most every :data:`DRAIN_INTERVAL_MS`: <= 30 Hz, never per event).

:class:`~gui.run_session.RunSession` owns one and says, after each batch, what the run's views are told.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from engine.control.memory import TRIM_INTERVAL_S, trim_heap
from engine.observe.telemetry import RunState

DRAIN_INTERVAL_MS = 33  # <= 30 Hz: events are folded and views told at most this often
#: The most events one batch folds: the rest wait for the next, so the GUI thread answers meanwhile.
BATCH_MAX = 50_000


class EventFeed(QObject):
    """The queue between a live run's thread and the GUI thread, and the timer that drains it."""

    due = Signal()  # time to fold a batch

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._timer = QTimer(self)
        self._timer.setObjectName("drainTimer")
        self._timer.setInterval(DRAIN_INTERVAL_MS)
        self._timer.timeout.connect(self.due)
        self._trimmed_at = time.monotonic()

    def listener(self) -> Callable[[dict[str, Any]], None]:
        """What the next run calls with each event, on its own thread (a fresh queue: what an earlier run left
        unfolded is dropped)."""
        self._events = queue.SimpleQueue()
        return self._events.put

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def empty(self) -> bool:
        return self._events.empty()

    def fold_into(self, state: RunState) -> int:
        """Fold the queued events (at most :data:`BATCH_MAX`) into ``state``; returns how many."""
        count = 0
        while count < BATCH_MAX:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            state.apply(event)
            count += 1
        if count and time.monotonic() - self._trimmed_at >= TRIM_INTERVAL_S:
            # hours of folding and drawing leave free pages in the C heap: given back now and then
            trim_heap()
            self._trimmed_at = time.monotonic()
        return count
