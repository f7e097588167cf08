"""The pre-launch check of a user's script: ``python -m engine.runtime.script_checker --check CONFIG --out RESULT``.

Run in a subprocess by :mod:`engine.control.script_check` (the script imports TensorFlow; the launcher must
not). It imports the script, builds its model and/or dataset and runs one batch through model and loss.
TensorFlow (and the runtime's modules that import it) comes in only once the script has been read: a syntax
error, a failing import or a missing function is reported in a fraction of a second, not after TensorFlow's
import (unless the script itself imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract.config import RunConfig
from engine.runtime.stop import remove_autograph_files
from engine.runtime.user_script import ScriptError, _function, load, script_path, user_traceback


def _check_batches(config: RunConfig, make: Any, per_replica: int, global_batch: int) -> list[dict[str, str]]:
    """The user's make_dataset alone (the model is a sharded script's, checked already): (x, y) batches of
    the expected size with labels in range."""
    import tensorflow as tf

    path = script_path(config, "data.path")
    try:
        batch = next(iter(make(config, None)))
    except BaseException as exc:  # noqa: BLE001 - whatever the script raises is the user's to read
        if isinstance(exc, ScriptError):
            return [{"field": exc.field, "message": str(exc)}]
        return [{"field": "data.path", "message": f"{str(path)!r}: make_dataset(input_context, config) raised "
                                                  f"{type(exc).__name__}:\n{user_traceback(exc, path)}"}]
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return [{"field": "data.path", "message": f"{str(path)!r}: make_dataset(input_context, config) yields "
                                                  f"{type(batch).__name__}; expected (x, y) pairs"}]
    rows = int(tf.shape(tf.nest.flatten(batch[0])[0])[0])
    if rows != per_replica:
        return [{"field": "data.path", "message": f"{str(path)!r}: make_dataset(None, config) gave a batch of {rows} "
                                                  f"examples; expected whole global batches of {global_batch}"}]
    custom = getattr(load(script_path(config, "model.script")), "loss", None) is not None
    labels = tf.reshape(tf.cast(batch[1], tf.int64), [-1])
    if not custom and int(tf.size(labels)):  # a script's own loss says what its labels are (regression)
        low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
        if low < 0 or high >= config.data.classes:
            return [{"field": "data.classes", "message": f"{str(path)!r}: the first batch holds label "
                                                         f"{high if high >= config.data.classes else low}; expected "
                                                         f"labels from 0 to {config.data.classes - 1}"}]
    return []


def check(config: RunConfig) -> list[dict[str, str]]:
    """Import the script, build its model and/or dataset, run one batch through model and loss.

    Returns problems as ``{"field", "message"}``; a failure inside the script carries its traceback.
    """
    model_script = config.model.name == "script"
    data_script = config.data.source == "script"
    sharded_model = model_script and config.parallelism.mode == "model"
    if sharded_model:
        # a sharded script: its build_sharded_model(config, mesh) on the run's mesh (set up before any
        # other TensorFlow use), then the data checks below without the Keras model
        from engine.runtime import sharded

        problems = sharded.check_script(config)
        if problems or not data_script:
            return problems
        model_script = False
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

    from engine.runtime.keras_import import import_keras

    import_keras()  # where the script did not import it: without the notebook extras
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
    mode = config.parallelism.mode
    context: Any = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                              num_replicas_in_sync=replicas)
    if mode == "model":  # the model-parallel runtime reads whole global batches (no input context)
        context, per_replica = None, global_batch
    elif mode == "async" and data_script:
        # the async runtime traces the dataset function once, with the worker's index as a tensor
        try:
            with tf.Graph().as_default():
                index = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [])
                data_mod.make_dataset(config, tf.distribute.InputContext(replicas, index, replicas))
        except BaseException as exc:  # noqa: BLE001
            return failed("data.path", "make_dataset(input_context, config) with the worker index as a tensor "
                                       "(parallelism 'async': input_context.input_pipeline_id is a tensor known "
                                       "only on the worker)", exc)
    keras.utils.set_random_seed(config.training.seed)
    if sharded_model:
        return _check_batches(config, data_mod.make_dataset, per_replica, global_batch)
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
    # the model as the run builds it: built on a batch where it has no variables yet, its optimizer built
    # against its variables, what trains decided (compiled or the run's own optimizer and loss)
    from engine.runtime import compiled

    try:
        recipe = compiled.build(config, tuple(batch))
    except BaseException as exc:  # noqa: BLE001
        hint = _compiled_label_hint(config, x, y)  # a compiled loss and labels of the other kind fail in the build
        if hint:
            return [{"field": "data.path" if data_script else "model.script", "message": f"{str(path)!r}: {hint}"}]
        if model_script:
            return failed("model.script", "build_model(config)", exc)
        return [{"field": "model.name", "message": f"the built-in model cannot be built: {exc}"}]
    model = recipe.model
    try:
        logits = model(x, training=False)
    except BaseException as exc:  # noqa: BLE001
        if model_script:
            return failed("model.script", "calling the model on one batch", exc)
        return [{"field": "data.shape", "message": f"the {config.model.name!r} model cannot read a batch of "
                                                   f"{str(path)!r}: {str(exc).splitlines()[0][:300]}"}]
    custom = model_script and getattr(load(script_path(config, "model.script")), "loss", None) is not None
    if recipe.step_kind == "loop" and not custom:
        problems = _logits_and_labels(config, path, model_script, rows, logits, y)
        if problems:
            return problems
    # one training step as the run takes it (compiled loss, metrics, train_step, optimizer): what would fail
    # after launch fails here
    loss_fn = models.loss_fn(config) if recipe.step_kind == "loop" else None
    try:
        figures = tf.function(lambda data: recipe.step(data, loss_fn, per_replica))(tuple(batch))
        mean = float(figures["loss"]) if "loss" in figures else 0.0
    except BaseException as exc:  # noqa: BLE001
        if custom:
            return failed("model.script", "loss(y_true, y_pred)", exc)
        if recipe.step_kind == "custom":
            return failed("model.script", f"{type(model).__name__}.train_step", exc)
        hint = _label_hint(config, logits, y, recipe)
        if hint:
            return [{"field": "data.path" if data_script else "model.script", "message": f"{str(path)!r}: {hint}"}]
        if model_script:
            return failed("model.script", "one training step (the model as compiled)"
                          if recipe.source == "compile" else "one training step", exc)
        return [{"field": "data.path", "message": f"{str(path)!r}: the loss cannot be computed on the first batch: "
                                                  f"{str(exc).splitlines()[0][:300]}"}]
    if mean != mean or mean in (float("inf"), float("-inf")):
        return [{"field": "model.script" if custom or recipe.source == "compile" else "data.path",
                 "message": f"{str(path)!r}: the loss of the first batch is {mean}; expected a finite number"}]
    if config.validation.enabled and data_script:
        try:
            first = next(iter(data_mod.validation_dataset(config)))
        except BaseException as exc:  # noqa: BLE001
            return failed("data.path", "make_validation_dataset(config)", exc)
        if not isinstance(first, (tuple, list)) or len(first) < 2:
            return [{"field": "data.path", "message": f"{str(path)!r}: make_validation_dataset(config) yields "
                                                      f"{type(first).__name__}; expected (x, y) batches"}]
    return []


def _logits_and_labels(config: RunConfig, path: Path, model_script: bool, rows: int, logits: Any,
                       y: Any) -> list[dict[str, str]]:
    """The run's default loss reads logits of ``data.classes`` and integer labels below it."""
    import tensorflow as tf

    shape = list(getattr(logits, "shape", []))
    if len(shape) != 2 or shape[1] != config.data.classes:
        field = "model.script" if model_script else "data.classes"
        return [{"field": field, "message": f"{str(script_path(config, 'model.script'))!r}: " * model_script
                 + f"the model's output has shape {shape}; expected [{rows}, {config.data.classes}] (logits "
                   f"of data.classes {config.data.classes})" + ", or define loss(y_true, y_pred) or compile the "
                   "model with its loss" * model_script}]
    hint = _label_hint(config, logits, y, None)
    if hint:
        return [{"field": "data.path", "message": f"{str(path)!r}: {hint}"}]
    labels = tf.reshape(tf.cast(y, tf.int64), [-1])
    if int(tf.size(labels)):
        low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
        if low < 0 or high >= config.data.classes:
            return [{"field": "data.classes", "message": f"{str(path)!r}: the first batch holds label "
                                                         f"{high if high >= config.data.classes else low}; "
                                                         f"expected labels from 0 to {config.data.classes - 1} "
                                                         f"(data.classes {config.data.classes})"}]
    return []


def _compiled_label_hint(config: RunConfig, x: Any, y: Any) -> str:
    """:func:`_label_hint` for a compiled model whose build failed (its loss is built on the first batch)."""
    from engine.runtime import compiled, models, tf_compat

    try:
        model = models.build_model(config)
        if not compiled.is_compiled(model):
            return ""
        logits = model(x, training=False)
        loss = compiled._name_of(tf_compat.compile_setting(model, "loss"))
    except BaseException:  # noqa: BLE001 - no hint then: the build's own error is reported
        return ""
    return _label_hint(config, logits, y, compiled.Recipe(model, None, "compile", "keras", loss))


def _label_hint(config: RunConfig, logits: Any, y: Any, recipe: Any) -> str:
    """What to change where labels are one-hot but the loss takes class ids (sparse cross-entropy)."""
    y_shape = list(getattr(y, "shape", []))
    out_shape = list(getattr(logits, "shape", []))
    loss_name = recipe.loss_name.replace("_", "").lower() if recipe is not None else ""
    sparse = recipe is None or recipe.source != "compile" or "sparse" in loss_name
    if sparse and len(y_shape) == 2 and len(out_shape) == 2 and y_shape[1] == out_shape[1] and y_shape[1] > 1:
        return (f"the labels have shape {y_shape}: one-hot vectors, but the loss (sparse categorical "
                "cross-entropy) takes class ids of shape [batch]; yield tf.argmax(y, axis=-1) instead, or compile "
                "the model with loss=keras.losses.CategoricalCrossentropy(from_logits=True)")
    categorical = not sparse and "categoricalcrossentropy" in loss_name
    if categorical and len(y_shape) <= 1 and len(out_shape) == 2 and out_shape[1] > 1:
        return (f"the labels have shape {y_shape}: class ids, but the compiled loss ({recipe.loss_name}) takes "
                f"one-hot vectors of shape [batch, {out_shape[1]}]; compile with "
                "loss=keras.losses.SparseCategoricalCrossentropy() instead, or yield "
                f"tf.one_hot(y, {out_shape[1]})")
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine.runtime.script_checker",
                                     description="check the user's script of a config (used before a launch)")
    parser.add_argument("--check", required=True, help="the run's config (YAML)")
    parser.add_argument("--out", required=True, help="write the problems here as JSON")
    args = parser.parse_args(argv)

    config = config_mod.load(args.check, check=False)
    try:
        problems = check(config)
    except ScriptError as exc:
        problems = [{"field": exc.field, "message": str(exc)}]
    Path(args.out).write_text(json.dumps({"problems": problems}), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    # the user's script may have started threads (or TF may hang in its shutdown): the answer is written
    remove_autograph_files()  # what the atexit handlers os._exit skips would have removed
    os._exit(0)


if __name__ == "__main__":
    main()
