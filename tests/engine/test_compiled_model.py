"""The model as the user compiled it: its optimizer and learning rate, its loss with regularization, every
compiled metric per replica, its own train_step, validation curves; real TensorFlow processes."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.contract.config import (
    Cluster,
    Data,
    Host,
    Model,
    Parallelism,
    RunConfig,
    Task,
    Training,
    Validation,
    replace,
)
from engine.control import script_check
from tests import kit

COMPILED = """
    import keras

    L2 = {l2}

    def build_model(config):
        # no keras.Input, as the tutorials write it: ClusterDeck builds the model on the first batch
        model = keras.Sequential([
            keras.layers.Dense(32, activation="relu", kernel_regularizer=keras.regularizers.L2(L2) if L2 else None),
            keras.layers.Dense(config.data.classes),
        ])
        model.compile(optimizer=keras.optimizers.SGD({lr}),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3")])
        return model
"""

CUSTOM_STEP = """
    import keras
    import tensorflow as tf

    class Counting(keras.Model):
        def __init__(self, classes, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(classes)
            self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

        def call(self, x, training=False):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            self.calls.assign_add(1)
            return {"loss": loss, "calls": tf.cast(self.calls, tf.float32)}

    def build_model(config):
        model = Counting(config.data.classes)
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model
"""


def write(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path


def config_for(script: Path, mode: str = "data", steps: int = 20, **changes: Any) -> RunConfig:
    if mode == "async":
        tasks: tuple[Task, ...] = (Task("chief", 0), Task("worker", 0), Task("worker", 1), Task("ps", 0))
    else:
        tasks = (Task("worker", 0), Task("worker", 1))
    cfg = RunConfig(
        name=f"compiled-{mode}",
        cluster=Cluster(hosts=(Host(name="local", tasks=tasks),)),
        parallelism=Parallelism(mode=mode),
        data=Data(source="digits", shape=(64,), classes=10, size=1497),
        model=Model(name="script", script=str(script)),
        # the preset's optimizer must not be the one used for a compiled model
        training=Training(global_batch_size=64, steps=steps, optimizer="adam", learning_rate=0.5, metrics_hz=1e6),
    )
    return replace(cfg, **changes) if changes else cfg


def run(cfg: RunConfig, runs_root: Path) -> list[dict[str, Any]]:
    return kit.run_to_end(cfg, runs_root)


def training_info(seen: list[dict[str, Any]]) -> dict[str, Any]:
    found = [e["training"] for e in seen if e["kind"] == "info" and "training" in e]
    assert found, "the run says what trained"
    return found[0]


@pytest.mark.cluster
def test_compiled_optimizer_loss_and_metrics_are_used_per_replica(tmp_path: Path, runs_root: Path) -> None:
    script = write(tmp_path, "compiled.py", COMPILED.format(l2=0.0, lr=0.001))
    seen = run(config_for(script), runs_root)
    info = training_info(seen)
    assert info["source"] == "compile" and info["optimizer"] == "SGD"
    assert math.isclose(info["learning_rate"], 0.001, rel_tol=1e-5)
    assert info["metrics"] == ["accuracy", "top3"]
    steps = [e for e in seen if e["kind"] == "step"]
    for replica in (0, 1):
        mine = [e for e in steps if e["replica"] == replica]
        assert mine and all(set(e["metrics"]) == {"accuracy", "top3"} for e in mine)
        assert all(0.0 <= e["metrics"]["accuracy"] <= e["metrics"]["top3"] <= 1.0 for e in mine)
    # SGD(0.001) barely moves in 20 steps; the preset's Adam(0.5) would have
    first = sum(e["loss"] for e in steps if e["step"] == min(x["step"] for x in steps)) / 2
    last = sum(e["loss"] for e in steps if e["step"] == 20) / 2
    assert abs(first - last) < 0.5, (first, last)


@pytest.mark.cluster
def test_regularization_losses_are_added(tmp_path: Path, runs_root: Path) -> None:
    plain = run(config_for(write(tmp_path, "plain.py", COMPILED.format(l2=0.0, lr=0.001)), steps=4), runs_root)
    heavy = run(config_for(write(tmp_path, "heavy.py", COMPILED.format(l2=1.0, lr=0.001)), steps=4), runs_root)

    def first_loss(seen: list[dict[str, Any]]) -> float:
        return next(e["loss"] for e in seen if e["kind"] == "step" and e["replica"] == 0)

    assert training_info(heavy)["regularization_losses"] == 1
    # L2(1.0) on a 64x32 glorot kernel adds ~20 to a loss of ~2.3
    assert first_loss(heavy) > first_loss(plain) + 5.0


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["data", "async"])
def test_a_custom_train_step_runs(tmp_path: Path, runs_root: Path, mode: str) -> None:
    script = write(tmp_path, "custom.py", CUSTOM_STEP)
    steps_total = 12
    seen = run(config_for(script, mode, steps=steps_total), runs_root)
    assert training_info(seen)["train_step"] == "custom"
    calls = [e["metrics"]["calls"] for e in seen if e["kind"] == "step"]
    assert calls, "the train_step's own logs are reported"
    if mode == "data":  # each worker's own counter: once per step
        assert max(calls) == steps_total
    else:  # one counter on the ps, every worker's steps
        assert max(calls) >= steps_total * 0.5


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["data", "async"])
def test_validation_curves_come_every_n_steps(tmp_path: Path, runs_root: Path, mode: str) -> None:
    script = write(tmp_path, "compiled.py", COMPILED.format(l2=0.0, lr=0.05))
    cfg = config_for(script, mode, steps=30, validation=Validation(split=0.2, every=10))
    seen = run(cfg, runs_root)
    evals = [e for e in seen if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20, 30]
    assert all(set(e["metrics"]) == {"accuracy", "top3"} and e["examples"] == 299 for e in evals)
    assert all(math.isfinite(e["loss"]) for e in evals)


def test_the_check_builds_an_unbuilt_model_and_names_one_hot_labels(tmp_path: Path) -> None:
    script = write(tmp_path, "onehot.py", """
        import keras
        import numpy as np
        import tensorflow as tf

        def build_model(config):
            return keras.Sequential([keras.layers.Dense(config.data.classes)])

        def make_dataset(input_context, config):
            x = np.zeros((256, 8), "float32")
            y = tf.one_hot(np.zeros(256, "int32"), config.data.classes)
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    """)
    cfg = RunConfig(name="onehot", cluster=Cluster(hosts=(Host(name="local", tasks=(Task("worker", 0),)),)),
                    data=Data(source="script", path=str(script), shape=(8,), classes=4, size=256),
                    model=Model(name="script", script=str(script)), training=Training(global_batch_size=16, steps=4))
    problems = script_check.check(cfg)
    assert len(problems) == 1, problems
    assert problems[0].field == "data.path"
    assert "one-hot" in problems[0].message and "tf.argmax(y, axis=-1)" in problems[0].message
    # the same labels with a categorical loss compiled: fine (and the unbuilt Sequential is built)
    script.write_text(script.read_text().replace(
        "return keras.Sequential([keras.layers.Dense(config.data.classes)])",
        "m = keras.Sequential([keras.layers.Dense(config.data.classes)])\n"
        "    m.compile(optimizer='sgd', loss=keras.losses.CategoricalCrossentropy(from_logits=True))\n"
        "    return m"))
    assert script_check.check(cfg) == []


def test_the_check_names_class_ids_given_to_a_categorical_loss(tmp_path: Path) -> None:
    """keras-io's mnist_convnet compiles categorical_crossentropy; the bundled digits give class ids."""
    script = write(tmp_path, "convnet.py", """
        import keras

        def build_model(config):
            model = keras.Sequential([keras.Input(shape=tuple(config.data.shape)),
                                      keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                                      keras.layers.Dense(config.data.classes, activation="softmax")])
            model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
            return model
    """)
    cfg = RunConfig(name="convnet", cluster=Cluster(hosts=(Host(name="local", tasks=(Task("worker", 0),)),)),
                    data=Data(source="digits", shape=(8, 8, 1), classes=10, size=1497),
                    model=Model(name="script", script=str(script)), training=Training(global_batch_size=32, steps=4))
    problems = script_check.check(cfg)
    assert len(problems) == 1 and problems[0].field == "model.script", problems
    assert "class ids" in problems[0].message and "SparseCategoricalCrossentropy" in problems[0].message
