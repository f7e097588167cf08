"""Sharded models for model parallelism (DTensor): the built-in ones and the user's own.

In parallelism ``model`` the devices of the run form a 2-D mesh ``batch`` x ``model``
(``parallelism.mesh``). The global batch is split over ``batch`` (each ``batch`` index is one
data-parallel replica); the parameters are split over ``model`` the way each layer says, and
every parameter is copied along ``batch``. On a 2 x 2 mesh a column-parallel kernel ``[784, 256]``
is held as two shards ``[784, 128]``, each on the 2 devices of its ``model`` index.

A *layout* names, per dimension of a tensor, the mesh axis it is split over, or
:data:`UNSHARDED`: ``(UNSHARDED, MODEL)`` splits the columns of a matrix over ``model``.

Your own model
--------------
A script named by ``model: {name: script, script: PATH}`` defines::

    from engine.runtime import sharded

    def build_sharded_model(config, mesh):
        b = sharded.Builder(mesh, seed=config.training.seed)
        fc1 = sharded.Dense(b, "fc1", 784, 256, shard="columns", activation="relu")
        fc2 = sharded.Dense(b, "fc2", 256, 10, shard="rows")
        return b.model("my_mlp", lambda x: fc2(fc1(x)))

``config`` is the run's :class:`~engine.contract.config.RunConfig`, ``mesh`` the run's
``dtensor.Mesh``. ``forward`` receives the global batch ``[global_batch, *data.shape]`` split over
``batch`` and returns logits ``[global_batch, data.classes]``; ClusterDeck adds the softmax
cross-entropy, the gradients, the optimizer (``training.optimizer``) and checkpoints of every
parameter made through the builder. Each parameter's first value depends only on the seed and
its name, so the same script trains the same way on a 1 x 1 mesh and on a 2 x 2 one.

The same file may also define ``build_model(config)`` (a Keras model, for parallelism ``data``
and ``async``) and ``make_dataset(input_context, config)``; a script-defined ``loss`` is not used
in parallelism ``model``.

Building blocks (all take the builder first, and a name that must be unique in the model):

- :class:`Dense` ``(b, name, fan_in, width, shard="columns" | "rows" | "none", activation=None)``
- :func:`dense_stack` ``(b, prefix, fan_in, widths, activation, out_name, out_width)``: alternating
  columns/rows layers and an output layer
- :class:`VocabEmbedding` ``(b, name, vocab, dim)``: a table split on the vocabulary
- :class:`LayerNorm` ``(b, name, dim)``, :class:`Attention` ``(b, name, dim, heads)``: heads split
  over ``model``
- :meth:`Builder.glorot`, :meth:`Builder.uniform`, :meth:`Builder.constant`, :meth:`Builder.param`:
  raw parameters with a layout you choose, for your own ops
- :func:`constrain` ``(t, mesh, *layout)``: pin an activation to a layout

:func:`build_for_config` is what the model-parallel runtime calls to get the model of a run;
:func:`check_script` is the pre-launch check of a script's sharded builder.
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
    MODEL,
    SHARDS,
    Attention,
    Builder,
    Dense,
    LayerNorm,
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
    "ACTIVATIONS", "BATCH", "FUNCTION", "MODEL", "SHARDS", "UNSHARDED", "Attention", "Builder", "Dense", "LayerNorm",
    "Param", "ShardedModel", "VocabEmbedding", "build_for_config", "build_from_script", "check_script", "constrain",
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
    ``data.shape`` into logits of ``data.classes``. The returned model's output is pinned to
    ``(batch, unsharded)``, the layout the runtime reads per-replica losses from.
    """
    path = user_script.script_path(config, FIELD)
    module = user_script.load(path, FIELD)
    fn = getattr(module, FUNCTION, None)
    if not callable(fn):
        also = (" (its build_model(config) builds a Keras model, which parallelism 'model' cannot shard)"
                if callable(getattr(module, "build_model", None)) else "")
        raise _fail(path, f"defines no {FUNCTION}({SIGNATURE}){also}; expected a function returning a "
                          f"sharded.ShardedModel built from engine.runtime.sharded blocks (see examples/sharded_model.py)")
    try:
        model = fn(config, mesh)
    except Exception as exc:
        raise _fail(path, f"{FUNCTION}({SIGNATURE}) raised {type(exc).__name__}: {exc}\n"
                          f"{user_script.user_traceback(exc, path)}") from exc
    _check_model(model, mesh, path)
    user_forward = model.forward
    rank = 1 + len(config.data.shape)

    def forward(x: tf.Tensor) -> tf.Tensor:
        return constrain(user_forward(x), mesh, BATCH, UNSHARDED)

    out = ShardedModel(model.name, list(model.params), forward, model.input_dtype, list(model.notes))
    if check:
        x = np.zeros((mesh.dim_size(BATCH), *config.data.shape), dtype=model.input_dtype.as_numpy_dtype)
        check_forward(out, config, mesh, dtensor.pack([x[i:i + 1] for i in _local_batch_rows(mesh)],
                                                      dtensor.Layout.batch_sharded(mesh, BATCH, rank)), path)
    return out


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
    """Run ``model.forward`` on ``x`` once; a ScriptError unless it gives logits ``[rows, data.classes]``."""
    path = path if path is not None else user_script.script_path(config, FIELD)
    rows = int(x.shape[0])
    try:
        logits = model.forward(x)
    except Exception as exc:
        raise _fail(path, f"the model's forward on a batch of shape {[rows, *config.data.shape]} "
                          f"({model.input_dtype.name}) raised {type(exc).__name__}: {str(exc).strip()[:600]}\n"
                          f"{user_script.user_traceback(exc, path)}") from exc
    shape = [int(d) for d in getattr(logits, "shape", [])]
    if shape != [rows, config.data.classes]:
        raise _fail(path, f"the model's forward turned a batch of shape {[rows, *config.data.shape]} into "
                          f"{shape}; expected logits [{rows}, {config.data.classes}] (data.classes "
                          f"{config.data.classes})")


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
            per = rows // batch_axis
            packed = dtensor.pack([data[i * per:(i + 1) * per] for i in _local_batch_rows(mesh)],
                                  dtensor.Layout.batch_sharded(mesh, BATCH, data.ndim))
            check_forward(model, config, mesh, packed)
    except ScriptError as exc:
        return [{"field": exc.field, "message": str(exc).removeprefix(f"{exc.field}: ")}]
    except ValueError as exc:  # the mesh of the config
        return [{"field": "parallelism.mesh", "message": str(exc)}]
    return []


def _check_mesh(config: RunConfig) -> dtensor.Mesh:
    p = config.parallelism
    wanted = p.mesh_batch * p.mesh_model
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if wanted > 1:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    except RuntimeError:  # TensorFlow has set up its devices already
        pass
    found = len(tf.config.list_logical_devices("CPU"))
    batch, model = (p.mesh_batch, p.mesh_model) if found >= wanted else (1, 1)
    return dtensor.create_mesh([(BATCH, batch), (MODEL, model)], devices=[f"CPU:{i}" for i in range(batch * model)],
                               device_type="CPU")

