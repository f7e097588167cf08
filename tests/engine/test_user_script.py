"""The user's script: checked before launch in a subprocess (its own traceback when it fails), run only when
the config chooses it, and trained for real as model, as data, or both."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import Cluster, ConfigError, Data, Host, Model, Problem, RunConfig, Task, Training, replace
from engine.control import preflight, script_check
from engine.control.launcher import Run
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "user_script.py"


def script_config(model_script: str | Path = "", data_script: str | Path = "", gpus: int = 0, steps: int = 8,
                  **data: Any) -> RunConfig:
    host = Host(name="local", gpus=gpus, tasks=(Task("worker", 0),))
    return RunConfig(
        name="user-script",
        cluster=Cluster(hosts=(host,)),
        data=Data(**{"source": "script" if data_script else "synthetic", "path": str(data_script), "shape": (32,),
                     "classes": 4, "size": 1024, **data}),
        model=Model(name="script" if model_script else "mlp", script=str(model_script), hidden=(32,)),
        training=Training(global_batch_size=32, steps=steps, learning_rate=0.01, optimizer="adam", metrics_hz=1e6),
    )


def write(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path


def one_problem(problems: list[Problem], field: str, *parts: str) -> Problem:
    assert len(problems) == 1, [str(p) for p in problems]
    p = problems[0]
    assert p.field == field, str(p)
    for part in parts:
        assert part in p.message, f"{part!r} not in:\n{p.message}"
    return p


GOOD_MODEL = """
    import keras

    def build_model(config):
        return keras.Sequential([keras.Input((32,)), keras.layers.Dense(config.data.classes)])
"""


# --------------------------------------------------------------------------- the check


def test_example_script_passes_the_check() -> None:
    assert script_check.check(script_config(EXAMPLE, EXAMPLE)) == []


def test_syntax_error_shows_the_file_line_and_caret(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", """
        import keras

        def build_model(config)
            return None
    """)
    p = one_problem(script_check.check(script_config(path)), "model.script", str(path),
                    "importing the script failed", "SyntaxError", "line 3", "def build_model(config)")
    assert "engine/runtime" not in p.message, "ClusterDeck's own frames stay out of the user's traceback"


def test_a_script_that_fails_before_importing_keras_is_reported_without_tensorflow(tmp_path: Path) -> None:
    # the check reads the script before TensorFlow comes in: the user's typo is named at once
    path = write(tmp_path, "typo.py", "def build_model(config)\n    return None\n")
    config_mod.save(script_config(path), tmp_path / "config.yaml")
    code = ("import sys\nfrom engine.contract import config\nfrom engine.runtime import script_checker\n"
            "problems = script_checker.check(config.load(sys.argv[1], check=False))\n"
            "print(problems[0]['field'], 'tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "config.yaml")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["model.script", "False", "False"]


def test_error_at_import_shows_the_scripts_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "fails.py", """
        SETTINGS = {"width": 64}

        def width():
            return SETTINGS["depth"]

        WIDTH = width()
    """)
    p = one_problem(script_check.check(script_config(path)), "model.script", "importing the script failed",
                    "Traceback (most recent call last)", f'File "{path}", line 6, in <module>',
                    f'File "{path}", line 4, in width', "KeyError: 'depth'")
    assert "importlib" not in p.message and "engine/runtime" not in p.message


def test_missing_build_model_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "nothing.py", "def build(config):\n    return None\n")
    one_problem(script_check.check(script_config(path)), "model.script", str(path),
                "defines no build_model(config); expected a function returning a keras.Model")


def test_missing_make_dataset_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "model_only.py", "def build_model(config):\n    return None\n")
    one_problem(script_check.check(script_config(data_script=path)), "data.path", str(path),
                "defines no make_dataset(input_context, config)")


def test_missing_script_file_needs_no_subprocess(tmp_path: Path) -> None:
    gone = tmp_path / "gone.py"
    one_problem(script_check.check(script_config(gone)), "model.script", str(gone), "no such file")


def test_error_inside_build_model_shows_its_own_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "raises.py", """
        import keras

        def layer_sizes(config):
            raise ValueError(f"no layout for {config.data.classes} classes")

        def build_model(config):
            sizes = layer_sizes(config)
            return keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(n) for n in sizes])
    """)
    p = one_problem(script_check.check(script_config(path)), "model.script", str(path),
                    "build_model(config) raised ValueError", "Traceback (most recent call last)",
                    f'File "{path}", line 7, in build_model', "sizes = layer_sizes(config)",
                    f'File "{path}", line 4, in layer_sizes', "ValueError: no layout for 4 classes")
    assert "user_script.py" not in p.message and "engine/" not in p.message


def test_dataset_batches_of_the_wrong_size_and_models_of_the_wrong_width(tmp_path: Path) -> None:
    path = write(tmp_path, "mixed.py", """
        import keras
        import numpy as np
        import tensorflow as tf

        def build_model(config):
            return keras.Sequential([keras.Input((32,)), keras.layers.Dense(3)])

        def make_dataset(input_context, config):
            x = np.zeros((256, 32), "float32")
            y = np.zeros(256, "int32")
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(config.training.global_batch_size)
    """)
    cfg = replace(script_config(data_script=path), cluster=Cluster(hosts=(Host(name="local", gpus=2,
                                                                              tasks=(Task("worker", 0),)),)))
    # two replicas: each batch must hold 32 / 2 examples
    one_problem(script_check.check(cfg), "data.path", str(path), "gave a batch of 32 examples",
                "expected the per-replica batch input_context.get_per_replica_batch_size(32) = 16")
    # the script's model gives 3 logits for data.classes 4 (batches the right size with one replica)
    one_problem(script_check.check(script_config(path, path)), "model.script", str(path),
                "the model's output has shape [32, 3]; expected [32, 4]", "or define loss(y_true, y_pred)")


def test_a_script_runs_only_when_the_config_chooses_it(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    path = write(tmp_path, "marker.py", f"""
        open({str(marker)!r}, "w").close()
    """)
    # named in the config, but the model is the built-in MLP and the data synthetic: nothing runs it
    unchosen = replace(script_config(), model=replace(script_config().model, script=str(path)),
                       data=replace(script_config().data, path=str(path)))
    assert config_mod.validate(unchosen) == []
    assert preflight.preflight(unchosen) == []
    import keras  # noqa: F401 - the runtime's own imports, as in a task process

    from engine.runtime import data as data_mod
    from engine.runtime import models

    models.build_model(unchosen)
    models.loss_fn(unchosen)
    data_mod.make_dataset(unchosen)
    assert not marker.exists()
    # chosen: the check imports it (and finds no build_model)
    one_problem(preflight.preflight(script_config(path)), "model.script", "defines no build_model")
    assert marker.exists()


def test_script_loss_forms_become_per_example_losses(tmp_path: Path) -> None:
    import numpy as np

    from engine.runtime import models, user_script

    y = np.array([0, 1, 2], dtype=np.int32)
    logits = np.eye(3, 4, dtype=np.float32) * 5
    reference = np.asarray(models.loss_fn(script_config())(y, logits))
    forms = {
        "function": "def loss(y_true, y_pred):\n    return keras.losses.sparse_categorical_crossentropy("
                    "y_true, y_pred, from_logits=True)\n",
        "mean": "def loss(y_true, y_pred):\n    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy("
                "y_true, y_pred, from_logits=True))\n",
        "keras loss": "loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)\n",
    }
    for name, body in forms.items():
        path = write(tmp_path, f"loss_{name.replace(' ', '_')}.py", "import keras\n" + body)
        values = np.asarray(models.loss_fn(script_config(path))(y, logits))
        assert values.shape == (3,), name
        expected = reference if name != "mean" else np.full(3, reference.mean())
        assert np.allclose(values, expected, atol=1e-6), name
    assert user_script.loss(script_config(write(tmp_path, "noloss.py", GOOD_MODEL))) is None


# --------------------------------------------------------------------------- real runs


def _run(config: RunConfig, runs_root: Path) -> list[dict[str, Any]]:
    assert config_mod.validate(config) == [], [str(p) for p in config_mod.validate(config)]
    run = Run(config, runs_root=runs_root)
    seen: list[dict[str, Any]] = []
    run.add_listener(seen.append)
    run.start()
    assert run.wait(90) == "finished", run.state.summary()
    steps = [e for e in seen if e["kind"] == "step"]
    assert max(e["step"] for e in steps) == config.training.steps
    assert all(math.isfinite(e["loss"]) for e in steps)
    return steps


@pytest.mark.cluster
def test_example_script_trains_as_model_and_data_on_two_replicas(runs_root: Path) -> None:
    preset = config_mod.load(ROOT / "presets" / "data-user-script.yaml")
    cfg = datasets.absolute_paths(preset, ROOT)
    cfg = replace(cfg, training=replace(cfg.training, steps=30, metrics_hz=1e6))
    steps = _run(cfg, runs_root)  # Run.start checks the script first (engine.control.launcher.launch_problems)
    assert cfg.training.steps_per_execution == 16  # as the preset ships it: groups cut at the warm-up's end (6)
    for r in (0, 1):
        assert [e["step"] for e in steps if e["replica"] == r] == [6, 22, 30]
    by_replica = {r: [e["loss"] for e in steps if e["replica"] == r] for r in (0, 1)}  # each group's mean loss
    mean = [(a + b) / 2 for a, b in zip(by_replica[0], by_replica[1], strict=True)]
    assert mean[-1] < mean[0], "the script's model learns the script's data"


@pytest.mark.cluster
def test_script_model_trains_on_the_shipped_digits(tmp_path: Path, runs_root: Path) -> None:
    path = write(tmp_path, "digits_model.py", """
        import keras

        def build_model(config):
            return keras.Sequential([keras.Input(config.data.shape), keras.layers.Flatten(),
                                     keras.layers.Dense(32, activation="relu"),
                                     keras.layers.Dense(config.data.classes)])
    """)
    cfg = script_config(path, source="digits", shape=(8, 8), classes=10, size=1497, steps=6)
    _run(cfg, runs_root)


@pytest.mark.cluster
def test_model_parallelism_reads_the_scripts_make_dataset(runs_root: Path) -> None:
    host = Host(name="local", gpus=4, tasks=(Task("worker", 0),))
    cfg = replace(script_config(data_script=EXAMPLE, steps=60, size=4096), cluster=Cluster(hosts=(host,)),
                  parallelism=config_mod.Parallelism(mode="model", mesh_batch=2, mesh_model=2))
    steps = _run(cfg, runs_root)
    assert {e["replica"] for e in steps} == {0, 1}
    losses = [e["loss"] for e in steps]
    # "learned": the last 10 reports' mean loss is below 0.6 x the first 10's
    assert sum(losses[-10:]) < 0.6 * sum(losses[:10]), (losses[:10], losses[-10:])


def test_launcher_refuses_a_broken_script_before_any_process_starts(tmp_path: Path, runs_root: Path) -> None:
    path = write(tmp_path, "broken.py", "def build_model(config)\n    return None\n")
    run = Run(script_config(path), runs_root=runs_root)
    with pytest.raises(ConfigError) as exc:
        run.start()
    one_problem(exc.value.problems, "model.script", str(path), "SyntaxError")
    assert not run.started and not run.pids()
    assert not runs_root.exists() or not any(runs_root.iterdir())
