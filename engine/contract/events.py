"""Versioned telemetry events: what a task emits, what the launcher reads.

An event is one JSON object on one line. Readers never trust a line: a
malformed, over-long or unknown one is counted and skipped.

Kinds (field ``kind``), all with ``v`` (schema version), ``task`` and ``t``
(wall time, seconds since the epoch):

- ``step``: ``replica``, ``step``, ``loss``, ``examples_per_sec``, ``step_time``
  (seconds) and optionally ``worker`` (async: the worker that ran the step).
- ``device``: ``cpu_percent``, ``rss_bytes``, and where known ``tf_bytes``,
  ``tf_peak_bytes``, ``gpu_util``, ``gpu_mem_bytes``, ``pid``.
- ``status``: ``state`` (one of :data:`STATES`), optional ``reason``, ``log_tail``,
  ``pid``, ``exit_code``.
- ``info``: ``message`` and any extra fields (e.g. ``emulated_gpus``).
- ``progress``: ``step``, ``total``, async queue figures ``scheduled``/``completed``.
- ``run``: run-level state from the launcher (``state``, ``reason``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from engine.contract.run_folder import MAX_LINE_BYTES, bounded_lines

EVENT_VERSION = 1
KINDS = ("step", "device", "status", "info", "progress", "run", "eval", "placement")
STATES = ("starting", "running", "finished", "failed", "stopped", "restarting")


def make(kind: str, task: str, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"v": EVENT_VERSION, "kind": kind, "task": task, "t": time.time()}
    event.update(fields)
    return event


def encode(event: dict[str, Any]) -> str:
    """One line of JSON that every reader can parse: non-finite floats become null, at any depth;
    numeric scalars of other libraries (``numpy.float32``) become plain numbers, any other value its text."""
    return json.dumps(_plain(event), separators=(",", ":"), allow_nan=False) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__index__"):
        return int(value)
    if hasattr(value, "__float__"):
        try:
            return _plain(float(value))
        except (TypeError, ValueError):
            pass
    return str(value)


def decode(line: str | bytes) -> dict[str, Any] | None:
    """The event on ``line``, or None when it is not a valid event.

    A line longer than :data:`MAX_LINE_BYTES` (UTF-8 bytes, line ending not counted) is rejected.
    """
    if isinstance(line, bytes):
        line = line.rstrip(b"\r\n")
        if len(line) > MAX_LINE_BYTES:
            return None
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        line = line.rstrip("\r\n")
        # a character is 1 to 4 bytes: count bytes only where it matters
        if len(line) > MAX_LINE_BYTES or (
            len(line) * 4 > MAX_LINE_BYTES and len(line.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES
        ):
            return None
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line, parse_constant=_null, parse_float=_finite_float, parse_int=_int64)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict):
        return None
    version = event.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version != EVENT_VERSION:
        return None
    if event.get("kind") not in KINDS:
        return None
    t = event.get("t")
    if not isinstance(event.get("task"), str) or not isinstance(t, (int, float)) or isinstance(t, bool):
        return None
    if event["kind"] == "step" and not _valid_step(event):
        return None
    return event


# Numbers no reader can use read as null, as :func:`encode` writes non-finite floats: ``NaN`` and
# ``Infinity`` (not JSON, yet Python writes them), floats that overflow (``1e999``) and integers
# beyond 64 bits (which would break every later ``float()``).


def _null(_: str) -> None:
    return None


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _int64(text: str) -> int | None:
    if len(text) > 20:
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _valid_step(event: dict[str, Any]) -> bool:
    replica, step = event.get("replica"), event.get("step")
    if not isinstance(replica, int) or isinstance(replica, bool) or replica < 0:
        return False
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return False
    for key in ("loss", "examples_per_sec", "step_time"):
        value = event.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return False
    return True


@dataclass
class ReadStats:
    good: int = 0
    bad: int = 0
    bad_samples: list[str] = field(default_factory=list)

    def note_bad(self, line: str | bytes) -> None:
        self.bad += 1
        if len(self.bad_samples) < 5:
            text = line if isinstance(line, str) else line[:200].decode("utf-8", "replace")
            self.bad_samples.append(text[:200])


def parse_lines(lines: Iterable[str | bytes], stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    stats = stats if stats is not None else ReadStats()
    for line in lines:
        if not line.strip():
            continue
        event = decode(line)
        if event is None:
            stats.note_bad(line)
        else:
            stats.good += 1
            yield event


def read_file(path: str | Path, stats: ReadStats | None = None) -> list[dict[str, Any]]:
    """All valid events of a JSON-lines file; a missing file reads as none."""
    stats = stats if stats is not None else ReadStats()
    try:
        with open(path, "rb") as fh:
            return list(parse_lines(bounded_lines(fh), stats))
    except OSError:
        return []


class EventWriter:
    """Appends events to a JSON-lines file, flushed per event so a crash loses none."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO | None = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, event: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(encode(event))

    def write_line(self, line: str) -> None:
        if self._fh is not None:
            self._fh.write(line if line.endswith("\n") else line + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
