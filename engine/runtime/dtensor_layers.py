"""Sharded models written directly on ``tf.experimental.dtensor``.

The public face of these blocks, for users' scripts, is :mod:`engine.runtime.sharded`.

Keras 3 ignores DTensor layouts on the TF backend, so the built-in models of
parallelism 'model' are raw :class:`dtensor.DVariable` parameters and plain
TensorFlow ops. Every parameter gets an explicit layout, and activations are
pinned to theirs with :func:`constrain`, so the communication pattern is the
one written here rather than whatever layout propagation picks:

- dense stacks alternate column-parallel (kernel ``(unsharded, model)``, output
  sharded on ``model``) and row-parallel layers (kernel ``(model, unsharded)``,
  partial sums all-reduced over ``model``), Megatron style;
- embeddings are sharded on the vocabulary: each device holds a slice of rows
  and contributes only the ids in its slice (a one-hot contraction over the
  sharded vocabulary, all-reduced over ``model``);
- attention shards its heads over ``model`` (query/key/value column-parallel,
  the output projection row-parallel).

Initial values are drawn on the host from a seed and the parameter's name, then
copied onto the mesh and relaid out, so a model starts from the same weights on
any mesh (``call_with_layout`` with stateless random ops fails on this TF).
"""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from engine.contract.config import RunConfig

BATCH = "batch"
MODEL = "model"
U = dtensor.UNSHARDED


@dataclass
class Param:
    """One trainable parameter: its name, DVariable and sharding spec (one entry per dimension)."""

    name: str
    var: Any  # dtensor.DVariable
    spec: tuple[str, ...]

    @property
    def shape(self) -> list[int]:
        return [int(d) for d in self.var.shape]


@dataclass
class ShardedModel:
    """A model the model-parallel runtime trains.

    ``forward`` maps a global batch of inputs ``[batch, *data.shape]``, laid out ``(batch, unsharded,
    ...)`` (rows split over the mesh's ``batch`` axis), to the model's output ``[batch, ...]`` (logits
    ``[batch, data.classes]`` for the default loss) laid out ``(batch, unsharded, ...)``. It is
    ``forward(x)`` or ``forward(x, training)``: see :meth:`call`. ``params`` are every trainable
    parameter (the runtime differentiates, optimises and checkpoints exactly these); ``state`` the
    non-trainable variables (dropout counters; checkpointed, not optimised); ``input_dtype`` is what
    ``forward`` reads (float32 features, int32 token ids: the runtime casts a batch of the same kind
    to it).
    """

    name: str
    params: list[Param]
    forward: Callable[..., tf.Tensor]  # batch-sharded inputs [, training] -> output laid out (batch, ...)
    input_dtype: tf.DType
    notes: list[str] = field(default_factory=list)
    state: list[Param] = field(default_factory=list)

    @property
    def variables(self) -> list[Any]:
        return [p.var for p in self.params]

    @property
    def takes_training(self) -> bool:
        """Whether ``forward`` accepts ``training`` (a parameter of that name, or ``**kwargs``)."""
        return takes_training(self.forward)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        """``forward(x, training=training)``, or ``forward(x)`` for a forward written before the flag."""
        return self.forward(x, training=training) if self.takes_training else self.forward(x)


def takes_training(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called with ``training=`` (old scripts' ``forward(x)`` cannot)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: call it the old way
        return False
    return any(p.name == "training" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class Builder:
    """Creates parameters on a mesh from host-side values that depend only on the seed and the name.

    Every block takes a builder as its first argument and registers its parameters in
    ``params``; :meth:`model` wraps them with a forward function into a :class:`ShardedModel`.
    Because a parameter's first value depends only on ``seed`` and its name, the same model
    starts from the same weights on a 1 x 1 mesh and on a 2 x 2 one.
    """

    def __init__(self, mesh: dtensor.Mesh, seed: int) -> None:
        self.mesh = mesh
        self.seed = seed
        self.params: list[Param] = []
        self.state: list[Param] = []

    def layout(self, spec: Sequence[str]) -> dtensor.Layout:
        return dtensor.Layout(list(spec), self.mesh)

    def check_spec(self, name: str, shape: Sequence[int], spec: Sequence[str]) -> None:
        """Raise a ValueError naming ``name`` unless ``spec`` fits ``shape`` on this mesh."""
        if len(spec) != len(shape):
            raise ValueError(f"{name}: a layout of {len(spec)} entries {list(spec)} for a parameter of shape "
                             f"{list(shape)}; expected one entry per dimension ({len(shape)})")
        axes = list(self.mesh.dim_names)
        for i, (size, axis) in enumerate(zip(shape, spec, strict=True)):
            if axis == U:
                continue
            if axis not in axes:
                raise ValueError(f"{name}: dimension {i} is laid out on {axis!r}; expected one of "
                                 f"{', '.join(map(repr, [*axes, U]))}")
            if int(size) % self.mesh.dim_size(axis):
                raise ValueError(f"{name}: dimension {i} ({int(size)}) is not divisible by the mesh {axis!r} axis "
                                 f"size {self.mesh.dim_size(axis)}; expected a multiple of it, or leave that "
                                 f"dimension unsharded")
        if len([a for a in spec if a != U]) != len({a for a in spec if a != U}):
            raise ValueError(f"{name}: layout {list(spec)} uses a mesh axis twice; expected each axis at most once")

    def model(self, name: str, forward: Callable[..., tf.Tensor],
              input_dtype: tf.DType = tf.float32) -> ShardedModel:
        """The parameters built so far and ``forward`` as a :class:`ShardedModel` called ``name``."""
        return ShardedModel(name, list(self.params), forward, tf.as_dtype(input_dtype), state=list(self.state))

    def counter(self, name: str) -> Any:
        """A replicated int64 scalar, 0 at first, checkpointed with the model but not trained (dropout steps)."""
        if any(p.name == name for p in (*self.params, *self.state)):
            raise ValueError(f"{name}: a variable of that name exists already; expected a unique name")
        var = self.variable(np.zeros((), np.int64), (), name)
        self.state.append(Param(name, var, ()))
        return var

    def place(self, value: np.ndarray | tf.Tensor, spec: Sequence[str]) -> tf.Tensor:
        """A host value as a DTensor with ``spec``: replicated onto the mesh, then sliced locally."""
        t = tf.convert_to_tensor(value)
        replicated = dtensor.copy_to_mesh(t, dtensor.Layout.replicated(self.mesh, rank=len(spec)))
        return dtensor.relayout(replicated, self.layout(spec))

    def variable(self, value: np.ndarray | tf.Tensor, spec: Sequence[str], name: str) -> Any:
        return dtensor.DVariable(self.place(value, spec), name=name.replace("/", "_"))

    def param(self, name: str, value: np.ndarray, spec: Sequence[str]) -> Any:
        """A trainable float32 parameter ``name`` with first value ``value``, laid out as ``spec``."""
        value = np.asarray(value)
        self.check_spec(name, value.shape, spec)
        if any(p.name == name for p in self.params):
            raise ValueError(f"{name}: a parameter of that name exists already; expected a unique name "
                             f"(it names the parameter's first value and its checkpoint entry)")
        var = self.variable(value.astype(np.float32), spec, name)
        self.params.append(Param(name, var, tuple(spec)))
        return var

    def rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, 7, zlib.crc32(name.encode("utf-8"))])

    def glorot(self, name: str, shape: Sequence[int], fan_in: int, fan_out: int, spec: Sequence[str]) -> Any:
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return self.param(name, self.rng(name).uniform(-limit, limit, size=tuple(shape)), spec)

    def uniform(self, name: str, shape: Sequence[int], spec: Sequence[str], scale: float = 0.05) -> Any:
        return self.param(name, self.rng(name).uniform(-scale, scale, size=tuple(shape)), spec)

    def constant(self, name: str, shape: Sequence[int], spec: Sequence[str], value: float = 0.0) -> Any:
        return self.param(name, np.full(tuple(shape), value, dtype=np.float32), spec)


def constrain(t: tf.Tensor, mesh: dtensor.Mesh, *spec: str) -> tf.Tensor:
    """Pin ``t`` to a layout (a no-op where propagation already chose it)."""
    return dtensor.relayout(t, dtensor.Layout(list(spec), mesh))


def activation_spec(rank: int, last: str) -> tuple[str, ...]:
    return (BATCH, *([U] * (rank - 2)), last)


def batch_spec(rank: int) -> tuple[str, ...]:
    """``(batch, unsharded, ...)``: rows split over ``batch``, every other dimension whole."""
    return (BATCH, *([U] * (rank - 1)))


# --------------------------------------------------------------------------- building blocks


#: How :class:`Dense` may lay out its kernel over the mesh's ``model`` axis.
SHARDS = ("columns", "rows", "none")
#: Activations :class:`Dense` accepts by name.
ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "relu": tf.nn.relu,
    "gelu": lambda t: tf.nn.gelu(t, approximate=False),
    "tanh": tf.tanh,
    "sigmoid": tf.sigmoid,
    "softplus": tf.nn.softplus,
    "silu": tf.nn.silu,
}


def _activation(name: str, activation: str | Callable[[tf.Tensor], tf.Tensor] | None
                ) -> Callable[[tf.Tensor], tf.Tensor] | None:
    if activation is None or callable(activation):
        return activation
    if isinstance(activation, str) and activation in ACTIVATIONS:
        return ACTIVATIONS[activation]
    raise ValueError(f"{name}: activation {activation!r}; expected None, a function or one of "
                     f"{', '.join(map(repr, ACTIVATIONS))}")


class Dense:
    """``y = activation(x @ kernel + bias)`` with its kernel laid out over a mesh axis as ``shard`` says.

    - ``shard="columns"`` (column-parallel): kernel ``(unsharded, axis)``, bias ``(axis,)``; each
      device computes its slice of the ``width`` outputs from the whole input, and the output stays
      sharded on ``axis`` (no communication). ``width`` must divide by the ``axis`` size.
    - ``shard="rows"`` (row-parallel): kernel ``(axis, unsharded)``, bias whole; each device
      contracts its slice of the ``fan_in`` inputs, the partial sums are all-reduced over ``axis``
      and the output is whole. Made to follow a ``"columns"`` layer (its input is already split
      that way); ``fan_in`` must divide by the ``axis`` size.
    - ``shard="none"``: kernel and bias replicated on every device; the output is whole.

    ``axis`` is ``model`` unless given (any axis of the mesh but ``batch``). ``spec``, a pair of mesh
    axis names or :data:`U`, lays the kernel out directly instead (``("feature", "model")``: inputs
    split over ``feature``, outputs over ``model``); the bias and the output follow its second entry.
    The batch dimension of input and output is always split over ``batch``. ``activation`` is a
    function, a name in :data:`ACTIVATIONS` or None.
    """

    def __init__(self, b: Builder, name: str, fan_in: int, width: int, shard: str = "none",
                 activation: str | Callable[[tf.Tensor], tf.Tensor] | None = None, *, axis: str = MODEL,
                 spec: Sequence[str] | None = None) -> None:
        if shard not in SHARDS:
            raise ValueError(f"{name}: shard={shard!r}; expected one of {', '.join(map(repr, SHARDS))}")
        check_axis(b, name, axis)
        self.mesh = b.mesh
        self.name = name
        self.shard = shard
        self.activation = _activation(name, activation)
        if spec is not None:
            if len(spec) != 2:
                raise ValueError(f"{name}: spec={tuple(spec)!r}; expected a pair (input axis, output axis) of mesh "
                                 f"axis names or {U!r}")
            kernel_spec: tuple[str, ...] = tuple(spec)
        else:
            kernel_spec = {"columns": (U, axis), "rows": (axis, U), "none": (U, U)}[shard]
        self.out_axis = kernel_spec[1]
        self.output_sharded = self.out_axis != U
        self.kernel = b.glorot(f"{name}/kernel", (fan_in, width), fan_in, width, kernel_spec)
        self.bias = b.constant(f"{name}/bias", (width,), (self.out_axis,))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        rank = len(x.shape)
        y = tf.tensordot(x, self.kernel, axes=[[rank - 1], [0]]) if rank > 2 else tf.matmul(x, self.kernel)
        y = constrain(y, self.mesh, *activation_spec(rank, self.out_axis))
        y = y + self.bias
        return self.activation(y) if self.activation is not None else y


def check_axis(b: Builder, name: str, axis: str) -> None:
    """Raise a ValueError naming ``name`` unless ``axis`` is a mesh axis a layer may be split over."""
    axes = [a for a in b.mesh.dim_names if a != BATCH]
    if axis not in axes:
        raise ValueError(f"{name}: axis={axis!r}; expected one of the mesh's axes {', '.join(map(repr, axes))} "
                         f"('batch' splits the examples, not the layers)")


def dense_stack(b: Builder, prefix: str, fan_in: int, widths: Sequence[int],
                activation: str | Callable[[tf.Tensor], tf.Tensor] | None, out_name: str,
                out_width: int) -> tuple[list[Dense], Dense]:
    """Hidden layers ``{prefix}_{i}`` alternating columns/rows parallel, then the output layer ``out_name``.

    The first hidden layer is column-parallel, the next row-parallel, and so on (one all-reduce
    per pair, Megatron style); the output layer is row-parallel after a column-parallel layer,
    else replicated, since output widths (classes) need not divide the ``model`` axis.
    """
    layers: list[Dense] = []
    sharded = False
    for i, width in enumerate(widths):
        layer = Dense(b, f"{prefix}_{i}", fan_in, width, "rows" if sharded else "columns", activation)
        layers.append(layer)
        sharded, fan_in = layer.output_sharded, width
    out = Dense(b, out_name, fan_in, out_width, "rows" if sharded else "none")
    return layers, out


class VocabEmbedding:
    """A table ``[vocab, dim]`` sharded on the vocabulary (rows split over ``model``).

    Reads integer token ids ``[batch, length]`` of any integer dtype (int64 as StringLookup emits,
    int32, int16, uint8, ...) and returns ``[batch, length, dim]``, whole on ``model``: each device
    looks up only the ids in its slice of the vocabulary and the slices are summed over ``model``.
    ``vocab`` must divide by the ``model`` axis size.
    """

    def __init__(self, b: Builder, name: str, vocab: int, dim: int, *, axis: str = MODEL) -> None:
        check_axis(b, name, axis)
        self.mesh = b.mesh
        self.vocab = vocab
        self.axis = axis
        self.table = b.uniform(f"{name}/embeddings", (vocab, dim), (axis, U))

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        # one_hot of int64 (or uint8) ids on a vocabulary-sharded mesh gives shards of the wrong shape in
        # DTensor's SPMD expansion ("op output inconsistent with the provided layout"); of int32 it is right
        if ids.dtype != tf.int32:
            ids = tf.cast(ids, tf.int32)
        # each device sees the one-hot columns of its own vocabulary slice and the matching table rows;
        # the contraction over the sharded vocabulary becomes a sum over the 'model' axis
        hot = constrain(tf.one_hot(ids, self.vocab, dtype=tf.float32), self.mesh, BATCH, U, self.axis)
        out = tf.einsum("blv,ve->ble", hot, self.table)
        return constrain(out, self.mesh, BATCH, U, U)


class LayerNorm:
    """Normalises the last dimension (``dim``) of a whole (unsharded on ``model``) activation; replicated."""

    def __init__(self, b: Builder, name: str, dim: int, epsilon: float = 1e-3) -> None:
        self.gamma = b.constant(f"{name}/gamma", (dim,), (U,), 1.0)
        self.beta = b.constant(f"{name}/beta", (dim,), (U,), 0.0)
        self.epsilon = epsilon

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + self.epsilon) * self.gamma + self.beta


class Attention:
    """Multi-head self-attention with its heads sharded over ``model``.

    Reads ``[batch, length, dim]`` (whole on ``model``) and returns the same shape, whole: the
    query/key/value projections are column-parallel over the heads, each device attends with its
    own heads, and the output projection is row-parallel (all-reduced over ``model``). ``dim`` must
    divide by ``heads``, and ``heads`` by the ``model`` axis size.
    """

    def __init__(self, b: Builder, name: str, dim: int, heads: int) -> None:
        if heads < 1 or dim % heads:
            raise ValueError(f"{name}: dim {dim} is not divisible by the {heads} attention heads; expected a "
                             f"multiple of heads")
        self.mesh = b.mesh
        self.head_dim = dim // heads
        shape, d = (dim, heads, self.head_dim), self.head_dim
        self.q = b.glorot(f"{name}/query/kernel", shape, dim, heads * d, (U, MODEL, U))
        self.k = b.glorot(f"{name}/key/kernel", shape, dim, heads * d, (U, MODEL, U))
        self.v = b.glorot(f"{name}/value/kernel", shape, dim, heads * d, (U, MODEL, U))
        self.qb = b.constant(f"{name}/query/bias", (heads, d), (MODEL, U))
        self.kb = b.constant(f"{name}/key/bias", (heads, d), (MODEL, U))
        self.vb = b.constant(f"{name}/value/bias", (heads, d), (MODEL, U))
        self.o = b.glorot(f"{name}/output/kernel", (heads, d, dim), heads * d, dim, (MODEL, U, U))
        self.ob = b.constant(f"{name}/output/bias", (dim,), (U,))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        m = self.mesh
        heads = (BATCH, U, MODEL, U)
        q = constrain(tf.einsum("ble,ehd->blhd", x, self.q), m, *heads) + self.qb
        k = constrain(tf.einsum("ble,ehd->blhd", x, self.k), m, *heads) + self.kb
        v = constrain(tf.einsum("ble,ehd->blhd", x, self.v), m, *heads) + self.vb
        scores = tf.einsum("blhd,bmhd->bhlm", q, k) * (1.0 / math.sqrt(self.head_dim))
        weights = tf.nn.softmax(constrain(scores, m, BATCH, MODEL, U, U), axis=-1)
        mixed = constrain(tf.einsum("bhlm,bmhd->blhd", weights, v), m, *heads)
        out = tf.einsum("blhd,hde->ble", mixed, self.o)  # sum over the sharded heads
        return constrain(out, m, BATCH, U, U) + self.ob


# --------------------------------------------------------------------------- convolution, pooling, dropout


#: How :class:`Conv2D` may lay out its kernel: output channels split over a mesh axis, or replicated.
CONV_SHARDS = ("filters", "none")
PADDINGS = ("same", "valid")


def _pair(name: str, what: str, value: int | Sequence[int]) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ValueError(f"{name}: {what}={value!r}; expected an integer >= 1 or a pair of them")
    return int(pair[0]), int(pair[1])


def _image(name: str, x: tf.Tensor, channels: int | None = None) -> tf.Tensor:
    """``x`` as ``[batch, height, width, channels]``: a ``[batch, height, width]`` batch gets one channel."""
    if len(x.shape) == 3 and channels in (None, 1):
        x = tf.expand_dims(x, -1)
    if len(x.shape) != 4 or (channels is not None and int(x.shape[-1]) != channels):
        want = f"[batch, height, width, {channels}]" if channels is not None else "[batch, height, width, channels]"
        raise ValueError(f"{name}: an input of shape {list(x.shape)}; expected {want}")
    return x


def windows(x: tf.Tensor, size: tuple[int, int], strides: tuple[int, int], padding: str) -> list[tf.Tensor]:
    """Every window offset's strided slice of ``x`` ``[b, h, w, c]``, each ``[b, out_h, out_w, c]``, row-major.

    Built from pads and strided slices, which DTensor expands on any layout: its own convolution and
    pooling ops accept only a replicated filter and batch-parallel layouts.
    """
    (kh, kw), (sh, sw) = size, strides
    height, width = int(x.shape[1]), int(x.shape[2])
    if padding == "same":
        out_h, out_w = -(-height // sh), -(-width // sw)
        pad_h, pad_w = max((out_h - 1) * sh + kh - height, 0), max((out_w - 1) * sw + kw - width, 0)
        if pad_h or pad_w:  # as tf.nn.conv2d pads: the odd one at the bottom and right
            x = tf.pad(x, [[0, 0], [pad_h // 2, pad_h - pad_h // 2], [pad_w // 2, pad_w - pad_w // 2], [0, 0]])
    else:
        out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"a window of {kh} x {kw} does not fit an image of {height} x {width}; expected an image "
                         f"at least as large as the window, or padding 'same'")
    return [x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, :] for i in range(kh) for j in range(kw)]


class Conv2D:
    """A 2-D convolution ``[b, h, w, in_channels] -> [b, h', w', filters]`` with its filters split over a mesh axis.

    - ``shard="filters"``: kernel ``(unsharded, unsharded, unsharded, axis)``, bias ``(axis,)``; each
      device computes its slice of the output channels from the whole input, and the output stays
      sharded on ``axis``. ``filters`` must divide by the ``axis`` size. The input is gathered whole
      first (one all-gather where it comes sharded from another ``"filters"`` layer).
    - ``shard="none"``: kernel and bias replicated; the output is whole.

    ``kernel`` and ``strides`` are an integer or a pair, ``padding`` ``"same"`` or ``"valid"`` (as
    ``keras.layers.Conv2D``); ``axis`` is ``model`` unless given. A ``[b, h, w]`` input of one
    channel is read as ``[b, h, w, 1]``. DTensor's own convolution accepts only a replicated kernel,
    so the sharded one is computed from the input's windows (one einsum over them).
    """

    def __init__(self, b: Builder, name: str, in_channels: int, filters: int, kernel: int | Sequence[int] = 3,
                 shard: str = "filters", activation: str | Callable[[tf.Tensor], tf.Tensor] | None = None,
                 padding: str = "same", strides: int | Sequence[int] = 1, *, axis: str = MODEL) -> None:
        if shard not in CONV_SHARDS:
            raise ValueError(f"{name}: shard={shard!r}; expected one of {', '.join(map(repr, CONV_SHARDS))}")
        if padding not in PADDINGS:
            raise ValueError(f"{name}: padding={padding!r}; expected one of {', '.join(map(repr, PADDINGS))}")
        check_axis(b, name, axis)
        self.mesh, self.name, self.in_channels = b.mesh, name, in_channels
        self.size, self.strides, self.padding = _pair(name, "kernel", kernel), _pair(name, "strides", strides), padding
        self.activation = _activation(name, activation)
        self.out_axis = axis if shard == "filters" else U
        self.output_sharded = shard == "filters"
        kh, kw = self.size
        self.kernel = b.glorot(f"{name}/kernel", (kh, kw, in_channels, filters), kh * kw * in_channels,
                               kh * kw * filters, (U, U, U, self.out_axis))
        self.bias = b.constant(f"{name}/bias", (filters,), (self.out_axis,))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = constrain(_image(self.name, x, self.in_channels), self.mesh, BATCH, U, U, U)
        if self.output_sharded:
            patches = tf.stack(windows(x, self.size, self.strides, self.padding), axis=3)  # [b, h', w', kh*kw, c]
            kernel = tf.reshape(self.kernel, [-1, *self.kernel.shape[2:]])  # [kh*kw, c, filters]
            y = tf.einsum("bhwpc,pcf->bhwf", patches, constrain(kernel, self.mesh, U, U, self.out_axis))
        else:
            y = tf.nn.conv2d(x, self.kernel, [1, *self.strides, 1], self.padding.upper())
        y = constrain(y, self.mesh, BATCH, U, U, self.out_axis) + self.bias
        return self.activation(y) if self.activation is not None else y


class _Pool:
    """Pooling over ``pool_size`` windows every ``strides`` (default: the window), padding ``"valid"``.

    Channels keep their layout (a ``"filters"``-sharded activation stays sharded): each window is a
    strided slice, reduced element-wise.
    """

    how = "max"

    def __init__(self, b: Builder, pool_size: int | Sequence[int] = 2, strides: int | Sequence[int] | None = None,
                 padding: str = "valid") -> None:
        name = type(self).__name__
        if padding != "valid":
            raise ValueError(f"{name}: padding={padding!r}; expected 'valid' (every window inside the image)")
        self.mesh = b.mesh
        self.size = _pair(name, "pool_size", pool_size)
        self.strides = _pair(name, "strides", strides if strides is not None else self.size)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        parts = windows(_image(type(self).__name__, x), self.size, self.strides, "valid")
        out = parts[0]
        for part in parts[1:]:
            out = tf.maximum(out, part) if self.how == "max" else out + part
        return out if self.how == "max" else out * (1.0 / len(parts))


class MaxPool2D(_Pool):
    """The largest value of each window, per channel (``keras.layers.MaxPooling2D``, padding ``"valid"``)."""

    how = "max"


class AvgPool2D(_Pool):
    """The mean of each window, per channel (``keras.layers.AveragePooling2D``, padding ``"valid"``)."""

    how = "mean"


class GlobalAvgPool2D:
    """``[b, h, w, c] -> [b, c]``: the mean over height and width; the channels keep their layout."""

    def __init__(self, b: Builder) -> None:
        self.mesh = b.mesh

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(_image("GlobalAvgPool2D", x), axis=[1, 2])


class Flatten:
    """``[b, d1, d2, ...] -> [b, d1 * d2 * ...]``, whole on every axis but ``batch`` (gathered where sharded:
    a sharded last dimension cannot stay sharded once merged with the others)."""

    def __init__(self, b: Builder) -> None:
        self.mesh = b.mesh

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        rank = len(x.shape)
        if rank <= 2:
            return constrain(x, self.mesh, *batch_spec(rank)) if rank == 2 else x
        x = constrain(x, self.mesh, *batch_spec(rank))
        return constrain(tf.reshape(x, [-1, int(np.prod(x.shape[1:]))]), self.mesh, BATCH, U)


class Dropout:
    """Zeroes each value with probability ``rate`` in training and scales the rest by ``1 / (1 - rate)``;
    the identity when ``training`` is false (evaluation).

    DTensor has no stateful random ops: the mask is stateless random from a seed made of the builder's
    seed, the layer's name and a counter (a checkpointed variable ``{name}/step``) that each training
    call advances, so every step draws a new mask and a restored run draws the masks it would have.
    Sharded dimensions draw their shards independently, so a mask depends on the mesh's shape.
    """

    def __init__(self, b: Builder, name: str, rate: float) -> None:
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"{name}: rate={rate!r}; expected a fraction from 0 to below 1")
        self.name, self.rate = name, float(rate)
        self.key = int(b.rng(f"{name}/dropout").integers(0, 2**62))
        self.steps = b.counter(f"{name}/step")

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        if not training or self.rate == 0.0:
            return x
        self.steps.assign_add(1)
        seed = tf.stack([tf.constant(self.key, tf.int64), self.steps.read_value()])
        keep = tf.random.stateless_uniform(tf.shape(x), seed, dtype=x.dtype) >= self.rate
        return tf.where(keep, x * (1.0 / (1.0 - self.rate)), tf.zeros_like(x))


# --------------------------------------------------------------------------- the built-in models


def build(config: RunConfig, mesh: dtensor.Mesh) -> ShardedModel:
    """The sharded counterpart of :func:`engine.runtime.models.build_model` for ``config.model``."""
    b = Builder(mesh, config.training.seed)
    m, classes = config.model, config.data.classes
    if m.name == "mlp":
        features = int(np.prod(config.data.shape))
        hidden, logits = dense_stack(b, "dense", features, m.hidden, tf.nn.relu, "logits", classes)

        def mlp(x: tf.Tensor) -> tf.Tensor:
            h = constrain(x, mesh, BATCH, U)
            for layer in hidden:
                h = layer(h)
            return logits(h)

        return ShardedModel("mlp", b.params, mlp, tf.float32)
    if m.name == "embedding":
        embed = VocabEmbedding(b, "embedding", m.vocab_size, m.embed_dim)
        hidden, logits = dense_stack(b, "dense", m.embed_dim, m.hidden, tf.nn.relu, "logits", classes)

        def embedding(ids: tf.Tensor) -> tf.Tensor:
            h = tf.reduce_mean(embed(constrain(ids, mesh, BATCH, U)), axis=1)
            for layer in hidden:
                h = layer(h)
            return logits(h)

        return ShardedModel("embedding", b.params, embedding, tf.int32)
    if m.name == "transformer":
        return _transformer(config, b)
    raise ValueError(f"model.name: unknown model {m.name!r}")


def _transformer(config: RunConfig, b: Builder) -> ShardedModel:
    """One pre-norm block, as :func:`engine.runtime.models._transformer` builds it with Keras."""
    m, mesh = config.model, b.mesh
    length = int(config.data.shape[0])
    embed = VocabEmbedding(b, "embedding", m.vocab_size, m.embed_dim)
    positions = b.uniform("positions/embeddings", (length, m.embed_dim), (U, U))
    norm_1 = LayerNorm(b, "norm_1", m.embed_dim)
    attention = Attention(b, "attention", m.embed_dim, m.heads)
    norm_2 = LayerNorm(b, "norm_2", m.embed_dim)
    gelu: Callable[[tf.Tensor], tf.Tensor] = lambda t: tf.nn.gelu(t, approximate=False)  # noqa: E731
    hidden, mlp_out = dense_stack(b, "mlp", m.embed_dim, m.hidden or (4 * m.embed_dim,), gelu, "mlp_out",
                                  m.embed_dim)
    logits = Dense(b, "logits", m.embed_dim, config.data.classes, "none")

    def transformer(ids: tf.Tensor) -> tf.Tensor:
        x = embed(constrain(ids, mesh, BATCH, U)) + positions
        x = x + attention(norm_1(x))
        h = norm_2(x)
        for layer in hidden:
            h = layer(h)
        x = x + mlp_out(h)
        return logits(tf.reduce_mean(x, axis=1))

    return ShardedModel("transformer", b.params, transformer, tf.int32)


def per_example_loss(logits: tf.Tensor, labels: tf.Tensor, classes: int) -> tf.Tensor:
    """Sparse softmax cross-entropy, one value per example, laid out like the batch (labels of any number type)."""
    labels = _class_ids(labels)
    return -tf.reduce_sum(tf.one_hot(labels, classes, dtype=logits.dtype) * tf.nn.log_softmax(logits), axis=-1)


def match_labels(y: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
    """Labels ``[b]`` for an output ``[b, 1]`` become ``[b, 1]``, as Keras's ``Loss`` lines them up (its
    loss functions, e.g. ``"binary_crossentropy"``, do not)."""
    return tf.expand_dims(y, -1) if len(y.shape) == len(out.shape) - 1 and out.shape[-1] == 1 else y


def per_example_correct(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """1.0 where the largest logit is the label's class, else 0.0; one value per example."""
    hit = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), _class_ids(labels))
    return tf.cast(hit, logits.dtype)


def _class_ids(labels: tf.Tensor) -> tf.Tensor:
    # int32: one_hot of int64 ids expands wrongly under DTensor (see VocabEmbedding); float labels of a
    # script's data are class numbers too
    if len(labels.shape) == 2 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, -1)
    return labels if labels.dtype == tf.int32 else tf.cast(labels, tf.int32)


# --------------------------------------------------------------------------- optimizers


class Optimizer:
    """The update rules of Keras 3's optimizers (default hyper-parameters), on DVariables.

    Slots take the layout of their parameter, so the update is local to each shard.
    """

    KINDS = ("sgd", "momentum", "adam", "adamw", "rmsprop")

    def __init__(self, kind: str, learning_rate: float, params: list[Param], b: Builder) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"training.optimizer: expected one of {', '.join(map(repr, self.KINDS))} "
                             f"for parallelism 'model', got {kind!r}")
        self.kind = kind
        self.lr = learning_rate
        self.params = params
        self.iterations = b.variable(np.zeros((), np.float32), (), "iterations")
        slots = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v"), "adamw": ("m", "v"),
                 "rmsprop": ("velocity",)}[kind]
        self.slots: list[dict[str, Any]] = [
            {s: b.variable(np.zeros(p.shape, np.float32), p.spec, f"{p.name}/{s}") for s in slots} for p in params
        ]

    def slot_variables(self) -> list[Any]:
        return [v for s in self.slots for v in s.values()]

    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        # new values are computed from tensors read once, then assigned: no update reads a slot it has
        # just written (on a multi-device mesh DTensor did not keep that read-after-write order: updates read stale slots)
        lr = self.lr
        t = self.iterations.read_value() + 1.0
        for p, g, slot in zip(self.params, grads, self.slots, strict=True):
            var = p.var
            g = dtensor.relayout(g, var.layout)  # a no-op: gradients follow their variable's layout
            value = var.read_value()
            if self.kind == "sgd":
                var.assign(value - lr * g)
            elif self.kind == "momentum":
                mom = 0.9 * slot["momentum"].read_value() - lr * g
                slot["momentum"].assign(mom)
                var.assign(value + mom)
            elif self.kind in ("adam", "adamw"):
                b1, b2, eps = 0.9, 0.999, 1e-7
                if self.kind == "adamw":
                    value = value - value * 0.004 * lr
                step_lr = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
                m = slot["m"].read_value()
                v = slot["v"].read_value()
                m = m + (g - m) * (1.0 - b1)
                v = v + (tf.square(g) - v) * (1.0 - b2)
                slot["m"].assign(m)
                slot["v"].assign(v)
                var.assign(value - step_lr * m / (tf.sqrt(v) + eps))
            else:  # rmsprop
                vel = 0.9 * slot["velocity"].read_value() + 0.1 * tf.square(g)
                slot["velocity"].assign(vel)
                var.assign(value - lr * g / tf.sqrt(vel + 1e-7))
        self.iterations.assign(t)


# --------------------------------------------------------------------------- placement


def shard_shape(shape: Sequence[int], spec: Sequence[str], mesh: dtensor.Mesh) -> list[int]:
    return [int(d) // (mesh.dim_size(s) if s != U else 1) for d, s in zip(shape, spec, strict=True)]


def describe(params: list[Param], mesh: dtensor.Mesh) -> list[dict[str, Any]]:
    """One record per parameter, read from the live variable's layout (not from what was asked)."""
    out = []
    for p in params:
        layout = p.var.layout
        spec = [str(s) for s in layout.sharding_specs]
        shards = int(np.prod([mesh.dim_size(s) for s in spec if s != U] or [1]))
        out.append({"name": p.name, "shape": p.shape, "sharding": spec, "shard_shape": shard_shape(p.shape, spec, mesh),
                    "shards": shards, "copies": mesh.size // shards, "replicated": bool(layout.is_fully_replicated())})
    return out


def describe_line(record: dict[str, Any]) -> str:
    """``dense_0/kernel [784, 256] sharded (unsharded, model) → shard [784, 128] on 2 devices (×2 copies)``."""
    shape = record["shape"]
    copies = f" (×{record['copies']} copies)" if record["copies"] > 1 else ""
    if record["shards"] <= 1:
        return f"{record['name']} {shape} replicated on all {record['copies']} devices"
    spec = ", ".join(record["sharding"])
    return (f"{record['name']} {shape} sharded ({spec}) → shard {record['shard_shape']} "
            f"on {record['shards']} devices{copies}")
