"""The sharded blocks and steps of parallelism 'model' for real models, in real TensorFlow on logical CPU devices.

Convolution and pooling against TensorFlow's own ops, a small convnet that learns on a 2 x 2 mesh, dropout
in training and evaluation, int64 token ids, a script's MSE and binary cross-entropy losses, old
``forward(x)`` scripts, and a batch x feature x model mesh. Everything runs in one process on four logical
CPU devices; where an earlier test of the session set up fewer, in one fresh interpreter (:func:`figures`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.engine.test_sharded_api import four_cpus  # one way to split the CPU

DEVICES = 4


def mesh_of(*dims: tuple[str, int]) -> Any:
    from tensorflow.experimental import dtensor

    size = int(np.prod([n for _, n in dims]))
    return dtensor.create_mesh(list(dims), devices=[f"CPU:{i}" for i in range(size)], device_type="CPU")


def pack(mesh: Any, a: np.ndarray) -> Any:
    from tensorflow.experimental import dtensor

    from engine.runtime import dtensor_layers as layers

    replicas = mesh.dim_size("batch")
    per = len(a) // replicas
    rows = [int(loc["batch"]) for loc in mesh.local_device_locations()]
    return dtensor.pack([a[r * per:(r + 1) * per] for r in rows], dtensor.Layout(list(layers.batch_spec(a.ndim)), mesh))


def whole(t: Any) -> np.ndarray:
    """A DTensor's (or DVariable's) whole value."""
    from tensorflow.experimental import dtensor

    value = t.read_value() if hasattr(t, "read_value") else t
    layout = dtensor.fetch_layout(value)
    return dtensor.unpack(dtensor.relayout(value, dtensor.Layout.replicated(layout.mesh, len(value.shape))))[0].numpy()


def script_loss(tmp: Path, loss: str) -> Any:
    """The per-example loss the runtime takes from a script whose ``loss`` is ``loss`` (Python source)."""
    from engine.contract import config as config_mod
    from engine.contract.config import replace
    from engine.runtime import user_script

    path = tmp / f"loss_{abs(hash(loss))}.py"
    path.write_text(f"import keras\nloss = {loss}\n")
    cfg = config_mod.RunConfig()
    return user_script.loss(replace(cfg, model=replace(cfg.model, name="script", script=str(path))))


def train(steps: Any, mesh: Any, x: np.ndarray, y: np.ndarray, n: int) -> tuple[list[float], list[float]]:
    losses, accuracies = [], []
    for _ in range(n):
        per_example, hits = steps.train(pack(mesh, x), pack(mesh, y))
        losses.append(float(whole(per_example).mean()))
        accuracies.append(float(whole(hits).mean()) if hits is not None else -1.0)
    return losses, accuracies


def convnet(b: Any, classes: int, rate: float = 0.0) -> Any:
    from engine.runtime import sharded

    c1 = sharded.Conv2D(b, "conv1", 1, 4, 3, activation="relu")
    p1 = sharded.MaxPool2D(b, 2)
    c2 = sharded.Conv2D(b, "conv2", 4, 8, 3, activation="relu")
    p2 = sharded.AvgPool2D(b, 2)
    flat = sharded.Flatten(b)
    drop = sharded.Dropout(b, "drop", rate)
    out = sharded.Dense(b, "logits", 2 * 2 * 8, classes, shard="none")

    def forward(x: Any, training: bool = False) -> Any:
        return out(drop(flat(p2(c2(p1(c1(x))))), training))

    return b.model("convnet", forward)


def compute(tmp: Path) -> dict[str, Any]:
    """Every figure the tests below read, computed on four logical CPU devices."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from engine.runtime import dtensor_layers as layers
    from engine.runtime import sharded
    from engine.runtime.model_parallel import MeshSteps

    assert four_cpus(), "this process must have 4 logical CPU devices"
    out: dict[str, Any] = {}
    mesh = mesh_of(("batch", 2), ("model", 2))
    rng = np.random.default_rng(3)

    # convolution and pooling blocks against TensorFlow's own ops (same kernel)
    b = sharded.Builder(mesh, seed=1)
    conv = sharded.Conv2D(b, "c", 2, 4, (3, 2), strides=2, padding="same")
    plain = sharded.Conv2D(b, "p", 2, 4, 3, shard="none", padding="valid")
    x = rng.normal(size=(4, 9, 9, 2)).astype("float32")
    y = tf.function(lambda t: (conv(t), plain(t), sharded.MaxPool2D(b, 3, 2)(conv(t)),
                               sharded.AvgPool2D(b, 2)(conv(t)), sharded.GlobalAvgPool2D(b)(conv(t))))(pack(mesh, x))
    ref = tf.nn.conv2d(x, whole(conv.kernel), 2, "SAME").numpy()
    out["conv_error"] = float(np.abs(whole(y[0]) - ref).max())
    out["conv_layout"] = [str(s) for s in dtensor.fetch_layout(y[0]).sharding_specs]
    out["conv_kernel_layout"] = [str(s) for s in conv.kernel.layout.sharding_specs]
    out["valid_error"] = float(np.abs(whole(y[1]) - tf.nn.conv2d(x, whole(plain.kernel), 1, "VALID").numpy()).max())
    out["max_error"] = float(np.abs(whole(y[2]) - tf.nn.max_pool2d(ref, 3, 2, "VALID").numpy()).max())
    out["avg_error"] = float(np.abs(whole(y[3]) - tf.nn.avg_pool2d(ref, 2, 2, "VALID").numpy()).max())
    out["gap_error"] = float(np.abs(whole(y[4]) - ref.mean(axis=(1, 2))).max())

    # a convnet on [8, 8, 1] images learns on the 2 x 2 mesh (conv -> pool -> conv -> pool -> flatten -> dense)
    images = rng.normal(size=(32, 8, 8, 1)).astype("float32")
    labels = (images[:, :4].mean(axis=(1, 2, 3)) > images[:, 4:].mean(axis=(1, 2, 3))).astype("int32")
    b = sharded.Builder(mesh, seed=2)
    model = convnet(b, 2, rate=0.1)
    optimizer = layers.Optimizer("adam", 0.01, model.params, sharded.Builder(mesh, 2))
    losses, accuracies = train(MeshSteps(model, optimizer, 2), mesh, images, labels, 40)
    out["convnet"] = {"losses": losses, "accuracies": accuracies,
                      "layouts": {p.name: [str(s) for s in p.var.layout.sharding_specs] for p in model.params},
                      "dropout_steps": int(whole(model.state[0].var))}

    # dropout: drops about `rate` of the values in training, a new mask each call; the identity in evaluation
    b = sharded.Builder(mesh, seed=4)
    drop = sharded.Dropout(b, "d", 0.5)
    ones = pack(mesh, np.ones((8, 64), np.float32))
    step = tf.function(lambda t, training: drop(t, training))
    first, second, evaluated = whole(step(ones, True)), whole(step(ones, True)), whole(step(ones, False))
    out["dropout"] = {"zeros": float((first == 0).mean()), "kept": sorted({float(v) for v in first.ravel()}),
                      "same_mask": bool((first == second).all()), "eval_identity": bool((evaluated == 1).all())}

    # token ids of any integer dtype through the vocabulary-sharded embedding (int64: StringLookup's)
    b = sharded.Builder(mesh, seed=5)
    embed = sharded.VocabEmbedding(b, "emb", 16, 8)
    head = sharded.Dense(b, "head", 8, 3)
    tokens = b.model("tokens", lambda ids: head(tf.reduce_mean(embed(ids), axis=1)), tf.int64)
    ids = rng.integers(0, 16, (8, 5))
    token_steps = MeshSteps(tokens, layers.Optimizer("sgd", 0.1, tokens.params, sharded.Builder(mesh, 5)), 3)
    out["ids"] = {}
    for dtype in ("int64", "int32", "int16", "uint8"):
        per_example, _ = token_steps.train(pack(mesh, ids.astype(dtype)), pack(mesh, (ids[:, 0] % 3).astype("int64")))
        out["ids"][dtype] = float(whole(per_example).mean())

    # a script's losses: MSE regression on float labels (output width 1), sigmoid + binary cross-entropy
    features = rng.normal(size=(64, 6)).astype("float32")
    target = (features @ rng.normal(size=6)).astype("float32")
    for name, loss, labels_, act in (("mse", '"mse"', target, None),
                                     ("bce", "keras.losses.BinaryCrossentropy()", (target > 0).astype("int32"),
                                      "sigmoid"),
                                     ("bce_name", '"binary_crossentropy"', (target > 0).astype("int32"), "sigmoid")):
        b = sharded.Builder(mesh, seed=6)
        h = sharded.Dense(b, "h", 6, 16, "columns", "relu")
        o = sharded.Dense(b, "o", 16, 1, "rows", act)
        reg = b.model(name, lambda t, h=h, o=o: o(h(t)))
        steps = MeshSteps(reg, layers.Optimizer("adam", 0.02, reg.params, sharded.Builder(mesh, 6)), 2,
                          script_loss(tmp, loss))
        losses, accuracies = train(steps, mesh, features, labels_, 60)
        out[name] = {"losses": losses, "accuracies": accuracies}

    # an old forward(x) and a forward(x, training); the runtime's wrapper calls each the right way
    b = sharded.Builder(mesh, seed=7)
    d = sharded.Dense(b, "d", 4, 2)
    seen: list[Any] = []
    old = b.model("old", lambda t: d(t))

    def with_flag(t: Any, training: bool = False) -> Any:
        seen.append(training)
        return d(t)

    new = b.model("new", with_flag)
    t4 = pack(mesh, np.ones((2, 4), np.float32))
    out["signatures"] = {"old": [old.takes_training, list(old.call(t4, training=True).shape)],
                         "new": [new.takes_training, list(new.call(t4, training=True).shape), seen]}

    # batch x feature x model (1 x 2 x 2): a kernel split over feature (inputs) and model (outputs)
    mesh3 = mesh_of(("batch", 1), ("feature", 2), ("model", 2))
    b = sharded.Builder(mesh3, seed=8)
    fc1 = sharded.Dense(b, "fc1", 8, 8, spec=("feature", "model"), activation="relu")
    fc2 = sharded.Dense(b, "fc2", 8, 3, "rows")
    fc3 = sharded.Dense(b, "fc3", 3, 4, "columns", axis="feature")
    mlp = b.model("mlp3", lambda t: fc3(fc2(fc1(t))))
    xs = rng.normal(size=(16, 8)).astype("float32")
    ys = np.argmax(xs[:, :4], axis=1).astype("int32")
    losses, _ = train(MeshSteps(mlp, layers.Optimizer("adam", 0.02, mlp.params, sharded.Builder(mesh3, 8)), 4),
                      mesh3, xs, ys, 30)
    out["mesh3"] = {"losses": losses,
                    "layouts": {p.name: [str(s) for s in p.var.layout.sharding_specs] for p in mlp.params},
                    "shard": list(dtensor.unpack(fc1.kernel.read_value())[0].shape)}
    try:
        sharded.Dense(sharded.Builder(mesh3, 1), "bad", 8, 8, "columns", axis="height")
        out["bad_axis"] = ""
    except ValueError as exc:
        out["bad_axis"] = str(exc)
    return out


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("blocks")
    if four_cpus():
        return compute(tmp)
    code = textwrap.dedent(f"""
        import json, pathlib, tests.engine.test_model_mode_blocks as t
        print('FIGURES' + json.dumps(t.compute(pathlib.Path({str(tmp)!r}))))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FIGURES"))
    return dict(json.loads(line.removeprefix("FIGURES")))


def test_sharded_convolution_and_pooling_compute_what_tensorflow_does(figures: dict[str, Any]) -> None:
    for key in ("conv_error", "valid_error", "max_error", "avg_error", "gap_error"):
        assert figures[key] < 1e-4, (key, figures[key])
    assert figures["conv_kernel_layout"] == ["unsharded", "unsharded", "unsharded", "model"]
    assert figures["conv_layout"] == ["batch", "unsharded", "unsharded", "model"]  # filters stay split


def test_a_small_convnet_learns_on_a_2x2_mesh(figures: dict[str, Any]) -> None:
    net = figures["convnet"]
    losses, accuracies = net["losses"], net["accuracies"]
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    assert np.mean(accuracies[-5:]) > 0.85, accuracies
    assert net["layouts"]["conv1/kernel"][-1] == "model" and net["layouts"]["conv2/bias"] == ["model"]
    assert net["dropout_steps"] == 40  # one mask per training step


def test_dropout_drops_in_training_and_is_the_identity_in_evaluation(figures: dict[str, Any]) -> None:
    drop = figures["dropout"]
    assert 0.35 < drop["zeros"] < 0.65, drop
    assert drop["kept"] == [0.0, 2.0]  # survivors scaled by 1 / (1 - rate)
    assert not drop["same_mask"], "each training call draws a new mask"
    assert drop["eval_identity"]


def test_token_ids_of_any_integer_dtype_train(figures: dict[str, Any]) -> None:
    assert set(figures["ids"]) == {"int64", "int32", "int16", "uint8"}
    assert all(np.isfinite(v) and v > 0 for v in figures["ids"].values()), figures["ids"]


def test_a_scripts_mse_loss_trains_a_regression(figures: dict[str, Any]) -> None:
    losses = figures["mse"]["losses"]
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5]), losses
    assert figures["mse"]["accuracies"] == [-1.0] * len(losses)  # no accuracy for a script's own loss


@pytest.mark.parametrize("name", ["bce", "bce_name"])
def test_a_scripts_binary_cross_entropy_trains_binary_labels(figures: dict[str, Any], name: str) -> None:
    losses = figures[name]["losses"]
    assert losses[0] > 0.4 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_old_forward_without_training_still_works(figures: dict[str, Any]) -> None:
    assert figures["signatures"]["old"] == [False, [2, 2]]
    assert figures["signatures"]["new"] == [True, [2, 2], [True]]


def test_a_batch_feature_model_mesh_trains_with_layouts_naming_any_axis(figures: dict[str, Any]) -> None:
    mesh3 = figures["mesh3"]
    assert mesh3["layouts"]["fc1/kernel"] == ["feature", "model"]
    assert mesh3["layouts"]["fc3/kernel"] == ["unsharded", "feature"]
    assert mesh3["shard"] == [4, 4]
    assert np.mean(mesh3["losses"][-3:]) < 0.7 * np.mean(mesh3["losses"][:3]), mesh3["losses"]
    assert "axis='height'" in figures["bad_axis"] and "'feature'" in figures["bad_axis"]
