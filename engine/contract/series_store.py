"""A run's curves on disk in tiers: every point of a recent window, older points as bucket summaries.

A run folder's ``series/`` holds the ``step`` and ``device`` samples (the ``events.jsonl`` beside it
keeps the lifecycle: status, info, run, eval, progress, placement). Each *level* is a set of Arrow
IPC stream files (``series/<level>/<group>-<seq>.arrows``, LZ4-compressed buffers), one group for
replicas (``step``: x is the step) and one for tasks (``device``: x is the wall time):

- ``raw``: one row per event (owner, t, step, one float32 column per numeric field, null where the
  event had none), kept for :attr:`Retention.raw_s` (an hour by default);
- ``1s``, ``5s``, ``30s``, ``300s``, ``3000s``: one row per owner and wall-time bucket of that width (aligned
  to the epoch): the events it summarises (``n``), first and last t and step, and per field its
  ``min``, ``max``, ``mean``, ``last`` and ``count``. Each tier is folded from the one below while the
  run runs, so a curve can be drawn at any zoom with its envelope; ``1s`` is kept for
  :attr:`Retention.fine_s`, the others for the whole run.

Files are append-only: a record batch is one Arrow message, and a reader stops at the first message
that is not whole, so a writer killed mid-write leaves whole records only. A writer never appends to
a file it did not create (a new writer starts new files), so a torn tail is never followed by data.
Owners (a replica and its task, a task and its device) are numbered in ``series/owners.jsonl``, one
whole JSON line written before the first record that names it. Old files are deleted whole.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from engine.contract import events

__all__ = ["GROUPS", "LEVELS", "Block", "Owner", "Retention", "SeriesStore", "SeriesWriter", "read_batches"]

#: Levels by bucket width in seconds (0: every event), finest first.
#: Steps of 5-10x: a view reads at most ~6x the rows it needs (a day at ~2,000 points per curve is the
#: ``30s`` level as it is: 2,880 rows per owner, no merging).
LEVELS: tuple[tuple[str, float], ...] = (("raw", 0.0), ("1s", 1.0), ("5s", 5.0), ("30s", 30.0), ("300s", 300.0),
                                         ("3000s", 3000.0))
GROUPS = events.SAMPLE_KINDS  # a group of files per kind of sample
SUFFIX = ".arrows"
#: Fields of an event that are not samples (``worker``, ``sync_wait`` … are kept: the stragglers use them).
_NOT_SAMPLES = frozenset(("v", "kind", "task", "t", "replica", "step", "generation", "device", "pid", "host"))
#: A sample column of a summary: ``<field>:<stat>``.
STATS = ("min", "max", "mean", "last", "count")
#: LZ4 frames: measured on 400 batches of 1,280 raw rows, 22 bytes a row against 36 uncompressed and 16 with
#: zstd, and read 4x faster than zstd (a reopen decodes every batch it reads).
_WRITE_OPTIONS = ipc.IpcWriteOptions(compression="lz4")
#: A tier's closed buckets are written at this many rows, or once they span this much data (seconds):
#: what a killed writer loses of a tier, which the finer levels (raw: an hour) still hold.
TIER_BATCH_ROWS = 8192
TIER_HOLD_S = 600.0


@dataclass
class Retention:
    """How long (seconds of data, up to the newest sample) each level is kept; ``None``: the whole run.

    An hour of every point of 128 replicas at 20 Hz is ~0.3 GB; the ``1s`` tier is a twentieth of that
    per hour; the coarser tiers are a few MB a day, so they are kept for the whole run.
    """

    raw_s: float | None = 3600.0
    fine_s: float | None = 6 * 3600.0
    #: A level's files are rolled at this much data (retention deletes whole files).
    raw_file_s: float = 120.0
    tier_file_s: float = 3600.0

    def keep(self, level: str) -> float | None:
        return self.raw_s if level == "raw" else self.fine_s if level == "1s" else None

    def file_span(self, level: str) -> float:
        return self.raw_file_s if level == "raw" else self.tier_file_s


@dataclass(frozen=True)
class Owner:
    """Who a row belongs to: a replica (group ``step``) or a task, or a task's device (group ``device``)."""

    id: int
    group: str
    task: str
    replica: int | None = None
    device: str | None = None
    first: dict[str, float] = field(default_factory=dict)  # the owner's first event's samples

    @property
    def key(self) -> str:
        """The history's prefix: ``replica/<id>`` or ``task/<name>`` (``task/<name>@<device>``)."""
        if self.group == "step":
            return f"replica/{self.replica}"
        return f"task/{self.task}@{self.device}" if self.device else f"task/{self.task}"


class Block:
    """Rows of one group as numpy columns, raw rows and summaries alike.

    ``owner``, ``t_first``/``t_last``, ``x_first``/``x_last`` (for ``device`` rows x is t), ``n`` (events
    summarised), and per sample field ``min``, ``max``, ``last`` (NaN where none), ``sum`` (float64) and
    ``count``. A raw row is a summary of one event.
    """

    __slots__ = ("cols", "count", "last", "max", "min", "n", "owner", "sum", "t_first", "t_last", "width",
                 "x_first", "x_last")

    def __init__(self, owner: np.ndarray, t_first: np.ndarray, t_last: np.ndarray, x_first: np.ndarray,
                 x_last: np.ndarray, n: np.ndarray, cols: list[str], width: float = 0.0) -> None:
        self.owner, self.t_first, self.t_last, self.x_first, self.x_last, self.n = (
            owner, t_first, t_last, x_first, x_last, n)
        self.cols = list(cols)
        self.width = width
        self.min: dict[str, np.ndarray] = {}
        self.max: dict[str, np.ndarray] = {}
        self.last: dict[str, np.ndarray] = {}
        self.sum: dict[str, np.ndarray] = {}
        self.count: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.owner)

    @classmethod
    def empty(cls, cols: Iterable[str] = ()) -> Block:
        f, block = np.empty(0), None
        block = cls(np.empty(0, np.uint32), f, f, f, f, np.empty(0, np.uint32), list(cols))
        for c in block.cols:
            block._set(c, f.astype(np.float32), f.astype(np.float32), f.astype(np.float32), f,
                       np.empty(0, np.uint32))
        return block

    def _set(self, c: str, lo: np.ndarray, hi: np.ndarray, last: np.ndarray, total: np.ndarray,
             count: np.ndarray) -> None:
        self.min[c], self.max[c], self.last[c], self.sum[c], self.count[c] = lo, hi, last, total, count

    def mean(self, c: str) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.sum[c] / self.count[c]).astype(np.float32)

    def take(self, index: np.ndarray | slice) -> Block:
        """The rows at ``index`` (a boolean mask or indexes)."""
        out = Block(self.owner[index], self.t_first[index], self.t_last[index], self.x_first[index],
                    self.x_last[index], self.n[index], self.cols, self.width)
        for c in self.cols:
            out._set(c, self.min[c][index], self.max[c][index], self.last[c][index], self.sum[c][index],
                     self.count[c][index])
        return out

    @classmethod
    def concat(cls, blocks: list[Block]) -> Block:
        """The rows of every block in order; a field some block lacks is absent (count 0) in its rows."""
        blocks = [b for b in blocks if len(b)] or blocks[:1]
        if not blocks:
            return cls.empty()
        if len(blocks) == 1:
            return blocks[0]
        cols = list(dict.fromkeys(c for b in blocks for c in b.cols))
        def joined(name: str) -> np.ndarray:
            return np.concatenate([getattr(b, name) for b in blocks])

        out = cls(joined("owner"), joined("t_first"), joined("t_last"), joined("x_first"), joined("x_last"),
                  joined("n"), cols, blocks[0].width)
        for c in cols:
            parts = []
            for b in blocks:
                if c in b.cols:
                    parts.append((b.min[c], b.max[c], b.last[c], b.sum[c], b.count[c]))
                else:
                    nan = np.full(len(b), np.nan, np.float32)
                    parts.append((nan, nan, nan, np.zeros(len(b)), np.zeros(len(b), np.uint32)))
            out._set(c, *(np.concatenate([p[i] for p in parts]) for i in range(5)))
        return out

    def summarise(self, width: float) -> Block:
        """One row per owner and bucket ``floor(t_first / width)``, rows of a bucket in arrival order; a width of 0
        (the raw level) leaves every row its own."""
        if width <= 0:
            return self
        if not len(self):
            out = Block.empty(self.cols)
            out.width = width
            return out
        bucket = np.floor(self.t_first / width).astype(np.int64)
        bucket -= bucket.min()
        # one stable sort of a combined key (owner, bucket): a bucket's rows stay in arrival order
        order = np.argsort(self.owner.astype(np.int64) * (int(bucket.max()) + 1) + bucket, kind="stable")
        owner, bucket = self.owner[order], bucket[order]
        change = np.flatnonzero((owner[1:] != owner[:-1]) | (bucket[1:] != bucket[:-1])) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change, [len(order)])) - 1
        out = Block(owner[starts], np.minimum.reduceat(self.t_first[order], starts),
                    np.maximum.reduceat(self.t_last[order], starts), self.x_first[order][starts],
                    self.x_last[order][ends], np.add.reduceat(self.n[order], starts).astype(np.uint32),
                    self.cols, width)
        position = np.arange(len(order))
        for c in self.cols:
            count = self.count[c][order]
            last_at = np.maximum.reduceat(np.where(count > 0, position, -1), starts)
            last = self.last[c][order][np.maximum(last_at, 0)]
            # fmin/fmax: a bucket's NaNs (no sample) are passed over; a sum of +inf and -inf samples is NaN, as said
            with np.errstate(invalid="ignore"):
                lo = np.fmin.reduceat(self.min[c][order], starts)
                hi = np.fmax.reduceat(self.max[c][order], starts)
                total = np.add.reduceat(self.sum[c][order], starts)
            out._set(c, lo, hi, np.where(last_at >= 0, last, np.float32(np.nan)).astype(np.float32), total,
                     np.add.reduceat(count, starts).astype(np.uint32))
        return out


def _numbers(got: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """A column of event fields as float32 and where it has a number (None, text and a field that is
    only ever true/false: none; a field mixing numbers and true/false reads them as 1 and 0)."""
    try:
        arr = pa.array(got)  # inferred in C: no per-value check in Python on the launcher's hot path
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        arr = pa.array([v if type(v) is float or type(v) is int else None for v in got], type=pa.float64())
    if not (pa.types.is_floating(arr.type) or pa.types.is_integer(arr.type)):
        return np.full(len(got), np.nan, np.float32), np.zeros(len(got), bool)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
    with np.errstate(over="ignore"):  # beyond float32: stored as inf
        values = np.asarray(arr.to_numpy(zero_copy_only=False), np.float64).astype(np.float32)
    return values, valid


def _samples(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """min/max/last, sum and count of raw values: a NaN sample is drawn as a gap, not summarised."""
    counted = valid & ~np.isnan(values)
    shown = np.where(counted, values, np.float32(np.nan)).astype(np.float32)
    return shown, np.where(counted, values, 0.0).astype(np.float64), counted.astype(np.uint32)


# -- Arrow files -----------------------------------------------------------------------------------


def _raw_schema(group: str, cols: list[str]) -> pa.Schema:
    fields = [pa.field("owner", pa.uint32()), pa.field("t", pa.float64())]
    if group == "step":
        fields.append(pa.field("x", pa.float64()))
    return pa.schema(fields + [pa.field(c, pa.float32()) for c in cols])


def _tier_schema(group: str, cols: list[str]) -> pa.Schema:
    fields = [pa.field("owner", pa.uint32()), pa.field("n", pa.uint32()), pa.field("t_first", pa.float64()),
              pa.field("t_last", pa.float64())]
    if group == "step":
        fields += [pa.field("x_first", pa.float64()), pa.field("x_last", pa.float64())]
    for c in cols:
        fields += [pa.field(f"{c}:{s}", pa.uint32() if s == "count" else pa.float32()) for s in STATS]
    return pa.schema(fields)


def _raw_batch(schema: pa.Schema, owner: np.ndarray, t: np.ndarray, x: np.ndarray | None,
               values: dict[str, tuple[np.ndarray, np.ndarray]]) -> pa.RecordBatch:
    arrays: list[pa.Array] = [pa.array(owner), pa.array(t)]
    if x is not None:
        arrays.append(pa.array(x))
    n = len(owner)
    for name in schema.names[len(arrays):]:
        got = values.get(name)
        arrays.append(pa.array(got[0], mask=~got[1]) if got is not None else pa.nulls(n, pa.float32()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _tier_batch(schema: pa.Schema, block: Block, group: str) -> pa.RecordBatch:
    arrays = [block.owner.astype(np.uint32), block.n.astype(np.uint32), block.t_first, block.t_last]
    if group == "step":
        arrays += [block.x_first, block.x_last]
    for c in block.cols:
        arrays += [block.min[c], block.max[c], block.mean(c), block.last[c], block.count[c]]
    return pa.RecordBatch.from_arrays([pa.array(a) for a in arrays], schema=schema)


def _messages(path: Path) -> tuple[pa.Schema | None, list[Any]]:
    """A file's schema and its whole record-batch messages, not decoded (a torn or unreadable tail ends it)."""
    try:
        reader = ipc.MessageReader.open_stream(pa.memory_map(str(path)))
        schema = ipc.read_schema(reader.read_next_message())
    except (pa.ArrowException, OSError, ValueError, StopIteration):
        return None, []
    messages = []
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError):  # a message cut short by a kill: whole records only
            break
        if message.type == "record batch":
            messages.append(message)
    return schema, messages


def read_batches(path: Path, skip: int = 0, last: int | None = None) -> list[pa.RecordBatch]:
    """The whole record batches of one file after the first ``skip`` (``last``: only that many of the
    newest); messages skipped are not decoded."""
    schema, messages = _messages(path)
    if schema is None:
        return []
    chosen = messages[skip:] if last is None else messages[skip:][-last:] if last else []
    return [ipc.read_record_batch(m, schema) for m in chosen]


def count_batches(path: Path) -> int:
    return len(_messages(path)[1])


def _first_batch(path: Path) -> list[pa.RecordBatch]:
    schema, messages = _messages(path)
    return [ipc.read_record_batch(messages[0], schema)] if schema is not None and messages else []


def _files(root: Path, level: str, group: str) -> list[Path]:
    folder = root / level
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(group) + r"-(\d+)" + re.escape(SUFFIX) + "$")
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


class _LevelFiles:
    """The files one level of one group is written to: a new file at each new schema (a new sample
    field) and every :meth:`Retention.file_span` seconds of data; files past retention deleted."""

    def __init__(self, root: Path, level: str, group: str, retention: Retention) -> None:
        self.folder = root / level
        self.level, self.group = level, group
        self.span = retention.file_span(level)
        self.keep = retention.keep(level)
        existing = _files(root, level, group)
        self._seq = int(existing[-1].name.split("-")[1].split(".")[0]) + 1 if existing else 0
        self._writer: ipc.RecordBatchStreamWriter | None = None
        self._sink: Any = None
        self._schema: pa.Schema | None = None
        self._started = 0.0  # t of the current file's first row
        self._done: list[tuple[Path, float]] = []  # closed files of this writer and their newest t

    def write(self, schema: pa.Schema, batch: pa.RecordBatch, t_min: float, t_max: float) -> None:
        if self._writer is None or schema != self._schema or t_max - self._started > self.span:
            self._roll(schema, t_min)
        assert self._writer is not None
        self._writer.write_batch(batch)
        self._newest = t_max
        if self.keep is not None:
            while self._done and t_max - self._done[0][1] > self.keep:
                path, _ = self._done.pop(0)
                path.unlink(missing_ok=True)

    def _roll(self, schema: pa.Schema, t_min: float) -> None:
        self.close()
        self.folder.mkdir(exist_ok=True)  # not parents: a run folder deleted under the writer is not recreated
        path = self.folder / f"{self.group}-{self._seq:06d}{SUFFIX}"
        self._seq += 1
        self._sink = pa.OSFile(str(path), "wb")  # unbuffered: each message reaches the OS as written
        self._writer = ipc.new_stream(self._sink, schema, options=_WRITE_OPTIONS)
        self._schema, self._started, self._path, self._newest = schema, t_min, path, t_min

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._done.append((self._path, self._newest))
            self._writer = None


# -- writing ---------------------------------------------------------------------------------------


class _Tier:
    """One summary level being folded: rows of buckets still open, by owner."""

    def __init__(self, width: float) -> None:
        self.width = width
        self.pending = Block.empty()
        self.out: list[Block] = []  # closed buckets not yet written
        self.out_rows = 0
        self.top = np.full(0, np.iinfo(np.int64).min, np.int64)  # per owner: the newest bucket seen

    def push(self, rows: Block, final: bool = False) -> Block:
        """The summaries of the buckets ``rows`` close: a bucket of an owner closes once that owner has
        a row in a later bucket (an owner that went quiet is summarised at ``final``)."""
        block = Block.concat([self.pending, rows])
        if not len(block):
            return Block.empty(block.cols)
        bucket = np.floor(block.t_first / self.width).astype(np.int64)
        owners = int(block.owner.max()) + 1
        if owners > len(self.top):
            self.top = np.concatenate((self.top, np.full(owners - len(self.top), np.iinfo(np.int64).min)))
        np.maximum.at(self.top, block.owner, bucket)
        closed = np.ones(len(block), bool) if final else bucket < self.top[block.owner]
        self.pending = block.take(~closed)
        return block.take(closed).summarise(self.width)


def _finite(value: Any) -> bool:
    """A plain int, or a finite float (a number JSON can hold)."""
    return type(value) is int or (type(value) is float and math.isfinite(value))


class SeriesWriter:
    """Takes ``step`` and ``device`` events (:meth:`add`) and writes them in tiers under ``root``.

    :meth:`add` only appends to lists (the launcher's hot path); :meth:`flush` turns what is held into
    one record batch per group for ``raw`` and folds it into the tiers. Not thread-safe: one writer thread.
    """

    def __init__(self, root: str | Path, retention: Retention | None = None) -> None:
        self.root = Path(root)
        self.retention = retention or Retention()
        self.root.mkdir(parents=True, exist_ok=True)
        self._owners_fd = os.open(self.root / "owners.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                  0o644)
        known = SeriesStore(self.root).owners()
        self._owner_ids: dict[tuple[Any, ...], int] = {
            ((o.replica, o.task) if o.group == "step" else (o.task, o.device)): o.id for o in known}
        self._next_owner = max((o.id for o in known), default=-1) + 1
        self._held: dict[str, list[dict[str, Any]]] = {g: [] for g in GROUPS}
        self._cols: dict[str, list[str]] = {g: [] for g in GROUPS}  # every sample field seen, in order
        self._files = {(lv, g): _LevelFiles(self.root, lv, g, self.retention) for lv, _ in LEVELS for g in GROUPS}
        self._tiers = {g: [_Tier(w) for _, w in LEVELS[1:]] for g in GROUPS}
        self.held = 0  # events held since the last flush
        self.written = 0  # events written to raw so far

    def add(self, event: dict[str, Any]) -> bool:
        """Hold a ``step`` or ``device`` event for the next :meth:`flush`; False for any other kind.

        Only the event is kept here (the launcher's hot path: one list append); its fields become
        columns at :meth:`flush`, a column at a time."""
        kind = event.get("kind")
        if kind == "step":
            self._held["step"].append(event)
        elif kind == "device":
            device = event.get("device")
            if isinstance(device, str) and device:  # TensorFlow's memory is per device: a row of its own
                tf = {k: v for k, v in event.items() if k.startswith("tf_")}
                if tf:
                    self._held["device"].append({"task": event.get("task", ""), "t": event.get("t"), **tf,
                                                 "device": device})
                event = {k: v for k, v in event.items() if not k.startswith("tf_") and k != "device"}
            self._held["device"].append(event)
        else:
            return False
        self.held += 1
        return True

    def _owners_of(self, group: str, rows: list[dict[str, Any]]) -> np.ndarray:
        ids = self._owner_ids
        if group == "step":
            keys = [(e.get("replica"), e.get("task", "")) for e in rows]
        else:
            keys = [(e.get("task", ""), e.get("device")) for e in rows]
        found = list(map(ids.get, keys))
        if None in found:
            for i, k in enumerate(keys):
                if found[i] is None:
                    found[i] = ids.get(k)
                    if found[i] is None:
                        found[i] = self._new_owner(group, k, rows[i])
        return np.array(found, np.uint32)

    def _new_owner(self, group: str, key: tuple[Any, ...], fields: dict[str, Any]) -> int:
        owner = self._owner_ids[key] = self._next_owner
        self._next_owner += 1
        # its first finite values (a NaN or infinite first loss is a sample, but no JSON number)
        first = {k: v for k, v in fields.items() if _finite(v) and k not in _NOT_SAMPLES}
        if isinstance(fields.get("metrics"), dict):
            first.update({"metrics." + k: v for k, v in fields["metrics"].items() if _finite(v)})
        record: dict[str, Any] = {"id": owner, "group": group, "first": first}
        if group == "step":
            record.update(replica=key[0], task=key[1])
        else:
            record.update(task=key[0], **({"device": key[1]} if key[1] else {}))
        # one whole line per write, before any record that names the owner
        os.write(self._owners_fd, (json.dumps(record, allow_nan=False, default=str) + "\n").encode())
        return owner

    def flush(self) -> None:
        """Write what is held: one raw record batch per group, and the tier buckets it closes."""
        for group in GROUPS:
            rows = self._held[group]
            if rows:
                self._held[group] = []
                self._write(group, rows)
        self.held = 0

    def _write(self, group: str, rows: list[dict[str, Any]]) -> None:
        n = len(rows)
        owner = self._owners_of(group, rows)
        t = np.array([e.get("t", 0.0) for e in rows], np.float64)
        x = np.array([e.get("step", 0) for e in rows], np.float64) if group == "step" else t
        names: set[str] = set().union(*rows)
        metrics = [e.get("metrics") for e in rows] if "metrics" in names else []
        found = [k for k in names if k not in _NOT_SAMPLES and k != "metrics"]
        if metrics:
            metric_names: dict[str, None] = {}
            for m in metrics:
                if type(m) is dict:
                    metric_names.update(dict.fromkeys(m))
            found += ["metrics." + k for k in metric_names]
        cols = self._cols[group]
        values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for c in [*cols, *sorted(c for c in found if c not in cols)]:
            if c.startswith("metrics.") and metrics:
                name = c[8:]
                got = [m.get(name) if type(m) is dict else None for m in metrics]
            else:
                got = [e.get(c) for e in rows]
            values[c] = _numbers(got)
        # a field becomes a column at its first number (a text field never does)
        cols.extend(c for c in values if c not in cols and values[c][1].any())
        block = Block(owner, t, t, x, x, np.ones(n, np.uint32), cols)
        for c in cols:
            v, valid = values[c]
            shown, total, count = _samples(v, valid)
            block._set(c, shown, shown, shown, total, count)
        t_min, t_max = float(t.min()), float(t.max())
        schema = _raw_schema(group, cols)
        self._files[("raw", group)].write(schema, _raw_batch(schema, owner, t, x if group == "step" else None,
                                                             values), t_min, t_max)
        self.written += n
        self._fold(group, block)

    def _fold(self, group: str, rows: Block, final: bool = False) -> None:
        """Fold new rows up the tiers; a tier's closed buckets are written once :data:`TIER_BATCH_ROWS`
        are held or they span :data:`TIER_HOLD_S` (a reader decodes a batch at a time: few, large ones)."""
        newest = float(rows.t_last.max()) if len(rows) else -math.inf
        for (level, _), tier in zip(LEVELS[1:], self._tiers[group], strict=True):
            rows = tier.push(rows, final) if len(rows) or final else rows
            if len(rows):
                tier.out.append(rows)
                tier.out_rows += len(rows)
            if tier.out and (final or tier.out_rows >= TIER_BATCH_ROWS
                             or newest - float(tier.out[0].t_first.min()) >= TIER_HOLD_S):
                block = Block.concat(tier.out)
                tier.out, tier.out_rows = [], 0
                schema = _tier_schema(group, block.cols)
                self._files[(level, group)].write(schema, _tier_batch(schema, block, group),
                                                  float(block.t_first.min()), float(block.t_last.max()))

    def close(self, write: bool = True) -> None:
        """Write what is held, summarise every open bucket, and close the files (``write=False``: close
        only, what is held dropped: a folder that failed)."""
        if write:
            self.flush()
            for group in GROUPS:
                self._fold(group, Block.empty(self._cols[group]), final=True)
        self._held = {g: [] for g in GROUPS}
        for files in self._files.values():
            files.close()
        if self._owners_fd >= 0:
            os.close(self._owners_fd)
            self._owners_fd = -1


# -- reading ---------------------------------------------------------------------------------------


def _block_of(batches: list[pa.RecordBatch], group: str, width: float) -> Block:
    """Record batches of one level as a :class:`Block` (raw rows as summaries of one event)."""
    if not batches:
        out = Block.empty()
        out.width = width
        return out
    table = pa.Table.from_batches(batches) if len({b.schema for b in batches}) == 1 else pa.concat_tables(
        [pa.Table.from_batches([b]) for b in batches], promote_options="default")

    def col(name: str, dtype: Any = np.float64) -> np.ndarray:
        return np.asarray(table.column(name).to_numpy(), dtype=dtype)

    owner = col("owner", np.uint32)
    if width == 0.0:
        t = col("t")
        x = col("x") if group == "step" else t
        cols = [c for c in table.column_names if c not in ("owner", "t", "x")]
        block = Block(owner, t, t, x, x, np.ones(len(t), np.uint32), cols, 0.0)
        for c in cols:
            arr = table.column(c)
            valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
            values = np.asarray(arr.to_numpy(zero_copy_only=False), np.float32)
            shown, total, count = _samples(values, valid)
            block._set(c, shown, shown, shown, total, count)
        return block
    t_first, t_last = col("t_first"), col("t_last")
    x_first, x_last = (col("x_first"), col("x_last")) if group == "step" else (t_first, t_last)
    cols = list(dict.fromkeys(n.rsplit(":", 1)[0] for n in table.column_names if n.endswith(":count")))
    block = Block(owner, t_first, t_last, x_first, x_last, col("n", np.uint32), cols, width)
    for c in cols:
        count = np.nan_to_num(col(f"{c}:count"), nan=0).astype(np.uint32)  # null: a file before the field
        mean = col(f"{c}:mean")
        block._set(c, col(f"{c}:min", np.float32), col(f"{c}:max", np.float32), col(f"{c}:last", np.float32),
                   np.where(count > 0, mean * count, 0.0), count)
    return block


class SeriesStore:
    """Reads a run's ``series/``: its owners, any level, or a view composed of the levels it needs."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def exists(self) -> bool:
        return (self.root / "owners.jsonl").is_file()

    def owners(self) -> list[Owner]:
        """Every owner, by id (whole lines only: a torn last line is left out)."""
        try:
            data = (self.root / "owners.jsonl").read_bytes()
        except OSError:
            return []
        out: list[Owner] = []
        for line in data.split(b"\n")[:-1]:
            try:
                r = json.loads(line)
                out.append(Owner(int(r["id"]), str(r["group"]), str(r.get("task", "")), r.get("replica"),
                                 r.get("device"), dict(r.get("first") or {})))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def read_level(self, group: str, level: str, newer_than: float | None = None) -> Block:
        """Every whole row of one level; ``newer_than``: only files read from the newest back until one
        holds a row at or before that time (a finer level's tail)."""
        width = dict(LEVELS)[level]
        files = _files(self.root, level, group)
        batches: list[list[pa.RecordBatch]] = []
        for path in reversed(files):
            got = read_batches(path)
            batches.append(got)
            if newer_than is not None and got and float(
                    pc.min(got[0].column(1 if width == 0.0 else 2)).as_py() or math.inf) <= newer_than:
                break
        return _block_of([b for got in reversed(batches) for b in got], group, width)

    def span(self) -> tuple[float, float] | None:
        """First and last wall time of any sample (the coarsest level's first row, raw's last)."""
        lo, hi = math.inf, -math.inf
        for group in GROUPS:
            for level, width in reversed(LEVELS):
                files = _files(self.root, level, group)
                if files and (first := _first_batch(files[0])):
                    lo = min(lo, float(pc.min(first[0].column(1 if width == 0.0 else 2)).as_py()))
                    break
            for level, width in LEVELS:
                files = _files(self.root, level, group)
                if files and (got := read_batches(files[-1], last=1)):
                    hi = max(hi, float(pc.max(got[-1].column(1 if width == 0.0 else 3)).as_py()))
                    break
        return (lo, hi) if lo <= hi else None

    def view(self, group: str, max_points: int, span: tuple[float, float] | None = None) -> Block:
        """Every owner's rows at about ``max_points`` per series over the run: the coarsest level with at
        least half that many buckets in the span, the newer rows it has not summarised yet from finer levels
        (down to raw), older rows it no longer holds from coarser ones, its buckets merged to the widest
        multiple of its width that still gives ``max_points`` where that is at least twice its width;
        sorted by owner, then time."""
        span = span or self.span()
        if span is None:
            return Block.empty()
        length = span[1] - span[0]
        chosen = 0
        for i, (_, width) in enumerate(LEVELS):
            if width and length / width >= max_points / 2:  # enough: at least half (one point per pixel)
                chosen = i
        parts = [self.read_level(group, LEVELS[chosen][0])]
        known = self.owners()
        owners = max((o.id for o in known), default=-1) + 1
        mine = np.array([o.id for o in known if o.group == group], np.intp)  # owner ids are shared by the groups
        end = _per_owner(parts[0], owners, np.maximum, parts[0].t_last, -math.inf)
        tails = []
        for level, _ in reversed(LEVELS[:chosen]):  # finer: what the chosen level has not summarised yet
            newer = float(end[mine].min()) if len(mine) else None
            tail = self.read_level(group, level, newer_than=newer)
            tail = tail.take(tail.t_first > end[tail.owner]) if len(tail) else tail
            tails.append(tail)
            end = np.maximum(end, _per_owner(tail, owners, np.maximum, tail.t_last, -math.inf))
        if tails:  # summarised here to the chosen width: one resolution from end to end
            parts.append(Block.concat(tails).summarise(LEVELS[chosen][1]))
        start = _per_owner(parts[0], owners, np.minimum, parts[0].t_first, math.inf)
        for level, _ in LEVELS[chosen + 1:]:  # coarser: what retention dropped from the chosen level
            head = self.read_level(group, level)
            head = head.take(head.t_first < start[head.owner]) if len(head) else head
            if not len(head):
                continue
            # a bucket that began before the finer rows did stands for its whole span: the finer rows in
            # it go (retention cut the finer level at a file, not at a bucket's edge)
            cut = _per_owner(head, owners, np.maximum, head.t_last, -math.inf)
            parts = [p.take(p.t_first > cut[p.owner]) if len(p) else p for p in parts]
            parts.insert(0, head)
            start = np.minimum(start, _per_owner(head, owners, np.minimum, head.t_first, math.inf))
        width = LEVELS[chosen][1]
        target = math.floor(length / max_points / width) * width if width else 0.0
        if width and target >= 2 * width:  # the level's buckets merged to about max_points per series (a multiple of its width)
            # part by part: no copy of the whole level (a bucket cut by a part's edge is two rows)
            parts, width = [p.summarise(target) for p in parts if len(p)], target
        block = Block.concat(parts)
        if len(block):
            block = block.take(np.lexsort((block.t_first, block.owner)))
        block.width = width  # the buckets' width (rows newer than the level's last may be finer)
        return block


def _per_owner(block: Block, owners: int, ufunc: Any, values: np.ndarray, empty: float) -> np.ndarray:
    out = np.full(owners, empty)
    if len(block):
        ufunc.at(out, block.owner.astype(np.intp), values)
    return out


class SeriesFollower:
    """The raw rows written since the last call (a front end attached to a running run)."""

    def __init__(self, root: str | Path, *, at_end: bool = False, recent: bool = False) -> None:
        """``at_end``: only rows written after this; ``recent``: from the newest raw file of each group on
        (its last minutes: a view that needs recent events, not an hour of them)."""
        self.store = SeriesStore(root)
        self._read: dict[Path, int] = {}  # batches read of each raw file
        self._sizes: dict[Path, int] = {}  # its size when last read
        if at_end or recent:
            for group in GROUPS:
                files = _files(self.store.root, "raw", group)
                for path in files if at_end else files[:-1]:
                    self._read[path] = count_batches(path)

    def read_new(self) -> dict[str, Block]:
        out: dict[str, Block] = {}
        for group in GROUPS:
            batches: list[pa.RecordBatch] = []
            for path in _files(self.store.root, "raw", group):
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if self._sizes.get(path) == size:  # unchanged since last read: no message scan
                    continue
                self._sizes[path] = size
                done = self._read.get(path, 0)
                got = read_batches(path, skip=done)
                self._read[path] = done + len(got)
                batches += got
            if batches:
                out[group] = _block_of(batches, group, 0.0)
        return out
