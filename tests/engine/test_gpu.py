"""GPU figures through NVML, with a stand-in NVML module; the real one where it is installed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from engine.control.gpu import GpuSample, GpuSampler, task_gpu_figures

GIB = 1024**3


class NVMLError(Exception):
    """Like pynvml's: one base class, many subclasses."""


@dataclass
class _Util:
    gpu: int
    memory: int = 0


@dataclass
class _Memory:
    total: int
    used: int
    free: int = 0


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - NVML's own spelling


@dataclass
class FakeNVML:
    """The few NVML calls the sampler makes, over a made-up machine."""

    util: list[int] = field(default_factory=lambda: [35, 80])
    used: list[int] = field(default_factory=lambda: [3 * GIB, 10 * GIB])
    total: list[int] = field(default_factory=lambda: [16 * GIB, 16 * GIB])
    procs: list[list[tuple[int, int | None]]] = field(
        default_factory=lambda: [[(100, 2 * GIB), (200, 1 * GIB)], [(100, 4 * GIB), (300, None)]])
    init_error: Exception | None = None
    procs_error: Exception | None = None
    broken_index: int | None = None
    calls: list[str] = field(default_factory=list)

    def nvmlInit(self) -> None:  # noqa: N802
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.util)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < len(self.util) or index == self.broken_index:
            raise NVMLError(f"invalid argument: {index}")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:  # noqa: N802
        return _Util(self.util[handle])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:  # noqa: N802
        return _Memory(total=self.total[handle], used=self.used[handle])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:  # noqa: N802
        if self.procs_error is not None:
            raise self.procs_error
        return [_Process(pid, mem) for pid, mem in self.procs[handle]]


def test_sampler_reads_every_gpu() -> None:
    nvml = FakeNVML()
    sampler = GpuSampler(nvml)
    assert sampler.available and sampler.count == 2 and sampler.error == ""
    samples = sampler.sample()
    assert samples == [
        GpuSample(0, 35.0, 3 * GIB, 16 * GIB, {100: 2 * GIB, 200: 1 * GIB}),
        GpuSample(1, 80.0, 10 * GIB, 16 * GIB, {100: 4 * GIB, 300: 0}),
    ]
    assert all(isinstance(s.util_percent, float) for s in samples)
    sampler.close()
    assert nvml.calls == ["init", "shutdown"]
    assert not sampler.available and sampler.sample() == []
    sampler.close()
    assert nvml.calls == ["init", "shutdown"], "shut down once only"


def test_sampler_reads_only_the_asked_gpus_and_skips_bad_ones() -> None:
    sampler = GpuSampler(FakeNVML(broken_index=0))
    assert [s.index for s in sampler.sample([1])] == [1]
    assert [s.index for s in sampler.sample([0, 1, 7])] == [1]
    assert [s.index for s in sampler.sample()] == [1]


def test_sampler_without_per_process_figures() -> None:
    samples = GpuSampler(FakeNVML(procs_error=NVMLError("not supported"))).sample()
    assert [(s.index, s.util_percent, s.process_mem_bytes) for s in samples] == [(0, 35.0, {}), (1, 80.0, {})]


def test_sampler_whose_init_raises_is_unavailable() -> None:
    nvml = FakeNVML(init_error=NVMLError("Driver Not Loaded"))
    sampler = GpuSampler(nvml)
    assert sampler.available is False
    assert "Driver Not Loaded" in sampler.error
    assert sampler.sample() == [] and sampler.sample([0]) == []
    sampler.close()
    assert nvml.calls == ["init"], "no shutdown after a failed init"


def test_sampler_with_no_gpu_still_shuts_nvml_down() -> None:
    nvml = FakeNVML(util=[], used=[], total=[], procs=[])
    sampler = GpuSampler(nvml)
    assert sampler.available is False and sampler.error == "NVML found no GPU"
    assert sampler.sample() == []
    sampler.close()
    assert nvml.calls == ["init", "shutdown"]


def test_sampler_whose_count_raises() -> None:
    class NoCount(FakeNVML):
        def nvmlDeviceGetCount(self) -> int:  # noqa: N802
            raise NVMLError("Unknown Error")

    nvml = NoCount()
    sampler = GpuSampler(nvml)
    assert sampler.available is False and "Unknown Error" in sampler.error
    sampler.close()
    assert nvml.calls == ["init", "shutdown"]


def test_sampler_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.control.gpu as gpu

    monkeypatch.setattr(gpu, "_load_nvml", lambda: None)
    sampler = GpuSampler()
    assert sampler.available is False and sampler.error == "nvidia-ml-py is not installed"
    assert sampler.sample() == []
    sampler.close()


def test_real_nvml_never_raises() -> None:
    """On a machine without a GPU or driver: unavailable, with a reason; with GPUs: plausible figures."""
    sampler = GpuSampler()
    try:
        if not sampler.available:
            assert sampler.error
            assert sampler.sample() == []
        else:
            samples = sampler.sample()
            assert len(samples) == sampler.count >= 1
            for s in samples:
                assert 0.0 <= s.util_percent <= 100.0
                assert 0 <= s.mem_used_bytes <= s.mem_total_bytes
                assert all(pid > 0 and mem >= 0 for pid, mem in s.process_mem_bytes.items())
    finally:
        sampler.close()
    assert sampler.available is False


def test_task_gpu_figures_picks_the_tasks_gpus_and_its_pid() -> None:
    samples = GpuSampler(FakeNVML()).sample()
    assert task_gpu_figures(samples, [0, 1], 100) == {
        "gpu_util": (35.0 + 80.0) / 2,
        "gpu_mem_bytes": 6 * GIB,
        "gpu_mem_total_bytes": 32 * GIB,
    }
    assert task_gpu_figures(samples, [1], 100) == {"gpu_util": 80.0, "gpu_mem_bytes": 4 * GIB,
                                                   "gpu_mem_total_bytes": 16 * GIB}
    assert task_gpu_figures(samples, [0], 200)["gpu_mem_bytes"] == GIB
    assert task_gpu_figures(samples, [1], 300)["gpu_mem_bytes"] == 0  # driver gave no figure
    assert task_gpu_figures(samples, [0], 999)["gpu_mem_bytes"] == 0  # not on this GPU


def test_task_gpu_figures_without_gpus() -> None:
    samples = GpuSampler(FakeNVML()).sample()
    assert task_gpu_figures(samples, [], 100) == {}
    assert task_gpu_figures(samples, [5], 100) == {}
    assert task_gpu_figures([], [0], 100) == {}
