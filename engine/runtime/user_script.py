"""The user's own Python file: a model, a data pipeline and optionally a loss.

A script may define:

- ``build_model(config) -> keras.Model`` (used with ``model: {name: script, script: PATH}``): called
  inside the strategy's scope; returns logits of ``data.classes`` unless the script defines ``loss``.
- ``make_dataset(input_context, config) -> tf.data.Dataset`` (used with ``data: {source: script,
  path: PATH}``): ``(x, y)`` batches of ``input_context.get_per_replica_batch_size(global_batch_size)``
  examples, sharded with ``input_context.num_input_pipelines``/``input_pipeline_id``; with
  ``input_context=None`` (model parallelism), whole global batches. ClusterDeck repeats it, so it
  may end. In async mode (ParameterServerStrategy) it is traced once on the chief and run on every
  worker: ``num_input_pipelines`` is the number of workers and ``input_pipeline_id`` a scalar int64
  tensor known only on the worker (use it in ``ds.shard`` or TensorFlow ops, not Python or numpy);
  whatever the function builds from numpy arrays travels to the workers inside it.
- ``loss(y_true, y_pred)`` (with model ``script``): per-example losses, or a scalar mean, or a
  ``keras.losses.Loss``; the default is sparse categorical cross-entropy on logits.

``config`` is the run's :class:`engine.contract.config.RunConfig`. A script is imported only in the processes
of a run whose config names it, and, before the launch, by the check of this module
:mod:`engine.runtime.script_checker` (``python -m engine.runtime.script_checker --check CONFIG --out RESULT``),
run in a subprocess by :mod:`engine.control.script_check`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.contract.config import RunConfig

_modules: dict[str, ModuleType] = {}


class ScriptError(Exception):
    """A problem of the user's script, with the field of the config that names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def script_path(config: RunConfig, field: str) -> Path:
    """The absolute path of the script named by ``model.script`` or ``data.path``."""
    raw = config.model.script if field == "model.script" else config.data.path
    p = Path(os.path.expanduser(raw))  # "~nosuchuser" stays as written: reported as missing
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
        where = f"{str(script_path(config, 'model.script'))!r}: build_model(config) returned {type(model).__name__}"
        if type(model).__module__.split(".")[0] == "tf_keras":
            raise ScriptError("model.script", f"{where}, a legacy tf-keras (Keras 2) model (TF_USE_LEGACY_KERAS=1 "
                                              "makes tf.keras tf-keras); tf-keras models are not supported: "
                                              "ClusterDeck trains, checkpoints and measures Keras 3 models; expected "
                                              "a keras.Model built with `import keras` (TF_USE_LEGACY_KERAS unset)")
        raise ScriptError("model.script", f"{where}; expected a keras.Model")
    return model


def make_dataset(config: RunConfig, input_context: Any) -> Any:
    """The script's ``make_dataset(input_context, config)``, checked to return a ``tf.data.Dataset``."""
    import tensorflow as tf

    ds = _function(config, "data.path", "make_dataset", "input_context, config")(input_context, config)
    if not isinstance(ds, tf.data.Dataset):
        raise ScriptError("data.path", f"{str(script_path(config, 'data.path'))!r}: make_dataset(input_context, "
                                       f"config) returned {type(ds).__name__}; expected a tf.data.Dataset")
    return ds


def make_validation_dataset(config: RunConfig) -> Any:
    """The script's ``make_validation_dataset(config)``: held-out ``(x, y)`` examples, batched by the script
    (validation with ``data: {source: script}``), checked to return a ``tf.data.Dataset``."""
    import tensorflow as tf

    path = script_path(config, "data.path")
    fn = getattr(load(path, "data.path"), "make_validation_dataset", None)
    if not callable(fn):
        raise ScriptError("validation", f"{str(path)!r} defines no make_validation_dataset(config); expected it "
                                        "for validation with data source 'script' (a tf.data.Dataset of held-out "
                                        "(x, y) batches)")
    ds = fn(config)
    if not isinstance(ds, tf.data.Dataset):
        raise ScriptError("validation", f"{str(path)!r}: make_validation_dataset(config) returned "
                                        f"{type(ds).__name__}; expected a tf.data.Dataset")
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
