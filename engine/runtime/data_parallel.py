"""Synchronous data parallelism: MirroredStrategy on one task, MultiWorkerMirroredStrategy across tasks.

The adapter of :class:`engine.runtime.loop.TrainingLoop` for these strategies: a custom loop
(``tf.function`` + ``strategy.run``), since Keras 3's ``model.fit`` breaks under
MultiWorkerMirroredStrategy (keras-team/keras#20585). The first trainer writes the run's
checkpoints; every trainer restores the latest of them on start (a restart), the others save into
their scratch folders because the strategy wants every worker to save.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import TRAINER_ROLES, RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import data as data_mod
from engine.runtime import models, tf_compat
from engine.runtime.context import StepReporter, TaskContext
from engine.runtime.devices import DeviceSetup, memory_info
from engine.runtime.loop import Checkpoints, Restored, TrainingLoop
from engine.runtime.summaries import Summaries


def trainer_rank(config: RunConfig, role: str, index: int) -> int:
    """Position of a trainer among all trainers: the chief first, then workers by index."""
    has_chief = bool(config.cluster.tasks_of("chief"))
    if role == "chief":
        return 0
    return index + (1 if has_chief else 0)


def make_strategy(ctx: TaskContext, setup: DeviceSetup) -> tf.distribute.Strategy:
    trainers = [t for _, t in ctx.config.cluster.tasks() if t.role in TRAINER_ROLES]
    if len(trainers) <= 1:
        return tf.distribute.MirroredStrategy(devices=list(setup.names))
    if setup.kind == "CPU" and setup.count > 1:
        try:
            tf_compat.emulate_multi_worker_devices(setup.count)
        except (ImportError, tf_compat.CompatError) as exc:
            ctx.emitter.info(f"one replica per worker: this TensorFlow cannot emulate several devices per "
                             f"worker ({exc})")
    timeout = ctx.config.parallelism.collective_timeout_s
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout if timeout > 0 else None)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


class MirroredAdapter:
    """Mirrored / MultiWorkerMirrored: one step is ``strategy.run`` over this task's replicas."""

    def __init__(self, ctx: TaskContext, *, telemetry: bool = True) -> None:
        config = self.config = ctx.config
        self.ctx = ctx
        setup = ctx.setup_devices()
        strategy = self.strategy = make_strategy(ctx, setup)
        replicas = self.replicas = strategy.num_replicas_in_sync
        self.lockstep = not isinstance(strategy, tf.distribute.MirroredStrategy)  # MultiWorkerMirrored
        local = len(strategy.extended.worker_devices)
        rank = trainer_rank(config, ctx.role, ctx.index)
        base = rank * local
        self.replica_ids = list(range(base, base + local))
        global_batch = self.global_batch = config.training.global_batch_size
        if global_batch % replicas:
            raise ValueError(f"training.global_batch_size: {global_batch} is not divisible by the "
                             f"{replicas} replicas in sync")
        per_replica = global_batch // replicas
        kind = "MirroredStrategy" if isinstance(strategy, tf.distribute.MirroredStrategy) else \
            "MultiWorkerMirroredStrategy"
        ctx.emitter.info(f"{kind}: {replicas} replicas in sync, {local} on this task", strategy=kind,
                         replicas=replicas, local_replicas=local, replica_ids=self.replica_ids,
                         devices=list(strategy.extended.worker_devices))

        keras.utils.set_random_seed(config.training.seed)
        with strategy.scope():
            model = self.model = models.build_model(config)
            optimizer = self.optimizer = models.build_optimizer(config)
            optimizer.build(model.trainable_variables)
        loss_obj = models.loss_fn(config)
        self.checkpoints = Checkpoints(ctx, tf.train.Checkpoint(model=model, optimizer=optimizer),
                                       primary=rank == 0)

        dist = strategy.distribute_datasets_from_function(lambda ic: data_mod.make_dataset(config, ic))
        self.iterator = iter(dist)
        try:
            sync_timer = tf_compat.time_gradient_all_reduce(optimizer)
        except tf_compat.CompatError as exc:
            sync_timer = tf_compat.SyncTimer()
            ctx.emitter.info(f"the all-reduce wait is not measured: {exc}")

        @tf.function
        def train_step(it: Any) -> Any:
            def step_fn(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                with tf.GradientTape() as tape:
                    per_example = loss_obj(y, model(x, training=True))
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # all-reduce inside
                # this replica's own mean loss (not the all-reduced one), and how long it waited for the others
                return tf.reduce_mean(per_example), sync_timer.wait()

            return strategy.run(step_fn, args=next(it))

        self.train_step = train_step
        self.summaries = Summaries(RunFolder(ctx.run_dir).tensorboard(ctx.task)) if telemetry else None
        if self.summaries is not None and not self.summaries.enabled:
            ctx.emitter.info("the tensorboard package is not installed: no TensorBoard summaries for this run")
        self.reporter = StepReporter(ctx.emitter if telemetry else None, self.replica_ids, per_replica,
                                     config.training.metrics_hz,
                                     [n.lstrip("/").replace("device:", "") for n in setup.names],
                                     memory_info, self.summaries)
        self.result: Any = None

    # -- the adapter

    def restore(self) -> Restored | None:
        latest = self.checkpoints.restore()
        if latest is None:
            return None
        return Restored(int(self.optimizer.iterations.numpy()), latest)

    def run_step(self, step: int) -> None:
        self.result = self.train_step(self.iterator)

    def _local_results(self) -> list[tuple[float, float]]:
        """(loss, sync wait) of each replica on this task."""
        losses = self.strategy.experimental_local_results(self.result[0])
        waits = self.strategy.experimental_local_results(self.result[1])
        return [(float(loss.numpy()), float(wait.numpy())) for loss, wait in zip(losses, waits, strict=True)]

    def report(self, step: int, *, force: bool) -> None:
        self.reporter.step_done(step, self._local_results, force=force)

    def settle(self) -> None:
        if self.result is not None:
            self._local_results()

    def flush(self, step: int) -> None:
        if self.result is not None:
            self.reporter.flush(step, self._local_results)

    def save(self, step: int) -> str | None:
        path = self.checkpoints.save(step)
        self.reporter.restart_clock()
        return path

    def final_losses(self) -> list[float]:
        return [loss for loss, _ in self._local_results()] if self.result is not None else []

    def close(self) -> None:
        if self.summaries is not None:
            self.summaries.close()
        self.checkpoints.close()


def train(ctx: TaskContext, *, telemetry: bool = True) -> dict[str, Any]:
    """Train to ``config.total_steps()``; returns a summary (also used by the benchmark)."""
    adapter = MirroredAdapter(ctx, telemetry=telemetry)
    summary = TrainingLoop(ctx, adapter).run()
    summary.update(replicas=adapter.replicas, replica_ids=adapter.replica_ids, reports=adapter.reporter.reports)
    return summary


def main(ctx: TaskContext, *, telemetry: bool = True) -> dict[str, Any]:
    """Entry of a data-parallel task: chief and workers train, an evaluator evaluates checkpoints."""
    if ctx.role == "evaluator":
        from engine.runtime import evaluator

        return evaluator.main(ctx)
    return train(ctx, telemetry=telemetry)
