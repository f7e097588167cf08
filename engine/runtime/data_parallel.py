"""Synchronous data parallelism: MirroredStrategy on one task, MultiWorkerMirroredStrategy across tasks.

A custom loop (``tf.function`` + ``strategy.run``): Keras 3's ``model.fit``
breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585).
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import TRAINER_ROLES, RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import data as data_mod
from engine.runtime import models
from engine.runtime.context import StepReporter, TaskContext
from engine.runtime.devices import DeviceSetup, memory_info
from engine.runtime.summaries import Summaries


def trainer_rank(config: RunConfig, role: str, index: int) -> int:
    """Position of a trainer among all trainers: the chief first, then workers by index."""
    has_chief = bool(config.cluster.tasks_of("chief"))
    if role == "chief":
        return 0
    return index + (1 if has_chief else 0)


def _emulated_multi_worker_devices(setup: DeviceSetup) -> None:
    """Let MultiWorkerMirroredStrategy use every logical CPU device of this task.

    TF picks one CPU device per worker when no GPU exists; emulated GPUs are
    logical CPU devices, which its collectives handle fine. This hooks the
    private device discovery, so it is applied only for emulation.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    def local_devices(self: Any, cluster_resolver: Any, worker_device: str) -> tuple[tuple[str, ...], str]:
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(setup.count)), "CPU"

    cars.CollectiveAllReduceExtended._initialize_local_devices = local_devices


def make_strategy(ctx: TaskContext, setup: DeviceSetup) -> tf.distribute.Strategy:
    trainers = [t for _, t in ctx.config.cluster.tasks() if t.role in TRAINER_ROLES]
    if len(trainers) <= 1:
        return tf.distribute.MirroredStrategy(devices=list(setup.names))
    if setup.kind == "CPU" and setup.count > 1:
        try:
            _emulated_multi_worker_devices(setup)
        except (ImportError, AttributeError):
            ctx.emitter.info("this TensorFlow cannot emulate several devices per worker: one replica per worker")
    timeout = ctx.config.parallelism.collective_timeout_s
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout if timeout > 0 else None)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def train(ctx: TaskContext, *, telemetry: bool = True) -> dict[str, Any]:
    """Train to ``config.total_steps()``; returns a summary (also used by the benchmark)."""
    config = ctx.config
    setup = ctx.setup_devices()
    strategy = make_strategy(ctx, setup)
    replicas = strategy.num_replicas_in_sync
    local = len(strategy.extended.worker_devices)
    rank = trainer_rank(config, ctx.role, ctx.index)
    base = rank * local
    global_batch = config.training.global_batch_size
    if global_batch % replicas:
        raise ValueError(f"training.global_batch_size: {global_batch} is not divisible by the "
                         f"{replicas} replicas in sync")
    per_replica = global_batch // replicas
    kind = "MirroredStrategy" if isinstance(strategy, tf.distribute.MirroredStrategy) else \
        "MultiWorkerMirroredStrategy"
    ctx.emitter.info(f"{kind}: {replicas} replicas in sync, {local} on this task", strategy=kind, replicas=replicas, local_replicas=local,
                     replica_ids=list(range(base, base + local)), devices=list(strategy.extended.worker_devices))

    keras.utils.set_random_seed(config.training.seed)
    with strategy.scope():
        model = models.build_model(config)
        optimizer = models.build_optimizer(config)
        optimizer.build(model.trainable_variables)
    loss_obj = models.loss_fn(config)

    primary = rank == 0
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    ckpt_dir = str(ctx.checkpoint_dir) if primary else tempfile.mkdtemp(prefix=f"ckpt-{rank}-")
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=2)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)
        ctx.emitter.info(f"restored checkpoint {os.path.basename(manager.latest_checkpoint)}",
                         checkpoint=manager.latest_checkpoint)
    start = int(optimizer.iterations.numpy())

    dist = strategy.distribute_datasets_from_function(lambda ic: data_mod.make_dataset(config, ic))
    iterator = iter(dist)

    sync_timer = _SyncTimer(optimizer)

    @tf.function
    def train_step(it: Any) -> Any:
        def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_example = loss_obj(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # all-reduce inside
            wait = getattr(sync_timer.local, "wait", None)
            if wait is None:
                wait = tf.constant(0.0, tf.float64)
            # this replica's own mean loss (not the all-reduced one), and how long it waited for the others
            return tf.reduce_mean(per_example), wait

        return strategy.run(step_fn, args=next(it))

    total = config.total_steps()
    summaries = Summaries(RunFolder(ctx.run_dir).tensorboard(ctx.task)) if telemetry else None
    if summaries is not None and not summaries.enabled:
        ctx.emitter.info("the tensorboard package is not installed: no TensorBoard summaries for this run")
    reporter = StepReporter(ctx.emitter if telemetry else None, range(base, base + local), per_replica,
                            config.training.metrics_hz, [n.lstrip("/").replace("device:", "") for n in setup.names],
                            memory_info, summaries)
    every = config.training.checkpoint_every
    result: Any = None
    # steady-state throughput, measured the same way with and without telemetry (the benchmark reads it)
    warm_until = start + max(1, min(50, (total - start) // 5))
    window_start: float | None = None
    if start < total:
        ctx.emitter.status("running", step=start, total=total)
    delay = _test_step_delay(ctx.task)
    for step in range(start + 1, total + 1):
        if delay:
            time.sleep(delay)
        result = train_step(iterator)
        if step == warm_until:
            _local_results(strategy, result)
            window_start = time.perf_counter()
        reporter.step_done(step, functools.partial(_local_results, strategy, result),
                           force=step == total or step == start + 1)
        if every and step % every == 0 and step < total:
            manager.save(checkpoint_number=step)
            reporter.restart_clock()
    final = [loss for loss, _ in _local_results(strategy, result)] if result is not None else []
    if summaries is not None:
        summaries.close()
    window_eps = None
    if window_start is not None and total > warm_until:
        window_eps = (total - warm_until) * global_batch / (time.perf_counter() - window_start)
    manager.save(checkpoint_number=total)
    if not primary:
        # other workers write to throw-away folders (MultiWorkerMirrored needs every worker to save)
        tf.io.gfile.rmtree(ckpt_dir)
    return {"steps": total, "start": start, "replicas": replicas, "final_loss": final,
            "window_examples_per_sec": window_eps,
            "replica_ids": list(range(base, base + local)), "reports": reporter.reports}


class _SyncTimer:
    """Times the gradient all-reduce of each replica inside the step.

    In a synchronous step every replica lasts as long as the slowest, so the
    time a replica spends waiting in the all-reduce is what separates a
    straggler (little wait) from the others (long wait). Keras 3's optimizer
    all-reduces in ``_all_reduce_sum_gradients`` (in the replica's own thread);
    the timer wraps it and leaves the result untouched. Without that hook the
    wait reads 0 and the step time is used instead.
    """

    def __init__(self, optimizer: Any) -> None:
        self.local = threading.local()
        original = getattr(optimizer, "_all_reduce_sum_gradients", None)
        if original is None:
            return

        def timed(grads_and_vars: Any) -> Any:
            pairs = list(grads_and_vars)
            grads = [g for g, _ in pairs if g is not None]
            with tf.control_dependencies(grads):
                before = tf.timestamp()
            with tf.control_dependencies([before]):
                pairs = [(tf.identity(g) if g is not None else None, v) for g, v in pairs]
            reduced = original(pairs)
            with tf.control_dependencies([g for g, _ in reduced if g is not None]):
                self.local.wait = tf.timestamp() - before
            return reduced

        optimizer._all_reduce_sum_gradients = timed


def _local_results(strategy: tf.distribute.Strategy, result: Any) -> list[tuple[float, float]]:
    """(loss, sync wait) of each replica on this task."""
    losses = strategy.experimental_local_results(result[0])
    waits = strategy.experimental_local_results(result[1])
    return [(float(loss.numpy()), float(wait.numpy())) for loss, wait in zip(losses, waits, strict=True)]


def _test_step_delay(task: str) -> float:
    """Test-only: ``CLUSTERDECK_TEST_STEP_DELAY=worker:1=0.03`` slows one task's every step."""
    spec = os.environ.get("CLUSTERDECK_TEST_STEP_DELAY", "")
    name, _, seconds = spec.rpartition("=")
    try:
        return float(seconds) if name == task else 0.0
    except ValueError:
        return 0.0


def main(ctx: TaskContext, *, telemetry: bool = True) -> dict[str, Any]:
    """Entry of a data-parallel task: chief and workers train, an evaluator evaluates checkpoints."""
    if ctx.role == "evaluator":
        from engine.runtime import evaluator

        return evaluator.main(ctx)
    return train(ctx, telemetry=telemetry)
