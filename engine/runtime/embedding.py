"""The built-in sharded-embedding classifier for asynchronous (parameter-server) training.

Token ids -> their rows in an embedding table, summed (scaled by
1/sqrt(ids per example)) -> a small Keras dense head -> class logits. The
table is a raw ``tf.Variable`` (not a Keras one): a variable partitioner may
split it into a ``ShardedVariable`` over the ps tasks, which Keras 3 cannot
differentiate through. It is read with ``tf.nn.embedding_lookup`` and updated
shard by shard from the sparse per-shard gradients: SGD on the touched rows
only, with the gradient of the batch's summed loss (a row appears in about
one example of a batch, so the batch mean would dilute its update by the batch
size). The head trains with the configured Keras optimizer.

The same task as the Keras ``embedding`` model of the synchronous modes
(``data.shape = (ids per example,)``, ``model.vocab_size`` rows of
``model.embed_dim`` floats, ``model.hidden`` dense widths, ``data.classes``
classes, :func:`engine.runtime.data.synthetic_tokens`), built so that its
table can be sharded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import RunConfig

MODEL_NAME = "embedding"


class EmbeddingClassifier:
    """Create under ``strategy.scope()``; ``sharded`` is a context manager during which the
    strategy's partitioner may split a variable (only the table is created inside it)."""

    def __init__(self, config: RunConfig, sharded: Any = None) -> None:
        vocab, dim = config.model.vocab_size, config.model.embed_dim
        init = keras.initializers.RandomNormal(stddev=0.2, seed=config.training.seed)
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
        pooled = tf.reduce_sum(rows, axis=1) / tf.sqrt(tf.cast(tf.shape(ids)[1], rows.dtype))
        return self.head(pooled, training=training)

    def apply_table_gradients(self, grads: Sequence[Any], batch_size: tf.Tensor) -> None:
        """Sparse SGD on each shard from gradients of the batch-mean loss: only the rows the batch
        touched move, each by the gradient of the summed loss (``batch_size`` times the mean's)."""
        rate = self.learning_rate * tf.cast(batch_size, tf.float32)
        for shard, grad in zip(self.table_shards, grads, strict=True):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                shard.scatter_sub(tf.IndexedSlices(grad.values * rate, grad.indices, grad.dense_shape))
            else:
                shard.assign_sub(grad * rate)

    def checkpoint_items(self) -> dict[str, Any]:
        return {"table": self.table, "head": self.head}
