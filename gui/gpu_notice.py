"""One notice when a run's GPUs are emulated, in every mode: from the tasks' ``info`` events that carry
``emulated_gpus`` (a task that found no GPU says how many it emulates), or, for a live run on this
machine without NVIDIA's driver, from the config itself (a mode whose tasks do not say so). No Qt."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from engine.contract.config import RunConfig, split_gpus
from engine.control import gpu

#: The words of TensorFlow's own line when it finds no GPU: never folded away as start-up noise.
GPU_WORDS = ("GPU will not be used", "Could not find cuda drivers")


def assigned_gpus(config: RunConfig) -> dict[str, int]:
    """How many GPUs each task of ``config`` is given (tasks given none left out)."""
    counts: dict[str, int] = {}
    for host in config.cluster.hosts:
        for name, ids in split_gpus(host, config.parallelism.mode).items():
            if ids:
                counts[name] = len(ids)
    return counts


def emulated_here(config: RunConfig) -> bool:
    """Whether a run of ``config`` started now would emulate its GPUs: every host is this machine,
    some task is given GPUs, and the machine has no NVIDIA driver."""
    return config.cluster.is_local and bool(assigned_gpus(config)) and not _driver_present()


@functools.lru_cache(maxsize=1)
def _driver_present() -> bool:
    return gpu.driver_present()  # a machine's driver does not come or go while the app runs


def emulated_by_task(infos: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The GPUs each task said it emulates (its latest word)."""
    out: dict[str, int] = {}
    for event in infos:
        count = event.get("emulated_gpus")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            out[str(event.get("task", ""))] = count
    return out


def notice(by_task: Mapping[str, int]) -> str:
    """The one line: ``no GPU here: 2 GPU(s) emulated as logical CPU devices``."""
    n = sum(by_task.values())
    return f"no GPU here: {n} GPU(s) emulated as logical CPU devices"


def is_gpu_word(line: str) -> bool:
    """TensorFlow's line that it will not use a GPU (shown, not folded, as it may be the only word on it)."""
    return any(w in line for w in GPU_WORDS)
