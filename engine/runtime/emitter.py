"""The task side of telemetry: events to the run folder (durable) and to the supervisor (live)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.contract import events


class Emitter:
    """Writes each event to the task's ``events.jsonl`` first, then to the supervisor's pipe.

    Thread-safe. A broken pipe (supervisor gone) leaves the file going: the
    lifeline watcher ends the process soon after anyway. Events emitted together
    (a report of every replica) may be sent in one :meth:`batch`. ``samples_to_file=False``: step and device
    samples go to the pipe only, so the task's file is not a second full copy of the run's samples.
    """

    def __init__(self, task: str, path: str | Path | None, fd: int | None = None, *,
                 samples_to_file: bool = True) -> None:
        self.task = task
        self.samples_to_file = samples_to_file
        self._lock = threading.Lock()
        # a full or unwritable run folder must not cost the pipe its events (the launcher then fails the run)
        self._file = events.EventWriter(path, keep_going=True) if path else None
        self._fd = fd
        self._batch = threading.local()  # a thread's lines held by batch(), or none
        #: called after each write (from the writing thread, outside the lock): the task's look for a profile
        #: request (``engine.runtime.diagnostics``) rides on the events it sends anyway, with no thread of its own
        self.after_write: Callable[[], None] | None = None

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = events.make(kind, self.task, **fields)
        line = events.encode(event)
        to_file = self.samples_to_file or kind not in events.SAMPLE_KINDS
        held: list[tuple[str, bool]] | None = getattr(self._batch, "lines", None)
        if held is not None:
            held.append((line, to_file))
        else:
            self._write(line, line if to_file else "")
        return event

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The events this thread emits inside the block go out together when it ends: one write to the
        file and one to the pipe, so the supervisor (and the launcher after it) wakes once for them, not
        once per event. Held lines are written even when the block raises."""
        if getattr(self._batch, "lines", None) is not None:  # already in a batch: the outer one writes
            yield
            return
        self._batch.lines = []
        try:
            yield
        finally:
            lines, self._batch.lines = self._batch.lines, None
            if lines:
                self._write("".join(line for line, _ in lines), "".join(line for line, to_file in lines if to_file))

    def _write(self, piped: str, filed: str) -> None:
        """``piped`` to the supervisor, ``filed`` (the same lines less the samples kept off the file) to the file."""
        with self._lock:
            if self._file is not None and filed:
                self._file.write_line(filed)
            if self._fd is not None:
                try:
                    os.write(self._fd, piped.encode("utf-8"))
                except OSError:
                    self._fd = None
        after = self.after_write
        if after is not None:
            try:
                after()
            except Exception:  # noqa: BLE001 - an event written matters more than what rides on it
                pass

    def status(self, state: str, **fields: Any) -> None:
        self.emit("status", state=state, pid=os.getpid(), **fields)

    def info(self, message: str, **fields: Any) -> None:
        self.emit("info", message=message, **fields)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None
