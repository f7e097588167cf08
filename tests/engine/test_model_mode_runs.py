"""Parallelism 'model' for real models, launched for real: the convnet preset with per-replica accuracy, a
script's MSE loss on float labels over a batch x feature x model mesh, and the pre-launch check of the
new blocks and of a script's loss (in its subprocess, as the app runs it)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, RunConfig, Task, replace
from engine.control import script_check
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import PRESETS

REGRESSION = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf

    from engine.runtime import sharded

    loss = "mse"


    def build_sharded_model(config, mesh):
        b = sharded.Builder(mesh, seed=config.training.seed)
        fc1 = sharded.Dense(b, "fc1", 8, 16, spec=("feature", "model"), activation="relu")
        fc2 = sharded.Dense(b, "fc2", 16, 1, shard="rows")
        return b.model("regression", lambda x, training=False: fc2(fc1(x)))


    def make_dataset(input_context, config):
        rng = np.random.default_rng(5)
        x = rng.normal(0, 1, (2048, 8)).astype("float32")
        y = (1.0 / (1.0 + np.exp(-(x @ rng.normal(0, 1, 8))))).astype("float32")  # float targets in (0, 1)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shuffle(1024, seed=1).repeat().batch(config.training.global_batch_size, drop_remainder=True)
''')

CONVNET = textwrap.dedent('''
    from engine.runtime import sharded


    def build_sharded_model(config, mesh):
        b = sharded.Builder(mesh, seed=1)
        conv = sharded.Conv2D(b, "conv1", 1, FILTERS, 3, shard="filters", activation="relu")
        pool, flat = sharded.GlobalAvgPool2D(b), sharded.Flatten(b)
        out = sharded.Dense(b, "logits", FILTERS, config.data.classes, shard="none")
        return b.model("cnn", lambda x, training=False: out(flat(pool(conv(x)))))
''')


def small(cfg: RunConfig, steps: int) -> RunConfig:
    """Every step reported (``metrics_hz`` 1e6), no checkpoints: the count of reports follows the steps."""
    return replace(cfg, training=replace(cfg.training, steps=steps, checkpoint_every=0, metrics_hz=1e6))


def regression_config(tmp_path: Path, steps: int = 60) -> RunConfig:
    script = tmp_path / "regression.py"
    script.write_text(REGRESSION)
    base = config_mod.load(PRESETS / "model-user-script.yaml")
    host = Host(name="local", gpus=4, tasks=(Task("worker", 0),))
    return small(replace(base, name="model-feature-axis", cluster=Cluster(hosts=(host,)),
                         parallelism=replace(base.parallelism, mesh_batch=1, mesh_model=2,
                                             mesh_axes=(("feature", 2),)),
                         data=replace(base.data, source="script", path=str(script), shape=(8,), classes=2, size=2048),
                         model=replace(base.model, script=str(script), hidden=(16,)),
                         training=replace(base.training, global_batch_size=64, optimizer="adam",
                                          learning_rate=0.01)), steps)


def convnet_check_config(tmp_path: Path, filters: int, extra: str = "") -> RunConfig:
    script = tmp_path / "cnn.py"
    script.write_text(CONVNET.replace("FILTERS", str(filters)) + extra)
    base = config_mod.load(PRESETS / "model-convnet.yaml")
    return replace(base, model=replace(base.model, script=str(script)))


def steps_of(run: Run) -> list[dict[str, Any]]:
    return [e for e in read_events(run.folder.path) if e["kind"] == "step" and e.get("loss") is not None]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.cluster
def test_the_convnet_preset_learns_and_reports_each_replicas_accuracy(tmp_path: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "model-convnet.yaml"), 60)
    run = Run(cfg, runs_root=tmp_path / "runs")
    run.start()
    assert run.wait(240) == "finished", run.state.reason
    steps = steps_of(run)
    assert sorted({e["replica"] for e in steps}) == [0, 1]
    for replica in (0, 1):
        mine = [e for e in steps if e["replica"] == replica]
        assert len(mine) >= 30, len(mine)
        assert all(0.0 <= e["metrics"]["accuracy"] <= 1.0 for e in mine)
        losses, accuracy = [e["loss"] for e in mine], [e["metrics"]["accuracy"] for e in mine]
        assert mean(losses[-5:]) < 0.6 * mean(losses[:5]), losses
        assert mean(accuracy[-5:]) > mean(accuracy[:5]) + 0.2, accuracy


@pytest.mark.cluster
def test_a_scripts_mse_loss_on_float_labels_trains_on_a_batch_feature_model_mesh(tmp_path: Path) -> None:
    cfg = regression_config(tmp_path)
    assert cfg.parallelism.mesh_dims() == [("batch", 1), ("feature", 2), ("model", 2)]
    run = Run(cfg, runs_root=tmp_path / "runs")
    run.start()
    assert run.wait(240) == "finished", run.state.reason
    every = list(events.read_file(run.folder.events))
    placement = next(e for e in every if e["kind"] == "placement")
    assert placement["mesh"] == {"batch": 1, "feature": 2, "model": 2}
    layouts = {v["name"]: v["sharding"] for v in placement["variables"]}
    assert layouts["fc1/kernel"] == ["feature", "model"] and layouts["fc2/kernel"] == ["model", "unsharded"]
    steps = steps_of(run)
    assert {e["replica"] for e in steps} == {0}  # one 'batch' index: one replica
    losses = [e["loss"] for e in steps]
    assert mean(losses[-5:]) < 0.3 * mean(losses[:5]), losses
    assert not any("metrics" in e for e in steps)  # no accuracy for a regression loss


def test_the_check_passes_a_regression_script_with_its_loss(tmp_path: Path) -> None:
    assert script_check.check(regression_config(tmp_path)) == []


def test_the_check_names_filters_the_mesh_cannot_split(tmp_path: Path) -> None:
    problems = script_check.check(convnet_check_config(tmp_path, filters=3))
    assert [p.field for p in problems] == ["model.script"], problems
    assert "conv1/kernel" in problems[0].message and "not divisible by the mesh 'model' axis size 2" in \
        problems[0].message


def test_the_check_names_a_loss_of_the_wrong_shape(tmp_path: Path) -> None:
    extra = textwrap.dedent('''
        import tensorflow as tf


        def loss(y_true, y_pred):
            return tf.reshape(tf.stack([y_pred, y_pred]), [-1])  # 2 * rows * classes values
    ''')
    problems = script_check.check(convnet_check_config(tmp_path, filters=4, extra=extra))
    assert [p.field for p in problems] == ["model.script"], problems
    assert "loss(y_true, y_pred)" in problems[0].message and "expected one value per example" in problems[0].message
