"""Synchronous data parallelism: MirroredStrategy on one task, MultiWorkerMirroredStrategy across tasks.

The adapter of :class:`engine.runtime.loop.TrainingLoop` for these strategies: a custom loop
(``tf.function`` + ``strategy.run``), since Keras 3's ``model.fit`` breaks under
MultiWorkerMirroredStrategy (keras-team/keras#20585). The first trainer writes the run's
checkpoints; every trainer restores the latest of them on start (a restart), the others save into
their scratch folders because the strategy wants every worker to save.

With ``training.steps_per_execution`` K > 1 one ``tf.function`` runs a group of up to K steps in a
``tf.range`` loop (each step still all-reduces its gradients): the Python dispatch of a step, a
large share of a small model's step, is paid once per group. The updates are those of K single
steps. A group's figures are its means: each replica's mean loss and metrics over the group's steps,
and the step time over the group; its breakdown (all-reduce and input waits) too, every step of a
measured group timed (a peer late to start a group makes the others wait in its first step). Costs:
figures and a stop come per group, and a worker lost in the middle of a group leaves the others'
variables part-way through it (the restart resumes from the last checkpoint, as without groups).

The step breakdown is measured in every step of a run shorter than :data:`SAMPLE_FROM_STEPS` steps
(timestamps in every step cost a small model about 1 % of its steps/s: ``bench/breakdown_cost.py``). A longer
run measures it on a sample of the steps, chosen by step number so that every worker runs the same functions
(one step in :data:`BREAKDOWN_EVERY`, or one group in :data:`BREAKDOWN_GROUPS`), and pays a second trace of
its step functions for it once; a report carries the last measured step's or group's.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import TRAINER_ROLES, RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import compiled, models, servers, tf_compat
from engine.runtime import data as data_mod
from engine.runtime.context import ReplicaFigures, StepReporter, TaskContext, breakdown_measured
from engine.runtime.devices import DeviceSetup, memory_info
from engine.runtime.loop import Checkpoints, Restored, TrainingLoop
from engine.runtime.summaries import Summaries, hparams_of


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
    # a worker registers with the coordination leader as it creates the strategy: the leader's server up
    # first, or the first attempt fails and gRPC's reconnect backoff is waited for (engine.runtime.servers)
    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec().as_dict()
    servers.await_before_connecting(ctx, servers.leader_to_await(spec, ctx.task))
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


#: With one step per function, the breakdown is measured on one step in BREAKDOWN_EVERY (and on the first); with
#: groups, on one group in BREAKDOWN_GROUPS, every step of it timed. A report carries the last measured figures: a
#: few steps old (at 20 reports a second, a straggler's excess still shows for as long as it lasts).
BREAKDOWN_EVERY = 8
BREAKDOWN_GROUPS = 4
#: Only a run with at least this many steps to take samples its breakdown; a shorter one measures every step. A
#: sampled run traces its step functions twice (measured and not), which took each worker of ``data-2workers`` about
#: 1 CPU-second (0.4 s of its training's wall time, ~6 % of a 1,500-step run) while timestamps in every step cost
#: about 1 % of a step: sampling pays back only over tens of thousands of steps (docs/benchmarks.md 1b).
SAMPLE_FROM_STEPS = 20_000


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
        dist = strategy.distribute_datasets_from_function(lambda ic: data_mod.make_dataset(config, ic))
        with strategy.scope():
            recipe = self.recipe = compiled.build(config, data_mod.sample_batch(config, per_replica))
            model = self.model = recipe.model
            optimizer = self.optimizer = recipe.optimizer
        ctx.emitter.info(recipe.message(), training=recipe.describe())
        loss_obj = models.loss_fn(config) if recipe.step_kind == "loop" else None
        self.checkpoints = Checkpoints(ctx, tf.train.Checkpoint(model=model, optimizer=optimizer),
                                       primary=rank == 0)
        self.iterator = iter(dist)
        # the step breakdown (the all-reduce's wait, the batch's) is measured inside the step's functions, on a
        # sample of the steps (see BREAKDOWN_EVERY): its timestamps cost about 1 % of a small model's step where
        # every step carries them. ``timed`` says whether it is measured at all (CLUSTERDECK_STEP_BREAKDOWN=0 turns
        # it off for a task; bench/breakdown_cost.py flips it between the groups of one adapter). A step not
        # measured holds neither timestamps nor the all-reduce hook.
        self.timed = breakdown_measured()
        self.sync_timer: tf_compat.SyncTimer | None = None  # the all-reduce hook, once a measured function is made
        self._functions: dict[bool, tuple[Any, Any]] = {}
        # the last result and the last that measured the breakdown (reports read both): (its figures, grouped)
        self.result: tuple[Any, bool] | None = None
        self.breakdown_result: tuple[Any, bool] | None = None
        self.last_step = 0  # the last step taken
        self.sampled = False  # the breakdown measured on a sample of the steps (SAMPLE_FROM_STEPS), else on every one
        plain = tf_compat.SyncTimer()

        def run(batch: Any, measured: bool) -> Any:
            """``strategy.run`` of one step: each replica's own figures (its mean loss, not the all-reduced one; its
            metrics) and, measured, how long it waited for the others in the all-reduce."""
            hook = self.sync_timer
            timer = hook if measured and hook is not None else plain
            if hook is not None:
                hook.active = measured  # (while tracing) this step's all-reduce timed or not
            return strategy.run(lambda data: recipe.step(data, loss_obj, global_batch, after_apply=timer.wait),
                                args=(batch,))

        def next_batch(it: Any, measured: bool, after: Any = ()) -> tuple[Any, tf.Tensor]:
            """The next batch and, measured, the seconds this task waited for it (its input pipeline's share),
            from when the step before it (``after``: its figures) was done."""
            if not measured:
                return next(it), tf.constant(0.0, tf.float64)
            with tf.control_dependencies(tf.nest.flatten(after)):
                t0 = tf.timestamp()
            batch = next(it)
            with tf.control_dependencies([t0, *tf.nest.flatten(batch, expand_composites=True)]):
                waited = tf.timestamp() - t0
            return batch, waited

        def on_this_task(results: dict[str, Any]) -> dict[str, tf.Tensor]:
            """Each figure of each replica of this task as a float64 vector."""
            return {name: tf.stack([tf.cast(v, tf.float64) for v in strategy.experimental_local_results(r)])
                    for name, r in results.items()}

        def step_functions(timed: bool) -> tuple[Any, Any]:
            """The single-step function, measuring its step's breakdown where ``timed``, and the group function
            (n >= 2 steps), measuring each of its steps' where ``timed``."""

            @tf.function
            def train_step(it: Any) -> Any:
                batch, waited = next_batch(it, timed)
                results = dict(run(batch, timed))
                results["_input"] = waited
                return results

            @tf.function
            def train_steps(it: Any, n: tf.Tensor) -> dict[str, tf.Tensor]:
                """A group of ``n`` >= 2 steps: each replica's mean of each figure over them, its breakdown's too
                where ``timed`` (every step of the group timed: a wait falls on whichever step meets it, the first
                one of a group where a peer's host was late to start it)."""
                batch, waited = next_batch(it, timed)
                sums = on_this_task(run(batch, timed))
                for _ in tf.range(n - 1):
                    batch, wait = next_batch(it, timed, after=sums)
                    figures = on_this_task(run(batch, timed))
                    sums = {name: sums[name] + figures[name] for name in sums}
                    waited += wait
                count = tf.cast(n, tf.float64)
                means = {name: value / count for name, value in sums.items()}
                means["_input"] = tf.fill(tf.shape(means["_wait"]), waited / count)
                return means

            return train_step, train_steps

        self._step_functions_of = step_functions
        if self.timed:  # the all-reduce hook's failure is said at the start
            self._step_functions(True)
        self.per_execution = config.training.steps_per_execution
        self.pending = 0  # steps taken and not run yet (the loop says where a group ends)
        self.unreported = 0  # steps run and not yet counted by the reporter
        self.forced = False  # a step taken since the last report asked to be reported at once
        if self.per_execution > 1:
            ctx.emitter.info(f"{self.per_execution} steps per function (training.steps_per_execution)",
                             steps_per_execution=self.per_execution)
        self.summaries = Summaries(RunFolder(ctx.run_dir).tensorboard, hparams=hparams_of(config),
                                   trial=config.name) if telemetry else None
        if self.summaries is not None and not self.summaries.enabled:
            ctx.emitter.info("the tensorboard package is not installed: no TensorBoard summaries for this run")
        self.reporter = StepReporter(ctx.emitter if telemetry else None, self.replica_ids, per_replica,
                                     config.training.metrics_hz,
                                     [n.lstrip("/").replace("device:", "") for n in setup.names],
                                     memory_info, self.summaries)
        # validation on every trainer in step (what it runs may include collectives, which every worker must
        # run alike); the first trainer reports it
        self.validator = None
        self.validation_reported = rank == 0
        if config.validation.enabled:
            from engine.runtime.validation import Validator

            self.validator = Validator(config, recipe)

    # -- the adapter

    def restore(self) -> Restored | None:
        latest = self.checkpoints.restore()
        start = self._optimizer_steps() if latest is not None else 0
        # every worker restores the same checkpoint: they sample alike (their functions' collectives must match)
        self.sampled = self.ctx.config.total_steps() - start >= SAMPLE_FROM_STEPS
        if latest is None:
            return None
        return Restored(start, latest)

    def run_step(self, step: int, *, last: bool) -> None:
        self.pending += 1
        self.last_step = step
        if last:
            self._run_group()

    def _run_group(self) -> None:
        # taken before the function runs: a group that raises (a peer gone) is not run again by a stop's settle
        n, self.pending = self.pending, 0
        if not n:
            return
        # which steps measure the breakdown: the same on every worker (a function's collectives must match theirs)
        # (workers cut their groups alike): the first, and those holding a multiple of the period
        period = BREAKDOWN_EVERY if self.per_execution == 1 else BREAKDOWN_GROUPS * self.per_execution
        measured = self.timed and (not self.sampled or self.breakdown_result is None
                                   or self.last_step // period != (self.last_step - n) // period)
        if n == 1:
            result = (self._step_functions(measured)[0](self.iterator), False)
        else:
            result = (self._step_functions(measured)[1](self.iterator, tf.constant(n, tf.int64)), True)
        self.result = result
        if measured:
            self.breakdown_result = result
        self.unreported += n

    def _step_functions(self, measured: bool) -> tuple[Any, Any]:
        """The step functions that measure the breakdown or not, made the first time they are asked for."""
        if measured and self.sync_timer is None:
            try:
                self.sync_timer = tf_compat.time_gradient_all_reduce(self.optimizer)
            except tf_compat.CompatError as exc:
                self.sync_timer = tf_compat.SyncTimer()
                self.ctx.emitter.info(f"the all-reduce wait is not measured: {exc}")
        if measured not in self._functions:
            self._functions[measured] = self._step_functions_of(measured)
        return self._functions[measured]

    def _columns(self, result: tuple[Any, bool]) -> tuple[dict[str, Any], list[float]]:
        """A result's figures, each a sequence over this task's replicas, and the task's input wait per replica."""
        value, grouped = result
        if grouped:
            columns = {name: v.numpy() for name, v in value.items()}
            inputs = [float(v) for v in columns.pop("_input")]
        else:
            figures = dict(value)
            waited = float(figures.pop("_input").numpy())
            columns = {name: [v.numpy() for v in self.strategy.experimental_local_results(v)]
                       for name, v in figures.items()}
            inputs = [waited] * len(columns["_wait"])
        return columns, inputs

    def _local_results(self) -> list[ReplicaFigures]:
        """(loss, sync wait, metrics, input wait) of each replica on this task: the last step or group run's loss and
        metrics, the last measured step's waits (the input wait is the task's: its replicas share one input
        pipeline; both None where the breakdown is off)."""
        assert self.result is not None
        columns, _ = self._columns(self.result)
        count = len(columns.pop("_wait"))
        losses = columns.pop("loss", None)
        waits: list[float | None] = [None] * count
        inputs: list[float | None] = [None] * count
        if self.timed and self.breakdown_result is not None:
            measured, measured_inputs = self._columns(self.breakdown_result)
            waits, inputs = [float(w) for w in measured["_wait"]], list(measured_inputs)
        return [ReplicaFigures(float(losses[i]) if losses is not None else None, waits[i],
                               {name: float(values[i]) for name, values in columns.items()}, inputs[i])
                for i in range(count)]

    def report(self, step: int, *, force: bool) -> None:
        self.forced = self.forced or force
        if self.pending or not self.unreported:
            return  # the group has not run yet: it reports when it has
        steps, self.unreported = self.unreported, 0
        force, self.forced = self.forced, False
        self.reporter.step_done(step, self._local_results, force=force, steps=steps)

    def settle(self) -> None:
        self._run_group()
        if self.result is not None:
            self._local_results()

    def steps_held(self, counted: int) -> int:
        return max(counted, self._optimizer_steps())

    def _optimizer_steps(self) -> int:
        """The steps the optimizer has applied (restored with a checkpoint)."""
        return int(self.optimizer.iterations.numpy())

    def flush(self, step: int) -> None:
        self._run_group()
        if self.unreported:
            self.report(step, force=True)
        elif self.result is not None:
            self.reporter.flush(step, self._local_results)

    def save(self, step: int) -> str | None:
        self._run_group()  # a checkpoint holds exactly the steps before it
        path = self.checkpoints.save(step)
        self.reporter.restart_clock()
        return path

    def final_losses(self) -> list[float]:
        return [r.loss for r in self._local_results() if r.loss is not None] if self.result is not None else []

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
