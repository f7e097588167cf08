"""Custom training loop with MultiWorkerMirroredStrategy, written like TensorFlow's tutorial
"Custom training loop with Keras and MultiWorkerMirroredStrategy"
(tensorflow.org/tutorials/distribute/multi_worker_with_ctl), on synthetic numpy data instead of MNIST.

Each worker reads its place in the cluster from ``TF_CONFIG`` (ClusterDeck writes it for every task);
run it with ``clusterdeck run program-multi-worker-ctl``. By hand, without ``TF_CONFIG``, it trains
as a cluster of one. The two ClusterDeck lines are marked.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

import clusterdeck  # ClusterDeck line 1 of 2

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps-per-epoch", type=int, default=10)
parser.add_argument("--per-worker-batch-size", type=int, default=32)
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1

per_worker_batch_size = args.per_worker_batch_size
global_batch_size = per_worker_batch_size * num_workers


def mnist_dataset():
    # synthetic "digits": 28x28 pixels, the label is the brightest of the first ten
    rng = np.random.default_rng(0)
    x_train = rng.random((4096, 28, 28), dtype=np.float32)
    y_train = x_train.reshape(len(x_train), -1)[:, :10].argmax(axis=1).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(60000, seed=0).repeat()


def dataset_fn(input_context):
    # a tf.data.Dataset
    dataset = mnist_dataset()
    # the per-replica batch size
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    # shard it so that each worker reads different examples
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)


def build_cnn_model():
    return tf.keras.Sequential([
        tf.keras.layers.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
    multi_worker_model = build_cnn_model()
    multi_worker_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    optimizer.build(multi_worker_model.trainable_variables)  # before the first step (see the TF 2.21 notes)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    """Training step function."""

    def step_fn(inputs):
        """Per-Replica step function."""
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)

        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return tf.reduce_mean(per_example_loss)  # this replica's own mean loss

    return strategy.run(step_fn, args=(next(iterator),))


epoch = 0
step_in_epoch = 0
step = 0
iterator = iter(multi_worker_dataset)
while epoch < args.epochs:
    total_loss = 0.0
    num_batches = 0
    while step_in_epoch < args.steps_per_epoch:
        per_replica_loss = train_step(iterator)
        total_loss += strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)
        num_batches += 1
        step_in_epoch += 1
        step += 1
        clusterdeck.report(step, loss=per_replica_loss, metrics={"accuracy": train_accuracy.result()}, examples=per_worker_batch_size, total=args.epochs * args.steps_per_epoch)  # ClusterDeck line 2 of 2
    train_loss = total_loss / num_batches
    print(f"Epoch: {epoch}, accuracy: {float(train_accuracy.result()):.3f}, train_loss: {float(train_loss):.3f}.")
    train_accuracy.reset_state()
    epoch += 1
    step_in_epoch = 0
