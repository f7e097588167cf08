"""Distributed training with Keras' model.fit under MirroredStrategy, written like TensorFlow's tutorial
"Distributed training with Keras" (tensorflow.org/tutorials/distribute/keras), on synthetic numpy data
instead of MNIST.

There is no ClusterDeck line in it at all: run it with ``clusterdeck run program-keras-fit`` and the
per-replica losses, accuracy and validation figures arrive anyway (ClusterDeck adds its callback to
``fit`` in its program tasks).
"""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=10)
args = parser.parse_args()

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

BATCH_SIZE_PER_REPLICA = 32
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

rng = np.random.default_rng(0)
images = rng.random((BATCH_SIZE * args.steps_per_epoch + 256, 28, 28, 1), dtype=np.float32)
labels = images.reshape(len(images), -1)[:, :10].argmax(axis=1).astype(np.int64)
train_dataset = tf.data.Dataset.from_tensor_slices((images[:-256], labels[:-256])).shuffle(
    10000, seed=0).batch(BATCH_SIZE, drop_remainder=True)
eval_dataset = tf.data.Dataset.from_tensor_slices((images[-256:], labels[-256:])).batch(BATCH_SIZE)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(learning_rate=0.003),
                  metrics=["accuracy"])

model.fit(train_dataset, epochs=args.epochs, validation_data=eval_dataset, verbose=2)
eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
print(f"Eval loss: {eval_loss:.4f}, Eval accuracy: {eval_acc:.4f}")
