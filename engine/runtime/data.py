"""Built-in data for task processes (all generated or shipped: nothing downloads)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine.config import RunConfig


def synthetic_arrays(config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """A learnable classification task: Gaussian inputs labelled by a fixed random teacher."""
    d = config.data
    rng = np.random.default_rng(config.training.seed)
    x = rng.standard_normal((d.size, *d.shape), dtype=np.float32)
    flat = x.reshape(d.size, -1)
    teacher = rng.standard_normal((flat.shape[1], d.classes), dtype=np.float32)
    y = np.argmax(flat @ teacher + 0.5 * rng.standard_normal((d.size, d.classes), dtype=np.float32), axis=1)
    return x, y.astype(np.int32)


def make_dataset(config: RunConfig, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The training stream of one input pipeline, batched per replica, repeated forever.

    With several input pipelines (several workers) each reads its own shard.
    """
    x, y = synthetic_arrays(config)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    batch = config.training.global_batch_size
    if input_context is not None:
        if input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    ds = ds.shuffle(min(len(x), 10_000), seed=config.training.seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
