"""Model parallelism: a DTensor mesh ``batch`` x ... x ``model`` over the devices of the worker tasks.

The mesh's axes are ``parallelism.mesh_dims()``: ``batch``, any extra named axes (``feature``), ``model``.

One worker task is a single DTensor client owning the whole mesh; several
worker tasks are one client each (``DTENSOR_*`` set by the launcher), and the
mesh spans their devices in task order. Inputs and labels are sharded on
``batch``; parameters as :mod:`engine.runtime.dtensor_layers` lays them out.

The adapter of :class:`engine.runtime.loop.TrainingLoop` for DTensor is :class:`MeshAdapter`; the
data is the run's stream of global batches (:func:`engine.runtime.data.make_dataset` without an
input context: any source, the user's ``make_dataset(None, config)`` included), of which each
client packs the rows of its own devices.

The loss is the script's ``loss`` where it defines one (model ``script``), else softmax
cross-entropy on logits; :class:`MeshSteps` holds the train and evaluation steps (``forward`` gets
``training=True`` in the one, ``False`` in the other).

Telemetry: a ``step`` event per data-parallel replica (an index on the
``batch`` axis) with the mean loss over its batch shard (and its accuracy with the
default loss), reported by the client holding that replica's device at index 0 of every
other axis; ``device`` events per local device; a ``placement`` event with every
parameter's live layout.

Step breakdown: ``input_wait`` is the mean time a step waited for its batch since the previous report
(taking the next global batch from the pipeline, checking its labels, packing it onto the mesh); the rest
of the step is the one DTensor function, whose collectives run inside it, so they are not told apart from
compute here (a profile's summary tells them apart: ``engine.runtime.diagnostics``). No ``sync_wait`` or
``own_time`` is reported: a client's step lasts as long as the slowest client's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor
from tensorflow.python.eager import context as tf_context

from engine.contract.config import RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import data as data_mod
from engine.runtime import dtensor_layers as layers
from engine.runtime import sharded, user_script
from engine.runtime.context import ReplicaFigures, StepReporter, TaskContext, breakdown_measured
from engine.runtime.devices import DeviceSetup, memory_info
from engine.runtime.loop import Checkpoints, Restored, TrainingLoop
from engine.runtime.summaries import Summaries, hparams_of


@dataclass(frozen=True)
class MeshInfo:
    mesh: dtensor.Mesh
    client: int
    clients: int
    local_batch_index: tuple[int, ...]  # the batch coordinate of each local device, in local order
    owned: tuple[int, ...]  # replicas (batch indices) this client reports: it holds their device at 0 elsewhere

    def component_of(self, replica: int) -> int:
        """Position among the local components of the device reporting ``replica``."""
        locations = self.mesh.local_device_locations()
        return next(i for i, loc in enumerate(locations) if loc[layers.BATCH] == replica and _reporter(loc))


def _reporter(location: dict[str, int]) -> bool:
    """The device at index 0 of every axis but ``batch`` reports its replica (the others hold the same rows)."""
    return all(index == 0 for axis, index in location.items() if axis != layers.BATCH)


def mesh_text(config: RunConfig) -> str:
    """``batch x feature x model = 1 x 2 x 2 = 4`` for messages."""
    dims = config.parallelism.mesh_dims()
    return (f"{' x '.join(name for name, _ in dims)} = {' x '.join(str(size) for _, size in dims)} = "
            f"{config.parallelism.mesh_devices()}")


def make_mesh(config: RunConfig, setup: DeviceSetup) -> MeshInfo:
    """The mesh of ``parallelism.mesh_dims()``; multi-client when the launcher set ``DTENSOR_NUM_CLIENTS`` > 1."""
    p = config.parallelism
    dims = p.mesh_dims()
    wanted = p.mesh_devices()
    clients = int(os.environ.get("DTENSOR_NUM_CLIENTS", "1") or 1)
    if clients > 1:
        dtensor.initialize_accelerator_system(setup.kind)
        found = dtensor.num_global_devices(setup.kind)
        if found != wanted:
            raise ValueError(f"parallelism.mesh: {mesh_text(config)} does not match the {found} {setup.kind} "
                             f"devices of the {clients} DTensor clients")
        mesh = dtensor.create_distributed_mesh(dims, device_type=setup.kind)
        client = dtensor.client_id()
    else:
        if setup.count != wanted:
            raise ValueError(f"parallelism.mesh: {mesh_text(config)} does not match the {setup.count} "
                             f"{setup.kind} devices of this worker")
        mesh = dtensor.create_mesh(dims, devices=[n.replace("/device:", "") for n in setup.names],
                                   device_type=setup.kind)
        client = 0
    locations = mesh.local_device_locations()
    owned = tuple(sorted(loc[layers.BATCH] for loc in locations if _reporter(loc)))
    return MeshInfo(mesh, client, clients, tuple(loc[layers.BATCH] for loc in locations), owned)


def _batches(config: RunConfig) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Global batches, the same stream (data, shuffle, seed) as a single data-parallel replica reads.

    A script's model gets ``[batch, *data.shape]`` as the data gives it; the built-in MLP rows of features.
    """
    for x, y in data_mod.make_dataset(config).as_numpy_iterator():
        if config.model.name == "mlp" and x.ndim > 2:
            x = x.reshape(x.shape[0], -1)
        yield x, y


def shard_batch(info: MeshInfo, array: np.ndarray, layout: dtensor.Layout | None = None) -> tf.Tensor:
    """A host batch as a DTensor sharded on ``batch`` (whole on every other axis): each local device gets its
    replica's rows."""
    layout = layout if layout is not None else dtensor.Layout(list(layers.batch_spec(array.ndim)), info.mesh)
    per = array.shape[0] // info.mesh.dim_size(layers.BATCH)
    return dtensor.pack([array[b * per:(b + 1) * per] for b in info.local_batch_index], layout)


def as_input(x: np.ndarray, dtype: tf.DType) -> np.ndarray:
    """``x`` in the model's ``input_dtype`` where both are integers or both floats (int64 ids for an int32
    model: what StringLookup emits); of another kind, as it is (the model's ops say what they accept)."""
    want = np.dtype(dtype.as_numpy_dtype)
    same_kind = (np.issubdtype(x.dtype, np.integer) and np.issubdtype(want, np.integer)) or \
                (np.issubdtype(x.dtype, np.floating) and np.issubdtype(want, np.floating))
    return x.astype(want, copy=False) if same_kind and x.dtype != want else x


#: A per-example loss ``(labels, output) -> [batch]``.
LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def model_loss(config: RunConfig) -> LossFn | None:
    """The script's ``loss`` as a per-example function (model ``script``), or None: softmax cross-entropy."""
    return user_script.loss(config) if config.model.name == "script" else None


class MeshSteps:
    """The train and evaluation steps of a sharded model over its mesh.

    Each returns ``(per-example losses, per-example hits or None)`` laid out ``(batch,)``: hits (1.0 where
    the largest logit is the label) with the default softmax cross-entropy only, the loss that has
    classes to count. ``forward`` gets ``training=True`` in :attr:`train`, ``False`` in :attr:`evaluate`.
    """

    def __init__(self, model: layers.ShardedModel, optimizer: layers.Optimizer, classes: int,
                 loss: LossFn | None = None) -> None:
        self.model, self.optimizer, self.classes, self.loss = model, optimizer, classes, loss
        self.mesh = model.params[0].var.layout.mesh

        @tf.function
        def train(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:
            with tf.GradientTape() as tape:
                per_example, hits = self.losses(model.call(x, training=True), y)
                mean = tf.reduce_mean(per_example)
            optimizer.apply(tape.gradient(mean, model.variables))
            return per_example, hits

        @tf.function
        def evaluate(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:
            return self.losses(model.call(x, training=False), y)

        self.train = train
        self.evaluate = evaluate

    def losses(self, out: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Per-example losses and hits of the model's output ``out`` for labels ``y``."""
        if self.loss is None:
            per_example = layers.per_example_loss(out, y, self.classes)
            hits = layers.constrain(layers.per_example_correct(out, y), self.mesh, layers.BATCH)
        else:
            per_example, hits = tf.cast(self.loss(layers.match_labels(y, out), out), tf.float32), None
        return layers.constrain(per_example, self.mesh, layers.BATCH), hits


def check_labels(y: np.ndarray, classes: int, step: int) -> None:
    """Raise ``ValueError`` where a label of the batch of ``step`` is not a class id (0 to ``classes - 1``):
    the model mode's one-hot cross-entropy would train on it at loss 0 without a word."""
    if y.size == 0:
        return
    if not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.floating) or not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ValueError(f"data labels: the batch of step {step} holds labels that are not class ids "
                             f"(dtype {y.dtype}); expected integers 0 to {classes - 1} (data.classes {classes})")
    low, high = float(np.min(y)), float(np.max(y))
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise ValueError(f"data labels: label {bad:g} in the batch of step {step} is out of range; expected 0 to "
                         f"{classes - 1} (data.classes {classes})")


def replica_means(info: MeshInfo, values: tf.Tensor) -> list[float]:
    """The mean of a ``(batch,)``-laid-out value over each replica this client reports."""
    components = dtensor.unpack(values)
    return [float(np.mean(components[info.component_of(r)].numpy())) for r in info.owned]


def per_replica(info: MeshInfo, per_example: tf.Tensor, hits: tf.Tensor | None) -> list[Any]:
    """Per replica this client reports: its mean loss, or its :class:`ReplicaFigures` with its accuracy where the
    loss counts hits (what :meth:`StepReporter.step_done` reads)."""
    losses = replica_means(info, per_example)
    if hits is None:
        return losses
    return [ReplicaFigures(loss, metrics={"accuracy": acc})
            for loss, acc in zip(losses, replica_means(info, hits), strict=True)]


class MeshValidator:
    """The held-out examples (``validation``) through ``forward(x, training=False)``, whole global batches
    only (the mesh splits a batch evenly): the mean loss and accuracy of the replicas this client holds."""

    def __init__(self, adapter: MeshAdapter) -> None:
        self.adapter = adapter

    def evaluate(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        config = self.adapter.config
        losses: list[float] = []
        hits: list[float] = []
        rows = 0
        for x, y in data_mod.validation_dataset(config).as_numpy_iterator():
            if x.shape[0] != config.training.global_batch_size:
                continue
            if config.model.name == "mlp" and x.ndim > 2:
                x = x.reshape(x.shape[0], -1)
            for result in self.adapter.evaluate(x, y):
                figures = result if isinstance(result, ReplicaFigures) else ReplicaFigures(result)
                losses.append(float(figures.loss))
                if figures.metrics and "accuracy" in figures.metrics:
                    hits.append(float(figures.metrics["accuracy"]))
            rows += x.shape[0]
        metrics = {"accuracy": float(np.mean(hits))} if hits else {}
        return {"loss": float(np.mean(losses)) if losses else None, "metrics": metrics, "examples": rows,
                "seconds": time.perf_counter() - t0}


def _ckpt_key(name: str) -> str:
    return name.replace("/", "__")


class MeshAdapter:
    """DTensor: one step is a ``tf.function`` over the mesh; every client runs every step.

    Every client saves and restores its own shards of the one checkpoint of the run (DTensor's
    save and restore are collective), so a restarted run continues on every client from the
    same step.
    """

    def __init__(self, ctx: TaskContext) -> None:
        if ctx.role != "worker":
            raise ValueError(f"parallelism 'model' runs worker tasks only (one DTensor client each), not {ctx.role!r}")
        config = self.config = ctx.config
        self.ctx = ctx
        setup = ctx.setup_devices()
        info = self.info = make_mesh(config, setup)
        self.lockstep = info.clients > 1
        self.per_execution = 1  # one DTensor function per step (training.steps_per_execution: data and async)
        mesh, p = info.mesh, config.parallelism
        global_batch = self.global_batch = config.training.global_batch_size
        self.replicas = p.mesh_batch
        if global_batch % self.replicas:
            raise ValueError(f"training.global_batch_size: {global_batch} is not divisible by the mesh 'batch' "
                             f"axis size {self.replicas}")
        per_replica_batch = global_batch // self.replicas
        local_names = [n.lstrip("/").replace("device:", "") for n in setup.names]
        client_text = f", client {info.client} of {info.clients}" if info.clients > 1 else ""
        mesh_sizes = dict(p.mesh_dims())
        axes = " × ".join(f"{name} {size}" for name, size in p.mesh_dims())
        ctx.emitter.info(f"DTensor mesh {axes} over {mesh.size} {setup.kind} devices, {mesh.num_local_devices()} "
                         f"on this task{client_text}",
                         strategy="DTensor", mesh=mesh_sizes, client=info.client, clients=info.clients,
                         replica_ids=list(info.owned), devices=[str(d) for d in mesh.local_devices()],
                         device_ids=[int(i) for i in mesh.local_device_ids()],
                         coordinates=[dict(loc) for loc in mesh.local_device_locations()])

        model = self.model = sharded.build_for_config(config, mesh)
        builder = layers.Builder(mesh, config.training.seed)
        optimizer = self.optimizer = layers.Optimizer(config.training.optimizer, config.training.learning_rate,
                                                      model.params, builder)
        # the sharded variables, their optimizer slots and the model's state (dropout counters); every
        # client saves its own shards
        ckpt = tf.train.Checkpoint(**{_ckpt_key(p.name): p.var for p in (*model.params, *model.state)},
                                   **{_ckpt_key(f"{p.name}/{k}"): v
                                      for p, slot in zip(model.params, optimizer.slots, strict=True)
                                      for k, v in slot.items()},
                                   iterations=optimizer.iterations)
        self.checkpoints = Checkpoints(ctx, ckpt, primary=True)
        placement = layers.describe(model.params, mesh)
        if info.client == 0:
            ctx.emitter.emit("placement", mesh=mesh_sizes, devices=mesh.size, model=model.name, variables=placement)
            lines = [layers.describe_line(r) for r in placement]
            ctx.emitter.info(f"{model.name}: {len(placement)} parameters on the mesh\n" + "\n".join(lines),
                             lines=lines)

        self.steps = MeshSteps(model, optimizer, config.data.classes, model_loss(config))
        self.summaries = Summaries(RunFolder(ctx.run_dir).tensorboard, hparams=hparams_of(config),
                                   trial=config.name)
        self.reporter = StepReporter(ctx.emitter, info.owned, per_replica_batch, config.training.metrics_hz, local_names,
                                     memory_info, self.summaries)
        self.batches = _batches(config)
        self.result: tuple[tf.Tensor, tf.Tensor | None] | None = None
        self.timed = breakdown_measured()
        self.input_s = 0.0  # seconds the steps since the last report waited for their batch
        self.input_steps = 0
        # validation (engine.runtime.loop): every client runs it (DTensor functions are collective), the first reports
        self.validator = MeshValidator(self) if config.validation.enabled else None
        self.validation_reported = info.client == 0

    def pack(self, x: np.ndarray, y: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
        """A host batch on the mesh: inputs in the model's ``input_dtype`` where of its kind, rows split on
        ``batch``."""
        return shard_batch(self.info, as_input(x, self.model.input_dtype)), shard_batch(self.info, y)

    def _replica_results(self) -> list[Any]:
        """What the reporter reads of each replica: its loss (and accuracy), and the steps' mean input wait
        since the last report."""
        assert self.result is not None
        results = per_replica(self.info, *self.result)
        if not self.input_steps:
            return results
        waited = self.input_s / self.input_steps
        self.input_s, self.input_steps = 0.0, 0
        return [r._replace(input_wait=waited) if isinstance(r, ReplicaFigures) else ReplicaFigures(r, input_wait=waited)
                for r in results]

    def _replica_losses(self) -> list[float]:
        assert self.result is not None
        return replica_means(self.info, self.result[0])

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> list[Any]:
        """One held-out global batch through ``forward(x, training=False)``: per replica as :meth:`report`
        gives it (the loss, with the accuracy where the loss counts hits)."""
        return per_replica(self.info, *self.steps.evaluate(*self.pack(x, y)))

    # -- the adapter

    def restore(self) -> Restored | None:
        latest = self.checkpoints.restore()
        if latest is None:
            return None
        step = self._optimizer_steps()
        for _ in range(step):  # the data stream carries on where the checkpoint left it
            next(self.batches)
        return Restored(step, latest)

    def run_step(self, step: int, *, last: bool) -> None:
        t0 = time.perf_counter() if self.timed else 0.0
        x, y = next(self.batches)  # every step is its own group (steps_per_execution is 1 in this mode)
        if self.steps.loss is None:  # softmax cross-entropy of one-hot labels: one out of range would count 0
            check_labels(y, self.steps.classes, step)
        packed = self.pack(x, y)
        if self.timed:
            self.input_s += time.perf_counter() - t0
            self.input_steps += 1
        self.result = self.steps.train(*packed)

    def report(self, step: int, *, force: bool) -> None:
        self.reporter.step_done(step, self._replica_results, force=force)

    def settle(self) -> None:
        if self.result is not None:
            self._replica_losses()

    def steps_held(self, counted: int) -> int:
        return max(counted, self._optimizer_steps())

    def _optimizer_steps(self) -> int:
        """The steps the optimizer has applied (restored with a checkpoint)."""
        return int(round(float(self.optimizer.iterations.numpy())))

    def flush(self, step: int) -> None:
        if self.result is not None:
            self.reporter.flush(step, self._replica_results)

    def save(self, step: int) -> str | None:
        path = self.checkpoints.save(step)
        self.reporter.restart_clock()
        self.input_s, self.input_steps = 0.0, 0  # the reporter's clock starts over: so does the steps' mean
        return path

    def final_losses(self) -> list[float]:
        return self._replica_losses() if self.result is not None else []

    def close(self) -> None:
        self.summaries.close()
        if self.info.clients > 1 and not self.ctx.stop.requested:
            # every client has finished its last step before any leaves (the first to exit ends the
            # coordination service)
            dtensor.barrier(self.info.mesh, "clusterdeck-end")
            leave_together(self.info.client, self.info.clients)


#: How long client 0 waits for the others' goodbyes after the end barrier (a client that died meanwhile
#: does not hold it longer).
LEAVE_TIMEOUT_MS = 10_000


def leave_together(client: int, clients: int, kv: Any = None) -> None:
    """Client 0 hosts the coordination service, so it leaves last.

    The end barrier's answer reaches each client over the network; a client 0 that exited as soon as
    its own answer came could take the service down before another client's answer left, and that
    client would fail with "connection reset by peer" after finishing its work. So each other client,
    once its answer came, says goodbye in the service's key-value store, and client 0 waits for every
    goodbye. A goodbye whose own answer is lost (client 0 leaving) is harmless: everything is done.
    ``kv``: the store (TensorFlow's context; tests pass their own).
    """
    kv = tf_context.context() if kv is None else kv
    if client != 0:
        delay = float(os.environ.get("CLUSTERDECK_TEST_LEAVE_DELAY", "0") or 0)  # test-only: a slow goodbye
        if delay > 0:
            time.sleep(delay)
        try:
            kv.set_config_key_value(f"clusterdeck-left/{client}", "1")
        except Exception:  # noqa: BLE001 - client 0 already gone: nothing is left to say goodbye to
            pass
        return
    for other in range(1, clients):
        try:
            kv.get_config_key_value(f"clusterdeck-left/{other}", timeout_in_ms=LEAVE_TIMEOUT_MS)
        except Exception:  # noqa: BLE001 - that client died after the barrier: leave anyway
            pass


def main(ctx: TaskContext) -> dict[str, Any]:
    adapter = MeshAdapter(ctx)
    summary = TrainingLoop(ctx, adapter).run()
    p = ctx.config.parallelism
    summary.update(replicas=adapter.replicas, replica_ids=list(adapter.info.owned),
                   reports=adapter.reporter.reports, mesh=dict(p.mesh_dims()),
                   client=adapter.info.client)
    return summary
