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
    raise ValueError(f"model.name: unknown model {m.name!r}")


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
