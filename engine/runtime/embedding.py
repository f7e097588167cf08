"""The built-in sharded-embedding classifier and its synthetic token data.

Token ids -> mean of their rows in an embedding table -> a small Keras dense
head -> class logits. The table is a raw ``tf.Variable`` (not a Keras one): a
variable partitioner may split it into a ``ShardedVariable`` over the ps
tasks, which Keras 3 cannot differentiate through. It is read with
``tf.nn.embedding_lookup`` and updated shard by shard from the sparse
per-shard gradients (plain SGD on the touched rows only); the head trains with
the configured Keras optimizer.

Shape of the task: ``data.shape = (ids per example,)``, ``data.classes``
classes, a vocabulary of :data:`VOCAB_SIZE` ids and rows of
:data:`EMBEDDING_DIM` floats; ``model.hidden`` are the head's widths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from engine.config import RunConfig

MODEL_NAME = "embedding"
VOCAB_SIZE = 8192
EMBEDDING_DIM = 64  # 8192 x 64 float32 = 2 MiB: split by the default 256 KiB minimum shard size


def vocab_size(config: RunConfig) -> int:
    return int(getattr(config.model, "vocab", VOCAB_SIZE) or VOCAB_SIZE)


def embedding_dim(config: RunConfig) -> int:
    return int(getattr(config.model, "embedding_dim", EMBEDDING_DIM) or EMBEDDING_DIM)


def synthetic_id_tensors(config: RunConfig) -> tuple[tf.Tensor, tf.Tensor]:
    """A learnable task on token ids: each id votes for the classes by a fixed random teacher.

    Drawn with TF's stateless RNG, so every worker makes the same set itself.
    """
    d = config.data
    vocab = vocab_size(config)
    length = int(np.prod(d.shape))
    seed = tf.constant([config.training.seed, 0], dtype=tf.int64)
    ids = tf.random.stateless_uniform((d.size, length), seed=seed, maxval=vocab, dtype=tf.int32)
    teacher = tf.random.stateless_normal((vocab, d.classes), seed=seed + [0, 1])
    votes = tf.reduce_sum(tf.gather(teacher, ids), axis=1) / float(np.sqrt(length))
    noise = tf.random.stateless_normal((d.size, d.classes), seed=seed + [0, 2])
    y = tf.argmax(votes + 0.5 * noise, axis=1, output_type=tf.int32)
    return ids, y


class EmbeddingClassifier:
    """Create under ``strategy.scope()``; ``sharded`` is a context manager during which the
    strategy's partitioner may split a variable (only the table is created inside it)."""

    def __init__(self, config: RunConfig, sharded: Any = None) -> None:
        vocab, dim = vocab_size(config), embedding_dim(config)
        init = keras.initializers.RandomNormal(stddev=0.1, seed=config.training.seed)
        if sharded is not None:
            with sharded:
                self.table = tf.Variable(lambda: init((vocab, dim)), name="embedding_table")
        else:
            self.table = tf.Variable(lambda: init((vocab, dim)), name="embedding_table")
        layers: list[keras.layers.Layer] = [keras.Input(shape=(dim,))]
        for i, width in enumerate(config.model.hidden):
            layers.append(keras.layers.Dense(width, activation="relu", name=f"dense_{i}"))
        layers.append(keras.layers.Dense(config.data.classes, name="logits"))
        self.head = keras.Sequential(layers, name="embedding_head")
        self.learning_rate = config.training.learning_rate

    @property
    def table_shards(self) -> list[tf.Variable]:
        """The table's pieces: one per ps shard, or the whole table when it is not split."""
        return list(getattr(self.table, "variables", [self.table]))

    @property
    def trainable_variables(self) -> list[Any]:
        """The Keras head's variables (the table is updated separately, see :meth:`apply_table_gradients`)."""
        return list(self.head.trainable_variables)

    def __call__(self, ids: tf.Tensor, training: bool = False) -> tf.Tensor:
        rows = tf.nn.embedding_lookup(self.table, ids)
        return self.head(tf.reduce_mean(rows, axis=1), training=training)

    def apply_table_gradients(self, grads: Sequence[Any]) -> None:
        """Sparse SGD on each shard: only the rows the batch touched move."""
        for shard, grad in zip(self.table_shards, grads, strict=True):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                shard.scatter_sub(tf.IndexedSlices(grad.values * self.learning_rate, grad.indices,
                                                   grad.dense_shape))
            else:
                shard.assign_sub(grad * self.learning_rate)

    def checkpoint_items(self) -> dict[str, Any]:
        return {"table": self.table, "head": self.head}
