"""The public API for users' sharded models (engine.runtime.sharded) and its example script.

Everything runs in one process on logical CPU devices: four of them make the 2 x 2 mesh. TensorFlow fixes
its devices when it first sets them up, so where an earlier test of the session already did with fewer,
the mesh computations run in one fresh interpreter instead (same code, :func:`mesh_figures`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract.config import RunConfig, replace
from tests.conftest import PRESETS, ROOT

EXAMPLE = ROOT / "examples" / "sharded_model.py"
STEPS = 20
DEVICES = 4
U = "unsharded"


def example_config(script: Path = EXAMPLE, **mesh: int) -> RunConfig:
    """The preset with the example script (absolute path), a batch and learning rate at which 20 Adam steps
    visibly lower the loss, and the mesh asked for."""
    cfg = config_mod.load(PRESETS / "model-user-script.yaml")
    cfg = replace(cfg, model=replace(cfg.model, script=str(script)),
                  training=replace(cfg.training, steps=STEPS, global_batch_size=64, optimizer="adam",
                                   learning_rate=0.002))
    if mesh:
        cfg = replace(cfg, parallelism=replace(cfg.parallelism, mesh_batch=mesh["batch"], mesh_model=mesh["model"]))
    return cfg


def four_cpus() -> bool:
    """Split this process's CPU into four logical devices; False where TensorFlow has set up fewer already."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * DEVICES)
    except RuntimeError:
        pass
    return len(tf.config.list_logical_devices("CPU")) >= DEVICES


def make_mesh(batch: int, model: int) -> Any:
    from tensorflow.experimental import dtensor

    return dtensor.create_mesh([("batch", batch), ("model", model)],
                               devices=[f"CPU:{i}" for i in range(batch * model)], device_type="CPU")


def full_value(var: Any) -> np.ndarray:
    """A DVariable's whole value, whatever its layout."""
    from tensorflow.experimental import dtensor

    replicated = dtensor.relayout(var.read_value(), dtensor.Layout.replicated(var.layout.mesh, len(var.shape)))
    return dtensor.unpack(replicated)[0].numpy()


def train(cfg: RunConfig, mesh: Any, batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[float], Any]:
    """The model-parallel runtime's step (softmax cross-entropy, gradients, its optimizer) on ``batches``."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from engine.runtime import dtensor_layers as layers
    from engine.runtime import sharded

    model = sharded.build_for_config(cfg, mesh)
    initial = {p.name: full_value(p.var) for p in model.params}
    optimizer = layers.Optimizer(cfg.training.optimizer, cfg.training.learning_rate, model.params,
                                 layers.Builder(mesh, cfg.training.seed))

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(layers.per_example_loss(model.forward(x), y, cfg.data.classes))
        optimizer.apply(tape.gradient(loss, model.variables))
        return loss

    rows = [int(loc["batch"]) for loc in mesh.local_device_locations()]
    replicas = mesh.dim_size("batch")

    def pack(a: np.ndarray) -> tf.Tensor:
        per = len(a) // replicas
        return dtensor.pack([a[r * per:(r + 1) * per] for r in rows],
                            dtensor.Layout.batch_sharded(mesh, "batch", a.ndim))

    losses = [float(dtensor.unpack(step(pack(x), pack(y)))[0].numpy()) for x, y in batches]
    return losses, (model, initial)


def mesh_figures() -> dict[str, Any]:
    """The example trained 20 steps on a 1 x 1 and a 2 x 2 mesh, and what the 2 x 2 mesh holds."""
    from tensorflow.experimental import dtensor

    from engine.runtime import data as data_mod
    from engine.runtime import sharded

    assert four_cpus(), "this process must have 4 logical CPU devices"
    cfg = example_config(batch=2, model=2)
    stream = data_mod.make_dataset(cfg).as_numpy_iterator()
    batches = [next(stream) for _ in range(STEPS)]
    one, (_, first) = train(example_config(batch=1, model=1), make_mesh(1, 1), batches)
    four, (model, initial) = train(cfg, make_mesh(2, 2), batches)
    # the first loss as plain numpy computes it from the first weights: the 1 x 1 run is the MLP it claims
    x, y = batches[0]
    hidden = np.maximum(x @ first["fc1/kernel"] + first["fc1/bias"], 0.0)
    logits = hidden @ first["fc2/kernel"] + first["fc2/bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    plain = float(-log_probs[np.arange(len(y)), y].mean())
    layouts = {p.name: ([str(s) for s in p.var.layout.sharding_specs],
                        list(dtensor.unpack(p.var.read_value())[0].shape)) for p in model.params}
    # a layer width the mesh cannot split, asked for by a script
    with tempfile.TemporaryDirectory() as tmp:
        odd = Path(tmp) / "odd.py"
        odd.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
        cfg_odd = replace(example_config(odd, batch=2, model=2), model=replace(cfg.model, script=str(odd),
                                                                                 hidden=(255,)))
        problems = sharded.check_script(cfg_odd)
    return {"one": one, "four": four, "plain": plain, "name": model.name, "layouts": layouts,
            "same_start": {k: float(np.abs(first[k] - initial[k]).max()) for k in first},
            "indivisible": problems}


@pytest.fixture(scope="module")
def in_process() -> bool:
    """Whether this process could get its four logical CPU devices (asked before any mesh is made)."""
    return four_cpus()


@pytest.fixture(scope="module")
def figures(in_process: bool) -> dict[str, Any]:
    if in_process:
        return mesh_figures()
    code = "import json, tests.engine.test_sharded_api as t; print('FIGURES' + json.dumps(t.mesh_figures()))"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FIGURES"))
    return dict(json.loads(line.removeprefix("FIGURES")))


def test_example_on_2x2_mesh_follows_its_unsharded_run(figures: dict[str, Any]) -> None:
    one, four = figures["one"], figures["four"]
    assert len(one) == len(four) == STEPS
    assert abs(one[0] - figures["plain"]) <= 1e-5, "the 1 x 1 run must compute the plain MLP"
    assert one[-1] < one[0] - 0.05, "the loss must fall, or the comparison proves nothing"
    assert max(figures["same_start"].values()) == 0.0, "both meshes start from the same weights"
    for step, (a, b) in enumerate(zip(one, four, strict=True), start=1):
        assert abs(a - b) <= 1e-4, f"step {step}: mesh 1 x 1 {a:.6f} vs mesh 2 x 2 {b:.6f}"


def test_example_layers_are_split_as_the_script_asks(figures: dict[str, Any]) -> None:
    assert figures["name"] == "sharded_mlp"
    # name: (layout, what one device holds)
    assert {name: (spec, shard) for name, (spec, shard) in figures["layouts"].items()} == {
        "fc1/kernel": ([U, "model"], [784, 128]),  # column-parallel: half the hidden units each
        "fc1/bias": (["model"], [128]),
        "fc2/kernel": (["model", U], [128, 10]),  # row-parallel: the matching half of the rows
        "fc2/bias": ([U], [10]),
    }


def test_a_width_the_mesh_cannot_split_names_the_parameter(figures: dict[str, Any]) -> None:
    (problem,) = figures["indivisible"]
    assert problem["field"] == "model.script"
    assert "odd.py" in problem["message"]
    assert "fc1/kernel: dimension 1 (255) is not divisible by the mesh 'model' axis size 2" in problem["message"]


# --------------------------------------------------------------------------- errors of a script


def script_config(tmp_path: Path, body: str, name: str = "user_model.py") -> RunConfig:
    path = tmp_path / name
    path.write_text("from engine.runtime import sharded\nimport tensorflow as tf\n\n" + textwrap.dedent(body),
                    encoding="utf-8")
    return example_config(path, batch=1, model=1)


def build_error(cfg: RunConfig) -> str:
    from engine.runtime import sharded
    from engine.runtime.user_script import ScriptError

    with pytest.raises(ScriptError) as err:
        sharded.build_for_config(cfg, make_mesh(1, 1))
    assert err.value.field == "model.script"
    text = str(err.value)
    assert text.startswith(f"model.script: {cfg.model.script!r}: "), text
    return text


def test_a_script_without_the_sharded_builder_is_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_model(config):
            return None
    """))
    assert "defines no build_sharded_model(config, mesh) (its build_model(config) builds a Keras model" in text


def test_a_builder_returning_something_else_is_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_sharded_model(config, mesh):
            return lambda x: x
    """))
    assert "build_sharded_model(config, mesh) returned function; expected a sharded.ShardedModel" in text


def test_a_model_without_parameters_is_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_sharded_model(config, mesh):
            return sharded.Builder(mesh, seed=1).model("empty", lambda x: x)
    """))
    assert "a model without parameters" in text


def test_a_failing_builder_shows_the_script_line(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_sharded_model(config, mesh):
            b = sharded.Builder(mesh, seed=1)
            sharded.Dense(b, "fc1", 784, 64, shard="diagonal")
    """))
    assert "raised ValueError: fc1: shard='diagonal'; expected one of 'columns', 'rows', 'none'" in text
    assert 'user_model.py", line 7, in build_sharded_model' in text


def test_two_parameters_of_one_name_are_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_sharded_model(config, mesh):
            b = sharded.Builder(mesh, seed=1)
            first = sharded.Dense(b, "fc", 784, 10)
            second = sharded.Dense(b, "fc", 10, 10)
            return b.model("twice", lambda x: second(first(x)))
    """))
    assert "fc/kernel: a parameter of that name exists already" in text


def test_logits_of_the_wrong_width_are_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        def build_sharded_model(config, mesh):
            b = sharded.Builder(mesh, seed=1)
            fc = sharded.Dense(b, "fc", 784, 7)
            return b.model("seven", fc)
    """))
    assert "turned a batch of shape [1, 784] into [1, 7]; expected logits [1, 10] (data.classes 10)" in text


def test_parameters_of_another_mesh_are_refused(in_process: bool, tmp_path: Path) -> None:
    text = build_error(script_config(tmp_path, """
        from tensorflow.experimental import dtensor

        def build_sharded_model(config, mesh):
            other = dtensor.create_mesh([("model", 1), ("batch", 1)], devices=["CPU:0"], device_type="CPU")
            b = sharded.Builder(other, seed=1)
            fc = sharded.Dense(b, "fc", 784, 10)
            return b.model("elsewhere", fc)
    """))
    assert "parameter 'fc/kernel' lives on another mesh" in text


def test_the_pre_launch_check_passes_the_example_and_names_the_field(in_process: bool, tmp_path: Path) -> None:
    from engine.runtime import sharded

    assert sharded.check_script(example_config(batch=1, model=1)) == []
    cfg = script_config(tmp_path, "x = 1\n")
    (problem,) = sharded.check_script(cfg)
    assert problem["field"] == "model.script"
    assert problem["message"].startswith(f"{cfg.model.script!r}: defines no build_sharded_model(config, mesh);")


def test_config_allows_a_script_in_model_mode() -> None:
    cfg = config_mod.load(PRESETS / "model-user-script.yaml")
    assert config_mod.validate(cfg) == []
    empty = replace(cfg, model=replace(cfg.model, script=""))
    (problem,) = config_mod.validate(empty)
    assert problem.field == "model.script" and "build_sharded_model(config, mesh)" in problem.message
