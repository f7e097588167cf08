"""GPU order: CUDA counts GPUs in PCI bus order in every task, and NVML's figures are matched by PCI bus id
(a stand-in NVML of a host with two models of GPU, where NVML's index is not CUDA's)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.contract import config as config_mod
from engine.contract.plan import plan_tasks, resolve_ports
from engine.contract.task_plan import CUDA_ORDER, CUDA_ORDER_ENV
from engine.control.gpu import GpuSampler, cuda_order, task_gpu_figures
from tests.conftest import PRESETS
from tests.engine.test_gpu import _Memory, _Process, _Util  # the NVML stand-in's records

GIB = 1024**3


@dataclass
class _Pci:
    busId: bytes  # noqa: N815 - NVML's own spelling


class MixedHost:
    """NVML of a host with an A100 on bus 0x81 and a T4 on bus 0x3B, listed A100 first (as NVML or CUDA's
    FASTEST_FIRST may); in PCI bus order, CUDA's device 0 is the T4."""

    devices = [  # NVML index order
        {"name": "A100", "bus": b"00000000:81:00.0", "util": 90, "total": 80 * GIB, "procs": [(200, 40 * GIB)]},
        {"name": "T4", "bus": b"00000000:3B:00.0", "util": 10, "total": 16 * GIB, "procs": [(100, 2 * GIB)]},
    ]

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict:  # noqa: N802
        return self.devices[i]

    def nvmlDeviceGetPciInfo(self, handle: dict) -> _Pci:  # noqa: N802
        return _Pci(handle["bus"])

    def nvmlDeviceGetUtilizationRates(self, handle: dict) -> _Util:  # noqa: N802
        return _Util(handle["util"])

    def nvmlDeviceGetMemoryInfo(self, handle: dict) -> _Memory:  # noqa: N802
        return _Memory(handle["total"], handle["total"] // 2)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict) -> list[_Process]:  # noqa: N802
        return [_Process(pid, used) for pid, used in handle["procs"]]


def test_cuda_index_0_is_the_gpu_first_on_the_pci_bus_not_nvmls_first() -> None:
    nvml = MixedHost()
    assert cuda_order(nvml, 2) == [1, 0]
    sampler = GpuSampler(nvml)
    samples = sampler.sample()
    by_index = {s.index: s for s in samples}
    assert by_index[0].mem_total_bytes == 16 * GIB and by_index[0].util_percent == 10  # the T4
    assert by_index[1].mem_total_bytes == 80 * GIB  # the A100
    # a task given CUDA device 0 (the T4) sees the T4's figures and its own memory there
    figures = task_gpu_figures(samples, [0], 100)
    assert figures == {"gpu_util": 10.0, "gpu_mem_bytes": 2 * GIB, "gpu_mem_total_bytes": 16 * GIB}
    assert sampler.sample([1])[0].util_percent == 90


def test_without_pci_info_nvmls_order_is_kept() -> None:
    class NoPci(MixedHost):
        def nvmlDeviceGetPciInfo(self, handle: dict) -> _Pci:  # noqa: N802
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    assert cuda_order(NoPci(), 2) == [0, 1]


def test_every_task_runs_with_cuda_counting_in_pci_bus_order() -> None:
    for preset in ("data-2workers.yaml", "async-1ps.yaml", "model-2clients.yaml"):
        cfg = config_mod.load(PRESETS / preset)
        cfg = config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))
        for plan in plan_tasks(cfg):
            assert plan.env[CUDA_ORDER_ENV] == CUDA_ORDER == "PCI_BUS_ID", (preset, plan.name)
