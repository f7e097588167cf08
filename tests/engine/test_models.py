"""Built-in models: what each builds, which parallelism modes each claims, and a ResNet that trains the same
on one device and on two (its normalisation does not depend on how the batch is split)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract.config import (
    IMAGE_MODELS,
    MODEL_MODES,
    MODELS,
    MODES,
    Cluster,
    Data,
    Host,
    Model,
    RunConfig,
    Task,
    Training,
    replace,
)
from engine.control.launcher import Run


def make_config(model: str, shape: tuple[int, ...], gpus: int = 0, **fields: Any) -> RunConfig:
    host = Host(name="local", gpus=gpus, tasks=(Task("worker", 0),))
    return RunConfig(name=f"model-{model}", cluster=Cluster(hosts=(host,)),
                     data=Data(shape=shape, classes=5, size=512),
                     model=Model(name=model, **{"hidden": (16,), **fields}),
                     training=Training(global_batch_size=32, steps=6, learning_rate=0.05, metrics_hz=1e6))


BUILT_IN: dict[str, dict[str, Any]] = {
    "mlp": {"shape": (20,)},
    "cnn": {"shape": (8, 8, 1)},
    "resnet": {"shape": (8, 8)},
    "embedding": {"shape": (12,), "vocab_size": 40, "embed_dim": 8},
    "transformer": {"shape": (12,), "vocab_size": 40, "embed_dim": 8, "heads": 2},
}


def test_every_model_names_the_modes_it_supports() -> None:
    assert set(MODEL_MODES) == set(MODELS)
    assert set(BUILT_IN) | {"script"} == set(MODELS)
    for name, modes in MODEL_MODES.items():
        assert modes and set(modes) <= set(MODES), name
    # async trains every model; model parallelism only models made of sharded blocks
    assert all("async" in modes for modes in MODEL_MODES.values())
    for name in IMAGE_MODELS:
        assert MODEL_MODES[name] == ("data", "async")


@pytest.mark.parametrize("name", ["cnn", "resnet", "transformer", "script"])
def test_async_accepts_every_model(name: str) -> None:
    shape = (12,) if name == "transformer" else (8, 8, 1)
    cfg = make_config(name, shape, script="/x.py", **({"vocab_size": 40, "embed_dim": 8, "heads": 2}
                                                     if name == "transformer" else {}))
    chief = Host(name="local", tasks=(Task("chief", 0), Task("worker", 0), Task("ps", 0)))
    cfg = replace(cfg, cluster=Cluster(hosts=(chief,)), parallelism=replace(cfg.parallelism, mode="async"))
    assert [str(p) for p in config_mod.validate(cfg) if p.field == "model.name"] == []


@pytest.mark.parametrize("name", ["cnn", "resnet"])
def test_models_refuse_modes_they_do_not_support(name: str) -> None:
    cfg = make_config(name, (8, 8, 1))
    worker = Host(name="local", gpus=2, tasks=(Task("worker", 0),))
    cfg = replace(cfg, cluster=Cluster(hosts=(worker,)), parallelism=replace(cfg.parallelism, mode="model",
                                                                            mesh_batch=1, mesh_model=2))
    problems = [str(p) for p in config_mod.validate(cfg)]
    assert f"model.name: model {name!r} supports parallelism 'data', 'async', not 'model'" in problems


@pytest.mark.parametrize("shape", [(64,), (2, 8, 8, 1)])
def test_image_models_need_an_image_shape(shape: tuple[int, ...]) -> None:
    problems = [str(p) for p in config_mod.validate(make_config("cnn", shape))]
    assert (f"data.shape: model 'cnn' reads images; expected [height, width] or [height, width, channels], "
            f"got {list(shape)}") in problems


def test_script_model_needs_its_file() -> None:
    problems = [str(p) for p in config_mod.validate(make_config("script", (20,)))]
    assert any(p.startswith("model.script: model 'script' is built by a Python file") for p in problems)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_built_in_model_gives_logits_of_every_class(name: str) -> None:
    import keras

    from engine.runtime import data as data_mod
    from engine.runtime import models

    cfg = make_config(name, **BUILT_IN[name])
    assert config_mod.validate(cfg) == [], [str(p) for p in config_mod.validate(cfg)]
    keras.utils.set_random_seed(0)
    model = models.build_model(cfg)
    x, y = data_mod.arrays(cfg)
    logits = np.asarray(model(x[:3], training=False))
    assert logits.shape == (3, 5) and np.all(np.isfinite(logits))
    assert model.count_params() < 300_000, "built-in models stay small"
    loss = np.asarray(models.loss_fn(cfg)(y[:3], logits))
    assert loss.shape == (3,), "the loss is per example: the loop averages it over the global batch"
    kinds = {type(layer).__name__ for layer in model.layers}
    if name == "cnn":
        assert "Conv2D" in kinds
    if name == "resnet":
        assert {"Conv2D", "Add", "GroupNormalization"} <= kinds and "BatchNormalization" not in kinds
        assert model.get_layer("channels").output.shape[-1] == 1  # [h, w] images get a channel axis


def _trajectory(cfg: RunConfig, runs_root: Path) -> list[float]:
    run = Run(cfg, runs_root=runs_root)
    seen: list[dict[str, Any]] = []
    run.add_listener(seen.append)
    run.start()
    assert run.wait(90) == "finished", run.state.summary()
    per_step: dict[int, list[float]] = {}
    for e in seen:
        if e["kind"] == "step":
            per_step.setdefault(e["step"], []).append(e["loss"])
    return [sum(v) / len(v) for _, v in sorted(per_step.items())]


@pytest.mark.cluster
def test_resnet_follows_the_same_trajectory_on_one_and_two_devices(runs_root: Path) -> None:
    base = make_config("resnet", (8, 8, 1), hidden=())
    base = replace(base, training=replace(base.training, learning_rate=0.02, steps=5))
    one = _trajectory(replace(base, name="resnet-1"), runs_root)
    two = _trajectory(replace(base, name="resnet-2", cluster=Cluster(hosts=(replace(base.cluster.hosts[0], gpus=2),))),
                      runs_root)
    assert len(one) == len(two) == 5
    assert one[-1] < one[0], f"the loss must fall, or the comparison proves nothing: {one}"
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        assert abs(a - b) <= 1e-4, f"step {step}: 1 device {a:.6f} vs 2 devices {b:.6f}"
