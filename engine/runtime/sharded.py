"""Sharded models for model parallelism (DTensor): the built-in ones and the user's own.

In parallelism ``model`` the devices of the run form a mesh ``batch`` x ... x ``model``
(``parallelism.mesh``; extra named axes such as ``feature`` sit between the two). The global batch
is split over ``batch`` (each ``batch`` index is one data-parallel replica); the parameters are
split over the other axes the way each layer says, and every parameter is copied along the axes
it is not split over. On a 2 x 2 mesh a column-parallel kernel ``[784, 256]`` is held as two
shards ``[784, 128]``, each on the 2 devices of its ``model`` index.

A *layout* names, per dimension of a tensor, the mesh axis it is split over, or
:data:`UNSHARDED`: ``(UNSHARDED, MODEL)`` splits the columns of a matrix over ``model``.

Your own model
--------------
A script named by ``model: {name: script, script: PATH}`` defines::

    from engine.runtime import sharded

    def build_sharded_model(config, mesh):
        b = sharded.Builder(mesh, seed=config.training.seed)
        fc1 = sharded.Dense(b, "fc1", 784, 256, shard="columns", activation="relu")
        drop = sharded.Dropout(b, "drop", 0.1)
        fc2 = sharded.Dense(b, "fc2", 256, 10, shard="rows")
        return b.model("my_mlp", lambda x, training=False: fc2(drop(fc1(x), training)))

``config`` is the run's :class:`~engine.contract.config.RunConfig`, ``mesh`` the run's
``dtensor.Mesh``. ``forward`` receives the global batch ``[global_batch, *data.shape]`` split over
``batch``, and ``training`` (True in the train step, False in evaluation) where it takes it, and
returns logits ``[global_batch, data.classes]``, or any ``[global_batch, ...]`` output the
script's ``loss(y_true, y_pred)`` reads. ClusterDeck adds the loss (the script's, else softmax
cross-entropy, with per-replica accuracy), the gradients, the optimizer
(``training.optimizer``) and checkpoints of every parameter made through the builder. Each
parameter's first value depends only on the seed and its name, so the same script trains the
same way on a 1 x 1 mesh and on a 2 x 2 one (dropout masks aside).

The same file may also define ``build_model(config)`` (a Keras model, for parallelism ``data``
and ``async``) and ``make_dataset(input_context, config)``.

Building blocks (all take the builder first; docs/model-parallel.md has the table):

- :class:`Dense` ``(b, name, fan_in, width, shard="columns" | "rows" | "none", activation=None,
  axis="model", spec=None)``; :func:`dense_stack`
- :class:`Conv2D` ``(b, name, in_channels, filters, kernel, shard="filters" | "none", activation,
  padding, strides, axis)``; :class:`MaxPool2D`, :class:`AvgPool2D`, :class:`GlobalAvgPool2D`,
  :class:`Flatten`: shape only
- :class:`Dropout` ``(b, name, rate)``: called ``(x, training)``
- :class:`VocabEmbedding` ``(b, name, vocab, dim)``: a table split on the vocabulary, ids of any
  integer dtype
- :class:`LayerNorm` ``(b, name, dim)``, :class:`Attention` ``(b, name, dim, heads)``: heads split
  over ``model``
- :meth:`Builder.glorot`, :meth:`Builder.uniform`, :meth:`Builder.constant`, :meth:`Builder.param`:
  raw parameters with a layout naming any mesh axis, for your own ops
- :func:`constrain` ``(t, mesh, *layout)``: pin an activation to a layout

:func:`build_for_config` is what the model-parallel runtime calls to get the model of a run;
:func:`check_script` is the pre-launch check of a script's sharded builder (and its loss).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from engine.contract.config import RunConfig
from engine.runtime import dtensor_layers as layers
from engine.runtime import user_script
from engine.runtime.dtensor_layers import (
    ACTIVATIONS,
    BATCH,
    CONV_SHARDS,
    MODEL,
    SHARDS,
    Attention,
    AvgPool2D,
    Builder,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    GlobalAvgPool2D,
    LayerNorm,
    MaxPool2D,
    Param,
    ShardedModel,
    VocabEmbedding,
    constrain,
    dense_stack,
)
from engine.runtime.user_script import ScriptError

#: A dimension held whole on every device (not split over any mesh axis).
UNSHARDED: str = layers.U
#: The function a script defines for parallelism ``model``.
FUNCTION = "build_sharded_model"
SIGNATURE = "config, mesh"
FIELD = "model.script"

__all__ = [
    "ACTIVATIONS", "BATCH", "CONV_SHARDS", "FUNCTION", "MODEL", "SHARDS", "UNSHARDED", "Attention", "AvgPool2D",
    "Builder", "Conv2D", "Dense", "Dropout", "Flatten", "GlobalAvgPool2D", "LayerNorm", "MaxPool2D", "Param",
    "ShardedModel", "VocabEmbedding", "build_for_config", "build_from_script", "check_script", "constrain",
    "dense_stack",
]


def build_for_config(config: RunConfig, mesh: dtensor.Mesh) -> ShardedModel:
    """The sharded model of ``config.model`` on ``mesh``: a built-in one, or the script's (``model.name: script``)."""
    if config.model.name == "script":
        return build_from_script(config, mesh)
    return layers.build(config, mesh)


def _fail(path: Path, message: str) -> ScriptError:
    return ScriptError(FIELD, f"{FIELD}: {str(path)!r}: {message}")


def build_from_script(config: RunConfig, mesh: dtensor.Mesh, *, check: bool = True) -> ShardedModel:
    """Call the script's ``build_sharded_model(config, mesh)`` and check what it returns.

    Raises :class:`~engine.runtime.user_script.ScriptError` (field ``model.script``) when the script
    defines no such function, when it raises, or returns anything but a :class:`ShardedModel` of
    parameters on ``mesh``; with ``check``, also when ``forward`` does not turn a batch of
    ``data.shape`` into logits of ``data.classes`` (or, with the script's ``loss``, into an output its
    loss turns into one value per example). The returned model's ``forward(x, training=False)``
    calls the script's ``forward(x, training=...)``, or ``forward(x)`` where it takes no flag, and pins
    the output to ``(batch, unsharded, ...)``, the layout the runtime reads per-replica losses from.
    """
    path = user_script.script_path(config, FIELD)
    module = user_script.load(path, FIELD)
    fn = getattr(module, FUNCTION, None)
    if not callable(fn):
        also = (" (its build_model(config) builds a Keras model, which parallelism 'model' cannot shard: see "
                "docs/model-parallel.md, 'From a Keras model')"
                if callable(getattr(module, "build_model", None)) else "")
        raise _fail(path, f"defines no {FUNCTION}({SIGNATURE}){also}; expected a function returning a "
                          f"sharded.ShardedModel built from engine.runtime.sharded blocks (see examples/sharded_model.py)")
    try:
        model = fn(config, mesh)
    except Exception as exc:
        raise _fail(path, f"{FUNCTION}({SIGNATURE}) raised {type(exc).__name__}: {exc}\n"
                          f"{user_script.user_traceback(exc, path)}") from exc
    _check_model(model, mesh, path)
    user = model

    def forward(x: tf.Tensor, training: bool = False) -> tf.Tensor:
        out = user.call(x, training=training)
        return constrain(out, mesh, *layers.batch_spec(len(out.shape)))

    out = ShardedModel(model.name, list(model.params), forward, model.input_dtype, list(model.notes),
                       list(model.state))
    if check:
        x = np.zeros((mesh.dim_size(BATCH), *config.data.shape), dtype=model.input_dtype.as_numpy_dtype)
        check_forward(out, config, mesh, _pack_rows(mesh, x), path)
    return out


def _pack_rows(mesh: dtensor.Mesh, data: np.ndarray) -> tf.Tensor:
    """A host batch split on ``batch`` (whole elsewhere), as the runtime feeds it."""
    per = len(data) // mesh.dim_size(BATCH)
    return dtensor.pack([data[i * per:(i + 1) * per] for i in _local_batch_rows(mesh)],
                        dtensor.Layout(list(layers.batch_spec(data.ndim)), mesh))


def _local_batch_rows(mesh: dtensor.Mesh) -> list[int]:
    return [int(loc[BATCH]) for loc in mesh.local_device_locations()]


def _check_model(model: Any, mesh: dtensor.Mesh, path: Path) -> None:
    what = f"{FUNCTION}({SIGNATURE})"
    if not isinstance(model, ShardedModel):
        raise _fail(path, f"{what} returned {type(model).__name__}; expected a sharded.ShardedModel, "
                          f"e.g. b.model('my_model', forward) of a sharded.Builder b")
    if not isinstance(model.name, str) or not model.name.strip():
        raise _fail(path, f"{what} returned a model named {model.name!r}; expected a non-empty name")
    if not callable(model.forward):
        raise _fail(path, f"{what} returned a model whose forward is a {type(model.forward).__name__}; "
                          f"expected a function of the input batch")
    if not isinstance(model.input_dtype, tf.DType):
        raise _fail(path, f"{what} returned input_dtype {model.input_dtype!r}; expected a tf.DType "
                          f"(tf.float32 for features, tf.int32 for token ids)")
    if not model.params:
        raise _fail(path, f"{what} returned a model without parameters; expected the parameters of its "
                          f"sharded.Builder (b.model(...) collects them)")
    seen: set[str] = set()
    for p in model.params:
        if not isinstance(p, Param):
            raise _fail(path, f"{what} returned a parameter of type {type(p).__name__}; expected sharded.Param "
                              f"values made by a sharded.Builder")
        if p.name in seen:
            raise _fail(path, f"{what} returned two parameters named {p.name!r}; expected unique names")
        seen.add(p.name)
        layout = getattr(p.var, "layout", None)
        if layout is None:
            raise _fail(path, f"parameter {p.name!r} is a {type(p.var).__name__}, not on the mesh; expected a "
                              f"dtensor.DVariable made by a sharded.Builder")
        if layout.mesh != mesh:
            raise _fail(path, f"parameter {p.name!r} lives on another mesh; expected sharded.Builder(mesh, ...) "
                              f"with the mesh passed to {FUNCTION}")


def check_forward(model: ShardedModel, config: RunConfig, mesh: dtensor.Mesh, x: tf.Tensor,
                  path: Path | None = None) -> None:
    """Run ``model.forward`` on ``x`` once (``training=False``); a ScriptError unless it gives logits
    ``[rows, data.classes]``, or, where the script defines ``loss``, an output ``[rows, ...]`` that its
    loss turns into one value per example."""
    path = path if path is not None else user_script.script_path(config, FIELD)
    rows = int(x.shape[0])
    batch = f"a batch of shape {[rows, *config.data.shape]}"
    try:
        out = model.call(x, training=False)
    except Exception as exc:
        raise _fail(path, f"the model's forward on {batch} ({model.input_dtype.name}) raised "
                          f"{type(exc).__name__}: {str(exc).strip()[:600]}\n"
                          f"{user_script.user_traceback(exc, path)}") from exc
    shape = [int(d) for d in getattr(out, "shape", [])]
    try:
        loss = user_script.loss(config) if config.model.name == "script" else None
    except ScriptError:
        raise
    except Exception as exc:  # e.g. keras.losses.get of a name Keras does not know
        raise _fail(path, f"its loss cannot be used: {type(exc).__name__}: {str(exc).strip()[:400]}; expected a "
                          f"function loss(y_true, y_pred), a keras.losses.Loss or a Keras loss name such as "
                          f"'mse'") from exc
    if loss is None:
        if shape != [rows, config.data.classes]:
            raise _fail(path, f"the model's forward turned {batch} into {shape}; expected logits [{rows}, "
                              f"{config.data.classes}] (data.classes {config.data.classes}), or define "
                              f"loss(y_true, y_pred)")
        return
    if not shape or shape[0] != rows:
        raise _fail(path, f"the model's forward turned {batch} into {shape}; expected an output of {rows} rows "
                          f"[{rows}, ...], one per example")
    y = _check_labels(config, rows, shape)
    try:
        values = tf.function(lambda y_true, y_pred: loss(layers.match_labels(y_true, y_pred), y_pred))(
            _pack_rows(mesh, y), out)
    except Exception as exc:
        raise _fail(path, f"loss(y_true, y_pred) on labels {list(y.shape)} ({y.dtype.name}) and the model's output "
                          f"{shape} raised {type(exc).__name__}: {str(exc).strip()[:600]}\n"
                          f"{user_script.user_traceback(exc, path)}") from exc
    got = [int(d) for d in values.shape]
    if got != [rows]:
        raise _fail(path, f"loss(y_true, y_pred) on labels {list(y.shape)} and the model's output {shape} gave "
                          f"values of shape {got}; expected one value per example [{rows}] (or a scalar, or "
                          f"[{rows}, ...] averaged per example)")


def _check_labels(config: RunConfig, rows: int, out_shape: list[int]) -> np.ndarray:
    """Zero labels for ``rows`` examples as the run's data gives them: a script's ``make_dataset`` says its
    shape and dtype (float labels for a regression); the built-in sources give int32 class numbers."""
    if config.data.source == "script":
        try:
            spec = user_script.make_dataset(config, None).element_spec[1]
            return np.zeros((rows, *[d if d is not None else 1 for d in spec.shape[1:]]),
                            dtype=spec.dtype.as_numpy_dtype)
        except Exception:  # noqa: BLE001 - the data's own check (data.path) reports a broken make_dataset
            return np.zeros((rows, *out_shape[1:]), dtype=np.float32)
    return np.zeros((rows,), dtype=np.int32)


def check_script(config: RunConfig, x: np.ndarray | None = None) -> list[dict[str, str]]:
    """The pre-launch check of a sharded script, as ``{"field", "message"}`` problems (empty: fine).

    Builds the script's model on a mesh of ``parallelism.mesh`` over logical CPU devices (call it
    before TensorFlow has set up its devices; where it already has too few, on a 1 x 1 mesh), then
    runs ``forward`` on ``x`` (a first global batch) or on zeros.
    """
    try:
        mesh = _check_mesh(config)
        model = build_from_script(config, mesh, check=x is None)
        if x is not None:
            batch_axis = mesh.dim_size(BATCH)
            rows = (len(x) // batch_axis) * batch_axis or batch_axis
            data = np.resize(np.asarray(x), (rows, *np.asarray(x).shape[1:])).astype(model.input_dtype.as_numpy_dtype)
            check_forward(model, config, mesh, _pack_rows(mesh, data))
    except ScriptError as exc:
        return [{"field": exc.field, "message": str(exc).removeprefix(f"{exc.field}: ")}]
    except ValueError as exc:  # the mesh of the config
        return [{"field": "parallelism.mesh", "message": str(exc)}]
    return []


def _check_mesh(config: RunConfig) -> dtensor.Mesh:
    p = config.parallelism
    wanted = p.mesh_devices()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if wanted > 1:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    except RuntimeError:  # TensorFlow has set up its devices already
        pass
    found = len(tf.config.list_logical_devices("CPU"))
    dims = p.mesh_dims() if found >= wanted else [(name, 1) for name, _ in p.mesh_dims()]
    size = int(np.prod([n for _, n in dims]))
    return dtensor.create_mesh(dims, devices=[f"CPU:{i}" for i in range(size)], device_type="CPU")

