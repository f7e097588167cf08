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

    ``forward`` maps a global batch of inputs, laid out ``(batch, unsharded)`` (rows split over the
    mesh's ``batch`` axis), to logits ``[batch, data.classes]`` laid out ``(batch, unsharded)``.
    ``params`` are every trainable parameter (the runtime differentiates, optimises and
    checkpoints exactly these); ``input_dtype`` is what ``forward`` reads (float32 features,
    int32 token ids).
    """

    name: str
    params: list[Param]
    forward: Callable[[tf.Tensor], tf.Tensor]  # batch-sharded inputs -> logits laid out (batch, unsharded)
    input_dtype: tf.DType
    notes: list[str] = field(default_factory=list)

    @property
    def variables(self) -> list[Any]:
        return [p.var for p in self.params]


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

    def model(self, name: str, forward: Callable[[tf.Tensor], tf.Tensor],
              input_dtype: tf.DType = tf.float32) -> ShardedModel:
        """The parameters built so far and ``forward`` as a :class:`ShardedModel` called ``name``."""
        return ShardedModel(name, list(self.params), forward, tf.as_dtype(input_dtype))

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
    """``y = activation(x @ kernel + bias)`` with its kernel laid out over the ``model`` axis as ``shard`` says.

    - ``shard="columns"`` (column-parallel): kernel ``(unsharded, model)``, bias ``(model,)``; each
      device computes its slice of the ``width`` outputs from the whole input, and the output stays
      sharded on ``model`` (no communication). ``width`` must divide by the ``model`` axis size.
    - ``shard="rows"`` (row-parallel): kernel ``(model, unsharded)``, bias whole; each device
      contracts its slice of the ``fan_in`` inputs, the partial sums are all-reduced over ``model``
      and the output is whole. Made to follow a ``"columns"`` layer (its input is already split
      that way); ``fan_in`` must divide by the ``model`` axis size.
    - ``shard="none"``: kernel and bias replicated on every device; the output is whole.

    The batch dimension of input and output is always split over ``batch``. ``activation`` is a
    function, a name in :data:`ACTIVATIONS` or None.
    """

    def __init__(self, b: Builder, name: str, fan_in: int, width: int, shard: str = "none",
                 activation: str | Callable[[tf.Tensor], tf.Tensor] | None = None) -> None:
        if shard not in SHARDS:
            raise ValueError(f"{name}: shard={shard!r}; expected one of {', '.join(map(repr, SHARDS))}")
        self.mesh = b.mesh
        self.name = name
        self.shard = shard
        self.activation = _activation(name, activation)
        kernel_spec, bias_spec = {"columns": ((U, MODEL), (MODEL,)), "rows": ((MODEL, U), (U,)),
                                  "none": ((U, U), (U,))}[shard]
        self.output_sharded = shard == "columns"
        self.kernel = b.glorot(f"{name}/kernel", (fan_in, width), fan_in, width, kernel_spec)
        self.bias = b.constant(f"{name}/bias", (width,), bias_spec)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        rank = len(x.shape)
        y = tf.tensordot(x, self.kernel, axes=[[rank - 1], [0]]) if rank > 2 else tf.matmul(x, self.kernel)
        y = constrain(y, self.mesh, *activation_spec(rank, MODEL if self.output_sharded else U))
        y = y + self.bias
        return self.activation(y) if self.activation is not None else y


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

    Reads int token ids ``[batch, length]`` and returns ``[batch, length, dim]``, whole on ``model``:
    each device looks up only the ids in its slice of the vocabulary and the slices are summed
    over ``model``. ``vocab`` must divide by the ``model`` axis size.
    """

    def __init__(self, b: Builder, name: str, vocab: int, dim: int) -> None:
        self.mesh = b.mesh
        self.vocab = vocab
        self.table = b.uniform(f"{name}/embeddings", (vocab, dim), (MODEL, U))

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        # each device sees the one-hot columns of its own vocabulary slice and the matching table rows;
        # the contraction over the sharded vocabulary becomes a sum over the 'model' axis
        hot = constrain(tf.one_hot(ids, self.vocab, dtype=tf.float32), self.mesh, BATCH, U, MODEL)
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
    """Sparse softmax cross-entropy, one value per example, laid out like the batch."""
    return -tf.reduce_sum(tf.one_hot(labels, classes, dtype=logits.dtype) * tf.nn.log_softmax(logits), axis=-1)


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
