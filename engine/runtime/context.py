"""What a task process knows about itself: its config, name, folders and emitter."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from engine.contract.config import RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import nan_guard
from engine.runtime.emitter import Emitter
from engine.runtime.stop import StopSignal

#: Set to ``0`` to leave the step breakdown unmeasured: model mode's input wait, data and async modes' timestamps
#: inside the step's function (``bench/breakdown_cost.py`` compares steps with and without it; nothing else turns
#: it off). Data and async modes read it when their adapter is built.
BREAKDOWN_ENV = "CLUSTERDECK_STEP_BREAKDOWN"


def breakdown_measured() -> bool:
    """Whether this task measures where its steps go (input wait, ...): always, unless a benchmark says not."""
    return os.environ.get(BREAKDOWN_ENV, "1").strip() != "0"


@dataclass
class TaskContext:
    config: RunConfig
    task: str  # "worker:0"
    role: str
    index: int
    run_dir: Path
    emitter: Emitter
    devices: int  # devices asked for by the plan (real or emulated)
    gpus_assigned: bool
    stop: StopSignal = field(default_factory=StopSignal)  # set on SIGTERM: checkpoint and leave
    # what must outlive training until the process exits (see keep)
    kept: list[Any] = field(default_factory=list, repr=False)

    def keep(self, obj: Any) -> None:
        """Keep ``obj`` alive until the process exits (a task ends with ``os._exit``).

        Tearing down a strategy's distributed iterator waits for its prefetch threads, which can be
        blocked on a peer that has already left: seconds of nothing between the last checkpoint and
        the task's ``finished``. Nothing needs that teardown, so nothing runs it.
        """
        self.kept.append(obj)

    @property
    def task_dir(self) -> Path:
        return RunFolder(self.run_dir).task_dir(self.task)

    @property
    def checkpoint_dir(self) -> Path:
        """The run's checkpoints (written by the primary task; every task restores from here)."""
        return RunFolder(self.run_dir).checkpoints

    @property
    def scratch_dir(self) -> Path:
        """This task's throw-away folder inside the run folder (never under /tmp)."""
        return RunFolder(self.run_dir).scratch(self.task)

    def setup_devices(self) -> Any:
        """This task's training devices (real GPUs, or emulated ones: the run is told so)."""
        from engine.runtime.devices import setup_devices

        setup = setup_devices(self.devices, self.gpus_assigned)
        if setup.emulated:
            self.emitter.info(f"no GPU here: {setup.count} GPU(s) emulated as logical CPU devices",
                              emulated_gpus=setup.count)
        return setup

    @staticmethod
    def from_env(config: RunConfig, run_dir: Path, emitter: Emitter, stop: StopSignal | None = None) -> TaskContext:
        task = os.environ.get("CLUSTERDECK_TASK", "worker:0")
        role, _, index = task.partition(":")
        return TaskContext(config=config, task=task, role=role, index=int(index or 0), run_dir=run_dir,
                           emitter=emitter, devices=int(os.environ.get("CLUSTERDECK_DEVICES", "1")),
                           gpus_assigned=bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()),
                           stop=stop or StopSignal())


class ReplicaFigures(NamedTuple):
    """What a report reads of one replica (an adapter's fetch gives one per replica, or a bare loss); a new figure
    of a ``step`` event is a new field here, and its field of the event in :meth:`StepReporter.step_done`."""

    loss: Any  # its mean loss over the steps reported (a number, a scalar tensor, or None)
    sync_wait: float | None = None  # seconds it waited for the others in the all-reduce
    metrics: dict[str, Any] | None = None  # its training metrics by name
    input_wait: float | None = None  # seconds its step waited for its batch


class StepReporter:
    """Turns training steps into ``step`` events at a bounded rate (``training.metrics_hz``).

    Between reports no value is fetched from the device, so the training loop
    is not synchronised more often than the rate allows; a report averages
    step time and throughput over the steps since the previous one.
    """

    def __init__(self, emitter: Emitter | None, replica_ids: Sequence[int], per_replica_batch: int,
                 hz: float, device_names: Sequence[str] = ("CPU:0",),
                 memory: Callable[[str], tuple[int | None, int | None]] | None = None,
                 summaries: Any = None) -> None:
        self.emitter = emitter
        self.summaries = summaries  # engine.runtime.summaries.Summaries, or None
        self.replica_ids = list(replica_ids)
        self.per_replica_batch = per_replica_batch
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.memory = memory
        self.device_names = list(device_names)
        self.last = time.perf_counter()
        self.last_emit = -float("inf")
        self.last_memory = -float("inf")
        self.pending = 0
        self.reports = 0

    def step_done(self, step: int, fetch: Callable[[], Sequence[Any]], force: bool = False,
                  worker: int | None = None, steps: int = 1) -> None:
        """Count ``steps`` finished steps, the last of them ``step``; report (calling ``fetch`` for
        per-replica losses) when due."""
        self.pending += steps
        now = time.perf_counter()
        if self.emitter is None or not (force or now - self.last_emit >= self.interval):
            return
        results = fetch()
        now = time.perf_counter()
        step_time = (now - self.last) / max(1, self.pending)
        rate = self.per_replica_batch / step_time if step_time > 0 else 0.0
        losses: list[tuple[int, Any]] = []
        with self.emitter.batch():  # a report's events (every replica, the devices) in one write
            for rid, result in zip(self.replica_ids, results, strict=False):
                # a result is the replica's loss, or its ReplicaFigures (a tuple in that order)
                figures = (ReplicaFigures(*result) if isinstance(result, (tuple, list))
                           else ReplicaFigures(result))
                loss, wait, metrics, input_wait = figures
                losses.append((rid, loss))
                fields: dict[str, Any] = {"replica": rid, "step": step, "loss": None if loss is None else float(loss),
                          "examples_per_sec": rate,
                          "step_time": step_time}
                if wait is not None:
                    fields["sync_wait"] = float(wait)
                    fields["own_time"] = max(1e-6, step_time - float(wait))
                if input_wait is not None:  # the step's wait for its batch (the input pipeline's share)
                    fields["input_wait"] = min(float(input_wait), step_time)
                if worker is not None:
                    fields["worker"] = worker
                if metrics:
                    fields["metrics"] = {name: float(value) for name, value in metrics.items()}
                self.emitter.emit("step", **fields)
                if self.summaries is not None:
                    self.summaries.replica(rid, step, loss=fields["loss"], examples_per_sec=rate, step_time=step_time,
                                           **(fields.get("metrics") or {}))
            self.reports += 1
            self.last = now
            self.last_emit = now
            self.pending = 0
            if self.memory is not None and now - self.last_memory >= 0.5:
                self.last_memory = now
                for i, name in enumerate(self.device_names):
                    current, peak = self.memory(name)
                    if current is not None:
                        self.emitter.emit("device", device=name, device_index=i, tf_bytes=current, tf_peak_bytes=peak)
        for rid, loss in losses:  # after the report (its step shows), a NaN or infinite loss fails the task
            nan_guard.check_loss(rid, step, loss)

    def flush(self, step: int, fetch: Callable[[], Sequence[Any]]) -> None:
        """Report the steps counted since the last report (the last one of a run that stops)."""
        if self.pending:
            self.pending -= 1
            self.step_done(step, fetch, force=True)

    def restart_clock(self) -> None:
        self.last = time.perf_counter()
        self.pending = 0
