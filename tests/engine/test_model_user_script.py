"""Parallelism 'model' with the user's own sharded model and data: checked before launch, then trained
for real in a task process on a 2 x 2 mesh of emulated devices, and it learns."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.config import replace
from engine.control import script_check
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import PRESETS

SCRIPT = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf

    from engine.runtime import sharded


    def build_sharded_model(config, mesh):
        b = sharded.Builder(mesh, seed=config.training.seed)
        fc1 = sharded.Dense(b, "fc1", 64, 32, shard="columns", activation="relu")
        fc2 = sharded.Dense(b, "fc2", 32, config.data.classes, shard="rows")
        return b.model("user_mlp", lambda x: fc2(fc1(x)))


    def make_dataset(input_context, config):
        rng = np.random.default_rng(5)
        centers = rng.normal(0, 1, (config.data.classes, 64)).astype("float32")
        y = rng.integers(0, config.data.classes, 4096)
        x = (centers[y] + rng.normal(0, 2.0, (4096, 64))).astype("float32")
        ds = tf.data.Dataset.from_tensor_slices((x, y.astype("int32")))
        return ds.shuffle(1024, seed=1).repeat().batch(config.training.global_batch_size, drop_remainder=True)
''')


def user_config(tmp_path: Path, steps: int = 60) -> config_mod.RunConfig:
    """The user's sharded model and data; every step reported (``metrics_hz`` 1e6), so the count of loss
    reports follows the steps, not how fast this machine ran them."""
    script = tmp_path / "sharded_user.py"
    script.write_text(SCRIPT)
    base = config_mod.load(PRESETS / "model-user-script.yaml")
    return replace(base, name="model-user-own",
                   data=replace(base.data, source="script", path=str(script), shape=(64,), classes=4, size=4096),
                   model=replace(base.model, script=str(script), hidden=(32,)),
                   training=replace(base.training, steps=steps, global_batch_size=64, learning_rate=0.003,
                                    checkpoint_every=0, metrics_hz=1e6))


def test_a_script_with_only_a_sharded_model_passes_the_check(tmp_path: Path) -> None:
    assert script_check.check(user_config(tmp_path)) == []


def test_the_check_names_a_wrong_batch_of_the_users_data(tmp_path: Path) -> None:
    cfg = user_config(tmp_path)
    Path(cfg.data.path).write_text(SCRIPT.replace("batch(config.training.global_batch_size", "batch(7"))
    problems = script_check.check(cfg)
    assert [p.field for p in problems] == ["data.path"] and "whole global batches of 64" in problems[0].message


@pytest.mark.cluster
def test_the_users_sharded_model_learns_on_a_2x2_mesh(tmp_path: Path) -> None:
    run = Run(user_config(tmp_path), runs_root=tmp_path / "runs")
    run.start()
    assert run.wait(240) == "finished", run.state.reason
    steps = [e for e in read_events(run.folder.path) if e["kind"] == "step" and e.get("loss") is not None]
    replicas = sorted({e["replica"] for e in steps})
    assert replicas == [0, 1]  # the mesh's batch axis
    for replica in replicas:
        losses = [e["loss"] for e in steps if e["replica"] == replica]
        assert len(losses) >= 8, losses
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        # four well separated classes: chance is ln 4 = 1.39; the model must get well below its start
        assert last < 0.5 * first, (first, last)
