"""Straggler flags for the views: an :class:`engine.observe.stragglers.StragglerDetector` fed from the shown run.

Events reach the detector two ways: a live run's listener (on the run's dispatcher thread: it only
enqueues) drained on the GUI thread whenever the controller folds new events, and an opened run
folder's events (``events.jsonl`` and the recent rows of ``series/``) replayed once, after the window shows the
run, :data:`REPLAY_SLICE` events per turn of the event loop. Views read :attr:`StragglerWatch.flagged` and listen to
:attr:`StragglerWatch.changed`.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from engine.contract.run_folder import RunFolder
from engine.observe.run_reader import EventFileReader
from engine.observe.stragglers import StragglerChange, StragglerDetector
from gui.run_session import RunSession

#: Events of an opened folder fed to the detector per turn of the event loop (~15 ms of the GUI thread: the plots
#: draw in between).
REPLAY_SLICE = 1024


def describe_change(change: StragglerChange) -> str:
    """``replica 1 (worker:1): step 120 ms vs median 80 ms (1.50×)``."""
    return (f"replica {change.replica} ({change.task}): step {change.step_time * 1000:.0f} ms vs median "
            f"{change.median * 1000:.0f} ms of the others ({change.ratio:.2f}×)"
            + (f": {change.cause}" if change.cause else ""))


class StragglerWatch(QObject):
    """Which replicas of the session's run are straggling now (``{replica: StragglerChange}``)."""

    changed = Signal()

    def __init__(self, session: RunSession, detector: StragglerDetector | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent if parent is not None else session)
        self.session = session
        self.detector = detector if detector is not None else StragglerDetector()
        self.flagged: dict[int, StragglerChange] = {}
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._attached: Any = None
        self._replays = 0  # folders replayed so far: a replay goes on only while it is the latest
        session.runLoaded.connect(self._run_loaded)
        session.runUpdated.connect(self.drain)
        session.runStateChanged.connect(lambda _s: self.drain())

    def _run_loaded(self) -> None:
        """A new run (or run folder, or none) is shown: start over."""
        self._replays += 1  # a replay under way is dropped
        self.detector.reset()
        self._queue = queue.SimpleQueue()
        had = bool(self.flagged)
        self.flagged = {}
        run = self.session.run
        if run is not None and run is not self._attached:
            # the session starts the run before telling us: a straggler needs seconds of steps, so
            # the few events that may precede this listener never decide a flag
            self.session.add_listener(self._queue.put)
            self._attached = run
        elif run is None and self.session.run_dir is not None:
            # the folder's events replayed after the window shows the run, a slice per turn of the event loop (the
            # plots' first frames come first; the views hear once, at the end)
            self._replays += 1
            token, run_dir = self._replays, self.session.run_dir
            QTimer.singleShot(0, lambda: self._replay(token, run_dir, None, 0))
        if had:
            self.changed.emit()

    def _replay(self, token: int, run_dir: Path, events: list[dict[str, Any]] | None, at: int) -> None:
        """Feed the detector :data:`REPLAY_SLICE` more of ``run_dir``'s events (read at the first call); the
        flags are said once all are in. Dropped once another run or folder (or the same again) is shown."""
        if token != self._replays:
            return
        if events is None:
            events = EventFileReader(RunFolder(run_dir).events).read_new()
        for event in events[at:at + REPLAY_SLICE]:
            self.detector.update(event)
        if at + REPLAY_SLICE < len(events):
            QTimer.singleShot(0, lambda: self._replay(token, run_dir, events, at + REPLAY_SLICE))
            return
        self.flagged = self.detector.flagged()
        if self.flagged:
            self.changed.emit()

    def drain(self) -> None:
        """Feed what the live run's listener queued (GUI thread)."""
        batch = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            self.feed(batch)

    def feed(self, events: list[dict[str, Any]]) -> list[StragglerChange]:
        """Give the detector events in order; ``changed`` is emitted once if any flag changed."""
        changes: list[StragglerChange] = []
        for event in events:
            changes += self.detector.update(event)
        if changes or (not events and self.flagged):
            self.flagged = self.detector.flagged()
            self.changed.emit()
        return changes

    def for_task(self, task: str) -> list[StragglerChange]:
        """The flagged replicas that run on ``task``."""
        return [c for _, c in sorted(self.flagged.items()) if c.task == task]

    def summary(self) -> str:
        """One line for the status bar ('' when nothing straggles)."""
        if not self.flagged:
            return ""
        worst = max(self.flagged.values(), key=lambda c: c.ratio)
        more = len(self.flagged) - 1
        return (f"⚠ Straggler: {describe_change(worst)}" + (f" and {more} more" if more else ""))
