"""What the launcher's side makes of the event stream: per-task and per-replica state,
progress with ETA, and the full history for plots (never downsampled here, stored compactly:
see :class:`Series`)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from engine.contract import records

TERMINAL = records.TERMINAL  # the states that end a task or a run (the wire's enums)


@dataclass
class TaskState:
    name: str
    role: str = ""
    host: str = ""
    state: str = "pending"
    pid: int | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    tf_bytes: int | None = None
    gpu_util: float | None = None
    gpu_mem_bytes: int | None = None
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)
    exit_code: int | None = None
    restarts: int = 0


@dataclass
class ReplicaState:
    replica: int
    task: str = ""
    step: int = 0
    loss: float | None = None
    examples_per_sec: float | None = None
    step_time: float | None = None
    worker: int | None = None
    first_loss: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)  # the latest of each training metric


#: A task's figures a ``device`` event sets (where it holds a number).
_TASK_FIGURES = ("cpu_percent", "rss_bytes", "tf_bytes", "gpu_util", "gpu_mem_bytes")


def _is_number(value: Any) -> TypeGuard[int | float]:
    return type(value) is float or (isinstance(value, (int, float)) and not isinstance(value, bool))


#: Steps are kept as float32 while every one is an integer of magnitude below this (float32 holds
#: each of them exactly); the first that is not widens its column to float64.
EXACT_STEPS = 2.0**24
#: Wall times are kept as float32 seconds from a base time (the history's first event) while within
#: this many seconds of it: float32 rounds them by less than a millisecond there (a spacing of at
#: most 2**-9 s). The first time past it widens its axis' times to float64 (offsets still).
TIME_SPAN = 2.0**15
#: Values are float32 (losses come from float32 tensors: exact; rates, times and percentages need no
#: more than 7 digits); one beyond float32's range widens its series to float64.
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: Items an array of the history starts with: 64 KiB of float32, which glibc serves as an ``mmap``
#: block of its own (see :mod:`engine.control.memory`), so its untouched room costs no memory and
#: its growth leaves no holes in the heap (arrays that started at 256 items and grew through the
#: heap left ~9 bytes per point of holes behind them in ``bench/gui_scale.py --large``).
START_CAPACITY = 16_384


def _grown(a: np.ndarray, n: int, dtype: Any = None) -> np.ndarray:
    """A copy of ``a``'s first ``n`` items in an array half as large again (at least 256 items).

    Only the filled part is copied: the rest stays untouched, and as large arrays are ``mmap``
    blocks of their own (:mod:`engine.control.memory`), that spare room costs address space, not memory.
    Measured with ``bench/gui_scale.py`` (36,000 points per series): growing by an eighth with
    ``np.concatenate`` (which writes the spare room too) ended at 316 MB RSS; copying the filled
    part only, 307 MB; with shared axes, 273 MB by an eighth, 265 MB by half, 264 MB by doubling.
    By half: most of the gain, with less idle room than doubling; 12 reallocations to 36,000 points, not 42.
    ``dtype``: the copy's (a widening), else ``a``'s.
    """
    b = np.empty(max(256, len(a) + len(a) // 2), dtype=a.dtype if dtype is None else dtype)
    b[:n] = a[:n]
    return b


def _wide(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` as float64, same capacity (its first ``n`` items copied)."""
    b = np.empty(len(a), dtype=np.float64)
    b[:n] = a[:n]
    return b


class _Steps:
    """A growable column of steps that several axes may read (see :class:`_Axis`): float32 while every
    step is an integer below :data:`EXACT_STEPS`, float64 after."""

    __slots__ = ("a", "n")

    def __init__(self, capacity: int = START_CAPACITY, dtype: Any = np.float32) -> None:
        self.a = np.empty(capacity, dtype=dtype)
        self.n = 0

    def push(self, x: float) -> None:
        n = self.n
        a = self.a
        if not (-EXACT_STEPS < x < EXACT_STEPS and int(x) == x) and a.dtype == np.float32:
            a = self.a = _wide(a, n)
        if n == len(a):
            a = self.a = _grown(a, n)
        a[n] = x
        self.n = n + 1

    def copy(self, start: int, stop: int) -> _Steps:
        n = stop - start
        col = _Steps(max(START_CAPACITY, n + n // 2), self.a.dtype)
        col.a[:n] = self.a[start:stop]
        col.n = n
        return col


class _Axis:
    """Where the points of one series are, or of several series of one owner that got a point from
    every event since they started (see :class:`History`): steps x and wall times t.

    ``t`` holds seconds from ``base`` (float32 while within :data:`TIME_SPAN` of it, else float64).
    ``x`` is a :class:`_Steps` column, possibly read by other axes too: an axis reads its first
    ``n`` items. Replicas of a synchronous run report the same steps, so the axes of every replica
    read one column: an axis appends to it when it is at its end, compares when behind (the same
    step costs nothing), and copies its part to a column of its own at the first step that differs.
    ``x is None``: x is the wall time (a series by time).
    """

    __slots__ = ("x", "t", "n", "base")

    def __init__(self, capacity: int = START_CAPACITY, t_is_x: bool = False, base: float | None = None,
                 steps: _Steps | None = None) -> None:
        self.x: _Steps | None = None if t_is_x else (steps if steps is not None else _Steps(capacity))
        self.t = np.empty(capacity, dtype=np.float32)
        self.n = 0
        self.base = base

    def append(self, x: float, t: float) -> None:
        n = self.n
        col = self.x
        if col is not None:
            if col.n == n:
                col.push(x)
            elif col.a.item(n) != x:  # a step other than the column's: this axis keeps its own steps from now on
                col = self.x = col.copy(0, n)
                col.push(x)
        base = self.base
        if base is None:
            base = self.base = t
        offset = t - base
        a = self.t
        if not -TIME_SPAN < offset < TIME_SPAN and a.dtype == np.float32:
            a = self.t = _wide(a, n)
        if n == len(a):
            a = self.t = _grown(a, n)
        a[n] = offset
        self.n = n + 1

    def part(self, start: int, stop: int) -> _Axis:
        """A copy of ``[start, stop)`` with room to grow (steps from the start still read the same column)."""
        n = stop - start
        axis = _Axis(0, self.x is None, self.base)
        axis.t = np.empty(max(START_CAPACITY, n + n // 2), dtype=self.t.dtype)
        axis.t[:n] = self.t[start:stop]
        if self.x is not None:
            axis.x = self.x if start == 0 else self.x.copy(start, stop)
        axis.n = n
        return axis


class Series:
    """One curve's points: steps x, values y and wall times t, with amortised O(1) appends.

    Stored compactly (float32 values, float32 steps while exact, wall times as float32 seconds from
    a base: see :data:`EXACT_STEPS`, :data:`TIME_SPAN`, :data:`FLOAT32_MAX`). ``x`` and ``y`` are
    views of what is stored; ``t`` (and ``x`` of a series by time) are absolute wall times, made
    as float64 on each access: where that copy matters, read ``t_rel`` (the stored seconds) and
    ``t_base`` (``t == t_base + t_rel``), or ``x_rel`` and ``x_base`` likewise.

    ``t_is_x``: the series is by time (x is the wall time), so no separate x is kept.
    ``x`` and ``t`` may be views of an axis shared with other series of the same owner
    (:class:`History` does that); ``y`` is always the series' own.
    """

    __slots__ = ("_axis", "_start", "_y", "_n", "_shared")

    def __init__(self, capacity: int = START_CAPACITY, *, t_is_x: bool = False, t_base: float | None = None,
                 steps: _Steps | None = None) -> None:
        self._axis = _Axis(capacity, t_is_x, t_base, steps)
        self._start = 0
        self._y = np.empty(capacity, dtype=np.float32)
        self._n = 0
        self._shared = False

    @classmethod
    def _on(cls, axis: _Axis, start: int) -> Series:
        """A series whose x and t are ``axis`` from index ``start`` on (it gets a point at each of them)."""
        s = cls.__new__(cls)
        s._axis, s._start, s._n, s._shared = axis, start, 0, True
        s._y = np.empty(START_CAPACITY, dtype=np.float32)
        return s

    @classmethod
    def from_arrays(cls, x: np.ndarray, y: np.ndarray, t: np.ndarray, *, t_is_x: bool = False,
                    t_base: float | None = None) -> Series:
        """A series holding these points (a run folder's tiers read back), stored as :meth:`append` would."""
        n = len(y)
        cap = max(START_CAPACITY, n + n // 2)
        s = cls(cap, t_is_x=t_is_x, t_base=t_base)
        axis = s._axis
        if axis.base is None:
            axis.base = float(t[0]) if n else None
        offset = np.asarray(t, np.float64) - (axis.base or 0.0)
        if n and not (np.abs(offset).max() < TIME_SPAN):
            axis.t = np.empty(cap, np.float64)
        axis.t[:n] = offset
        if axis.x is not None:
            xs = np.asarray(x, np.float64)
            if n and not (np.abs(xs).max() < EXACT_STEPS and bool(np.all(xs == np.floor(xs)))):
                axis.x.a = np.empty(cap, np.float64)
            axis.x.a[:n] = xs
            axis.x.n = n
        axis.n = n
        ys = np.asarray(y, np.float64)
        if n and bool(np.any(np.isfinite(ys) & (np.abs(ys) > FLOAT32_MAX))):
            s._y = np.empty(cap, np.float64)
        s._y[:n] = ys
        s._n = n
        return s

    def append(self, x: float, y: float, t: float) -> None:
        if self._shared:
            self._detach()
        self._axis.append(x, t)
        self._push(y)

    def _push(self, y: float) -> None:
        """Append y only: its x and t are already at the axis' index ``_start + len(self)``."""
        n = self._n
        a = self._y
        if (y > FLOAT32_MAX or y < -FLOAT32_MAX) and a.dtype == np.float32 and y - y == 0.0:
            a = self._y = _wide(a, n)  # finite, beyond float32: this series keeps float64 values
        if n == len(a):
            a = self._y = _grown(a, n)
        a[n] = y
        self._n = n + 1

    def _detach(self) -> None:
        """Copy this series' part of a shared axis: from now on it keeps x and t of its own."""
        self._axis = self._axis.part(self._start, self._start + self._n)
        self._start = 0
        self._shared = False

    def __len__(self) -> int:
        return self._n

    @property
    def y(self) -> np.ndarray:
        return self._y[: self._n]

    @property
    def t_rel(self) -> np.ndarray:
        """The stored wall times: seconds from :attr:`t_base` (float32, or float64 past :data:`TIME_SPAN`)."""
        return self._axis.t[self._start: self._start + self._n]

    @property
    def t_base(self) -> float:
        base = self._axis.base
        return 0.0 if base is None else base

    @property
    def t(self) -> np.ndarray:
        """Wall times in seconds (float64, absolute; a new array at each access)."""
        return self.t_base + self.t_rel.astype(np.float64)

    @property
    def by_time(self) -> bool:
        return self._axis.x is None

    @property
    def x_rel(self) -> np.ndarray:
        """x as stored: the steps, or for a series by time its :attr:`t_rel` (``x == x_base + x_rel``)."""
        col = self._axis.x
        if col is None:
            return self.t_rel
        return col.a[self._start: self._start + self._n]

    @property
    def x_base(self) -> float:
        return self.t_base if self._axis.x is None else 0.0

    @property
    def x(self) -> np.ndarray:
        """The steps (a view of what is stored), or for a series by time its wall times (:attr:`t`)."""
        return self.t if self._axis.x is None else self.x_rel


class _Owner:
    """The series of one owner (a replica, a task) and the axis shared by those that are aligned.

    A series is *shared* (x and t are views of ``axis``) as long as it got a point from every
    event that added one to the axis since it started; the first event that brings the axis a
    point but not this series detaches it: it copies its part and keeps its own x and t after.
    """

    __slots__ = ("prefix", "t_is_x", "series", "axis", "shared")

    def __init__(self, prefix: str, t_is_x: bool) -> None:
        self.prefix = prefix
        self.t_is_x = t_is_x
        self.series: dict[str, Series] = {}
        self.axis: _Axis | None = None
        self.shared: list[Series] = []


#: Per-replica metrics kept as history, with their units.
REPLICA_METRICS = {"loss": "", "examples_per_sec": "examples/s", "step_time": "s"}
#: A training metric's series is ``replica/<id>/<name>``; a name that is one of :data:`REPLICA_METRICS`
#: (a program reporting its own ``loss`` as a metric) is kept apart as ``metric:<name>``.
METRIC_PREFIX = "metric:"


def metric_key(name: str) -> str:
    """The series name of training metric ``name`` (see :data:`METRIC_PREFIX`)."""
    return METRIC_PREFIX + name if name in REPLICA_METRICS or name.startswith(METRIC_PREFIX) else name


def training_metrics(keys: Iterable[str]) -> list[str]:
    """The training metrics among a history's series names (``replica/<id>/<metric>`` or bare metrics),
    in first-seen order, without the built-in figures."""
    seen: dict[str, None] = {}
    for key in keys:
        metric = key.rsplit("/", 1)[-1]
        if metric not in REPLICA_METRICS and metric not in seen:
            seen[metric] = None
    return list(seen)
#: Per-task metrics kept as history.
TASK_METRICS = {"cpu_percent": "%", "rss_bytes": "B", "tf_bytes": "B", "gpu_util": "%", "gpu_mem_bytes": "B"}


@dataclass(frozen=True)
class Envelope:
    """The part of a series read back from summaries: per bucket its x (middle), min, max and width (s)."""

    x: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    width: np.ndarray


class History:
    """Every point of every curve: ``replica/<id>/<metric>`` (x = step) and ``task/<name>/<metric>`` (x = time).

    The metrics of one event have the same x and t: the series of one replica (of one task)
    share a single x and t axis as long as each got a point from every event (5 arrays per
    replica instead of 9), and the replicas' axes share one column of steps while they report
    the same steps (a synchronous run: 4 arrays per replica). ``series[key]`` is still every point
    of each, in order, stored compactly (see :class:`Series`).
    """

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.t0: float | None = None
        self.version = 0  # bumps on every append: views redraw only when it moved
        self._owners: dict[str, _Owner] = {}  # by key prefix
        self._by_replica: dict[Any, _Owner] = {}
        self._by_task: dict[str, _Owner] = {}
        self._steps = _Steps()  # the steps every replica's axis reads while they report the same ones
        #: Series read back from summaries: their buckets' min and max (see :meth:`load`).
        self.envelopes: dict[str, Envelope] = {}

    def load(self, key: str, x: np.ndarray, y: np.ndarray, t: np.ndarray,
             envelope: Envelope | None = None) -> None:
        """Series ``key`` as these points (read back from a run folder's tiers: a summarised point is a
        bucket's mean at its middle, its ``envelope`` the buckets' min and max); events that come
        after are appended to it as usual."""
        parts = key.split("/")
        by_time = parts[0] == "task"
        if self.t0 is None and len(t):
            self.t0 = float(t[0])
        s = Series.from_arrays(x, y, t, t_is_x=by_time, t_base=self.t0)
        self.series[key] = s
        if envelope is not None:
            self.envelopes[key] = envelope
        if len(parts) == 3 and "@" not in parts[1]:  # owned series: later events of the owner extend it
            prefix = f"{parts[0]}/{parts[1]}/"
            owner = self._owner(prefix, by_time)
            owner.series[parts[2]] = s
            if by_time:
                self._by_task[parts[1]] = owner
            else:
                rid: Any = int(parts[1]) if parts[1].lstrip("-").isdigit() else parts[1]
                self._by_replica[rid] = owner
        self.version += len(s)

    def _series(self, key: str, by_time: bool = False) -> Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(t_is_x=by_time, t_base=self.t0)
        return s

    def _owner(self, prefix: str, by_time: bool) -> _Owner:
        owner = self._owners.get(prefix)
        if owner is None:
            owner = self._owners[prefix] = _Owner(prefix, by_time)
        return owner

    def _fold(self, owner: _Owner, x: float, t: float, points: list[tuple[str, float]]) -> None:
        """One event's points of ``owner``'s metrics, all at (x, t)."""
        shared = owner.shared
        series = owner.series
        at = -1  # the axis index of this event's point, once it has one
        pushed = 0
        for metric, y in points:
            s = series.get(metric)
            if s is not None and not s._shared:
                s.append(x, y, t)
                continue
            if at < 0:
                axis = owner.axis
                if axis is None:
                    axis = owner.axis = _Axis(t_is_x=owner.t_is_x, base=self.t0, steps=self._steps)
                at = axis.n
                axis.append(x, t)
            if s is None:
                assert axis is not None  # it got this event's point just above
                s = series[metric] = self.series[owner.prefix + metric] = Series._on(axis, at)
                shared.append(s)
            s._push(y)
            pushed += 1
        self.version += len(points)
        if at >= 0 and pushed != len(shared):
            # the axis has a point some shared series did not get: those go their own way
            for s in [s for s in shared if not s._shared or s._start + s._n != at + 1]:
                if s._shared:
                    s._detach()
                shared.remove(s)
            if not shared:
                owner.axis = None

    def add(self, event: dict[str, Any]) -> None:
        t = float(event.get("t", 0.0))
        if self.t0 is None:
            self.t0 = t
        kind = event.get("kind")
        if kind == "step":
            points = [(m, float(v)) for m in REPLICA_METRICS
                      if (v := event.get(m)).__class__ is float or (v is not None and _is_number(v))]
            extra = event.get("metrics")
            if isinstance(extra, dict):
                points += [(metric_key(m), float(v)) for m, v in extra.items() if _is_number(v)]
            if points:
                rid = event["replica"]
                owner = self._by_replica.get(rid)
                if owner is None:
                    owner = self._by_replica[rid] = self._owner(f"replica/{rid}/", False)
                self._fold(owner, float(event["step"]), t, points)
        elif kind == "eval":
            values = {m: event.get(m) for m in ("loss", "accuracy")}
            extra = event.get("metrics")
            if isinstance(extra, dict):
                values.update(extra)
            for metric, value in values.items():
                if _is_number(value) and _is_number(event.get("step")):
                    self._series(f"eval/{metric}").append(float(event["step"]), float(value), t)
                    self.version += 1
        elif kind == "device":
            points = [(m, float(v)) for m in TASK_METRICS
                      if (v := event.get(m)).__class__ is float or (v is not None and _is_number(v))]
            if not points:
                return
            name = event["task"]
            if "device" in event:  # TensorFlow's memory is per device: a series of its own for each
                for metric, value in points:
                    if metric.startswith("tf_"):
                        self._series(f"task/{name}@{event['device']}/{metric}", by_time=True).append(t, value, t)
                        self.version += 1
                points = [p for p in points if not p[0].startswith("tf_")]
            if points:
                owner = self._by_task.get(name)
                if owner is None:
                    owner = self._by_task[name] = self._owner(f"task/{name}/", True)
                self._fold(owner, t, t, points)

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.series if k.startswith(prefix))

    def replicas(self) -> list[int]:
        return sorted({int(k.split("/")[1]) for k in self.series if k.startswith("replica/")})

    def total_points(self) -> int:
        return sum(len(s) for s in self.series.values())


class _NoHistory(History):
    """A history that keeps nothing: for a state whose owner draws no curves."""

    def add(self, event: dict[str, Any]) -> None:
        return None


#: The parts of a step's time, in the order views stack them, and what views call them.
BREAKDOWN_PARTS = ("compute", "collective", "input", "dispatch")
BREAKDOWN_LABELS = {"compute": "compute", "collective": "collective wait", "input": "input wait",
                    "dispatch": "dispatch wait"}
#: Reported steps of breakdown each replica keeps for the views' curves (a run state with history).
BREAKDOWN_KEEP = 900


def _seconds(value: Any) -> float | None:
    if not _is_number(value):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class StepBreakdown:
    """Where a replica's reported step went, in seconds per step; a part is None where its mode does not
    measure it.

    - ``compute``: the rest of the step: the replica's own work (in ``model`` mode, where DTensor's
      collectives run inside the one step function, it holds them too);
    - ``collective``: waiting in the gradient all-reduce for the other replicas (``data`` mode's ``sync_wait``);
    - ``input``: waiting for the batch (``input_wait``);
    - ``dispatch``: ``async`` mode's wait for the chief's next function (``dispatch_wait``).
    """

    t: float
    step: int
    step_time: float
    compute: float
    collective: float | None = None
    input: float | None = None
    dispatch: float | None = None

    def part(self, name: str) -> float:
        """Seconds per step of part ``name`` (0 where not measured)."""
        value = getattr(self, name)
        return float(value) if value is not None else 0.0

    @property
    def total(self) -> float:
        return sum(self.part(name) for name in BREAKDOWN_PARTS)

    def shares(self) -> dict[str, float]:
        """Each part's share of the step (they sum to 1; all 0 for an empty step)."""
        total = self.total
        return {name: (self.part(name) / total if total > 0 else 0.0) for name in BREAKDOWN_PARTS}

    def measured(self) -> tuple[str, ...]:
        """The parts this step's mode measures (``compute`` always)."""
        return tuple(name for name in BREAKDOWN_PARTS if getattr(self, name) is not None)


#: The step event's fields a breakdown is made of, in the order :class:`Breakdowns` keeps them.
_BREAKDOWN_FIELDS = ("t", "step", "step_time", "sync_wait", "input_wait", "dispatch_wait", "own_time")


def breakdown_of(event: dict[str, Any]) -> StepBreakdown | None:
    """A ``step`` event's breakdown (None where it has no usable step time).

    ``data`` mode reports ``sync_wait`` and ``input_wait`` within ``step_time``; ``async`` reports the
    worker's function time ``own_time`` (its ``input_wait`` inside) and the ``dispatch_wait`` after it;
    ``model`` mode reports ``input_wait`` only. What is left of the step is compute.
    """
    return _breakdown(*(event.get(name) for name in _BREAKDOWN_FIELDS))


def _breakdown(t: Any, step: Any, step_time: Any, sync_wait: Any, input_wait: Any, dispatch_wait: Any,
               own_time: Any) -> StepBreakdown | None:
    whole = _seconds(step_time)
    sync, waited, dispatch, own = _seconds(sync_wait), _seconds(input_wait), _seconds(dispatch_wait), _seconds(own_time)
    t = float(t) if _is_number(t) else 0.0
    step = int(step) if _is_number(step) else 0
    if dispatch is not None and own is not None:
        inside = min(waited, own) if waited is not None else None
        return StepBreakdown(t, step, whole if whole else own + dispatch, own - (inside or 0.0), None, inside, dispatch)
    if not whole:
        return None
    collective = min(sync, whole) if sync is not None else None
    inside = min(waited, whole - (collective or 0.0)) if waited is not None else None
    return StepBreakdown(t, step, whole, max(0.0, whole - (collective or 0.0) - (inside or 0.0)), collective, inside)


class Breakdowns:
    """Each replica's latest step breakdown, and its last ``keep`` ones for curves.

    Folding keeps an event's raw figures only (a tuple: the launcher folds thousands of events a second);
    breakdowns are made when a view reads them, at its own pace.
    """

    def __init__(self, keep: int = BREAKDOWN_KEEP) -> None:
        self.keep = max(1, keep)
        self._latest: dict[int, tuple[Any, ...]] = {}
        self._recent: dict[int, deque[tuple[Any, ...]]] = {}
        self.version = 0  # bumps on every step folded

    def add(self, replica: int, event: dict[str, Any]) -> None:
        raw = (event.get("t"), event.get("step"), event.get("step_time"), event.get("sync_wait"),
               event.get("input_wait"), event.get("dispatch_wait"), event.get("own_time"))
        self._latest[replica] = raw
        if self.keep > 1:
            recent = self._recent.get(replica)
            if recent is None:
                recent = self._recent[replica] = deque(maxlen=self.keep)
            recent.append(raw)
        self.version += 1

    def latest(self) -> dict[int, StepBreakdown]:
        """Each replica's latest breakdown (replicas without a usable step time left out), by replica."""
        out = {}
        for rid in sorted(self._latest):
            b = _breakdown(*self._latest[rid])
            if b is not None:
                out[rid] = b
        return out

    def replicas(self) -> list[int]:
        return sorted(self._latest)

    def recent(self, replica: int, every: int = 1) -> list[StepBreakdown]:
        """The replica's last ``keep`` breakdowns, oldest first (every ``every``-th of them: a view of many
        replicas reads fewer)."""
        raws: list[tuple[Any, ...]] = list(self._recent.get(replica, ()))
        if every > 1:
            raws = raws[::-1][::every][::-1]  # the newest always among them
        made = (_breakdown(*raw) for raw in raws)
        return [b for b in made if b is not None]

    def first_t(self) -> float | None:
        """The time of the oldest breakdown kept (None: none yet)."""
        firsts = [r[0][0] for r in self._recent.values() if r and _is_number(r[0][0])]
        return min(firsts) if firsts else None

    def kept(self) -> int:
        """How many breakdowns are kept, over every replica."""
        return sum(len(r) for r in self._recent.values())

    def mean(self) -> dict[str, float]:
        """Seconds per step of each part, averaged over the replicas' latest breakdowns (empty: none yet)."""
        latest = list(self.latest().values())
        if not latest:
            return {}
        return {name: sum(b.part(name) for b in latest) / len(latest) for name in BREAKDOWN_PARTS}

    def measured(self) -> tuple[str, ...]:
        """The parts any replica's latest breakdown measures, in stacking order."""
        seen = {name for b in self.latest().values() for name in b.measured()}
        return tuple(name for name in BREAKDOWN_PARTS if name in seen)


class RunState:
    """Folds events into the current picture of a run. Not thread-safe: feed it from one thread.

    ``keep_history=False``: the latest figures only, no curves (``history`` stays empty): a
    launcher whose views fold the events into their own state, a headless run.
    """

    def __init__(self, total_steps: int = 0, tasks: Iterable[tuple[str, str, str]] = (),
                 keep_history: bool = True) -> None:
        self.total_steps = total_steps
        self.tasks: dict[str, TaskState] = {}
        for name, role, host in tasks:
            self.tasks[name] = TaskState(name=name, role=role, host=host)
        self.replicas: dict[int, ReplicaState] = {}
        self.history = History() if keep_history else _NoHistory()
        #: Each replica's step breakdown (compute, collective, input, dispatch), the latest and recent ones.
        self.breakdowns = Breakdowns(BREAKDOWN_KEEP if keep_history else 1)
        self.infos: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.state = "pending"
        self.reason = ""
        self.failed_task = ""
        self.started_at: float | None = None
        self.first_step_at: float | None = None
        self.first_step: int = 0
        self.ended_at: float | None = None
        self.events = 0
        self.scheduled: int | None = None
        self.completed: int | None = None

    # -- folding

    def apply(self, event: dict[str, Any]) -> None:
        self.events += 1
        kind = event.get("kind")
        name = event.get("task", "")
        if kind == "step":
            self._step(event)
        elif kind == "device":
            task = self._task(name)
            for key in _TASK_FIGURES:
                if (value := event.get(key)) is not None and _is_number(value):
                    setattr(task, key, value)
            self.history.add(event)
        elif kind == "status":
            self._status(event)
        elif kind == "info":
            self.infos.append(event)
        elif kind == "eval":
            self.evals.append(event)
            self.history.add(event)
        elif kind == "progress":
            self.scheduled = event.get("scheduled", self.scheduled)
            self.completed = event.get("completed", self.completed)
            total = event.get("total")
            if _is_number(total) and total > 0:  # a program says how many steps it will take
                self.total_steps = int(total)
        elif kind == "run":
            self.state = str(event.get("state", self.state))
            self.reason = str(event.get("reason", self.reason) or "")
            self.failed_task = str(event.get("failed_task", self.failed_task) or "")
            if self.state == "running" and self.started_at is None:
                self.started_at = float(event["t"])
            if self.state in TERMINAL:
                self.ended_at = float(event["t"])

    def _task(self, name: str) -> TaskState:
        task = self.tasks.get(name)
        if task is None:
            task = self.tasks[name] = TaskState(name=name, role=name.split(":")[0])
        return task

    def _status(self, event: dict[str, Any]) -> None:
        task = self._task(event["task"])
        state = str(event.get("state", ""))
        if state == "starting" and task.state in (*TERMINAL, "running", "restarting"):
            task.restarts += 1
        task.state = state or task.state
        if "pid" in event and isinstance(event["pid"], int):
            task.pid = event["pid"]
        if "host" in event:
            task.host = str(event["host"])
        if "role" in event:
            task.role = str(event["role"])
        if "restarts" in event and isinstance(event["restarts"], int):
            task.restarts = event["restarts"]
        if state in ("failed", "stopped"):
            task.reason = str(event.get("reason", task.reason) or "")
        if isinstance(event.get("log_tail"), list):
            task.log_tail = [str(x) for x in event["log_tail"]]
        if "exit_code" in event:
            task.exit_code = event["exit_code"]
        if self.started_at is None:
            self.started_at = float(event["t"])

    def _step(self, event: dict[str, Any]) -> None:
        rid = event["replica"]
        rep = self.replicas.get(rid)
        if rep is None:
            rep = self.replicas[rid] = ReplicaState(replica=rid, task=event["task"])
        rep.task = event["task"]
        step = int(event["step"])
        if step > rep.step:
            rep.step = step
        rep.loss = event.get("loss")
        if rep.first_loss is None:
            rep.first_loss = rep.loss
        rep.examples_per_sec = event.get("examples_per_sec")
        rep.step_time = event.get("step_time")
        rep.worker = event.get("worker")
        metrics = event.get("metrics")
        if isinstance(metrics, dict):
            rep.metrics.update(metrics)
        if self.first_step_at is None:
            self.first_step_at = float(event["t"])
            self.first_step = int(event["step"])
        task = self.tasks.get(event["task"]) or self._task(event["task"])
        if task.state == "pending" or task.state == "starting":
            task.state = "running"
        self.breakdowns.add(rid, event)
        self.history.add(event)

    # -- figures

    @property
    def step(self) -> int:
        """Progress of the run: the furthest step any replica reported."""
        return max((r.step for r in self.replicas.values()), default=0)

    def throughput(self) -> float:
        """Examples/s summed over replicas (latest figure of each)."""
        return float(sum(r.examples_per_sec or 0.0 for r in self.replicas.values()))

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left at the pace since the first step (None before two reports)."""
        if self.first_step_at is None or not self.total_steps:
            return None
        now = time.time() if now is None else now
        done = self.step - self.first_step
        if done <= 0:
            return None
        rate = done / max(1e-6, now - self.first_step_at)
        return max(0.0, (self.total_steps - self.step) / rate)

    def summary(self) -> dict[str, Any]:
        replicas = {
            str(r.replica): {"task": r.task, "step": r.step, "loss": r.loss, "first_loss": r.first_loss,
                             "examples_per_sec": r.examples_per_sec, "step_time": r.step_time,
                             **({"worker": r.worker} if r.worker is not None else {}),
                             **({"metrics": dict(r.metrics)} if r.metrics else {})}
            for r in sorted(self.replicas.values(), key=lambda r: r.replica)
        }
        duration = None
        if self.started_at is not None and self.ended_at is not None:
            duration = self.ended_at - self.started_at
        last_eval = next((e for e in reversed(self.evals) if _is_number(e.get("loss"))), None)
        return {
            "state": self.state,
            "reason": self.reason,
            "failed_task": self.failed_task,
            "steps": self.step,
            "total_steps": self.total_steps,
            "examples_per_sec": self.throughput(),
            "duration_s": duration,
            "replicas": replicas,
            **({"validation": {"step": last_eval.get("step"), "loss": last_eval.get("loss"),
                               **(last_eval.get("metrics") or {})}} if last_eval is not None else {}),
            "tasks": {n: {"state": t.state, "host": t.host, "pid": t.pid, "reason": t.reason,
                          "restarts": t.restarts} for n, t in self.tasks.items()},
        }
