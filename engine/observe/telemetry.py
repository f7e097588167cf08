"""What the launcher's side makes of the event stream: per-task and per-replica state,
progress with ETA, and the full history for plots (never downsampled here)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

TERMINAL = ("finished", "failed", "stopped")


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


def _is_number(value: Any) -> TypeGuard[int | float]:
    return type(value) is float or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    """A copy of ``a``'s first ``n`` items in an array half as large again (at least 256 items).

    Only the filled part is copied: the rest stays untouched, and as large arrays are ``mmap``
    blocks of their own (:mod:`engine.control.memory`), that spare room costs address space, not memory.
    Measured with ``bench/gui_scale.py`` (36,000 points per series): growing by an eighth with
    ``np.concatenate`` (which writes the spare room too) ended at 316 MB RSS; copying the filled
    part only, 307 MB; with shared axes, 273 MB by an eighth, 265 MB by half, 264 MB by doubling.
    By half: most of the gain, with less idle room than doubling; 12 reallocations to 36,000 points, not 42.
    """
    b = np.empty(max(256, len(a) + len(a) // 2), dtype=np.float64)
    b[:n] = a[:n]
    return b


class _Axis:
    """Growable x and t (wall time) arrays: where the points of one series are, or of several
    series of one owner that got a point from every event since they started (see :class:`History`).

    ``t is None``: x is the wall time.
    """

    __slots__ = ("x", "t", "n")

    def __init__(self, capacity: int = 256, t_is_x: bool = False) -> None:
        self.x = np.empty(capacity, dtype=np.float64)
        self.t: np.ndarray | None = None if t_is_x else np.empty(capacity, dtype=np.float64)
        self.n = 0

    def append(self, x: float, t: float) -> None:
        n = self.n
        if n == len(self.x):
            self.x = _grown(self.x, n)
            if self.t is not None:
                self.t = _grown(self.t, n)
        self.x[n] = x
        if self.t is not None:
            self.t[n] = t
        self.n = n + 1

    def part(self, start: int, stop: int) -> _Axis:
        """A copy of ``[start, stop)`` with room to grow."""
        n = stop - start
        axis = _Axis(max(256, n + n // 2), self.t is None)
        axis.x[:n] = self.x[start:stop]
        if self.t is not None and axis.t is not None:
            axis.t[:n] = self.t[start:stop]
        axis.n = n
        return axis


class Series:
    """Growable float64 arrays x, y and t (wall time) with amortised O(1) appends.

    ``t_is_x``: the series is by time (x is the wall time), so no separate t array is kept.
    ``x`` and ``t`` may be views of an axis shared with other series of the same owner
    (:class:`History` does that); ``y`` is always the series' own.
    """

    __slots__ = ("_axis", "_start", "_y", "_n", "_shared")

    def __init__(self, capacity: int = 256, *, t_is_x: bool = False) -> None:
        self._axis = _Axis(capacity, t_is_x)
        self._start = 0
        self._y = np.empty(capacity, dtype=np.float64)
        self._n = 0
        self._shared = False

    @classmethod
    def _on(cls, axis: _Axis, start: int) -> Series:
        """A series whose x and t are ``axis`` from index ``start`` on (it gets a point at each of them)."""
        s = cls.__new__(cls)
        s._axis, s._start, s._n, s._shared = axis, start, 0, True
        s._y = np.empty(256, dtype=np.float64)
        return s

    def append(self, x: float, y: float, t: float) -> None:
        if self._shared:
            self._detach()
        self._axis.append(x, t)
        self._push(y)

    def _push(self, y: float) -> None:
        """Append y only: its x and t are already at the axis' index ``_start + len(self)``."""
        n = self._n
        if n == len(self._y):
            self._y = _grown(self._y, n)
        self._y[n] = y
        self._n = n + 1

    def _detach(self) -> None:
        """Copy this series' part of a shared axis: from now on it keeps x and t of its own."""
        self._axis = self._axis.part(self._start, self._start + self._n)
        self._start = 0
        self._shared = False

    def __len__(self) -> int:
        return self._n

    @property
    def x(self) -> np.ndarray:
        return self._axis.x[self._start: self._start + self._n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self._n]

    @property
    def t(self) -> np.ndarray:
        axis = self._axis
        return (axis.x if axis.t is None else axis.t)[self._start: self._start + self._n]


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
#: Per-task metrics kept as history.
TASK_METRICS = {"cpu_percent": "%", "rss_bytes": "B", "tf_bytes": "B", "gpu_util": "%", "gpu_mem_bytes": "B"}


class History:
    """Every point of every curve: ``replica/<id>/<metric>`` (x = step) and ``task/<name>/<metric>`` (x = time).

    The metrics of one event have the same x and t: the series of one replica (of one task)
    share a single x and t axis as long as each got a point from every event (5 arrays per
    replica instead of 9). ``series[key]`` is still every point of each, in order.
    """

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.t0: float | None = None
        self.version = 0  # bumps on every append: views redraw only when it moved
        self._owners: dict[str, _Owner] = {}  # by key prefix
        self._by_replica: dict[Any, _Owner] = {}
        self._by_task: dict[str, _Owner] = {}

    def _series(self, key: str, by_time: bool = False) -> Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(t_is_x=by_time)
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
                    axis = owner.axis = _Axis(t_is_x=owner.t_is_x)
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
            points = [(m, float(v)) for m in REPLICA_METRICS if (v := event.get(m)) is not None and _is_number(v)]
            if points:
                rid = event["replica"]
                owner = self._by_replica.get(rid)
                if owner is None:
                    owner = self._by_replica[rid] = self._owner(f"replica/{rid}/", False)
                self._fold(owner, float(event["step"]), t, points)
        elif kind == "eval":
            for metric in ("loss", "accuracy"):
                value = event.get(metric)
                if _is_number(value) and _is_number(event.get("step")):
                    self._series(f"eval/{metric}").append(float(event["step"]), float(value), t)
                    self.version += 1
        elif kind == "device":
            points = [(m, float(v)) for m in TASK_METRICS if (v := event.get(m)) is not None and _is_number(v)]
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


class RunState:
    """Folds events into the current picture of a run. Not thread-safe: feed it from one thread."""

    def __init__(self, total_steps: int = 0, tasks: Iterable[tuple[str, str, str]] = ()) -> None:
        self.total_steps = total_steps
        self.tasks: dict[str, TaskState] = {}
        for name, role, host in tasks:
            self.tasks[name] = TaskState(name=name, role=role, host=host)
        self.replicas: dict[int, ReplicaState] = {}
        self.history = History()
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
            for key in ("cpu_percent", "rss_bytes", "tf_bytes", "gpu_util", "gpu_mem_bytes"):
                if _is_number(event.get(key)):
                    setattr(task, key, event[key])
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
        rep.step = max(rep.step, int(event["step"]))
        rep.loss = event.get("loss")
        if rep.first_loss is None:
            rep.first_loss = rep.loss
        rep.examples_per_sec = event.get("examples_per_sec")
        rep.step_time = event.get("step_time")
        rep.worker = event.get("worker")
        if self.first_step_at is None:
            self.first_step_at = float(event["t"])
            self.first_step = int(event["step"])
        task = self._task(event["task"])
        if task.state in ("pending", "starting"):
            task.state = "running"
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
                             "examples_per_sec": r.examples_per_sec, "step_time": r.step_time}
            for r in sorted(self.replicas.values(), key=lambda r: r.replica)
        }
        duration = None
        if self.started_at is not None and self.ended_at is not None:
            duration = self.ended_at - self.started_at
        return {
            "state": self.state,
            "reason": self.reason,
            "failed_task": self.failed_task,
            "steps": self.step,
            "total_steps": self.total_steps,
            "examples_per_sec": self.throughput(),
            "duration_s": duration,
            "replicas": replicas,
            "tasks": {n: {"state": t.state, "host": t.host, "pid": t.pid, "reason": t.reason,
                          "restarts": t.restarts} for n, t in self.tasks.items()},
        }
