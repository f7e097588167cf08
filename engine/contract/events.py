"""Versioned telemetry events: what a task emits, what the launcher reads.

An event is one JSON object on one line. Readers never trust a line: a
malformed, over-long or unknown one is counted and skipped.

Every kind (field ``kind``: ``step``, ``eval``, ``device``, ``status``, ``info``, ``progress``, ``run``,
``placement``) and every field of each, with its JSON types and whether it is required, is declared once in
:mod:`engine.contract.records`; docs/events.md is generated from it. All share ``v`` (schema version),
``task`` and ``t`` (wall time, seconds since the epoch). :func:`decode` checks a line against those records.

Commands (launcher to supervisor, on the supervisor's stdin) are versioned JSON lines too, made by
:func:`make_command` and read strictly by :func:`decode_command`: ``{"v": 1, "command": "stop",
"state": "stopped"|"finished", "reason": ..., "grace_s": ...}``, ``{"v": 1, "command": "restart",
"task": ..., "reason": ...}``, ``{"v": 1, "command": "signal", "task": ..., "signal": "SIGKILL"}``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.contract import records
from engine.contract.records import COMMAND_VERSION, EVENT_VERSION
from engine.contract.run_folder import MAX_LINE_BYTES, OVERLONG, LineSplitter, bounded_lines

#: Every command and the fields it takes: name -> {field: type}; all listed fields but ``reason`` and
#: ``grace_s`` are required (declared in :data:`engine.contract.records.COMMANDS`).
COMMANDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    name: {x.name: x.types[0] if len(x.types) == 1 else x.types for x in fields}
    for name, (_, fields) in records.COMMANDS.items()
}
_OPTIONAL_COMMAND_FIELDS = ("reason", "grace_s", "state")
KINDS = tuple(records.EVENTS)
STATES = tuple(s.value for s in records.TaskState)
#: Metrics one step or eval event may carry, and the longest name of one.
MAX_METRICS = 64
MAX_METRIC_NAME = 100


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


#: The samples: nearly every event of a run (a replica's step report, a task's device use). Kept in the run folder's
#: tiered store (``series/``), not in ``events.jsonl``; written by a task to its pipe only; relayed by a supervisor as
#: its task wrote them, undecoded, where a line is that task's own (:func:`own_sample`): the launcher decodes them,
#: once, and takes a row of them at a time.
SAMPLE_KINDS = ("step", "device")


def sample_prefixes(task: str) -> tuple[bytes, ...]:
    """How task ``task``'s emitter begins its sample lines (:func:`make`, then :func:`encode`), one per kind of
    :data:`SAMPLE_KINDS`: ``{"v":<EVENT_VERSION>,"kind":"step","task":<task, JSON-encoded>,``."""
    name = json.dumps(task).encode("ascii")
    return tuple(b'{"v":%d,"kind":"%s","task":%s,' % (EVENT_VERSION, kind.encode("ascii"), name)
                 for kind in SAMPLE_KINDS)


def own_sample(line: bytes, prefixes: tuple[bytes, ...]) -> bool:
    """Whether ``line`` may be relayed as received by the reader of one task's stream: it begins with exactly one of
    ``prefixes`` (:func:`sample_prefixes` of that task), ends with ``}`` and its newline, and names no ``v``,
    ``kind`` or ``task`` again after its prefix, nor holds an escape that could spell one (JSON's last key wins):
    whatever decodes it reads a sample of that task, never another's, never a status. Its fields are not checked
    here: its reader (the launcher) decodes it, and counts it there if it is bad. Any other line is for
    :func:`decode`."""
    for prefix in prefixes:
        if line.startswith(prefix):
            n = len(prefix)  # searched from there: no copy of the rest
            return (line.endswith(b"}\n") and line.find(b"\\", n) < 0 and line.find(b'"task"', n) < 0
                    and line.find(b'"kind"', n) < 0 and line.find(b'"v"', n) < 0)
    return False


def decode(line: str | bytes) -> dict[str, Any] | None:
    """The event on ``line``, or None when it is not a valid event.

    A line longer than :data:`MAX_LINE_BYTES` (UTF-8 bytes, line ending not counted) is rejected.
    """
    if isinstance(line, bytes):
        # its line ending stays (JSON's whitespace, for orjson as for json): stripped only to count a long line
        if len(line) > MAX_LINE_BYTES and len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            return None
    else:
        line = line.rstrip("\r\n")
        # a character is 1 to 4 bytes: count bytes only where it matters
        if len(line) > MAX_LINE_BYTES or (
            len(line) * 4 > MAX_LINE_BYTES and len(line.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES
        ):
            return None
    event = _fast_event(line)
    if event is None:
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                return None
        line = line.strip()
        if not line.startswith("{"):
            return None
        event = _versioned_object(line, EVENT_VERSION, parse_constant=_null, parse_float=_finite_float,
                                  parse_int=_int64)
    if event is None:
        return None
    kind = event.get("kind")
    if kind not in KINDS:
        return None
    # every declared field of the kind (``v``, ``kind``, ``task``, ``t`` among them) there and of its types
    if not records.well_typed_decoded(kind, event):  # type: ignore[arg-type]
        return None
    if not -_T_LIMIT < event["t"] < _T_LIMIT:
        return None  # no clock reads that: the number only broke a reader's limits
    if kind == "step" and (event["replica"] < 0 or event["step"] < 0):
        return None  # both integers (declared, required): no negative ones
    if "metrics" in event and (kind == "step" or kind == "eval") and not valid_metrics(event["metrics"]):
        return None
    return event


_T_LIMIT = 2.0**63  # a time beyond 64 bits is no time


def valid_metrics(metrics: Any) -> bool:
    """A ``metrics`` field: a mapping of at most :data:`MAX_METRICS` names to numbers or nulls."""
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        return False
    for name, value in metrics.items():
        if not name or len(name) > MAX_METRIC_NAME:
            return False
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return False
    return True


# Numbers no reader can use read as null, as :func:`encode` writes non-finite floats: ``NaN`` and
# ``Infinity`` (not JSON, yet Python writes them), floats that overflow (``1e999``) and integers
# beyond 64 bits (which would break every later ``float()``).


def _fast_event(line: str | bytes) -> dict[str, Any] | None:
    """The versioned event object on ``line`` parsed by orjson (about ten times faster than ``json``), or None
    where orjson refuses the line. It refuses exactly what needs the careful reader below (``NaN``,
    ``Infinity``, a float that overflows, invalid UTF-8, anything not JSON) and reads integers beyond 64
    bits as floats, so what it returns holds no number a later ``float()`` could break on."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if obj.__class__ is not dict:
        return None
    v = obj.get("v")
    if v.__class__ is not int or v != EVENT_VERSION:
        return None
    return obj


def _versioned_object(line: str, version: int, **parse: Any) -> dict[str, Any] | None:
    """The JSON object on ``line`` when its ``v`` is ``version`` (events and commands share the framing)."""
    try:
        obj = json.loads(line, **parse)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    v = obj.get("v")
    if not isinstance(v, int) or isinstance(v, bool) or v != version:
        return None
    return obj


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


class StreamDecoder:
    """The one reader of an event stream fed in chunks (a supervisor's stdout in the launcher, a task's event
    pipe in the supervisor): bytes are split into lines of at most :data:`MAX_LINE_BYTES`
    (:class:`~engine.contract.run_folder.LineSplitter`), each decoded with :func:`decode`; a bad line
    (over-long, not an event) is counted in ``stats`` and skipped, a blank one ignored.

    :meth:`feed` and :meth:`finish` give ``(event, raw line)`` pairs, the line as received (its newline kept).

    A relay of one task's stream (the supervisor) gives ``own``, the task's :func:`sample_prefixes`, and reads with
    :meth:`relayed`: a line that is the task's own sample (:func:`own_sample`) comes undecoded, to pass on as it is.
    """

    __slots__ = ("stats", "lines", "own")

    def __init__(self, stats: ReadStats | None = None, lines: LineSplitter | None = None,
                 own: tuple[bytes, ...] = ()) -> None:
        self.stats = stats if stats is not None else ReadStats()
        self.lines = lines if lines is not None else LineSplitter()
        self.own = own

    def feed(self, chunk: bytes) -> list[tuple[dict[str, Any], bytes]]:
        """The events of every line ``chunk`` completes (a line left open waits for the next chunk)."""
        return self._decoded(self.lines.feed(chunk))

    def finish(self) -> list[tuple[dict[str, Any], bytes]]:
        """The event of the last line of an ended stream (one without a final newline), if any."""
        return self._decoded(self.lines.finish())

    def decode_line(self, line: bytes) -> dict[str, Any] | None:
        """One whole line's event, or None (a bad line counted, a blank one not)."""
        if line is OVERLONG:
            self.stats.note_bad(b"over-long line")
            return None
        event = decode(line)
        if event is None:
            if line.strip():
                self.stats.note_bad(line)
            return None
        self.stats.good += 1
        return event

    def relayed(self, lines: list[bytes]) -> list[tuple[dict[str, Any] | None, bytes]]:
        """Whole lines (of :attr:`lines`) as a relay passes them on, in order: ``(None, lines)`` for the task's own
        samples in a row, not decoded, joined (:func:`own_sample`; counted good: their reader decodes them),
        ``(event, line)`` for any other valid event (:meth:`decode_line`: a bad line counted and left out)."""
        own = self.own
        out: list[tuple[dict[str, Any] | None, bytes]] = []
        passed: list[bytes] = []
        good = 0
        for line in lines:
            if own and own_sample(line, own):
                passed.append(line)
                good += 1
                continue
            event = self.decode_line(line)
            if event is not None:
                if passed:
                    out.append((None, b"".join(passed)))
                    passed = []
                out.append((event, line))
        if passed:
            out.append((None, b"".join(passed)))
        self.stats.good += good
        return out

    def _decoded(self, lines: list[bytes]) -> list[tuple[dict[str, Any], bytes]]:
        out = []
        for line in lines:
            event = self.decode_line(line)
            if event is not None:
                out.append((event, line))
        return out


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


def make_command(command: str, **fields: Any) -> str:
    """One command line for a supervisor's stdin (see the module docstring)."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    return json.dumps({"v": COMMAND_VERSION, "command": command, **fields}, separators=(",", ":")) + "\n"


def decode_command(line: str | bytes) -> dict[str, Any] | None:
    """The command on ``line``, or None: wrong version, unknown command, a missing or mistyped field,
    an unknown field, or not JSON at all."""
    if isinstance(line, bytes):
        if len(line) > MAX_LINE_BYTES:
            return None
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    cmd = _versioned_object(line, COMMAND_VERSION, parse_constant=_null)
    if cmd is None:
        return None
    fields = COMMANDS.get(cmd.get("command"))  # type: ignore[arg-type]
    if fields is None:
        return None
    for key, value in cmd.items():
        if key in ("v", "command"):
            continue
        wanted = fields.get(key)
        if wanted is None or not isinstance(value, wanted) or isinstance(value, bool):
            return None
    missing = [k for k in fields if k not in cmd and k not in _OPTIONAL_COMMAND_FIELDS]
    return None if missing else cmd


class EventWriter:
    """Appends events to a JSON-lines file, one whole line per ``write`` call, so a crash loses none.

    A line is written with a single ``write`` on an append-only descriptor; when it fails (a full
    disk, a file made immutable) the file is cut back to where the line began, so what is there stays
    valid JSON lines. The ``OSError`` then reaches the caller, unless ``keep_going``: then it is kept in
    :attr:`error` and the file is no longer written (a task keeps sending its events on its pipe).

    A busy writer may instead :meth:`hold` lines and :meth:`flush` them with one ``write`` (the launcher's
    dispatcher flushes when its queue runs dry, and at least every 0.1 s); a failed flush cuts the file
    back to the end of the last whole line it wrote. :meth:`close` flushes what is still held.
    """

    def __init__(self, path: str | Path, *, keep_going: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        self._clock = clock  # monotonic seconds (tests pass their own)
        self.keep_going = keep_going
        self.error: OSError | None = None
        self._lock = threading.Lock()
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._held: list[bytes] = []
        self._held_bytes = 0
        #: the clock's time when the oldest line still held was held (0.0: none held).
        self.held_since = 0.0

    def write(self, event: dict[str, Any]) -> None:
        self.write_line(encode(event))

    def write_line(self, line: str) -> None:
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
        with self._lock:
            if self._held:
                data = self._take_held() + data  # in order after what is held
            self._write(data)

    def hold(self, line: bytes) -> None:
        """Keep ``line`` (one whole JSON line, ending in a newline) for the next :meth:`flush`."""
        with self._lock:
            if not self._held:
                self.held_since = self._clock()
            self._held.append(line)
            self._held_bytes += len(line)

    @property
    def held_bytes(self) -> int:
        """Bytes held for the next :meth:`flush`."""
        return self._held_bytes

    def flush(self) -> None:
        """Write every held line with one system call (see :meth:`write_line` for failures)."""
        with self._lock:
            if self._held:
                self._write(self._take_held())

    def _take_held(self) -> bytes:
        data = b"".join(self._held)
        self._held = []
        self._held_bytes = 0
        self.held_since = 0.0
        return data

    def _write(self, data: bytes) -> None:
        """``data`` (whole lines) appended; the lock is held."""
        fd = self._fd
        if fd is None:
            return
        start = -1
        written = 0
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (wrote {written} of {len(data)} bytes)")
        except OSError as exc:
            if start >= 0:
                try:
                    os.ftruncate(fd, start + data.rfind(b"\n", 0, written) + 1)  # no half line
                except OSError:
                    pass
            if not self.keep_going:
                raise
            self.error = exc
            self._close()

    def alive(self) -> bool:
        """False once the file was removed or replaced under the writer (its folder deleted)."""
        with self._lock:
            if self._fd is None:
                return False
            try:
                mine = os.fstat(self._fd)
                there = os.stat(self.path)
            except OSError:
                return False
            return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino) and mine.st_nlink > 0

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        self._held = []
        self._held_bytes = 0
        self.held_since = 0.0

    def close(self) -> None:
        """Flush what is held (a failure is kept in :attr:`error`, not raised) and close the file."""
        with self._lock:
            if self._held and self._fd is not None:
                try:
                    self._write(self._take_held())
                except OSError as exc:
                    self.error = exc
            self._close()
