"""Custom training with tf.distribute.MirroredStrategy, written like TensorFlow's tutorial
"Custom training with tf.distribute.Strategy" (tensorflow.org/tutorials/distribute/custom_training),
on synthetic numpy data instead of Fashion-MNIST.

Runs by hand (``python custom_training.py --epochs 2``) or on a ClusterDeck cluster
(``clusterdeck run program-custom-training``); the two ClusterDeck lines are marked.
"""

import argparse

import numpy as np
import tensorflow as tf

import clusterdeck  # ClusterDeck line 1 of 2

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--batch-size-per-replica", type=int, default=32)
args = parser.parse_args()

# If the list of devices is not specified, MirroredStrategy uses every GPU it finds
# (ClusterDeck emulates the GPUs a host asks for as logical CPU devices where it has none).
strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

BATCH_SIZE_PER_REPLICA = args.batch_size_per_replica
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = args.epochs

# Synthetic "images": 28x28 values in [0, 1], ten classes that depend on the pixels.
rng = np.random.default_rng(0)
train_images = rng.random((GLOBAL_BATCH_SIZE * args.steps_per_epoch, 28, 28, 1), dtype=np.float32)
train_labels = (train_images.reshape(len(train_images), -1)[:, :10].argmax(axis=1)).astype(np.int64)

train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(
    len(train_images), seed=0).batch(GLOBAL_BATCH_SIZE, drop_remainder=True)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)


def create_model():
    return tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


with strategy.scope():
    # Set reduction to `NONE` so you can do the reduction yourself.
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)

    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.003)
    optimizer.build(model.trainable_variables)  # before the first step (see the TF 2.21 notes)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    # this replica's own mean loss: compute_average_loss divided it by the replicas in sync
    return loss * strategy.num_replicas_in_sync


@tf.function
def distributed_train_step(dataset_inputs):
    return strategy.run(train_step, args=(dataset_inputs,))


step = 0
for epoch in range(EPOCHS):
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        per_replica_losses = distributed_train_step(x)
        total_loss += strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_losses, axis=None)
        num_batches += 1
        step += 1
        clusterdeck.report(step, loss=per_replica_losses, metrics={"accuracy": train_accuracy.result()}, examples=GLOBAL_BATCH_SIZE, total=EPOCHS * args.steps_per_epoch)  # ClusterDeck line 2 of 2
    train_loss = total_loss / num_batches
    print(f"Epoch {epoch + 1}, Loss: {float(train_loss):.4f}, Accuracy: {float(train_accuracy.result()) * 100:.2f}")
    train_accuracy.reset_state()
