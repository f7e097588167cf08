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
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Series:
    """Growable float64 arrays x, y and t (wall time) with amortised O(1) appends.

    ``t_is_x``: the series is by time (x is the wall time), so no separate t array is kept.
    """

    __slots__ = ("_x", "_y", "_n", "_t")

    def __init__(self, capacity: int = 256, *, t_is_x: bool = False) -> None:
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self._t = None if t_is_x else np.empty(capacity, dtype=np.float64)
        self._n = 0

    def append(self, x: float, y: float, t: float) -> None:
        if self._n == len(self._x):
            # grow by an eighth: hours of points at 10 Hz for 100+ series stay within ~12 % of what
            # they hold (doubling kept up to twice that alive); appends stay amortised O(1)
            grow = max(256, len(self._x) // 8)
            self._x = np.concatenate([self._x, np.empty(grow)])
            self._y = np.concatenate([self._y, np.empty(grow)])
            if self._t is not None:
                self._t = np.concatenate([self._t, np.empty(grow)])
        self._x[self._n] = x
        self._y[self._n] = y
        if self._t is not None:
            self._t[self._n] = t
        self._n += 1

    def __len__(self) -> int:
        return self._n

    @property
    def x(self) -> np.ndarray:
        return self._x[: self._n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self._n]

    @property
    def t(self) -> np.ndarray:
        return (self._x if self._t is None else self._t)[: self._n]


#: Per-replica metrics kept as history, with their units.
REPLICA_METRICS = {"loss": "", "examples_per_sec": "examples/s", "step_time": "s"}
#: Per-task metrics kept as history.
TASK_METRICS = {"cpu_percent": "%", "rss_bytes": "B", "tf_bytes": "B", "gpu_util": "%", "gpu_mem_bytes": "B"}


class History:
    """Every point of every curve: ``replica/<id>/<metric>`` (x = step) and ``task/<name>/<metric>`` (x = time)."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.t0: float | None = None
        self.version = 0  # bumps on every append: views redraw only when it moved

    def _series(self, key: str, by_time: bool = False) -> Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(t_is_x=by_time)
        return s

    def add(self, event: dict[str, Any]) -> None:
        t = float(event.get("t", 0.0))
        if self.t0 is None:
            self.t0 = t
        kind = event.get("kind")
        if kind == "step":
            rid = event["replica"]
            for metric in REPLICA_METRICS:
                value = event.get(metric)
                if _is_number(value):
                    self._series(f"replica/{rid}/{metric}").append(float(event["step"]), float(value), t)
                    self.version += 1
        elif kind == "eval":
            for metric in ("loss", "accuracy"):
                value = event.get(metric)
                if _is_number(value) and _is_number(event.get("step")):
                    self._series(f"eval/{metric}").append(float(event["step"]), float(value), t)
                    self.version += 1
        elif kind == "device":
            name = event["task"]
            for metric in TASK_METRICS:
                value = event.get(metric)
                if _is_number(value):
                    suffix = f"@{event['device']}" if "device" in event and metric.startswith("tf_") else ""
                    self._series(f"task/{name}{suffix}/{metric}", by_time=True).append(t, float(value), t)
                    self.version += 1

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
