"""A small convnet for parallelism 'model': its convolutions' filters split over the mesh (see
presets/model-convnet.yaml, digits of [8, 8, 1]).

    parallelism: {mode: model, mesh: {batch: 2, model: 2}}
    model: {name: script, script: examples/sharded_convnet.py}

``forward`` receives the global batch as the data gives it, ``[batch, 8, 8, 1]`` (split over 'batch'), and
``training`` (True in the train step, False in evaluation, so dropout drops only while training):

- conv1 and conv2 are split on their filters: each 'model' index holds half of the output channels and
  computes them from the whole input (conv2 first gathers conv1's channels: one all-gather);
- the pools keep the channels' split; flatten gathers them (a split last dimension cannot stay split
  once merged with height and width);
- hidden is column-parallel, logits row-parallel (one all-reduce), as in examples/sharded_model.py.

The same file trains in parallelism 'data' too, through ``build_model(config)`` (the same network in Keras).
"""

from __future__ import annotations

import keras

from engine.runtime import sharded


def build_sharded_model(config, mesh):
    """conv 16 -> max pool -> conv 32 -> max pool -> flatten -> dense 64 -> dropout -> logits."""
    height, width, channels = (*config.data.shape, 1)[:3]
    hidden = config.model.hidden[0] if config.model.hidden else 64
    b = sharded.Builder(mesh, seed=config.training.seed)
    conv1 = sharded.Conv2D(b, "conv1", channels, 16, 3, shard="filters", activation="relu")
    pool1 = sharded.MaxPool2D(b, 2)
    conv2 = sharded.Conv2D(b, "conv2", 16, 32, 3, shard="filters", activation="relu")
    pool2 = sharded.MaxPool2D(b, 2)
    flatten = sharded.Flatten(b)
    fc = sharded.Dense(b, "fc", (height // 4) * (width // 4) * 32, hidden, shard="columns", activation="relu")
    dropout = sharded.Dropout(b, "dropout", 0.2)
    logits = sharded.Dense(b, "logits", hidden, config.data.classes, shard="rows")

    def forward(x, training=False):
        h = flatten(pool2(conv2(pool1(conv1(x)))))
        return logits(dropout(fc(h), training))

    return b.model("sharded_convnet", forward)


def build_model(config):
    """The same network as a keras.Model, for the modes that replicate the model instead of splitting it."""
    hidden = config.model.hidden[0] if config.model.hidden else 64
    shape = tuple(config.data.shape) if len(config.data.shape) == 3 else (*config.data.shape, 1)
    return keras.Sequential([
        keras.Input(shape=shape),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(hidden, activation="relu", name="fc"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(config.data.classes, name="logits"),
    ], name="convnet")
