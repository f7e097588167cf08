"""Asynchronous training with parameter servers (``ParameterServerStrategy``).

The chief is the coordinator: it owns the strategy and a ``ClusterCoordinator``
and schedules training steps; each step runs on whichever worker is free and
updates the variables held by the ps tasks. Worker and ps tasks only serve:
they start a gRPC ``tf.distribute.Server`` and sit in ``server.join()`` until
the launcher ends them.

The chief runs :class:`engine.runtime.loop.TrainingLoop` with :class:`CoordinatorAdapter`. Any
model and data source of the run trains here: each worker reads its own shard of the examples
through ``ClusterCoordinator.create_per_worker_dataset`` (:func:`worker_dataset`; the index of
the worker is a tensor known only on the worker, see :class:`WorkerInputContext`).

A custom loop only: Keras 3's ``model.fit`` does not run under this strategy.

Steps run in groups of ``training.steps_per_execution`` (Keras' name for it): one scheduled
function runs a group on one worker in a ``tf.range`` loop, so the chief's Python work (one
``schedule``, one dispatch, one wait) is paid once per group instead of once per step, on a
machine whose cores also train. A group ends early where the loop needs every step so far done
(the end of the warm-up, a checkpoint, a stop, the last step). Figures come per group: what
is said below of a step holds for a group (its loss is the mean of the group's losses). What a
group costs: a stop waits for the groups in flight (four per worker) before its checkpoint, so
where a group takes seconds, a smaller group keeps a stop prompt; and a worker lost in the
middle of a group has applied some of its steps, which ``ClusterCoordinator`` runs again in
full on another worker (as with Keras' ``steps_per_execution``): up to K - 1 updates more than
the steps counted, per lost worker.

A step (a group) is one function, the same for every step, so that each worker
registers and instantiates it once, at its first step. It returns one small vector:
its loss, the index of the worker that ran it, that worker's clock and how many
batches that worker has read. The chief reads it for a sample of the steps (about
one per worker and report interval, and every step of the run's last window), so
it reports every worker's loss, throughput and step time without an extra round
trip. The chief waits for every step in order (a bounded window, so the pipeline
never drains just to read a figure, and a stop waits for a few groups only).

The vector stays on the worker unless the step is a sample: ``ClusterCoordinator`` copies a
function's output to the chief as soon as it ends wherever its ``RemoteValue`` is still held, on
the thread that feeds that worker, so the worker would wait for the copy before its next function
is sent. Every ``RemoteValue`` is taken over (:func:`engine.runtime.tf_compat.copy_when_fetched`):
a step that is not a sample is waited for without a copy (:func:`engine.runtime.tf_compat.wait_for`),
and a sample's output is copied by the chief's own thread when the window reaches it, while its
worker runs its next group; a worker lost in between loses that sample's figures, never its
update. One packed vector keeps a sample's copy to one tensor. The chief's last info event says
what copies cost the workers (``coordinator_copy_s`` against ``coordinator_run_s``, TensorFlow's
own timers); what each of these choices was measured to save is in docs/benchmarks.md, section 1e.
Throughput and step time stay exact (the worker's batch count and clock between two samples); a
report's loss is the mean of the sampled steps since the previous report. A stopped run's last
steps since each worker's latest sample are trained and checkpointed but not in its per-worker
step counts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import compiled, models, nan_guard, servers, tf_compat
from engine.runtime import data as data_mod
from engine.runtime import embedding as embedding_mod
from engine.runtime.context import TaskContext, breakdown_measured
from engine.runtime.loop import Checkpoints, Restored, TrainingLoop

#: Steps (or groups of steps) in flight per worker before the chief waits for the oldest one; a stop
#: waits for them too. With two groups per worker instead of four the async whole run measured ~8 %
#: slower against the same hand-written baselines (docs/benchmarks.md, section 1c).
WINDOW_PER_WORKER = 4
#: Steps whose figures the chief copies per worker and report interval (``training.metrics_hz``).
SAMPLES_PER_REPORT = 1
#: Seconds a worker or ps task keeps serving after SIGTERM (the chief's last steps and checkpoint).
SERVER_STOP_DELAY_S = 1.5


# --------------------------------------------------------------------------- servers


def serve(ctx: TaskContext) -> dict[str, Any]:
    """A worker or ps task: start the gRPC server, say so, and serve until ended.

    A worker first writes the run's numpy-made examples into its run folder (``EXAMPLES_FOLDER``),
    where the dataset function the chief sends it reads them.
    """
    if ctx.role == "worker" and ctx.config.data.source in ("synthetic", *data_mod.NUMPY_SOURCES):
        data_mod.write_examples(ctx.config, RunFolder(ctx.run_dir).scratch(EXAMPLES_SCRATCH))
    if ctx.role == "worker" and ctx.gpus_assigned and not tf.config.list_physical_devices("GPU"):
        # the same notice as the other modes': the GPUs the host asks for are not here
        ctx.emitter.info(f"no GPU here: {ctx.devices} GPU(s) emulated as logical CPU devices (this worker runs its "
                         "steps on the CPU)", emulated_gpus=ctx.devices)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
    ctx.emitter.status("running", target=server.target)
    from engine.runtime import diagnostics

    diagnostics.wait_forever()  # the launcher stops this process when the run ends


# --------------------------------------------------------------------------- sharding


class SelectivePartitioner:
    """The configured partitioner, applied only inside :meth:`sharding`.

    Keras 3 cannot differentiate through a ``ShardedVariable``, so Keras layer
    and optimizer variables are always created whole (placed round-robin over
    the ps tasks); only raw variables made for sharding (the embedding table)
    are split.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self.enabled = False

    def __call__(self, shape: Any, dtype: Any) -> list[int]:
        rank = max(1, len(shape))
        if self.enabled and self.base is not None:
            return list(self.base(shape, dtype))
        return [1] * rank

    @contextlib.contextmanager
    def sharding(self) -> Iterator[None]:
        self.enabled = True
        try:
            yield
        finally:
            self.enabled = False


def make_partitioner(config: RunConfig) -> Any:
    """The strategy's partitioner for ``parallelism.partitioner`` (None for 'none')."""
    p = config.parallelism
    num_ps = len(config.cluster.tasks_of("ps"))
    if p.partitioner == "min_size":
        return tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=p.min_shard_bytes, max_shards=max(1, num_ps))
    if p.partitioner == "fixed":
        return tf.distribute.experimental.partitioners.FixedShardsPartitioner(num_shards=p.shards)
    if p.partitioner == "none":
        return None
    raise ValueError(f"parallelism.partitioner: expected one of 'none', 'min_size', 'fixed', got {p.partitioner!r}")


_PS_DEVICE = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def device_task(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` ('' when the device names no task)."""
    m = _PS_DEVICE.search(device or "")
    return f"{m.group(1)}:{m.group(2)}" if m else ""


def _tf_variable(v: Any) -> Any:
    """The TensorFlow variable behind a Keras one (or ``v`` itself)."""
    return getattr(v, "value", v) if isinstance(v, keras.Variable) else v


def placement(variables: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """One entry per variable piece: name, shard index, shard count, shape, device and ps task."""
    out: list[dict[str, Any]] = []
    for name, var in variables:
        pieces = list(getattr(var, "variables", None) or [var])
        for i, piece in enumerate(pieces):
            tv = _tf_variable(piece)
            device = str(getattr(tv, "device", "") or "")
            out.append({"name": name, "shard": i, "shards": len(pieces),
                        "shape": [int(d) for d in piece.shape], "device": device, "task": device_task(device)})
    return out


# --------------------------------------------------------------------------- the model of a run


@dataclass
class Trainable:
    """What the loop trains: the model, how one step computes and applies gradients, what it checkpoints."""

    step_fn: Any  # (x, y) -> float64 vector: the step's loss, then each metric of metric_names
    variables: list[tuple[str, Any]]
    checkpoint_items: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    metric_names: list[str] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)  # the run's 'training' info (what trains)
    recipe: Any = None  # the engine.runtime.compiled.Recipe of a Keras model (None: the sharded embedding)


def build_trainable(config: RunConfig, partitioner: SelectivePartitioner) -> Trainable:
    """Build the model under the current strategy scope, with its step function.

    Any model of the run (built-in or the user's script) with any optimizer: the optimizer's slots
    are created here, under the strategy's scope, so they live on the ps tasks with the variables.
    """
    notes: list[str] = []
    if config.model.name == embedding_mod.MODEL_NAME:
        loss_obj = models.loss_fn(config)
        optimizer = models.build_optimizer(config)
        model = embedding_mod.EmbeddingClassifier(config, partitioner.sharding())
        optimizer.build(model.trainable_variables)

        def embedding_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            shards = model.table_shards
            head = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_obj(y, model(x, training=True)))
            grads = tape.gradient(loss, shards + head)
            optimizer.apply_gradients(zip(grads[len(shards):], head, strict=True))
            model.apply_table_gradients(grads[: len(shards)], tf.shape(y)[0])
            return tf.reshape(tf.cast(loss, tf.float64), [1])

        if config.training.optimizer != "sgd":
            notes.append(f"the embedding table trains with sparse SGD; training.optimizer "
                         f"{config.training.optimizer!r} applies to the dense head")
        variables = [("embedding_table", model.table)] + [(v.path, v) for v in model.head.weights]
        items = {**model.checkpoint_items(), "optimizer": optimizer}
        name, rate = compiled.describe_optimizer(optimizer)
        notes.insert(0, f"the run's optimizer and loss: {name} (learning rate {rate}), {models.loss_name(config)}")
        return Trainable(embedding_step, variables, items, notes,
                         training={"source": "config", "optimizer": name, "learning_rate": rate,
                                   "loss": models.loss_name(config), "metrics": [], "train_step": "clusterdeck"})

    workers = len(config.cluster.tasks_of("worker"))
    recipe = compiled.build(config, data_mod.sample_batch(config, config.training.global_batch_size // workers))
    net, optimizer = recipe.model, recipe.optimizer
    names: list[str] = []  # the metrics a step returns after its loss, in order (known once it is traced)
    step_loss = models.loss_fn(config) if recipe.step_kind == "loop" else None

    def dense_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        figures = recipe.step((x, y), step_loss, config.training.global_batch_size // workers)
        loss = figures.pop("loss", tf.constant(float("nan"), tf.float64))
        names[:] = sorted(figures)
        return tf.stack([loss, *(figures[n] for n in names)])

    variables = [(v.path, v) for v in net.weights] + [(v.path, v) for v in optimizer.variables]
    trainable = Trainable(dense_step, variables, {"model": net, "optimizer": optimizer}, notes,
                          metric_names=names, training=recipe.describe(), recipe=recipe)
    notes.insert(0, recipe.message())
    return trainable


# --------------------------------------------------------------------------- input


class WorkerInputContext(tf.distribute.InputContext):
    """The input context a worker's dataset function gets under ParameterServerStrategy.

    The dataset function is traced once, on the chief, and run on every worker, so the index of
    the worker reading (``input_pipeline_id``) is a scalar int64 *tensor*, known only on the
    worker: use it in TensorFlow ops (``ds.shard(n, input_pipeline_id)``, a seed made with
    ``tf.random``), not in Python arithmetic. ``num_input_pipelines`` is the number of workers
    and ``get_per_replica_batch_size(global_batch_size)`` the batch of one worker step.
    """

    def __init__(self, workers: int) -> None:
        index = tf.cast(tf_compat.current_worker_index(), tf.int64) if workers > 1 else tf.constant(0, tf.int64)
        super().__init__(num_input_pipelines=workers, input_pipeline_id=index, num_replicas_in_sync=workers)


#: Where each worker host keeps the numpy-made examples (synthetic, bundled, Keras' cache, npz, csv):
#: ``RUN/scratch/examples``, written by every worker task before it serves (:func:`serve`) and read by
#: the dataset function through a path relative to the task's working folder, its run folder. Embedded
#: as constants instead, the examples would travel inside the function to every worker (seconds of
#: start-up for 25 MB, and a 2 GiB limit).
EXAMPLES_SCRATCH = "examples"
EXAMPLES_FOLDER = f"scratch/{EXAMPLES_SCRATCH}"


def worker_dataset(config: RunConfig, workers: int) -> tf.data.Dataset:
    """One worker's stream: its shard of the run's examples (any source), batched per worker step."""
    return data_mod.make_dataset(config, WorkerInputContext(workers), examples_folder=EXAMPLES_FOLDER)


# --------------------------------------------------------------------------- telemetry


@dataclass
class _WorkerFigures:
    last_ts: float | None = None  # the worker's clock at its previous sample
    last_count: int = -1  # the worker's batch count at its previous sample
    ran: int = 0  # the worker's steps since the last report
    steps: int = 0  # samples since the last report
    busy: float = 0.0  # seconds between the worker's samples since the last report
    timed: int = 0  # the worker's steps within those seconds
    loss_sum: float = 0.0
    metric_sums: dict[str, float] = field(default_factory=dict)
    run_sum: float = 0.0  # seconds per step the sampled functions ran on the worker, summed
    input_sum: float = 0.0  # of those, waiting for the batch
    breakdowns: int = 0
    last_step: int = 0
    last_loss: float | None = None
    last_emit: float = -float("inf")


class WorkerReporter:
    """Per-worker ``step`` events at most ``metrics_hz`` per worker, plus ``progress`` events.

    It is given a sample of the steps: a step's loss, the worker that ran it, that worker's clock and
    its batch count (how many batches the worker has read, from 0). A report covers the worker's
    samples since its previous report: the mean of their losses, and the step time over the steps the
    worker ran between its samples, measured on its own clock (so it includes any time the worker
    waited for work). A count that goes back (the worker restarted, its dataset with it) starts over.
    """

    def __init__(self, ctx: TaskContext, per_worker_batch: int, total: int, hz: float) -> None:
        self.emitter = ctx.emitter
        self.batch = per_worker_batch
        self.total = total
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.workers: dict[int, _WorkerFigures] = {}
        self.last_progress = -float("inf")
        self.reports = 0

    def step_done(self, step: int, loss: float, worker: int, ts: float, count: int,
                  metrics: dict[str, float] | None = None, busy_s: float | None = None,
                  input_s: float | None = None) -> None:
        """One sampled step (group): ``busy_s`` and ``input_s`` are the seconds per step its function ran on the
        worker and, of those, waited for its batch."""
        nan_guard.check_loss(worker, step, loss, who="worker")
        w = self.workers.setdefault(worker, _WorkerFigures())
        if count > w.last_count:
            w.ran += count - w.last_count
            if w.last_ts is not None and ts > w.last_ts:
                w.busy += ts - w.last_ts
                w.timed += count - w.last_count
        else:  # the worker started over: its steps count from its first batch again
            w.ran += count + 1
        w.last_ts, w.last_count = ts, count
        w.steps += 1
        w.loss_sum += loss
        if busy_s is not None and input_s is not None:
            w.run_sum += busy_s
            w.input_sum += input_s
            w.breakdowns += 1
        for name, value in (metrics or {}).items():
            w.metric_sums[name] = w.metric_sums.get(name, 0.0) + value
        w.last_step = max(w.last_step, step)
        w.last_loss = loss

    def maybe_report(self, scheduled: int, completed: int, force: bool = False) -> None:
        now = time.perf_counter()
        due = [(index, w) for index, w in sorted(self.workers.items())
               if w.steps and (force or now - w.last_emit >= self.interval)]
        progress = force or now - self.last_progress >= self.interval
        if not due and not progress:
            return
        with self.emitter.batch():  # a report's events in one write
            for index, w in due:
                step_time = w.busy / w.timed if w.timed else None
                rate = self.batch / step_time if step_time else None
                extra: dict[str, Any] = {"metrics": {k: v / w.steps for k, v in w.metric_sums.items()}} \
                    if w.metric_sums else {}
                if w.breakdowns:  # the step's breakdown: its input, its own work, and the wait for the chief's next
                    ran, waited = w.run_sum / w.breakdowns, w.input_sum / w.breakdowns
                    extra.update(input_wait=min(waited, step_time or waited), own_time=ran,
                                 dispatch_wait=max(0.0, (step_time or ran) - ran))
                self.emitter.emit("step", replica=index, worker=index, step=w.last_step,
                                  loss=w.loss_sum / w.steps, examples_per_sec=rate, step_time=step_time,
                                  steps=w.ran, sampled=w.steps, **extra)
                self.reports += 1
                w.ran, w.steps, w.busy, w.timed, w.loss_sum, w.last_emit = 0, 0, 0.0, 0, 0.0, now
                w.metric_sums = {}
                w.run_sum, w.input_sum, w.breakdowns = 0.0, 0.0, 0
            if progress:
                self.emitter.emit("progress", step=completed, total=self.total, scheduled=scheduled,
                                  completed=completed)
                self.last_progress = now

    def final_losses(self) -> list[float]:
        return [float(w.last_loss) for _, w in sorted(self.workers.items()) if w.last_loss is not None]


# --------------------------------------------------------------------------- the coordinator


class CoordinatorAdapter:
    """The chief's side of :class:`engine.runtime.loop.TrainingLoop`: a step is scheduled on whichever
    worker is free; figures come back with each step's result, fetched oldest first."""

    def __init__(self, ctx: TaskContext) -> None:
        config = self.config = ctx.config
        self.ctx = ctx
        workers = self.workers = len(config.cluster.tasks_of("worker"))
        num_ps = len(config.cluster.tasks_of("ps"))
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        # every server up before the strategy connects: no server is first tried too early (gRPC's backoff)
        servers.await_before_connecting(ctx, servers.addresses_of(resolver.cluster_spec().as_dict(), ("worker", "ps")))
        partitioner = SelectivePartitioner(make_partitioner(config))
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        # tearing the coordinator (and its per-worker iterators) down waits on its threads for seconds; the
        # task process exits right after training (os._exit), so they are kept alive instead
        ctx.keep(coordinator)
        global_batch = config.training.global_batch_size
        self.lockstep = False  # only the chief runs the loop
        if global_batch % workers:
            raise ValueError(f"training.global_batch_size: {global_batch} is not divisible by the {workers} workers")
        # a step here is one worker's batch, not a global one: the run's throughput counts those
        per_worker_batch = self.global_batch = global_batch // workers
        per_execution = config.training.steps_per_execution
        ctx.emitter.info(f"ParameterServerStrategy: {workers} worker(s), {num_ps} ps, "
                         f"{per_worker_batch} examples per worker step"
                         + (f", {per_execution} steps per scheduled function" if per_execution > 1 else ""),
                         strategy="ParameterServerStrategy", workers=workers, ps=num_ps,
                         per_worker_batch=per_worker_batch, steps_per_execution=per_execution)

        keras.utils.set_random_seed(config.training.seed)
        with strategy.scope():
            trainable = build_trainable(config, partitioner)
        self.metric_names = trainable.metric_names
        self.validator = None  # on the chief, between scheduled steps (all finished first)
        if config.validation.enabled and trainable.recipe is not None:
            from engine.runtime.validation import Validator

            self.validator = Validator(config, trainable.recipe)
        for i, note in enumerate(trainable.notes):
            ctx.emitter.info(note, **({"training": trainable.training} if i == 0 and trainable.training else {}))
        ctx.emitter.emit("placement", partitioner=config.parallelism.partitioner, ps=num_ps,
                         variables=placement(trainable.variables))

        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")  # on the chief, not a ps
        self.checkpoints = Checkpoints(ctx, tf.train.Checkpoint(step=self.step_var, **trainable.checkpoint_items),
                                       primary=True)

        @tf.function
        def per_worker_dataset() -> Any:
            return strategy.distribute_datasets_from_function(
                lambda _: tf.data.Dataset.zip((tf.data.Dataset.counter(), worker_dataset(config, workers))))

        self.iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))
        ctx.keep(self.iterator)

        # the step breakdown (the function's own time, its wait for the batch) is measured inside the function:
        # off (CLUSTERDECK_STEP_BREAKDOWN=0, for benchmarks) it holds neither timestamp and reports no breakdown
        self.timed = timed = breakdown_measured()

        def started() -> tf.Tensor | None:
            return tf.timestamp() if timed else None

        def figures(values: tf.Tensor, count: tf.Tensor, start: tf.Tensor | None, waited: tf.Tensor,
                    n: Any) -> tf.Tensor:
            # one tensor, so that reading a step's figures is one copy from its worker, not four: the loss, the
            # worker, its clock, its batch count, the seconds per step the function ran and waited for its input,
            # then the step's metrics
            with tf.control_dependencies([values]):  # the step done (a timestamp is not ordered after remote ops)
                end = tf.timestamp()
            steps = tf.cast(n, tf.float64)
            ran = (end - start) / steps if start is not None else tf.constant(0.0, tf.float64)
            return tf.concat([values[:1], tf.stack([tf.cast(tf_compat.current_worker_index(), tf.float64), end,
                                                    tf.cast(count, tf.float64), ran, waited / steps]),
                              values[1:]], 0)

        def next_batch(it: Any) -> tuple[Any, Any, tf.Tensor]:
            """The next (count, batch) of this worker, and the seconds it waited for them."""
            if not timed:
                count, batch = next(it)
                return count, batch, tf.constant(0.0, tf.float64)
            t0 = tf.timestamp()
            count, batch = next(it)
            with tf.control_dependencies([count, *tf.nest.flatten(batch)]):
                waited = tf.timestamp() - t0
            return count, batch, waited

        # one function for every step (one for every group), so that a worker registers and instantiates it
        # once, at its first step; what it returns stays on the worker unless the step is a sample
        @tf.function
        def train_step(it: Any) -> tf.Tensor:
            start = started()
            count, batch, waited = next_batch(it)
            return figures(strategy.run(trainable.step_fn, args=batch), count, start, waited, 1)

        @tf.function
        def train_steps(it: Any, n: tf.Tensor) -> tf.Tensor:
            start = started()
            count, batch, waited = next_batch(it)
            total = strategy.run(trainable.step_fn, args=batch)
            for _ in tf.range(n - 1):
                count, batch, wait = next_batch(it)
                total += strategy.run(trainable.step_fn, args=batch)
                waited += wait
            return figures(total / tf.cast(n, tf.float64), count, start, waited, n)

        # a run of single steps (steps_per_execution 1) runs the single-step function, a grouped run the group one
        self.step_function = train_step if per_execution == 1 else train_steps
        # what is scheduled: the step function's concrete function, looked up once instead of by every
        # schedule (tf_compat.scheduled_concrete_function); the function itself where that hook fails
        self.function: Any = None
        self.counts: dict[int, tf.Tensor] = {}  # a group's step count, one tensor per count
        self.per_execution = per_execution
        self.pending = 0  # steps run_step was given and not yet scheduled (the loop says where a group ends)
        self.pending_step = 0  # the last of them
        self.reporter = WorkerReporter(ctx, per_worker_batch, config.total_steps(), config.training.metrics_hz)
        # (last step, its result, whether it is a sample, how many steps it ran)
        self.window: deque[tuple[int, Any, bool, int]] = deque()
        self.cap = max(2, WINDOW_PER_WORKER * workers)
        # a sample at most this often: about SAMPLES_PER_REPORT per worker and report interval; and every
        # group of the last window, so each worker's last steps are counted
        self.sample_every = self.reporter.interval / (SAMPLES_PER_REPORT * workers)
        self.last_sample = -float("inf")
        self.sample_all_after = config.total_steps() - self.cap * self.per_execution
        # steps scheduled and completed so far, counted from step 0 across restarts (fetched in order, so
        # ``completed`` is also the last finished step)
        self.scheduled = self.completed = 0
        self.lost_results = 0
        # a sample's figures copied when the chief reads them, not before its worker's next group is sent
        self.copy_when_fetched = True
        self.t0 = time.perf_counter()

    # -- fetching

    def _fetch_oldest(self) -> None:
        """Wait for the oldest step in flight; read its figures if it is a sample."""
        step, remote, sampled, ran = self.window.popleft()
        try:
            if not sampled:  # its figures stay on its worker: wait for it, copy nothing
                tf_compat.wait_for(remote)
                self.completed += ran
                return
            # a sample: its vector is copied from its worker here
            loss, worker, ts, count, ran_s, input_s, *metrics = remote.fetch()
        except tf_compat.ResultLost:
            # the step ran (its update reached the ps) but the worker holding its figures died or restarted
            # before the chief copied them: only that step's figures are lost
            self._lost(step, ran)
            return
        except (tf.errors.UnavailableError, tf.errors.CancelledError) as exc:
            # the same, where the coordinator's worker thread copied the result (copy_when_fetched off).
            # A lost ps is fatal: re-raise.
            if "/job:ps" in str(exc) or "/job:worker" not in str(exc):
                raise
            self._lost(step, ran)
            return
        self.completed += ran
        self.reporter.step_done(step, float(loss), int(worker), float(ts), int(count),
                                dict(zip(self.metric_names, (float(m) for m in metrics), strict=False)),
                                busy_s=float(ran_s) if self.timed else None,
                                input_s=float(input_s) if self.timed else None)

    def _lost(self, step: int, ran: int) -> None:
        """Count a group whose figures could not be read (it ran); say so for the first few."""
        self.completed += ran
        self.lost_results += 1
        if self.lost_results <= 3:
            self.ctx.emitter.info(f"step {step}: its worker died before its figures were read; "
                                  "training goes on", lost_step=step)

    # -- the adapter

    def restore(self) -> Restored | None:
        latest = self.checkpoints.restore()
        step = int(self.step_var.numpy())
        self.scheduled = self.completed = step
        self.pending = 0
        return Restored(step, latest) if latest else None

    def run_step(self, step: int, *, last: bool) -> None:
        self.pending += 1
        self.pending_step = step
        if last:
            self._schedule()

    def _schedule(self) -> None:
        """Schedule the pending steps as one function, once the window has room: if that raises, none
        of them started, and the step being run is given back (the loop does not count it as done, so a
        stop's settle must not run it). A run of single steps (``steps_per_execution`` 1) uses the
        single-step function; a grouped run uses the group function for every group, a group cut to
        one step included, so that it traces no more functions."""
        n, step = self.pending, self.pending_step
        if not n:
            return
        try:
            while len(self.window) > self.cap:
                self._fetch_oldest()
            now = time.perf_counter()
            sample = step > self.sample_all_after or now - self.last_sample >= self.sample_every
            args = (self.iterator,) if self.per_execution == 1 else (self.iterator, self._count(n))
            if self.function is None:
                self.function = self._scheduled_function(args)
            remote = self.coordinator.schedule(self.function, args=args)
        except BaseException:
            self.pending, self.pending_step = n - 1, step - 1
            raise
        if sample:
            self.last_sample = now
        if self.copy_when_fetched:
            try:  # a sample copied here when the window reaches it (not by the worker's thread), the rest never
                remote = tf_compat.copy_when_fetched(remote)
            except tf_compat.CompatError as exc:
                self.copy_when_fetched = False
                self.ctx.emitter.info(f"{exc}: each group's figures are copied to the chief as it ends")
        self.window.append((step, remote, sample, n))
        self.scheduled += n
        self.pending = 0

    def _count(self, n: int) -> tf.Tensor:
        count = self.counts.get(n)
        if count is None:
            count = self.counts[n] = tf.constant(n, tf.int64)
        return count

    def _scheduled_function(self, args: tuple[Any, ...]) -> Any:
        try:
            return tf_compat.scheduled_concrete_function(self.step_function, args)
        except tf_compat.CompatError as exc:
            self.ctx.emitter.info(f"{exc}: each scheduled group looks its function up again")
            return self.step_function

    def report(self, step: int, *, force: bool) -> None:
        self.reporter.maybe_report(self.scheduled, self.completed, force=force)

    def settle(self) -> None:
        self._schedule()
        while self.window:
            self._fetch_oldest()
        self.coordinator.join()

    def steps_held(self, counted: int) -> int:
        return counted  # the steps done are counted as their results come back (the ps hold the state)

    def flush(self, step: int) -> None:
        self.reporter.maybe_report(self.scheduled, self.completed, force=True)

    def save(self, step: int) -> str | None:
        self.settle()  # a checkpoint holds exactly the steps before it
        self.step_var.assign(step)
        return self.checkpoints.save(step)

    def final_losses(self) -> list[float]:
        return self.reporter.final_losses()

    def close(self) -> None:
        self.checkpoints.close()
        shutil.rmtree(RunFolder(self.ctx.run_dir).scratch(EXAMPLES_SCRATCH), ignore_errors=True)


def train(ctx: TaskContext) -> dict[str, Any]:
    """The chief: build the strategy and model, schedule ``config.total_steps()`` steps, checkpoint."""
    adapter = CoordinatorAdapter(ctx)
    loop = TrainingLoop(ctx, adapter)
    summary = loop.run()
    ran = adapter.scheduled - loop.start
    steps_per_sec = ran / loop.elapsed if loop.elapsed > 0 else 0.0
    text = f"{ran} steps in {loop.elapsed:.1f} s ({steps_per_sec:.1f} steps/s)"
    try:  # what reading the samples cost the workers: a copy on a worker's thread delays its next group
        timers = tf_compat.coordinator_timers()
    except tf_compat.CompatError:
        timers = {}
    run_s, copy_s = timers.get("coordinator_run_s", 0.0), timers.get("coordinator_copy_s", 0.0)
    if run_s:
        text += (f"; the workers waited {copy_s:.2f} s for copies to the chief "
                 f"({100 * copy_s / run_s:.1f} % of their {run_s:.1f} s)")
    ctx.emitter.info(text, steps_per_sec=steps_per_sec, steps_run=ran, **timers)
    summary.update(reports=adapter.reporter.reports, steps_per_sec=steps_per_sec)
    return summary


def main(ctx: TaskContext) -> dict[str, Any]:
    """Entry of an async task: the chief coordinates, workers and ps tasks serve."""
    # a lost peer fails the call at once instead of gRPC retrying it: a dead ps must end the chief's step
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    if ctx.role in ("worker", "ps"):
        # on SIGTERM a server keeps serving a moment, so the chief can finish its steps and save
        ctx.stop.budget_s = SERVER_STOP_DELAY_S
        ctx.stop.late_reason = None  # the supervisor says how it ended (a finished run ends its servers)
        return serve(ctx)
    if ctx.role == "chief":
        return train(ctx)
    if ctx.role == "evaluator":
        if ctx.config.model.name == embedding_mod.MODEL_NAME:
            raise ValueError("parallelism 'async': an evaluator cannot read the sharded-embedding checkpoints "
                             "yet (expected no evaluator task with model 'embedding')")
        from engine.runtime import evaluator  # a side-car outside the cluster: reads the chief's checkpoints

        return evaluator.main(ctx)
    raise ValueError(f"parallelism 'async': a {ctx.role!r} task has no part to play (expected chief, worker or ps)")
