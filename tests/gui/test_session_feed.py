"""A live run's events on their way to the GUI thread (gui/session_feed.py): queued on the run's thread, folded on
the GUI thread at most every DRAIN_INTERVAL_MS, and at once where an event finds the queue drained and the last
batch folded is old enough."""

from __future__ import annotations

import threading
import time
from typing import Any

from engine.observe.telemetry import RunState
from gui.session_feed import EventFeed


def step(n: int) -> dict[str, Any]:
    return {"v": 1, "kind": "step", "task": "worker:0", "t": 1_800_000_000.0 + n, "replica": 0, "step": n,
            "loss": 1.0 / n}


def put_from_a_thread(put: Any, event: dict[str, Any]) -> None:
    """As a run's dispatcher does: on a thread of its own."""
    sender = threading.Thread(target=put, args=(event,))
    sender.start()
    sender.join()


def test_an_event_to_a_drained_queue_is_folded_without_waiting_for_the_timer(qtbot: Any) -> None:
    feed = EventFeed()
    state = RunState()
    feed.due.connect(lambda: feed.fold_into(state))
    put = feed.listener()
    feed.start()
    feed._timer.setInterval(3_600_000)  # the timer never ticks here: only a wake can make the feed due
    with qtbot.waitSignal(feed.due, timeout=5000):
        put_from_a_thread(put, step(1))
    assert state.replicas[0].step == 1
    feed._folded_at = time.monotonic() + 3600  # a batch as if just folded: a wake waits for the timer
    with qtbot.assertNotEmitted(feed.due, wait=200):
        put_from_a_thread(put, step(2))
    assert state.replicas[0].step == 1 and not feed.empty()
    feed._folded_at = -1e9  # long ago, but the queue was not drained since: no wake was asked; the timer's tick folds
    with qtbot.assertNotEmitted(feed.due, wait=200):
        put_from_a_thread(put, step(3))
    feed._timer.setInterval(10)
    with qtbot.waitSignal(feed.due, timeout=5000):
        pass
    assert state.replicas[0].step == 3 and feed.empty()
    feed.stop()


def test_a_stopped_feed_is_not_woken(qtbot: Any) -> None:
    feed = EventFeed()
    put = feed.listener()
    with qtbot.assertNotEmitted(feed.due, wait=200):
        put_from_a_thread(put, step(1))  # never started (no run shown)
