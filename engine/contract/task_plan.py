"""What a supervisor needs of the plan to start its tasks, without the config model: each task's
:class:`TaskPlan` (the launcher makes them, :mod:`engine.contract.plan`), the variables a task's environment
is given, and how a host's cores are shared by its tasks.

Kept apart from :mod:`engine.contract.plan` so that a supervisor, started on every host of a launch, imports
neither the config model nor YAML (docs/benchmarks.md, 4d).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskPlan:
    """All a supervisor needs to start one task process."""

    name: str
    role: str
    index: int
    host: str
    port: int | None
    gpu_ids: tuple[int, ...]
    devices: int  # replicas/devices this task trains on (emulated when there is no GPU)
    env: dict[str, str]
    #: whether it runs training steps (chief and workers; async: the workers only), as
    #: :func:`engine.contract.config.gpu_roles` says
    trains: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "index": self.index, "host": self.host, "port": self.port,
                "gpu_ids": list(self.gpu_ids), "devices": self.devices, "env": dict(self.env), "trains": self.trains}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TaskPlan:
        return TaskPlan(name=d["name"], role=d["role"], index=int(d["index"]), host=d["host"], port=d.get("port"),
                        gpu_ids=tuple(d.get("gpu_ids", ())), devices=int(d.get("devices", 1)),
                        env=dict(d.get("env", {})), trains=bool(d.get("trains", False)))


#: Every task's CUDA device order: GPU ids mean the same to CUDA, to NVML's figures and across models of GPU.
CUDA_ORDER_ENV = "CUDA_DEVICE_ORDER"
CUDA_ORDER = "PCI_BUS_ID"


#: The variable TensorFlow sizes a process's intra-op thread pool by (unset: every core of the machine).
INTRA_OP_ENV = "TF_NUM_INTRAOP_THREADS"


def intra_op_threads(tasks_on_host: int, cores: int) -> int:
    """Intra-op threads for each of ``tasks_on_host`` tasks sharing ``cores`` cores: an even share, at least one.

    TensorFlow gives every process an intra-op pool as large as the machine, so N tasks on one host run
    N times as many compute threads as it has cores, and they preempt each other in every step (on 2
    cores, two data-parallel workers trained 1.14 times as fast with one thread each: docs/benchmarks.md).
    The supervisor sets :data:`INTRA_OP_ENV` to this share unless the environment already sets it.
    """
    return max(1, cores // max(1, tasks_on_host))


#: The variable TensorFlow sizes a process's inter-op thread pool by (unset: every core the process may run on).
INTER_OP_ENV = "TF_NUM_INTEROP_THREADS"


@dataclass(frozen=True)
class CoreShare:
    """How one task of a host uses the host's cores: the cores it runs on (``()``: any of the host's) and
    the thread settings it is given (:data:`INTRA_OP_ENV`, and :data:`INTER_OP_ENV` where it is pinned)."""

    cores: tuple[int, ...]
    env: dict[str, str]


def share_cores(plans: Sequence[TaskPlan], cores: Sequence[int]) -> dict[str, CoreShare]:
    """The cores of a host (``cores``: the CPUs its supervisor may use) shared by the host's tasks.

    Every task gets an even share of intra-op threads (:func:`intra_op_threads`). Where the tasks that
    train (:attr:`TaskPlan.trains`) are at least two and no more than the cores, each of them also runs
    on cores of its own, an even share in order (its CPU affinity, inherited by every thread it starts):
    the training tasks of a run step together, and on 2 cores the bare data-parallel loop trained 1.36
    times as fast pinned as placed by the kernel, the async one 1.13 times (docs/benchmarks.md, 1d). The tasks that
    serve or coordinate (ps, the async chief, an evaluator) wake briefly per step and stay free to run on
    any core. A pinned task keeps the inter-op pool TensorFlow would size by the host's cores: sized by its
    own single core, the pool of an async worker had one thread and its first group of steps never ended.
    """
    cpus = sorted(cores) or [0]
    share = intra_op_threads(len(plans), len(cpus))
    trainers = [p.name for p in plans if p.trains]
    out = {p.name: CoreShare((), {INTRA_OP_ENV: str(share)}) for p in plans}
    if 2 <= len(trainers) <= len(cpus):
        per = len(cpus) // len(trainers)
        for i, name in enumerate(trainers):
            own = tuple(cpus[i * per:(i + 1) * per])
            out[name] = CoreShare(own, {INTRA_OP_ENV: str(len(own)), INTER_OP_ENV: str(len(cpus))})
    return out


def cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a Slurm step's, a taskset's), in order."""
    try:
        return sorted(os.sched_getaffinity(0)) or [0]
    except (AttributeError, OSError):
        return list(range(max(1, os.cpu_count() or 1)))
