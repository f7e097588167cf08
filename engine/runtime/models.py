"""Built-in Keras models and optimizers."""

from __future__ import annotations

import keras

from engine.config import RunConfig


def build_model(config: RunConfig) -> keras.Model:
    """The model named by ``config.model``; seed the RNGs first for reproducible weights."""
    m = config.model
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


def loss_fn() -> keras.losses.Loss:
    """Per-example loss (no reduction): the loop averages it per replica and over the global batch."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
