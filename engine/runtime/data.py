"""Built-in data for task processes (all generated or shipped: nothing downloads)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine.config import TOKEN_MODELS, RunConfig


def synthetic_arrays(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """A learnable classification task: Gaussian inputs labelled by a fixed random teacher.

    ``split="eval"`` draws fresh inputs labelled by the same teacher (held-out data).
    """
    d = config.data
    seed = config.training.seed
    features = int(np.prod(d.shape))
    teacher = np.random.default_rng([seed, 0]).standard_normal((features, d.classes), dtype=np.float32)
    size = d.size if split == "train" else max(config.training.global_batch_size, min(d.size, 2048))
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    x = rng.standard_normal((size, *d.shape), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((size, d.classes), dtype=np.float32)
    y = np.argmax(x.reshape(size, -1) @ teacher + noise, axis=1)
    return x, y.astype(np.int32)


def synthetic_tokens(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Token sequences for the token models: each class favours its own slice of the vocabulary."""
    d, m = config.data, config.model
    seed = config.training.seed
    length = int(d.shape[0])
    size = d.size if split == "train" else max(config.training.global_batch_size, min(d.size, 2048))
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    y = rng.integers(0, d.classes, size=size)
    # half the tokens come from the class's own band of ids, half from anywhere
    band = max(1, m.vocab_size // d.classes)
    own = (y[:, None] * band + rng.integers(0, band, size=(size, length))) % m.vocab_size
    anywhere = rng.integers(0, m.vocab_size, size=(size, length))
    x = np.where(rng.random((size, length)) < 0.5, own, anywhere)
    return x.astype(np.int32), y.astype(np.int32)


def arrays(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The built-in data for this config's model (token ids for token models, features otherwise)."""
    if config.model.name in TOKEN_MODELS:
        return synthetic_tokens(config, split)
    return synthetic_arrays(config, split)


def make_dataset(config: RunConfig, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The training stream of one input pipeline, batched per replica, repeated forever.

    With several input pipelines (several workers) each reads its own shard.
    """
    x, y = arrays(config)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    batch = config.training.global_batch_size
    if input_context is not None:
        if input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    ds = ds.shuffle(min(len(x), 10_000), seed=config.training.seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
