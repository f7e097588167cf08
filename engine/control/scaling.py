"""Scaling report: run one config at 1, 2, 4, … local workers and measure how throughput scales.

Each worker count becomes its own run of the config's own mode, launched one after the other through
:class:`~engine.control.launcher.Run`: a data-parallel config runs ``MultiWorkerMirroredStrategy`` across
local worker processes; an asynchronous one keeps its chief and parameter servers and adds workers
(``ParameterServerStrategy``). A model-parallel config is refused, saying why (its scale is its mesh,
not a worker count). A run's
throughput is its steady state: the examples/s the trainers measured themselves after a warm-up
(``window_examples_per_sec`` of their ``finished`` status), or, where a run reports none, the pace of
its step events after the same warm-up. Scaling efficiency is ``tp(n) / (n * tp(1))``.

Choices, and why:

- Weak scaling by default (each replica keeps the config's per-replica batch, so the global batch
  grows with the workers), as Horovod's published figures are; ``strong=True`` keeps the global batch.
- A trainer's ``window_examples_per_sec`` already counts the *global* batch of every synchronous step,
  so the trainers' figures are averaged, never summed (a sum would count every example n times).
- Checkpoints only at the end and no restarts: a scaling run is a measurement, and a checkpoint in the
  middle would be timed as training.
- :class:`ScalingSession` never blocks: ``poll()`` advances it (the desktop app calls it from a
  timer); :func:`run_scaling` is the blocking loop around it for the command line.

Control half: no TensorFlow and no Qt. The PNG is drawn by ``python -m gui.scaling_plot`` in a
subprocess (:func:`render_png`).
"""

from __future__ import annotations

import csv
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract.config import ConfigError, Host, Problem, RunConfig, Task
from engine.control.lifecycle import RunHandle

__all__ = [
    "CSV_COLUMNS", "HOROVOD_EFFICIENCY", "ScalingPoint", "ScalingProgress", "ScalingReport", "ScalingSession",
    "describe", "parse_workers", "read_csv", "run_scaling", "scaling_configs", "write_csv",
]

#: Horovod's published scaling efficiency (Inception V3 and ResNet-101 on up to 512 GPUs): a reference line.
HOROVOD_EFFICIENCY = 0.90
DEFAULT_WORKERS = (1, 2, 4)
#: The modes a scaling report measures (by adding workers), and what it says of the others.
SCALED_MODES = ("data", "async")
REFUSED = {
    "model": "model parallelism splits one model over a fixed device mesh (parallelism.mesh); its scale is the "
             "mesh, not a number of workers — compare mesh shapes with separate runs instead",
}
MAX_WORKERS = 256
CSV_COLUMNS = ("workers", "replicas", "global_batch_size", "batch_per_replica", "steps", "examples_per_sec",
               "ideal_examples_per_sec", "efficiency", "step_time_ms", "source", "state", "duration_s", "reason",
               "run_dir", "preset", "scaling", "cpu_count", "mode")


# --------------------------------------------------------------------------- configs


def parse_workers(text: str | Iterable[int]) -> tuple[int, ...]:
    """``"1,2,4"`` (or a sequence of ints) as sorted unique worker counts; ConfigError naming ``workers``."""
    items: list[Any]
    if isinstance(text, str):
        items = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    else:
        items = list(text)
    counts: set[int] = set()
    for item in items:
        try:
            n = int(item) if not isinstance(item, bool) else -1
        except (TypeError, ValueError):
            n = -1
        if isinstance(item, float) and not item.is_integer():
            n = -1
        if not 1 <= n <= MAX_WORKERS:
            raise ConfigError([Problem("workers", f"expected worker counts from 1 to {MAX_WORKERS} "
                                                  f"(e.g. 1,2,4), got {item!r}")])
        counts.add(n)
    if not counts:
        raise ConfigError([Problem("workers", "expected at least one worker count (e.g. 1,2,4), got none")])
    return tuple(sorted(counts))


def _devices_per_worker(config: RunConfig) -> int:
    """Devices (real or emulated GPUs) each worker of the scaled runs gets: as the config's first trainer
    (in async mode its first worker: the chief trains nothing there)."""
    trainers = config.trainer_tasks()
    if config.parallelism.mode == "async":
        trainers = [(h, t) for h, t in trainers if t.role == "worker"]
    for host, task in trainers:
        if host.gpus > 0:
            return config.devices_of(host, task)
        return 1
    return 1


def _batch_per_replica(config: RunConfig) -> int:
    replicas = max(1, config.num_replicas())
    return max(1, config.training.global_batch_size // replicas)


def scaling_configs(config: RunConfig, workers: Iterable[int] | str = DEFAULT_WORKERS, *, strong: bool = False,
                    steps: int | None = None) -> list[RunConfig]:
    """One data-parallel, all-local config per worker count, otherwise as ``config``.

    Weak scaling (default): every replica keeps ``config``'s per-replica batch. ``strong=True``: the global
    batch stays ``config``'s. ``steps`` overrides ``training.steps``. Raises ConfigError naming the field.
    """
    counts = parse_workers(workers)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError([Problem("steps", f"expected an integer >= 1, got {steps!r}")])
    mode = config.parallelism.mode
    if mode not in SCALED_MODES:
        reason = REFUSED.get(mode, f"expected a mode of {', '.join(SCALED_MODES)}")
        raise ConfigError([Problem("parallelism.mode", f"a scaling report measures {' or '.join(SCALED_MODES)} "
                                                       f"parallelism, not {mode!r}: {reason}")])
    devices = _devices_per_worker(config)
    uses_gpus = any(h.gpus > 0 for h, _ in config.trainer_tasks())
    # async: the chief and the parameter servers stay (at least one ps), only the workers are counted
    servers = max(1, len(config.cluster.tasks_of("ps"))) if mode == "async" else 0
    others = ((Task("chief", 0),) + tuple(Task("ps", i) for i in range(servers))) if mode == "async" else ()
    per_replica = _batch_per_replica(config)
    base_host = next((h for h in config.cluster.hosts if h.is_local), None)
    out: list[RunConfig] = []
    for n in counts:
        replicas = n * devices
        if strong:
            global_batch = config.training.global_batch_size
            if global_batch % replicas:
                raise ConfigError([Problem("training.global_batch_size",
                                           f"strong scaling over {n} worker(s) ({replicas} replicas) needs a global "
                                           f"batch divisible by {replicas}, got {global_batch}")])
        else:
            global_batch = per_replica * replicas
        host = Host(name=base_host.name if base_host is not None else "local", address="localhost",
                    gpus=devices * n if uses_gpus else 0,
                    tasks=others[:1] + tuple(Task("worker", i) for i in range(n)) + others[1:],
                    python=base_host.python if base_host is not None else "python3")
        training = config_mod.replace(config.training.for_mode(mode), global_batch_size=global_batch,
                                      checkpoint_every=0, restarts=0,
                                      **({"steps": steps, "epochs": None} if steps is not None else {}))
        scaled = config_mod.replace(
            config, name=f"{config.name}-scaling-{n}w",
            cluster=config_mod.replace(config.cluster, hosts=(host,)),
            training=training)
        problems = config_mod.validate(scaled)
        if problems:
            raise ConfigError(problems, source=f"the scaling run with {n} worker(s)")
        out.append(scaled)
    return out


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ScalingPoint:
    """One worker count's run and its steady-state throughput (None when it could not be measured)."""

    workers: int
    replicas: int
    global_batch_size: int
    steps: int
    examples_per_sec: float | None
    source: str = ""  # "window" (the trainers' own measurement) or "steps" (from step events)
    state: str = ""  # the run's end state
    duration_s: float | None = None
    reason: str = ""
    run_dir: str = ""

    @property
    def batch_per_replica(self) -> int:
        return self.global_batch_size // max(1, self.replicas)

    @property
    def step_time_ms(self) -> float | None:
        if not self.examples_per_sec:
            return None
        return 1000.0 * self.global_batch_size / self.examples_per_sec


@dataclass(frozen=True)
class ScalingReport:
    preset: str
    scaling: str  # "weak" or "strong"
    cpu_count: int
    points: tuple[ScalingPoint, ...] = ()
    mode: str = ""  # the parallelism every run used ("data", "async"); "" when not known (an old CSV)

    def _baseline(self) -> ScalingPoint | None:
        """The 1-worker point (or the fewest workers measured) that ideal scaling extrapolates from."""
        measured = [p for p in self.points if p.examples_per_sec]
        return min(measured, key=lambda p: p.workers) if measured else None

    def ideal(self, point: ScalingPoint) -> float | None:
        """Perfect linear scaling from the baseline: ``n * tp(1)``."""
        base = self._baseline()
        if base is None or not base.examples_per_sec:
            return None
        return point.workers * base.examples_per_sec / base.workers

    def efficiency(self, point: ScalingPoint) -> float | None:
        """``tp(n) / (n * tp(1))``; None where either is unknown."""
        ideal = self.ideal(point)
        if ideal is None or point.examples_per_sec is None:
            return None
        return point.examples_per_sec / ideal

    @property
    def workers(self) -> list[int]:
        return [p.workers for p in self.points]


def describe(report: ScalingReport) -> str:
    """One line saying what was measured and on what (the plot's subtitle)."""
    parts = [report.preset]
    if report.mode:
        parts.append({"data": "data parallel (synchronous)", "async": "asynchronous, parameter servers"}
                     .get(report.mode, report.mode))
    if report.points:
        p = report.points[0]
        if report.scaling == "strong":
            parts.append(f"strong scaling, global batch {p.global_batch_size}")
        else:
            parts.append(f"weak scaling, {p.batch_per_replica} examples per replica")
        parts.append(f"{p.steps} steps")
    parts.append(f"{report.cpu_count} CPU core{'s' if report.cpu_count != 1 else ''} shared by all workers")
    most = max(report.workers, default=0)
    if report.cpu_count and most > report.cpu_count:
        parts.append(f"beyond {report.cpu_count} workers the workers compete for the cores")
    return " · ".join(parts)


def format_number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:.{digits}f}"


def write_csv(report: ScalingReport, path: str | os.PathLike[str]) -> Path:
    """One row per worker count, columns :data:`CSV_COLUMNS`; empty cells where nothing was measured."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for p in report.points:
            writer.writerow([p.workers, p.replicas, p.global_batch_size, p.batch_per_replica, p.steps,
                             format_number(p.examples_per_sec, 2), format_number(report.ideal(p), 2), format_number(report.efficiency(p)),
                             format_number(p.step_time_ms, 3), p.source, p.state, format_number(p.duration_s, 2), p.reason,
                             p.run_dir, report.preset, report.scaling, report.cpu_count, report.mode])
    return path


def read_csv(path: str | os.PathLike[str]) -> ScalingReport:
    """A report written by :func:`write_csv` (ideal and efficiency are recomputed, not read)."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = reader.fieldnames or []
    missing = [c for c in ("workers", "replicas", "global_batch_size", "steps", "examples_per_sec")
               if c not in columns]
    if missing:
        raise ConfigError([Problem("", f"not a scaling report: no column {', '.join(missing)}")], str(path))

    def number(text: str | None) -> float | None:
        try:
            value = float(text) if text not in (None, "") else None
        except ValueError:
            return None
        return value if value is not None and math.isfinite(value) else None

    points = []
    for i, row in enumerate(rows, start=2):
        try:
            points.append(ScalingPoint(
                workers=int(row["workers"]), replicas=int(row["replicas"]),
                global_batch_size=int(row["global_batch_size"]), steps=int(row["steps"]),
                examples_per_sec=number(row.get("examples_per_sec")), source=row.get("source") or "",
                state=row.get("state") or "", duration_s=number(row.get("duration_s")),
                reason=row.get("reason") or "", run_dir=row.get("run_dir") or ""))
        except (TypeError, ValueError):
            raise ConfigError([Problem(f"line {i}", "expected integers in workers, replicas, global_batch_size "
                                                    "and steps")], str(path)) from None
    first = rows[0] if rows else {}
    cpus = number(first.get("cpu_count"))
    return ScalingReport(preset=first.get("preset") or Path(path).stem, scaling=first.get("scaling") or "weak",
                         cpu_count=int(cpus) if cpus else (os.cpu_count() or 1), points=tuple(points),
                         mode=first.get("mode") or "")


# --------------------------------------------------------------------------- measuring


def warm_up_steps(total: int) -> int:
    """Steps left out of the measurement: as the trainers' own window (tracing, first all-reduces)."""
    return max(1, min(50, total // 5))


def measure(events: Sequence[dict[str, Any]], config: RunConfig) -> tuple[float | None, str]:
    """Steady-state examples/s of one finished run, and where the figure came from."""
    trainers = {t.name for _, t in config.trainer_tasks()}
    window = [float(e["window_examples_per_sec"]) for e in events
              if e.get("kind") == "status" and e.get("state") == "finished" and e.get("task") in trainers
              and _positive(e.get("window_examples_per_sec"))]
    if window:
        return statistics.fmean(window), "window"
    # from step events: each replica's pace after the warm-up, times the global batch of a step
    warm = warm_up_steps(config.total_steps())
    by_replica: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        if e.get("kind") == "step" and isinstance(e.get("step"), int) and _positive(e.get("t")):
            if e["step"] >= warm and isinstance(e.get("replica"), int):
                by_replica.setdefault(e["replica"], []).append((float(e["t"]), int(e["step"])))
    batch = config.training.global_batch_size
    if config.parallelism.mode == "async":  # a step there is one worker's batch, not a global one
        batch = max(1, batch // max(1, len(config.cluster.tasks_of("worker"))))
    rates = []
    for samples in by_replica.values():
        (t0, s0), (t1, s1) = min(samples), max(samples)
        if t1 > t0 and s1 > s0:
            rates.append((s1 - s0) * batch / (t1 - t0))
    if rates:
        return statistics.fmean(rates), "steps"
    return None, ""


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class ScalingProgress:
    """Where a scaling session stands: run ``index`` (0-based) of ``runs``, its step, and an ETA."""

    index: int
    runs: int
    workers: int
    step: int
    total_steps: int
    fraction: float  # 0..1 over the whole session
    elapsed_s: float
    eta_s: float | None
    state: str  # "running", "finished", "cancelled", "failed"
    message: str = ""


@dataclass
class _Current:
    run: RunHandle
    config: RunConfig
    events: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0


class ScalingSession:
    """Runs the scaling configs one after the other; :meth:`poll` advances it without blocking."""

    def __init__(self, config: RunConfig, workers: Iterable[int] | str = DEFAULT_WORKERS, steps: int | None = None,
                 runs_root: str | os.PathLike[str] | None = None, *, strong: bool = False,
                 run_factory: Callable[..., RunHandle] | None = None, run_options: dict[str, Any] | None = None) -> None:
        self.base = config
        self.configs = scaling_configs(config, workers, strong=strong, steps=steps)
        self.strong = strong
        self.runs_root = Path(runs_root) if runs_root is not None else None
        self._run_factory = run_factory
        self._run_options = dict(run_options or {})
        self.points: list[ScalingPoint] = []
        self._current: _Current | None = None
        self._index = 0
        self._started_at: float | None = None
        self._durations: list[float] = []
        self._cancelled = threading.Event()
        self.state = "pending"
        self.message = ""

    @property
    def done(self) -> bool:
        return self.state in ("finished", "cancelled", "failed")

    def cancel(self) -> None:
        """Stop the run in progress (without waiting) and start no other; ``poll()`` until ``done``."""
        self._cancelled.set()
        cur = self._current
        if cur is not None:
            cur.run.stop(reason="scaling report cancelled", wait=False)

    def poll(self) -> bool:
        """Advance: fold a finished run into its point, start the next. True once the session is done."""
        if self.done:
            return True
        if self._started_at is None:
            self._started_at = time.monotonic()
            self.state = "running"
        cur = self._current
        if cur is not None:
            if not cur.run.done:
                return False
            self._record(cur)
            self._current = None
            self._index += 1
        if self._cancelled.is_set():
            self.state, self.message = "cancelled", "cancelled"
            return True
        if self._index >= len(self.configs):
            self.state = "finished"
            self.message = f"{len(self.points)} run(s) measured"
            return True
        self._start(self.configs[self._index])
        return self.done

    def _start(self, config: RunConfig) -> None:
        from engine.control.launcher import Run  # the launcher pulls in psutil and the supervisor plumbing

        factory: Callable[..., RunHandle] = self._run_factory or Run
        run = factory(config, runs_root=self.runs_root, **self._run_options)
        cur = _Current(run=run, config=config, started=time.monotonic())
        run.add_listener(cur.events.append)  # on the run's dispatcher thread; read only once it is done
        self._current = cur
        workers = len(config.cluster.tasks_of("worker"))
        self.message = f"{workers} worker(s): starting"
        try:
            run.start()
        except (ConfigError, OSError) as exc:
            self._current = None
            self.points.append(self._point(config, None, "", "failed", None, str(exc), ""))
            self._index += 1
            self.message = f"{workers} worker(s) could not start: {exc}"

    def _record(self, cur: _Current) -> None:
        run, config = cur.run, cur.config
        summary = run.state.summary()
        duration = time.monotonic() - cur.started
        self._durations.append(duration)
        value, source = measure(cur.events, config) if summary["state"] == "finished" else (None, "")
        run_dir = ""
        try:
            run_dir = str(run.run_dir)
        except RuntimeError:
            pass
        self.points.append(self._point(config, value, source, str(summary["state"]), duration,
                                       str(summary.get("reason") or ""), run_dir))
        workers = len(config.cluster.tasks_of("worker"))
        self.message = (f"{workers} worker(s): {value:.0f} examples/s" if value
                        else f"{workers} worker(s): {summary['state']}")

    def _point(self, config: RunConfig, value: float | None, source: str, state: str, duration: float | None,
               reason: str, run_dir: str) -> ScalingPoint:
        return ScalingPoint(workers=len(config.cluster.tasks_of("worker")), replicas=config.num_replicas(),
                            global_batch_size=config.training.global_batch_size, steps=config.total_steps(),
                            examples_per_sec=value, source=source, state=state, duration_s=duration,
                            reason=reason, run_dir=run_dir)

    def progress(self) -> ScalingProgress:
        """A snapshot for a progress bar. The ETA weighs each run by its workers (a run of 4 takes longer)."""
        runs = len(self.configs)
        elapsed = time.monotonic() - self._started_at if self._started_at is not None else 0.0
        cur = self._current
        step, total, workers = 0, 0, 0
        frac_run = 0.0
        if cur is not None:
            step = int(cur.run.state.step)
            total = int(cur.config.total_steps())
            workers = len(cur.config.cluster.tasks_of("worker"))
            frac_run = min(1.0, step / total) if total else 0.0
        elif self._index < runs:
            workers = len(self.configs[self._index].cluster.tasks_of("worker"))
        weights = [1.0 + len(c.cluster.tasks_of("worker")) for c in self.configs]  # start-up + per-worker work
        done_w = sum(weights[: min(self._index, runs)])
        cur_w = weights[self._index] * frac_run if self._index < runs else 0.0
        fraction = 1.0 if self.done else min(1.0, (done_w + cur_w) / sum(weights)) if weights else 1.0
        eta = None
        if self.done:
            eta = 0.0
        elif fraction > 0.02 and elapsed > 0:
            eta = elapsed * (1.0 - fraction) / fraction
        return ScalingProgress(index=min(self._index, max(0, runs - 1)), runs=runs, workers=workers, step=step,
                               total_steps=total, fraction=fraction, elapsed_s=elapsed, eta_s=eta,
                               state=self.state if self.state != "pending" else "running", message=self.message)

    def report(self) -> ScalingReport:
        return ScalingReport(preset=self.base.name, scaling="strong" if self.strong else "weak",
                             cpu_count=os.cpu_count() or 1, points=tuple(self.points),
                             mode=self.base.parallelism.mode)


def run_scaling(config: RunConfig, workers: Iterable[int] | str = DEFAULT_WORKERS, steps: int | None = None,
                runs_root: str | os.PathLike[str] | None = None,
                on_progress: Callable[[ScalingProgress], None] | None = None, *, strong: bool = False,
                poll_s: float = 0.1, session: ScalingSession | None = None, **run_options: Any) -> ScalingReport:
    """Run ``config`` at each worker count, one run after another, and return the report (blocking).

    ``on_progress`` gets a :class:`ScalingProgress` about every ``poll_s`` seconds. ``session`` lets the
    caller keep a handle to :meth:`ScalingSession.cancel` it (from a signal handler).
    """
    if session is None:
        session = ScalingSession(config, workers, steps, runs_root, strong=strong, run_options=run_options)
    while not session.poll():
        if on_progress is not None:
            on_progress(session.progress())
        time.sleep(poll_s)
    if on_progress is not None:
        on_progress(session.progress())
    return session.report()
