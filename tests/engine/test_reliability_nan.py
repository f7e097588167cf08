"""Reliability, round three: NaN and infinite losses fail the run naming the replica and step (every mode), and
invalid labels in model mode raise instead of training at loss 0. Real TensorFlow tasks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract.config import replace
from engine.control.launcher import Run
from engine.runtime import nan_guard
from tests.conftest import PRESETS

#: The corpus of this family: (case, what the run's reason must say)
NAN_CASES = {
    "data-lr-1e30": ("data-2workers.yaml", "is NaN at step"),
    "async-lr-1e30": ("async-1ps.yaml", "is NaN at step"),
    "model-lr-1e30": ("model-2x2.yaml", "is NaN at step"),
}


class _Emitter:
    def __init__(self) -> None:
        self.infos: list[tuple[str, dict[str, object]]] = []

    def info(self, message: str, **fields: object) -> None:
        self.infos.append((message, fields))


def test_the_guard_fails_by_default_and_warns_once_when_told() -> None:
    nan_guard.configure(SimpleNamespace(training=SimpleNamespace()))
    nan_guard.check_loss(0, 3, 1.5)
    nan_guard.check_loss(0, 3, None)
    with pytest.raises(nan_guard.NonFiniteLoss, match=r"replica 1 is NaN at step 7"):
        nan_guard.check_loss(1, 7, float("nan"))
    with pytest.raises(nan_guard.NonFiniteLoss, match=r"worker 0 is \+inf at step 2"):
        nan_guard.check_loss(0, 2, float("inf"), who="worker")
    emitter = _Emitter()
    nan_guard.configure(SimpleNamespace(training=SimpleNamespace(on_nan="warn")), emitter)
    nan_guard.check_loss(0, 9, float("nan"))
    nan_guard.check_loss(1, 10, float("-inf"))
    assert len(emitter.infos) == 1 and emitter.infos[0][1]["warning"] == "nan"
    nan_guard.configure(SimpleNamespace(training=SimpleNamespace(on_nan="bogus")))
    with pytest.raises(nan_guard.NonFiniteLoss):
        nan_guard.check_loss(0, 1, float("nan"))


@pytest.mark.cluster
@pytest.mark.parametrize("case", sorted(NAN_CASES))
def test_a_diverging_run_fails_naming_the_replica_and_step(runs_root: Path, case: str) -> None:
    preset, expected = NAN_CASES[case]
    cfg = config_mod.load(PRESETS / preset)
    cfg = replace(cfg, training=replace(cfg.training, steps=400, learning_rate=1e30, checkpoint_every=0,
                                        restarts=0, metrics_hz=50.0))
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    assert run.wait(180) == "failed", run.state.summary()
    assert expected in run.state.reason and "training.on_nan" in run.state.reason, run.state.reason
    assert "replica" in run.state.reason or "worker" in run.state.reason


MID_RUN_NAN = '''
import keras
import tensorflow as tf


class GoesNaN(keras.layers.Layer):
    """Fine for 30 steps, then NaN: what a numerically unstable model does mid-run."""

    def build(self, shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x, training=False):
        if training:
            self.calls.assign_add(1.0)
        return tf.where(self.calls > 30.0, x * float("nan"), x)


def build_model(config):
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(10), GoesNaN()])
'''


@pytest.mark.cluster
def test_a_loss_that_turns_nan_mid_run_fails_the_run(runs_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "goes_nan.py"
    script.write_text(MID_RUN_NAN)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, model=replace(cfg.model, name="script", script=str(script)),
                  training=replace(cfg.training, steps=2000, checkpoint_every=0, restarts=0, metrics_hz=50.0))
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    assert run.wait(180) == "failed", run.state.summary()
    assert "is NaN at step" in run.state.reason, run.state.reason


@pytest.mark.cluster
def test_invalid_labels_in_model_mode_raise_instead_of_training_at_loss_zero(runs_root: Path, tmp_path: Path) -> None:
    data = tmp_path / "bad_labels.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.normal(size=(512, 784)).astype("float32"), y=np.full(512, 12, dtype="int64"))
    cfg = config_mod.load(PRESETS / "model-2x2.yaml")
    cfg = replace(cfg, data=replace(cfg.data, source="npz", path=str(data), size=512),
                  training=replace(cfg.training, steps=50, restarts=0))
    run = Run(cfg, runs_root=runs_root, checked=True)  # past the checks before launch, as a race or a bug would
    run.start()
    assert run.wait(180) == "failed", run.state.summary()
    assert "label 12" in run.state.reason and "data.classes 10" in run.state.reason, run.state.reason
