"""GPU figures through NVML (``nvidia-ml-py``), where GPUs and the driver exist.

Everything degrades to "no GPU figures" when the library or the driver is
missing; the NVML module can be swapped for a stand-in in tests.

Which GPU is which: a task's ``gpu_ids`` are CUDA's indices, and every task runs with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (:data:`engine.contract.task_plan.CUDA_ORDER_ENV`), so CUDA counts GPUs in
PCI bus order. NVML's own index need not follow that order (on a host of mixed models CUDA's default
puts the fastest first), so the sampler matches NVML's handles to CUDA's indices by PCI bus id
(:func:`cuda_order`), never by NVML's index.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    index: int
    util_percent: float
    mem_used_bytes: int
    mem_total_bytes: int
    process_mem_bytes: dict[int, int]  # pid -> bytes this process holds on the GPU


def driver_present() -> bool:
    """Whether this machine has NVIDIA's driver loaded (its device files or its ``/proc`` entry), so a
    process here may initialise CUDA. Without it every GPU a run assigns is emulated on the CPU."""
    return os.path.exists("/proc/driver/nvidia") or bool(glob.glob("/dev/nvidia[0-9]*"))


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuSampler:
    """Samples GPU utilisation and per-process GPU memory; inert without NVML."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml: Any = nvml if nvml is not None else _load_nvml()
        self.available = False
        self.count = 0
        self.error = ""
        self._initialised = False  # nvmlInit succeeded: nvmlShutdown is owed, GPUs or not
        self.order: list[int] = []  # NVML's index of each CUDA index (PCI bus order)
        if self.nvml is None:
            self.error = "nvidia-ml-py is not installed"
            return
        try:
            self.nvml.nvmlInit()
            self._initialised = True
            self.count = int(self.nvml.nvmlDeviceGetCount())
            self.available = self.count > 0
            self.order = cuda_order(self.nvml, self.count)
            if not self.available:
                self.error = "NVML found no GPU"
        except Exception as exc:  # noqa: BLE001 - NVMLError has many subclasses; any means: no GPU figures
            self.error = f"NVML unavailable: {exc}"
            self.available = False
            self.count = 0

    def sample(self, indices: list[int] | None = None) -> list[GpuSample]:
        if not self.available:
            return []
        out = []
        for i in indices if indices is not None else range(self.count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(self.order[i] if i < len(self.order) else i)
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                procs: dict[int, int] = {}
                try:
                    for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        used = getattr(p, "usedGpuMemory", None)
                        procs[int(p.pid)] = int(used) if used is not None else 0
                except Exception:  # noqa: BLE001 - per-process figures are optional on some drivers
                    pass
                out.append(GpuSample(i, float(util.gpu), int(mem.used), int(mem.total), procs))
            except Exception:  # noqa: BLE001
                continue
        return out

    def close(self) -> None:
        if self._initialised:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        self._initialised = False
        self.available = False


def _bus_id(value: Any) -> str:
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return text.strip().lower().rstrip("\x00")


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """``"00000000:3B:00.0"`` as numbers (domain, bus, device, function): PCI bus order, as CUDA counts."""
    parts = bus_id.replace(".", ":").split(":")
    try:
        return tuple(int(part, 16) for part in parts)
    except ValueError:
        return (1 << 62,)


def cuda_order(nvml: Any, count: int) -> list[int]:
    """NVML's index of each CUDA index under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: NVML's devices sorted by PCI bus
    id. NVML's own order where a bus id cannot be read."""
    ids: list[tuple[tuple[int, ...], int]] = []
    try:
        for i in range(count):
            info = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i))
            bus = getattr(info, "busId", None) or getattr(info, "busIdLegacy", None)
            if bus is None:
                return list(range(count))
            ids.append((_bus_key(_bus_id(bus)), i))
    except Exception:  # noqa: BLE001 - any NVML error: keep NVML's order
        return list(range(count))
    return [i for _, i in sorted(ids)]


def task_gpu_figures(samples: list[GpuSample], gpu_ids: list[int], pid: int) -> dict[str, float | int]:
    """Utilisation (mean over the task's GPUs) and the memory its process holds on them."""
    mine = [s for s in samples if s.index in gpu_ids]
    if not mine:
        return {}
    return {
        "gpu_util": sum(s.util_percent for s in mine) / len(mine),
        "gpu_mem_bytes": sum(s.process_mem_bytes.get(pid, 0) for s in mine),
        "gpu_mem_total_bytes": sum(s.mem_total_bytes for s in mine),
    }
