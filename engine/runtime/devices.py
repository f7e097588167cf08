"""Device set-up inside a task: real GPUs, or GPUs emulated as logical CPU devices."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class DeviceSetup:
    kind: str  # "GPU" or "CPU"
    names: tuple[str, ...]  # logical device names this task trains on
    emulated: bool  # GPUs asked for but emulated as logical CPU devices

    @property
    def count(self) -> int:
        return len(self.names)


def setup_devices(wanted: int, gpus_assigned: bool) -> DeviceSetup:
    """Make ``wanted`` training devices visible; call before any TensorFlow op runs.

    With real GPUs (``CUDA_VISIBLE_DEVICES`` already narrowed by the supervisor)
    they are used with memory growth on. Without, ``wanted`` logical CPU devices
    stand in for them so the same strategy code runs.
    """
    wanted = max(1, wanted)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        for gpu in gpus:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:
                pass
        names = tuple(f"/device:GPU:{i}" for i in range(min(wanted, len(gpus))))
        return DeviceSetup("GPU", names, emulated=False)
    cpu = tf.config.list_physical_devices("CPU")[0]
    if wanted > 1:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    names = tuple(f"/device:CPU:{i}" for i in range(wanted))
    return DeviceSetup("CPU", names, emulated=gpus_assigned)


def memory_info(device: str = "CPU:0") -> tuple[int | None, int | None]:
    """(current, peak) bytes held by TensorFlow's allocator on ``device``, where it reports them.

    On CPU this needs ``TF_CPU_ALLOCATOR_USE_BFC=1`` (the supervisor sets it).
    """
    try:
        info = tf.config.experimental.get_memory_info(device)
    except (ValueError, RuntimeError, tf.errors.OpError):
        return None, None
    return int(info.get("current", 0)), int(info.get("peak", 0))
