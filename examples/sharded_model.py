"""A user's own model for parallelism 'model': a 784-256-10 MLP split over the mesh (see
presets/model-user-script.yaml).

ClusterDeck imports this file in runs whose config names it:

    parallelism: {mode: model, mesh: {batch: 2, model: 2}}
    model: {name: script, script: examples/sharded_model.py}

and calls ``build_sharded_model(config, mesh)``. On a batch x model mesh the global batch is split
over 'batch' and the layers over 'model':

- fc1 is column-parallel: its kernel [784, 256] is split into column blocks [784, 128], one per
  'model' index; each device computes its 128 of the 256 hidden units from the whole input.
- fc2 is row-parallel: its kernel [256, 10] is split into row blocks [128, 10], matching the hidden
  units each device already holds; the partial logits are summed over 'model' (one all-reduce).

``forward`` receives the batch as the data gives it, ``[batch, *data.shape]`` (split over 'batch'); the
Flatten block makes rows of features of it, so the same file reads data.shape [784] or [28, 28].
The loss (softmax cross-entropy on the logits, unless the file defines ``loss``), gradients, optimizer
and checkpoints are ClusterDeck's; docs/model-parallel.md has every block.
The same file trains in parallelism 'data' too: there ClusterDeck calls ``build_model(config)``,
the same MLP in Keras.
"""

from __future__ import annotations

import math

import keras

from engine.runtime import sharded


def build_sharded_model(config, mesh):
    """The MLP on ``mesh``; ``forward`` maps a batch of ``data.shape`` examples to ``data.classes`` logits."""
    features = math.prod(config.data.shape)
    hidden = config.model.hidden[0] if config.model.hidden else 256
    b = sharded.Builder(mesh, seed=config.training.seed)
    flatten = sharded.Flatten(b)
    fc1 = sharded.Dense(b, "fc1", features, hidden, shard="columns", activation="relu")
    fc2 = sharded.Dense(b, "fc2", hidden, config.data.classes, shard="rows")

    def forward(x, training=False):  # training: True in the train step, False in evaluation
        return fc2(fc1(flatten(x)))

    return b.model("sharded_mlp", forward)


def build_model(config):
    """The same MLP as a keras.Model, for the modes that replicate the model instead of splitting it."""
    hidden = config.model.hidden[0] if config.model.hidden else 256
    return keras.Sequential([
        keras.Input(shape=tuple(config.data.shape)),
        keras.layers.Flatten(),
        keras.layers.Dense(hidden, activation="relu", name="fc1"),
        keras.layers.Dense(config.data.classes, name="fc2"),
    ], name="mlp")
