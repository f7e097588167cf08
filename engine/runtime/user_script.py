"""The user's own Python file: a model, a data pipeline and optionally a loss.

A script may define:

- ``build_model(config) -> keras.Model`` (used with ``model: {name: script, script: PATH}``): called
  inside the strategy's scope; returns logits of ``data.classes`` unless the script defines ``loss``.
- ``make_dataset(input_context, config) -> tf.data.Dataset`` (used with ``data: {source: script,
  path: PATH}``): ``(x, y)`` batches of ``input_context.get_per_replica_batch_size(global_batch_size)``
  examples, sharded with ``input_context.num_input_pipelines``/``input_pipeline_id``; with
  ``input_context=None``, whole global batches. ClusterDeck repeats it, so it may end.
- ``loss(y_true, y_pred)`` (with model ``script``): per-example losses, or a scalar mean, or a
  ``keras.losses.Loss``; the default is sparse categorical cross-entropy on logits.

``config`` is the run's :class:`engine.config.RunConfig`. A script is imported only in the processes
of a run whose config names it, and, before the launch, by the check of this module
(``python -m engine.runtime.user_script --check CONFIG --out RESULT``), run in a subprocess by
:mod:`engine.script_check`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.config import RunConfig

_modules: dict[str, ModuleType] = {}


class ScriptError(Exception):
    """A problem of the user's script, with the field of the config that names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def script_path(config: RunConfig, field: str) -> Path:
    """The absolute path of the script named by ``model.script`` or ``data.path``."""
    raw = config.model.script if field == "model.script" else config.data.path
    p = Path(raw).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def load(path: Path, field: str = "model.script") -> ModuleType:
    """Import the script once per process (its folder goes on ``sys.path`` for its own imports)."""
    key = str(path.resolve()) if path.exists() else str(path)
    module = _modules.get(key)
    if module is not None:
        return module
    if not path.is_file():
        raise ScriptError(field, f"{str(path)!r}: no such file; expected a Python script")
    name = "clusterdeck_user_" + hashlib.sha1(key.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ScriptError(field, f"{str(path)!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _modules[key] = module
    return module


def _function(config: RunConfig, field: str, name: str, signature: str) -> Callable[..., Any]:
    path = script_path(config, field)
    fn = getattr(load(path, field), name, None)
    if not callable(fn):
        raise ScriptError(field, f"{str(path)!r} defines no {name}({signature}); expected a function "
                                 f"{_WANTED[name]}")
    return fn


_WANTED = {
    "build_model": "returning a keras.Model",
    "make_dataset": "returning a tf.data.Dataset of (x, y) batches",
}


def build_model(config: RunConfig) -> Any:
    """The script's ``build_model(config)``, checked to return a Keras model."""
    import keras

    model = _function(config, "model.script", "build_model", "config")(config)
    if not isinstance(model, keras.Model):
        raise ScriptError("model.script", f"{str(script_path(config, 'model.script'))!r}: build_model(config) "
                                          f"returned {type(model).__name__}; expected a keras.Model")
    return model


def make_dataset(config: RunConfig, input_context: Any) -> Any:
    """The script's ``make_dataset(input_context, config)``, checked to return a ``tf.data.Dataset``."""
    import tensorflow as tf

    ds = _function(config, "data.path", "make_dataset", "input_context, config")(input_context, config)
    if not isinstance(ds, tf.data.Dataset):
        raise ScriptError("data.path", f"{str(script_path(config, 'data.path'))!r}: make_dataset(input_context, "
                                       f"config) returned {type(ds).__name__}; expected a tf.data.Dataset")
    return ds


def loss(config: RunConfig) -> Callable[[Any, Any], Any] | None:
    """The script's ``loss`` as a per-example loss function, or None when it defines none."""
    import keras
    import tensorflow as tf

    module = load(script_path(config, "model.script"))
    user = getattr(module, "loss", None)
    if user is None:
        return None
    if isinstance(user, str):
        user = keras.losses.get(user)
    elif isinstance(user, keras.losses.Loss):
        user = copy.copy(user)
        user.reduction = None  # per-example values: the loop averages over the global batch
    if not callable(user):
        raise ScriptError("model.script", f"{str(script_path(config, 'model.script'))!r}: loss is a "
                                          f"{type(user).__name__}; expected a function loss(y_true, y_pred)")
    fn = user

    def per_example(y_true: Any, y_pred: Any) -> Any:
        values = tf.convert_to_tensor(fn(y_true, y_pred))
        rank = values.shape.rank
        if rank == 0:  # a mean over the batch: as if every example had it
            values = tf.fill(tf.shape(y_pred)[:1], values)
        elif rank is not None and rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, rank)))
        return values

    return per_example


# --------------------------------------------------------------------------- the check (a subprocess)


def user_traceback(exc: BaseException, path: Path) -> str:
    """The traceback of ``exc`` from the first frame in the user's file on (ClusterDeck's frames left out)."""
    te = traceback.TracebackException.from_exception(exc)
    target = str(path.resolve())
    frames = list(te.stack)
    start = next((i for i, f in enumerate(frames) if f.filename and _same_file(f.filename, target)), None)
    te.stack = traceback.StackSummary.from_list(frames[start:] if start is not None else [])
    return "".join(te.format()).rstrip()


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def check(config: RunConfig) -> list[dict[str, str]]:
    """Import the script, build its model and/or dataset, run one batch through model and loss.

    Returns problems as ``{"field", "message"}``; a failure inside the script carries its traceback.
    """
    model_script = config.model.name == "script"
    data_script = config.data.source == "script"
    wanted = ([("model.script", "build_model", "config")] if model_script else []) + \
             ([("data.path", "make_dataset", "input_context, config")] if data_script else [])
    # the script first (a syntax error needs no TensorFlow to be found), then its functions
    for field, name, signature in wanted:
        path = script_path(config, field)
        try:
            _function(config, field, name, signature)
        except ScriptError as exc:
            return [{"field": exc.field, "message": str(exc)}]
        except BaseException as exc:  # noqa: BLE001 - whatever the script raises is the user's to read
            return [{"field": field, "message": f"{str(path)!r}: importing the script failed:\n"
                                                f"{user_traceback(exc, path)}"}]
    if not wanted:
        return []

    import keras
    import tensorflow as tf

    from engine.runtime import data as data_mod
    from engine.runtime import models

    def failed(field: str, what: str, exc: BaseException) -> list[dict[str, str]]:
        if isinstance(exc, ScriptError):
            return [{"field": exc.field, "message": str(exc)}]
        path = script_path(config, field)
        return [{"field": field, "message": f"{str(path)!r}: {what} raised {type(exc).__name__}:\n"
                                            f"{user_traceback(exc, path)}"}]

    replicas = max(1, config.num_replicas())
    global_batch = config.training.global_batch_size
    per_replica = global_batch // replicas if global_batch % replicas == 0 else global_batch
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=replicas)
    keras.utils.set_random_seed(config.training.seed)
    try:
        model = models.build_model(config)
    except BaseException as exc:  # noqa: BLE001
        return failed("model.script", "build_model(config)", exc) if model_script else \
            [{"field": "model.name", "message": f"the built-in model cannot be built: {exc}"}]
    try:
        ds = data_mod.make_dataset(config, context)
        batch = next(iter(ds))
    except BaseException as exc:  # noqa: BLE001
        if data_script:
            return failed("data.path", "make_dataset(input_context, config)", exc)
        return [{"field": "data.source", "message": str(exc)}]
    path = script_path(config, "data.path" if data_script else "model.script")
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return [{"field": "data.path", "message": f"{str(path)!r}: make_dataset(input_context, config) yields "
                                                  f"{type(batch).__name__}; expected (x, y) pairs"}]
    x, y = batch[0], batch[1]
    rows = int(tf.shape(tf.nest.flatten(x)[0])[0])
    if data_script and rows != per_replica:
        return [{"field": "data.path", "message": f"{str(path)!r}: make_dataset(input_context, config) gave a batch "
                                                  f"of {rows} examples; expected the per-replica batch "
                                                  f"input_context.get_per_replica_batch_size({global_batch}) = "
                                                  f"{per_replica}"}]
    try:
        logits = model(x, training=False)
    except BaseException as exc:  # noqa: BLE001
        if model_script:
            return failed("model.script", "calling the model on one batch", exc)
        return [{"field": "data.shape", "message": f"the {config.model.name!r} model cannot read a batch of "
                                                   f"{str(path)!r}: {str(exc).splitlines()[0][:300]}"}]
    custom = model_script and getattr(load(script_path(config, "model.script")), "loss", None) is not None
    if not custom:
        shape = list(getattr(logits, "shape", []))
        if len(shape) != 2 or shape[1] != config.data.classes:
            field = "model.script" if model_script else "data.classes"
            return [{"field": field, "message": f"{str(script_path(config, 'model.script'))!r}: " * model_script
                     + f"the model's output has shape {shape}; expected [{rows}, {config.data.classes}] (logits "
                       f"of data.classes {config.data.classes})" + ", or define loss(y_true, y_pred)" * model_script}]
        labels = tf.reshape(tf.cast(y, tf.int64), [-1])
        if int(tf.size(labels)):
            low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
            if low < 0 or high >= config.data.classes:
                return [{"field": "data.classes", "message": f"{str(path)!r}: the first batch holds label "
                                                             f"{high if high >= config.data.classes else low}; "
                                                             f"expected labels from 0 to {config.data.classes - 1} "
                                                             f"(data.classes {config.data.classes})"}]
    try:
        values = models.loss_fn(config)(y, logits)
        mean = float(tf.reduce_mean(tf.cast(values, tf.float32)))
    except BaseException as exc:  # noqa: BLE001
        if custom:
            return failed("model.script", "loss(y_true, y_pred)", exc)
        return [{"field": "data.path", "message": f"{str(path)!r}: the loss cannot be computed on the first batch: "
                                                  f"{str(exc).splitlines()[0][:300]}"}]
    if mean != mean or mean in (float("inf"), float("-inf")):
        return [{"field": "model.script" if custom else "data.path",
                 "message": f"{str(path)!r}: the loss of the first batch is {mean}; expected a finite number"}]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine.runtime.user_script",
                                     description="check the user's script of a config (used before a launch)")
    parser.add_argument("--check", required=True, help="the run's config (YAML)")
    parser.add_argument("--out", required=True, help="write the problems here as JSON")
    args = parser.parse_args(argv)
    from engine import config as config_mod

    config = config_mod.load(args.check, check=False)
    try:
        problems = check(config)
    except ScriptError as exc:
        problems = [{"field": exc.field, "message": str(exc)}]
    Path(args.out).write_text(json.dumps({"problems": problems}), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    # the user's script may have started threads (or TF may hang in its shutdown): the answer is written
    os._exit(0)


if __name__ == "__main__":
    main()
