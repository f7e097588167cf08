"""The record a run keeps in its folder while it runs: ``events.jsonl``, ``series/``, ``run.json``, and a
watch on them.

:class:`RunRecord` is what the launcher's dispatcher writes through; the
:class:`~engine.contract.run_folder.RunFolder` owns the paths and the atomic writes. Lifecycle events
(status, info, run, eval, progress, placement) go to ``events.jsonl``: it holds each event's line and
writes what it holds with one system call when the dispatcher's queue runs dry, at least every
:data:`FLUSH_S` seconds or once :data:`FLUSH_BYTES` are held (whole lines only, also after a failed
write: see :class:`~engine.contract.events.EventWriter`). Step and device samples go to the tiered store
``series/`` (:class:`~engine.contract.series_store.SeriesWriter`): held as they come, written as one
record batch per group at least every :data:`SERIES_FLUSH_S` seconds or :data:`SERIES_FLUSH_EVENTS`
events (not whenever the queue runs dry: each batch costs a few hundred bytes of framing and ~1 ms of
summarising, while the live views get events from the launcher, not from the disk). It rewrites ``run.json`` once per
burst of ``run`` and ``status`` events, and on the dispatcher's ticks at most every
:data:`META_INTERVAL_S` seconds while events keep coming.

A folder that can no longer be written (a full disk, a file made immutable) or that vanished (deleted
or moved: it is never recreated) is reported once, through the ``on_failure`` callback, with a reason
a user can act on; the record then writes no more events. It starts no thread and takes no lock of
the run: every call but the first ``run.json`` comes from the dispatcher thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.contract import events
from engine.contract.records import TERMINAL
from engine.contract.run_folder import RunFolder
from engine.contract.series_store import Retention, SeriesWriter

__all__ = ["FLUSH_BYTES", "FLUSH_S", "META_INTERVAL_S", "RunRecord"]

#: ``events.jsonl`` is written when the dispatcher's queue runs dry, and at least this often (seconds)
#: or once this many bytes are held, whichever comes first, while events keep coming.
FLUSH_S = 0.1
FLUSH_BYTES = 1 << 20
#: Samples are written to ``series/`` at least this often (seconds) and once this many are held: what a
#: killed launcher can lose of them (the tasks' own files keep theirs until the emitter stops copying).
SERIES_FLUSH_S = 0.5
SERIES_FLUSH_EVENTS = 50_000
META_INTERVAL_S = 1.0  # run.json is rewritten at most this often while the run runs
#: The states a run ends in (:class:`engine.control.lifecycle.EndState`): once one is decided, a
#: ``run.json`` that cannot be written fails nothing more.
#: Events that change what ``run.json`` says (the run's state, a task's state or pid).
META_KINDS = ("run", "status")


class RunRecord:
    """``events.jsonl`` and ``run.json`` of one run, written in bursts, and the run folder watched.

    ``describe()`` gives ``run.json``'s fields of the moment (``state`` among them; the folder adds
    ``created`` and ``updated``); ``on_failure(reason)`` is called when the folder fails the run.
    Opening the record opens ``events.jsonl`` (an ``OSError`` reaches the caller).
    """

    def __init__(self, folder: RunFolder, *, describe: Callable[[], dict[str, Any]],
                 on_failure: Callable[[str], None], flush_s: float = FLUSH_S, flush_bytes: int = FLUSH_BYTES,
                 meta_interval_s: float = META_INTERVAL_S, series: bool = True,
                 retention: Retention | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        self._clock = clock  # monotonic seconds: every flush and rewrite interval is judged by it (tests pass their own)
        self.flush_s = flush_s
        self.flush_bytes = flush_bytes
        self.meta_interval_s = meta_interval_s
        self._describe = describe
        self._on_failure = on_failure
        self._writer: events.EventWriter | None = events.EventWriter(folder.events, clock=clock)
        #: ``series=False``: every event to ``events.jsonl``, as before the tiers.
        self._series: SeriesWriter | None = SeriesWriter(folder.path / "series", retention) if series else None
        self._series_at = self._clock()  # when series/ was last written
        self._closed = False
        self._meta_at = 0.0  # the clock's time of the last run.json written (or tried)
        self._recorded = 0  # events recorded so far
        self._meta_recorded = -1  # ... when run.json was last written
        self._meta_due = False  # a run or status event since: run.json once the burst ends
        #: the run's end is held for events.jsonl: series/ is written before it, so whoever follows the folder and
        #: stops at the end has every sample before the end on disk when it reads the end
        self._end_held = False

    @property
    def writing(self) -> bool:
        """False once the folder failed or the record was closed: events are no longer written."""
        return self._writer is not None

    # -- events.jsonl

    def write_event(self, event: dict[str, Any], line: bytes | None = None) -> None:
        """``event`` held for the next flush, as ``line`` where one is given (a whole JSON line as
        received), else encoded. A ``run`` or ``status`` event makes ``run.json`` due."""
        self._recorded += 1
        kind = event.get("kind")
        if kind in META_KINDS:
            self._meta_due = True
            if kind == "run" and event.get("state") in TERMINAL:
                self._end_held = True
        if self._writer is not None:
            if self._series is not None and self._series.add(event):
                return
            self._writer.hold(line if line is not None else events.encode(event).encode("utf-8"))

    def flush(self) -> None:
        """Write every held sample, then every held line, now; a failure fails the run (see
        :meth:`folder_problem`)."""
        if self._writer is None:
            return
        self._flush_series()
        self._flush_events()

    def _flush_events(self) -> None:
        writer = self._writer
        if writer is None:
            return
        if self._end_held:
            self._end_held = False
            self._flush_series()  # the samples before the end are on disk before the end is
            writer = self._writer
            if writer is None:
                return
        try:
            writer.flush()
        except OSError as exc:
            self._fail(self.folder_problem(exc, self.folder.events))

    def _flush_series(self) -> None:
        self._series_at = self._clock()
        if self._series is None or not self._series.held:
            return
        try:
            self._series.flush()
        except OSError as exc:
            self._fail(self.folder_problem(exc, self._series.root))

    def catch_up(self, queue_dry: Callable[[], bool]) -> None:
        """After each turn of the dispatcher: flush what is held if the queue ran dry (``queue_dry()``),
        the oldest line waited :attr:`flush_s` or :attr:`flush_bytes` are held; then write ``run.json``
        if a burst of ``run``/``status`` events ended (or went on for :attr:`meta_interval_s`)."""
        writer = self._writer
        if writer is not None and writer.held_since and (
                queue_dry() or writer.held_bytes >= self.flush_bytes
                or self._clock() - writer.held_since >= self.flush_s):
            self._flush_events()
        series = self._series
        if series is not None and self._writer is not None and series.held and (
                series.held >= SERIES_FLUSH_EVENTS or self._clock() - self._series_at >= SERIES_FLUSH_S):
            self._flush_series()
        if self._meta_due and (queue_dry() or self._clock() - self._meta_at >= self.meta_interval_s):
            self._meta_due = False  # a task's or the run's new state: once per burst, not per event
            self.update_meta(force=True)

    # -- the folder

    def check_folder(self) -> None:
        """A deleted or moved run folder fails the run (it is never silently recreated); so does an ``events.jsonl``
        that can no longer be written (made immutable, its file system remounted read-only), found even while only
        samples come (they go to ``series/``, flushed less often)."""
        if self._writer is None:
            return
        if not self._writer.alive() or not self.folder.path.is_dir():
            self._fail(self._vanished())
        elif not os.access(self.folder.events, os.W_OK):
            try:  # the write's own error, in the user's words (access() says only no)
                with open(self.folder.events, "ab"):
                    pass
            except OSError as exc:
                self._fail(self.folder_problem(exc, self.folder.events))

    def folder_problem(self, exc: OSError, path: Path) -> str:
        """What a failed write of ``path`` tells the user (a file or folder of the run gone from under it: the folder
        was deleted or moved, or is being deleted while the folder itself is still there)."""
        if not self.folder.path.is_dir() or isinstance(exc, FileNotFoundError):
            return self._vanished()
        return f"the run folder cannot be written ({exc.strerror or exc}: {path})"

    def _vanished(self) -> str:
        return (f"the run folder vanished ({self.folder.path} was deleted or moved); nothing more of this "
                "run can be saved")

    def _fail(self, reason: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._close_series(write=False)  # a folder that failed or vanished is written no more (nor recreated)
        self._on_failure(reason)

    # -- run.json

    def update_meta(self, force: bool = False) -> None:
        """``run.json`` rewritten if events came since it was last written and :attr:`meta_interval_s`
        passed (``force``: now). Nothing once the record is closed."""
        if self._closed:
            return
        if not force and (self._clock() - self._meta_at < self.meta_interval_s
                          or self._recorded == self._meta_recorded):
            return
        self.write_meta()

    def write_meta(self, state: str | None = None, *, strict: bool = False, **extra: Any) -> None:
        """``run.json``: ``describe()``'s fields, ``state`` (where given) and ``extra`` over them. A failure
        to write fails the run, unless ``state`` is an end state (the end was decided already: the
        folder's trouble is in the reason or beyond help); ``strict``: the ``OSError`` is raised."""
        self._meta_at, self._meta_recorded = self._clock(), self._recorded
        fields = self._describe()
        if state is not None:
            fields["state"] = state
        fields.update(extra)
        try:
            self.folder.write_meta(**fields)
        except OSError as exc:
            if strict:
                raise
            if fields.get("state") in TERMINAL:
                return
            self._fail(self.folder_problem(exc, self.folder.run_json))

    def close(self) -> None:
        """Flush what is held (a failure is kept, not raised: the run has ended) and close ``events.jsonl``;
        ``run.json`` is no longer written."""
        self._closed = True
        if self._writer is not None:
            self._close_series()  # the samples first: a follower that reads the end has every sample before it
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _close_series(self, write: bool = True) -> None:
        """Write what is held and every open bucket's summary (``write``); a failure is kept (the run
        has ended)."""
        series, self._series = self._series, None
        if series is not None:
            try:
                series.close(write=write)
            except OSError:
                pass
