"""Device set-up inside a task: the real-GPU path (with TF's device queries stood in) and emulation."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT


def test_real_gpus_get_memory_growth_and_are_used_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    tf = pytest.importorskip("tensorflow")
    from engine.runtime import devices

    fake_gpus = [object(), object(), object()]
    grown: list[Any] = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: fake_gpus if kind == "GPU" else [object()])
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda gpu, on: grown.append((gpu, on)))
    monkeypatch.setattr(tf.config, "set_logical_device_configuration",
                        lambda *a, **k: pytest.fail("real GPUs must not be emulated"))
    setup = devices.setup_devices(2, gpus_assigned=True)
    assert setup.kind == "GPU" and not setup.emulated
    assert setup.names == ("/device:GPU:0", "/device:GPU:1")
    assert grown == [(g, True) for g in fake_gpus]


def test_without_gpus_the_assigned_ones_are_emulated_in_a_fresh_process() -> None:
    code = ("from engine.runtime.devices import setup_devices\n"
            "s = setup_devices(3, gpus_assigned=True)\n"
            "import tensorflow as tf\n"
            "print(s.kind, s.emulated, len(tf.config.list_logical_devices('CPU')))")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["CPU", "True", "3"]
