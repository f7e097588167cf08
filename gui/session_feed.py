"""A live run's events on their way to the screen: enqueued on the run's dispatcher thread (nothing else is done
there) and folded into the shown :class:`~engine.observe.telemetry.RunState` on the GUI thread, a batch each time
the feed is ``due`` (at most every :data:`DRAIN_INTERVAL_MS`: <= 30 Hz, never per event).

:class:`~gui.run_session.RunSession` owns one and says, after each batch, what the run's views are told.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from engine.control.memory import TRIM_INTERVAL_S, trim_heap
from engine.observe.telemetry import RunState

DRAIN_INTERVAL_MS = 33  # <= 30 Hz: events are folded and views told at most this often
#: The most events one batch folds: the rest wait for the next, so the GUI thread answers meanwhile.
BATCH_MAX = 50_000


class EventFeed(QObject):
    """The queue between a live run's thread and the GUI thread, and the timer that drains it.

    An event that finds the queue drained wakes the GUI thread (:attr:`_woken`, queued across threads): where the
    last batch folded is :data:`DRAIN_INTERVAL_MS` old it is folded at once, not at the timer's next tick (a point
    of a run reporting under 30 times a second reaches its curve in the time its fold and draw take). Batches are
    never folded more often than that."""

    due = Signal()  # time to fold a batch
    _woken = Signal()  # emitted on the run's thread; handled on the GUI thread

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._timer = QTimer(self)
        self._timer.setObjectName("drainTimer")
        self._timer.setInterval(DRAIN_INTERVAL_MS)
        self._timer.timeout.connect(self.due)
        self._woken.connect(self._wake, Qt.ConnectionType.QueuedConnection)
        self._folded_at = -math.inf  # when the last batch of events was folded (monotonic seconds)
        self._asleep = True  # the queue was found empty since: the next event wakes the GUI thread
        self._trimmed_at = time.monotonic()

    def listener(self) -> Callable[[dict[str, Any]], None]:
        """What the next run calls with each event, on its own thread (a fresh queue: what an earlier run left
        unfolded is dropped). Only enqueues, and wakes the GUI thread where the queue was drained."""
        events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._events = events
        put = events.put

        def enqueue(event: dict[str, Any]) -> None:
            put(event)
            if self._asleep:
                self._asleep = False
                self._woken.emit()

        return enqueue

    def _wake(self) -> None:
        """An event came to a drained queue: fold now where the last batch is old enough, else at the next tick."""
        if self._timer.isActive() and time.monotonic() - self._folded_at >= DRAIN_INTERVAL_MS / 1000:
            self._timer.start()  # the next tick a whole interval from now
            self.due.emit()

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
                self._asleep = True  # drained: the next event wakes the GUI thread (an event put meanwhile waits a tick)
                break
            state.apply(event)
            count += 1
        if count:
            self._folded_at = time.monotonic()
        if count and time.monotonic() - self._trimmed_at >= TRIM_INTERVAL_S:
            # hours of folding and drawing leave free pages in the C heap: given back now and then
            trim_heap()
            self._trimmed_at = time.monotonic()
        return count
