"""A user's own model and data for ClusterDeck (presets/data-user-script.yaml, presets/async-user-script.yaml).

ClusterDeck imports this file only in runs whose config names it:

    model: {name: script, script: examples/user_script.py}
    data:  {source: script, path: examples/user_script.py}

and, before the launch, in a check subprocess that builds the model and one batch.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def build_model(config):
    """Any keras.Model: ClusterDeck calls it inside the strategy's scope. Output: logits of data.classes."""
    return keras.Sequential([
        keras.Input(shape=tuple(config.data.shape)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(config.data.classes),
    ], name="user_mlp")


def make_dataset(input_context, config):
    """(x, y) batches of the per-replica size, this input pipeline's shard of the examples.

    ``input_context`` says how many input pipelines read (``num_input_pipelines``), which one this is
    (``input_pipeline_id``) and the per-replica batch (``get_per_replica_batch_size``). In async mode
    (parameter servers) this function is traced once, on the chief, and runs on every worker:
    ``input_pipeline_id`` is then a scalar int64 tensor known only on the worker, which ``ds.shard``
    takes as it is (keep it out of Python and numpy code). ``None`` in model parallelism: whole
    global batches.
    """
    d = config.data
    rng = np.random.default_rng(config.training.seed)
    x = rng.standard_normal((d.size, *d.shape)).astype("float32")
    teacher = rng.standard_normal((int(np.prod(d.shape)), d.classes)).astype("float32")
    y = np.argmax(x.reshape(d.size, -1) @ teacher, axis=1).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    batch = config.training.global_batch_size
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    return ds.shuffle(1024, seed=config.training.seed).repeat().batch(batch, drop_remainder=True)


# optional: per-example losses (here the default, with a little label smoothing)
def loss(y_true, y_pred):
    classes = tf.shape(y_pred)[-1]
    onehot = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), classes)
    return keras.losses.categorical_crossentropy(onehot, y_pred, from_logits=True, label_smoothing=0.05)
