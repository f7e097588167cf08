"""Parameter server training with a custom loop, written like TensorFlow's tutorial
"Parameter server training with ParameterServerStrategy"
(tensorflow.org/tutorials/distribute/parameter_server_training), on synthetic numpy data.

The chief runs this program; ClusterDeck starts the standard ``tf.distribute.Server`` in every worker
and ps task (the tutorial's ``if task_type in ("worker", "ps")`` branch, kept below for running it by
hand the tutorial's way). Run it with ``clusterdeck run program-ps-custom-loop``. The two ClusterDeck
lines are marked.
"""

import argparse

import numpy as np
import tensorflow as tf

import clusterdeck  # ClusterDeck line 1 of 2

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=10)
args = parser.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    # Start a TensorFlow server and wait.
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
                                  task_index=cluster_resolver.task_id, protocol=cluster_resolver.rpc_layer or "grpc",
                                  start=True)
    server.join()

# Keras 3 cannot train through a partitioned (sharded) variable: no variable_partitioner.
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)

global_batch_size = 64
feature_dim = 16


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    rng = np.random.default_rng(input_context.input_pipeline_id)
    x = rng.standard_normal((1024, feature_dim)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) > 0).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=0).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((feature_dim,)),
                                 tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)
    accuracy = tf.keras.metrics.Accuracy()


@tf.function
def step_fn(iterator):

    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(labels, pred)
            loss = tf.nn.compute_average_loss(per_example_loss)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        actual_pred = tf.cast(tf.greater(pred[:, 1], pred[:, 0]), tf.int64)
        accuracy.update_state(labels, actual_pred)
        return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    # the loss, and which worker ran the step
    return (strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None),
            tf.distribute.coordinator.experimental_get_current_worker_index())


coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)


per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

num_epochs = args.epochs
steps_per_epoch = args.steps_per_epoch
step = 0
for i in range(num_epochs):
    accuracy.reset_state()
    results = []
    for _ in range(steps_per_epoch):
        results.append(coordinator.schedule(step_fn, args=(per_worker_iterator,)))
    coordinator.join()
    for result in results:  # every step has run: read each one's loss and the worker that ran it
        step += 1
        loss, worker = result.fetch()
        clusterdeck.report(step, loss=loss, worker=worker, examples=global_batch_size, total=num_epochs * steps_per_epoch)  # ClusterDeck line 2 of 2
    print(f"Finished epoch {i}, accuracy is {accuracy.result().numpy():.3f}.")
