"""The classic parameter-server example's data: the handwritten digits shipped with ClusterDeck, as
28 x 28 images (784 values per example), for ``presets/async-classic.yaml``.

The 8 x 8 digits (pixel values 0-16) are scaled up three times to 24 x 24 and centred in 28 x 28, as
MNIST centres its 20 x 20 digits. ``make_dataset`` works in every parallelism mode:

- data parallelism: ``input_context`` says how many input pipelines read (one per worker) and which
  one this is; each reads its own shard, in batches of the per-replica size.
- async (parameter servers): the dataset function is traced once, on the chief, and runs on every
  worker, so ``input_context.input_pipeline_id`` is a scalar int64 *tensor* known only on the worker.
  ``ds.shard(num_input_pipelines, input_pipeline_id)`` takes it as it is; ``get_per_replica_batch_size``
  gives the batch of one worker step. (Python arithmetic or numpy on the id does not work there.)
- model parallelism: ``input_context`` is None; return whole global batches.

It also defines ``build_model`` (a classic convnet: two 5 x 5 convolutions with max pooling, a dense
layer, logits) for runs with ``model: {name: script, script: classic_digits.py}`` and
``data.shape: [28, 28, 1]``; the preset itself trains the built-in 784-256-10 ``mlp``.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from engine.contract.datasets import DIGITS_PATH


def digits_28x28(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28] with values 0-16, labels int32 [n])."""
    with np.load(DIGITS_PATH) as f:
        x = f["x_train" if split == "train" else "x_test"]
        y = f["y_train" if split == "train" else "y_test"]
    big = np.kron(x, np.ones((1, 3, 3), dtype=x.dtype))  # 24 x 24
    return np.pad(big, ((0, 0), (2, 2), (2, 2))), y.astype(np.int32)


def make_dataset(input_context, config):
    """(x, y) batches: x float32 of ``data.shape`` (784 values, scaled to [0, 1]), y the digit."""
    x, y = digits_28x28()
    n = min(len(x), config.data.size)
    shape = tuple(config.data.shape)
    ds = tf.data.Dataset.from_tensor_slices((x[:n], y[:n]))  # uint8 travels 4x lighter than float32
    batch = config.training.global_batch_size
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    ds = ds.map(lambda img, label: (tf.reshape(tf.cast(img, tf.float32) / 16.0, shape), label))
    ds = ds.cache().shuffle(2048, seed=config.training.seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True)


def build_model(config):
    """A classic convnet over [28, 28, 1] images: logits of ``data.classes``."""
    return keras.Sequential([
        keras.Input(shape=tuple(config.data.shape)),
        keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(32, 5, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 5, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(config.data.classes),
    ], name="classic_convnet")
