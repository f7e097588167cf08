"""Hand-written launches of ClusterDeck's training loops, as a user writes them without ClusterDeck.

The benchmarks write these files into a scratch folder and run them: a plain TensorFlow
script per mode (no ClusterDeck import) and a ~10-line shell launcher that sets
``TF_CONFIG`` by hand. They train the model of the presets (784-256-10 MLP, SGD at
0.05, global batch 128, the same synthetic set: Gaussian inputs labelled by a fixed random
teacher, seed 42, 8,192 examples, shuffled and repeated) with the same strategy:

- ``mwms_loop.py``: ``MultiWorkerMirroredStrategy``, a ``tf.function`` step around
  ``strategy.run`` (or, given a second argument K, groups of K steps per function in a
  ``tf.range`` loop, as Keras' ``steps_per_execution``), one fetch of the loss at the end (the
  data-parallel preset's loop);
- ``pss_chief.py`` + ``pss_server.py``: ``ParameterServerStrategy`` with a
  ``ClusterCoordinator``: every step ``schedule``d (or, given a second argument K, groups
  of K steps per scheduled function, as Keras' ``steps_per_execution``), one ``join`` and one
  fetch at the end;
  worker and ps tasks are plain ``tf.distribute.Server``s (the async preset's loop);
- ``dtensor_loop.py``: a DTensor mesh batch 2 x model 2 over 4 logical CPU devices (or
  4 GPUs), the MLP split Megatron style (hidden layer column-parallel, logits
  row-parallel), plain SGD (the model-parallel preset's loop).

Nothing is written to disk by these scripts. Two environment variables, read only by the
benchmarks, add measurements without changing the loop:

- ``CD_BENCH_STAMPS=1``: wall-clock stamps of the phases on stderr (``STAMP name t``);
- ``CD_BENCH_SUMMARY=PATH``: steady-state examples/s written there as JSON, measured as
  ClusterDeck's runtime measures its own (one extra sync at the end of the warm-up:
  ``min(50, steps // 5)`` steps, then the time to the last step).

A third, ``CD_BENCH_CORES`` (JSON: ``{"worker:0": {"cores": [0], "env": {...}}, ...}``), gives a task
the cores and thread settings ClusterDeck's supervisor gives it (``engine.contract.task_plan.share_cores``),
before TensorFlow is imported: the benchmarks' "ClusterDeck's settings" sides.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Applies ``CD_BENCH_CORES`` to this task (named by its ``TF_CONFIG``), before TensorFlow is imported.
_CORES = r'''
import json, os
_task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
_share = json.loads(os.environ.get("CD_BENCH_CORES") or "{}").get(f"{_task.get('type')}:{_task.get('index')}")
if _share:
    os.environ.update(_share["env"])
    if _share["cores"]:
        os.sched_setaffinity(0, _share["cores"])
'''

_PRELUDE = _CORES + r'''
import json, os, sys, time
T_START = time.time()
STAMPS = os.environ.get("CD_BENCH_STAMPS") == "1"
SUMMARY = os.environ.get("CD_BENCH_SUMMARY")

def stamp(name):
    if STAMPS:
        print(f"STAMP {name} {time.time():.6f}", file=sys.stderr, flush=True)

stamp("process")
import numpy as np
import tensorflow as tf
import keras
stamp("imported")

STEPS = int(sys.argv[1])
GLOBAL_BATCH, SEED, SIZE, FEATURES, CLASSES, LR = 128, 42, 8192, 784, 10, 0.05
WARM = max(1, min(50, STEPS // 5))


def synthetic():
    """Gaussian inputs labelled by a fixed random teacher (the presets' 'synthetic' data)."""
    teacher = np.random.default_rng([SEED, 0]).standard_normal((FEATURES, CLASSES), dtype=np.float32)
    rng = np.random.default_rng([SEED, 1])
    x = rng.standard_normal((SIZE, FEATURES), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((SIZE, CLASSES), dtype=np.float32)
    return x, np.argmax(x @ teacher + noise, axis=1).astype(np.int32)


def write_summary(examples_per_sec, **extra):
    if SUMMARY:
        with open(SUMMARY, "w") as fh:
            json.dump({"window_examples_per_sec": examples_per_sec, **extra}, fh)
'''

MWMS_LOOP = _PRELUDE + r'''

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x_all, y_all = synthetic()


def dataset_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x_all, y_all))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ds = ds.shuffle(SIZE, seed=SEED, reshuffle_each_iteration=True)
    return ds.repeat().batch(ctx.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)


keras.utils.set_random_seed(SEED)
with strategy.scope():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    optimizer = keras.optimizers.SGD(LR)
    optimizer.build(model.trainable_variables)
loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))


# steps per function (Keras' steps_per_execution); 1: every step its own call
PER_EXECUTION = int(sys.argv[2]) if len(sys.argv) > 2 else 1


def step_fn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_obj(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(it):
    return strategy.run(step_fn, args=next(it))


@tf.function
def train_steps(it, n):  # PER_EXECUTION > 1: a group of steps per function
    loss = strategy.run(step_fn, args=next(it))
    for _ in tf.range(n - 1):
        loss = strategy.run(step_fn, args=next(it))
    return loss


stamp("built")
window_start = None
# a group never spans the steps measured at (the first, the end of the warm-up with a summary)
marks = sorted({STEPS, 1} | ({WARM} if SUMMARY else set()))
counts = {}
step = 0
while step < STEPS:
    n = min(PER_EXECUTION, next(m for m in marks if m > step) - step)
    if PER_EXECUTION == 1:
        loss = train_step(iterator)
    else:
        loss = train_steps(iterator, counts.setdefault(n, tf.constant(n)))
    step += n
    if step == 1:
        strategy.reduce("SUM", loss, axis=None).numpy()
        stamp("first_step")
    if SUMMARY and step == WARM:
        strategy.reduce("SUM", loss, axis=None).numpy()
        window_start = time.perf_counter()
final = float(strategy.reduce("SUM", loss, axis=None).numpy())
stamp("last_step")
if window_start is not None and STEPS > WARM:
    write_summary((STEPS - WARM) * GLOBAL_BATCH / (time.perf_counter() - window_start))
print(f"steps={STEPS} loss={final:.4f}", flush=True)
stamp("exit")
if os.environ.get("CD_BENCH_PLAIN_EXIT") != "1":
    os._exit(0)  # as ClusterDeck's tasks do: TF's own teardown after MultiWorkerMirrored takes seconds
'''

PSS_SERVER = _CORES + r'''
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                              protocol="grpc", start=True)
server.join()
'''

PSS_CHIEF = _PRELUDE + r'''
# steps per scheduled function (Keras' steps_per_execution); 1: every step scheduled
PER_EXECUTION = int(sys.argv[2]) if len(sys.argv) > 2 else 1

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
WORKERS = len(resolver.cluster_spec().as_dict()["worker"])
PER_WORKER = GLOBAL_BATCH // WORKERS

keras.utils.set_random_seed(SEED)
with strategy.scope():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    optimizer = keras.optimizers.SGD(LR)
    optimizer.build(model.trainable_variables)
loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def dataset_fn(_):
    # each worker draws the same synthetic set itself (stateless RNG) and reads its own shard
    seed = tf.constant([SEED, 0], dtype=tf.int64)
    x = tf.random.stateless_normal((SIZE, FEATURES), seed=seed)
    teacher = tf.random.stateless_normal((FEATURES, CLASSES), seed=seed + [0, 1])
    noise = tf.random.stateless_normal((SIZE, CLASSES), seed=seed + [0, 2])
    y = tf.argmax(tf.matmul(x, teacher) + 0.5 * noise, axis=1, output_type=tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    index = tf.distribute.coordinator.experimental_get_current_worker_index()
    ds = ds.shard(WORKERS, tf.cast(index, tf.int64)).shuffle(SIZE, seed=SEED, reshuffle_each_iteration=True)
    return ds.repeat().batch(PER_WORKER, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


@tf.function
def per_worker_dataset():
    return strategy.distribute_datasets_from_function(dataset_fn)


iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))


def step_fn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_obj(y, model(x, training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(it):
    return strategy.run(step_fn, args=next(it))


@tf.function
def train_steps(it, n):  # PER_EXECUTION > 1: a group of steps per scheduled function
    loss = tf.constant(0.0)
    for _ in tf.range(n):
        loss = strategy.run(step_fn, args=next(it))
    return loss


stamp("built")
window_start = None
# a group never spans the steps measured at (the first with stamps, the end of the warm-up with a summary)
marks = sorted({STEPS} | ({1} if STAMPS else set()) | ({WARM} if SUMMARY else set()))
counts = {}
step = 0
while step < STEPS:
    n = min(PER_EXECUTION, next(m for m in marks if m > step) - step)
    if n == 1:
        result = coordinator.schedule(train_step, args=(iterator,))
    else:
        result = coordinator.schedule(train_steps, args=(iterator, counts.setdefault(n, tf.constant(n))))
    step += n
    if step == 1 and STAMPS:
        result.fetch()
        stamp("first_step")
    elif n > 1 and STAMPS and step - n == 1:
        # the first group traced train_steps: a window that starts here has every function traced
        result.fetch()
        stamp(f"grouped_{step}")
    if SUMMARY and step == WARM:
        result.fetch()
        window_start = time.perf_counter()
coordinator.join()
final = float(result.fetch())
stamp("last_step")
if window_start is not None and STEPS > WARM:
    write_summary((STEPS - WARM) * PER_WORKER / (time.perf_counter() - window_start),
                  steps_per_sec=(STEPS - WARM) / (time.perf_counter() - window_start))
print(f"steps={STEPS} loss={final:.4f}", flush=True)
stamp("exit")
os._exit(0)  # the coordinator's threads would keep the process alive
'''

DTENSOR_LOOP = _PRELUDE + r'''
from tensorflow.experimental import dtensor

BATCH_AXIS, MODEL_AXIS, U = "batch", "model", dtensor.UNSHARDED
gpus = tf.config.list_physical_devices("GPU")
if len(gpus) >= 4:
    kind, names = "GPU", [f"GPU:{i}" for i in range(4)]
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    kind, names = "CPU", [f"CPU:{i}" for i in range(4)]
mesh = dtensor.create_mesh([(BATCH_AXIS, 2), (MODEL_AXIS, 2)], devices=names, device_type=kind)


def variable(value, spec):
    t = tf.convert_to_tensor(value.astype(np.float32))
    replicated = dtensor.copy_to_mesh(t, dtensor.Layout.replicated(mesh, rank=len(spec)))
    return dtensor.DVariable(dtensor.relayout(replicated, dtensor.Layout(list(spec), mesh)))


rng = np.random.default_rng(SEED)
lim1, lim2 = (6.0 / (FEATURES + 256)) ** 0.5, (6.0 / (256 + CLASSES)) ** 0.5
w1 = variable(rng.uniform(-lim1, lim1, (FEATURES, 256)), (U, MODEL_AXIS))   # column-parallel
b1 = variable(np.zeros(256), (MODEL_AXIS,))
w2 = variable(rng.uniform(-lim2, lim2, (256, CLASSES)), (MODEL_AXIS, U))    # row-parallel
b2 = variable(np.zeros(CLASSES), (U,))
params = [w1, b1, w2, b2]
x_layout = dtensor.Layout([BATCH_AXIS, U], mesh)
y_layout = dtensor.Layout([BATCH_AXIS], mesh)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        h = tf.nn.relu(dtensor.relayout(tf.matmul(x, w1), dtensor.Layout([BATCH_AXIS, MODEL_AXIS], mesh)) + b1)
        logits = dtensor.relayout(tf.matmul(h, w2), dtensor.Layout([BATCH_AXIS, U], mesh)) + b2
        per_example = -tf.reduce_sum(tf.one_hot(y, CLASSES) * tf.nn.log_softmax(logits), axis=-1)
        loss = tf.reduce_mean(per_example)
    grads = tape.gradient(loss, params)
    for p, g in zip(params, grads):
        p.assign(p.read_value() - LR * dtensor.relayout(g, p.layout))  # gradients in their variable's layout
    return loss


x_all, y_all = synthetic()
ds = tf.data.Dataset.from_tensor_slices((x_all, y_all)).shuffle(SIZE, seed=SEED, reshuffle_each_iteration=True)
batches = ds.repeat().batch(GLOBAL_BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()
locations = mesh.local_device_locations()
half = GLOBAL_BATCH // 2


def shard(array, layout):
    return dtensor.pack([array[loc[BATCH_AXIS] * half:(loc[BATCH_AXIS] + 1) * half] for loc in locations], layout)


stamp("built")
window_start = None
for step in range(1, STEPS + 1):
    x, y = next(batches)
    loss = train_step(shard(x, x_layout), shard(y, y_layout))
    if step == 1:
        float(dtensor.unpack(loss)[0].numpy())
        stamp("first_step")
    if SUMMARY and step == WARM:
        float(dtensor.unpack(loss)[0].numpy())
        window_start = time.perf_counter()
final = float(dtensor.unpack(loss)[0].numpy())
stamp("last_step")
if window_start is not None and STEPS > WARM:
    write_summary((STEPS - WARM) * GLOBAL_BATCH / (time.perf_counter() - window_start))
print(f"steps={STEPS} loss={final:.4f}", flush=True)
stamp("exit")
if os.environ.get("CD_BENCH_PLAIN_EXIT") != "1":
    os._exit(0)  # as ClusterDeck's tasks do
'''

#: The data-parallel launch: two workers, TF_CONFIG by hand.
#: Arguments: STEPS PORT0 PORT1 [STEPS_PER_FUNCTION, default 1].
LAUNCH_DATA = r'''#!/bin/sh
# Two local workers of one MultiWorkerMirroredStrategy loop; TF_CONFIG written by hand.
# usage: launch_data.sh STEPS PORT0 PORT1 [STEPS_PER_FUNCTION]
CLUSTER="{\"worker\": [\"127.0.0.1:$2\", \"127.0.0.1:$3\"]}"
TF_CONFIG="{\"cluster\": $CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 0}}" "$PYTHON" mwms_loop.py "$1" "${4:-1}" &
W0=$!
TF_CONFIG="{\"cluster\": $CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 1}}" "$PYTHON" mwms_loop.py "$1" "${4:-1}" &
W1=$!
wait $W0; A=$?
wait $W1; B=$?
exit $((A | B))
'''

#: The async launch: ps and two workers serve, the chief trains, then the servers are ended.
#: Arguments: STEPS CHIEF_PORT WORKER0_PORT WORKER1_PORT PS_PORT [STEPS_PER_FUNCTION, default 1].
LAUNCH_ASYNC = r'''#!/bin/sh
# ParameterServerStrategy: 1 ps and 2 workers serve, the chief schedules; TF_CONFIG by hand.
# usage: launch_async.sh STEPS CHIEF_PORT WORKER0_PORT WORKER1_PORT PS_PORT [STEPS_PER_FUNCTION]
C="{\"chief\": [\"127.0.0.1:$2\"], \"worker\": [\"127.0.0.1:$3\", \"127.0.0.1:$4\"], \"ps\": [\"127.0.0.1:$5\"]}"
TF_CONFIG="{\"cluster\": $C, \"task\": {\"type\": \"ps\", \"index\": 0}}" "$PYTHON" pss_server.py & PS=$!
TF_CONFIG="{\"cluster\": $C, \"task\": {\"type\": \"worker\", \"index\": 0}}" "$PYTHON" pss_server.py & W0=$!
TF_CONFIG="{\"cluster\": $C, \"task\": {\"type\": \"worker\", \"index\": 1}}" "$PYTHON" pss_server.py & W1=$!
TF_CONFIG="{\"cluster\": $C, \"task\": {\"type\": \"chief\", \"index\": 0}}" "$PYTHON" pss_chief.py "$1" "${6:-1}"
CODE=$?
kill $PS $W0 $W1 2>/dev/null; wait
exit $CODE
'''

FILES = {"mwms_loop.py": MWMS_LOOP, "pss_chief.py": PSS_CHIEF, "pss_server.py": PSS_SERVER,
         "dtensor_loop.py": DTENSOR_LOOP, "launch_data.sh": LAUNCH_DATA, "launch_async.sh": LAUNCH_ASYNC}


def write_all(folder: Path) -> dict[str, Path]:
    """Write every hand-written file into ``folder``; the shell launchers are made executable."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, text in FILES.items():
        path = folder / name
        path.write_text(text.lstrip("\n"), encoding="utf-8")
        if name.endswith(".sh"):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        out[name] = path
    return out


def launch_lines(name: str) -> int:
    """Lines of a launcher that are not comments (what a user writes)."""
    return sum(1 for line in FILES[name].splitlines() if line.strip() and not line.lstrip().startswith("#"))


def shell_env(python: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the launchers run in: the caller's, plus ``PYTHON`` (the interpreter to use)."""
    env = dict(base if base is not None else os.environ)
    env["PYTHON"] = python
    return env
