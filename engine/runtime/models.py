"""Built-in Keras models, optimizers and the loss; the user's script model where the config names it.

Which parallelism modes each model supports is :data:`engine.contract.config.MODEL_MODES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from engine.contract.config import RunConfig
from engine.runtime import user_script


def build_model(config: RunConfig) -> keras.Model:
    """The model named by ``config.model``; seed the RNGs first for reproducible weights."""
    return _build(config)


def _build(config: RunConfig) -> keras.Model:
    m = config.model
    if m.name == "script":
        return user_script.build_model(config)
    if m.name == "cnn":
        return _cnn(config)
    if m.name == "resnet":
        return _resnet(config)
    if m.name == "mlp":
        layers: list[keras.layers.Layer] = [keras.Input(shape=tuple(config.data.shape))]
        if len(config.data.shape) > 1:
            layers.append(keras.layers.Flatten())
        for i, width in enumerate(m.hidden):
            layers.append(keras.layers.Dense(width, activation="relu", name=f"dense_{i}"))
        layers.append(keras.layers.Dense(config.data.classes, name="logits"))
        return keras.Sequential(layers, name="mlp")
    if m.name == "embedding":
        return keras.Sequential([
            keras.Input(shape=tuple(config.data.shape), dtype="int32"),
            keras.layers.Embedding(m.vocab_size, m.embed_dim, name="embedding"),
            keras.layers.GlobalAveragePooling1D(),
            *[keras.layers.Dense(w, activation="relu", name=f"dense_{i}") for i, w in enumerate(m.hidden)],
            keras.layers.Dense(config.data.classes, name="logits"),
        ], name="embedding")
    if m.name == "transformer":
        return _transformer(config)
    raise ValueError(f"model.name: unknown model {m.name!r}")


def _transformer(config: RunConfig) -> keras.Model:
    """One pre-norm transformer block over token embeddings, mean-pooled into a classifier."""
    m = config.model
    length = int(config.data.shape[0])
    tokens = keras.Input(shape=(length,), dtype="int32")
    x = keras.layers.Embedding(m.vocab_size, m.embed_dim, name="embedding")(tokens)
    positions = keras.layers.Embedding(length, m.embed_dim, name="positions")(keras.ops.arange(length))
    x = x + positions
    h = keras.layers.LayerNormalization(name="norm_1")(x)
    h = keras.layers.MultiHeadAttention(m.heads, m.embed_dim // m.heads, name="attention")(h, h)
    x = x + h
    h = keras.layers.LayerNormalization(name="norm_2")(x)
    for i, width in enumerate(m.hidden or (4 * m.embed_dim,)):
        h = keras.layers.Dense(width, activation="gelu", name=f"mlp_{i}")(h)
    h = keras.layers.Dense(m.embed_dim, name="mlp_out")(h)
    x = x + h
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(config.data.classes, name="logits")(x), name="transformer")


def _image_input(config: RunConfig) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The input of an image model, with a channel axis added to [height, width] images."""
    shape = tuple(config.data.shape)
    inputs = keras.Input(shape=shape)
    x = keras.layers.Reshape((*shape, 1), name="channels")(inputs) if len(shape) == 2 else inputs
    return inputs, x


def _cnn(config: RunConfig) -> keras.Model:
    """Two 3x3 convolution blocks (32, 64 filters), global average pooling, the dense layers, logits."""
    inputs, x = _image_input(config)
    for i, filters in enumerate((32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv_{i}")(x)
        x = keras.layers.MaxPooling2D(2, padding="same", name=f"pool_{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    for i, width in enumerate(config.model.hidden):
        x = keras.layers.Dense(width, activation="relu", name=f"dense_{i}")(x)
    return keras.Model(inputs, keras.layers.Dense(config.data.classes, name="logits")(x), name="cnn")


def _resnet(config: RunConfig) -> keras.Model:
    """A small ResNet (ResNet-8): a 16-filter stem, then one residual block of two 3x3 convolutions per
    stage at 16, 32 and 64 filters (stride 2 into each later stage), global average pooling, logits.

    Group normalization rather than batch normalization: its figures do not depend on how the
    global batch is split over replicas, so one device and several follow the same trajectory.
    """
    inputs, x = _image_input(config)

    def norm(name: str) -> keras.layers.Layer:
        return keras.layers.GroupNormalization(groups=4, name=name)

    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(x)
    x = keras.layers.Activation("relu")(norm("stem_norm")(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(1):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"stage{stage}_block{block}"
            shortcut = x
            h = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                                    name=f"{name}_conv1")(x)
            h = keras.layers.Activation("relu")(norm(f"{name}_norm1")(h))
            h = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(h)
            h = norm(f"{name}_norm2")(h)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                               name=f"{name}_project")(shortcut)
            x = keras.layers.Activation("relu")(keras.layers.Add(name=f"{name}_add")([h, shortcut]))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    for i, width in enumerate(config.model.hidden):
        x = keras.layers.Dense(width, activation="relu", name=f"dense_{i}")(x)
    return keras.Model(inputs, keras.layers.Dense(config.data.classes, name="logits")(x), name="resnet")


def build_optimizer(config: RunConfig) -> keras.optimizers.Optimizer:
    t = config.training
    lr = t.learning_rate
    if t.optimizer == "sgd":
        return keras.optimizers.SGD(lr)
    if t.optimizer == "momentum":
        return keras.optimizers.SGD(lr, momentum=0.9)
    if t.optimizer == "adam":
        return keras.optimizers.Adam(lr)
    if t.optimizer == "adamw":
        return keras.optimizers.AdamW(lr)
    if t.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(lr)
    raise ValueError(f"training.optimizer: unknown optimizer {t.optimizer!r}")


DEFAULT_LOSS = "SparseCategoricalCrossentropy(from_logits=True)"


def loss_name(config: RunConfig) -> str:
    """What :func:`loss_fn` computes, in words for the run's ``training`` info."""
    if config.model.name == "script":
        custom = getattr(user_script.load(user_script.script_path(config, "model.script")), "loss", None)
        if custom is not None:
            return custom if isinstance(custom, str) else getattr(custom, "__name__", None) or type(custom).__name__
    return DEFAULT_LOSS


def loss_fn(config: RunConfig) -> Callable[[Any, Any], Any]:
    """Per-example loss (no reduction): the loop averages it per replica and over the global batch.

    Sparse categorical cross-entropy on logits, or the ``loss`` of the user's script for model
    ``script``.
    """
    if config.model.name == "script":
        custom = user_script.loss(config)
        if custom is not None:
            return custom
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
