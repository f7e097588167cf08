"""Model parallelism: a DTensor mesh ``batch`` x ``model`` over the devices of the worker tasks.

One worker task is a single DTensor client owning the whole mesh; several
worker tasks are one client each (``DTENSOR_*`` set by the launcher), and the
mesh spans their devices in task order. Inputs and labels are sharded on
``batch``; parameters as :mod:`engine.runtime.dtensor_layers` lays them out.

The adapter of :class:`engine.runtime.loop.TrainingLoop` for DTensor is :class:`MeshAdapter`; the
data is the run's stream of global batches (:func:`engine.runtime.data.make_dataset` without an
input context: any source, the user's ``make_dataset(None, config)`` included), of which each
client packs the rows of its own devices.

Telemetry: a ``step`` event per data-parallel replica (an index on the
``batch`` axis) with the mean loss over its batch shard, reported by the
client holding that replica's ``model``-index-0 device; ``device`` events per
local device; a ``placement`` event with every parameter's live layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
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
from engine.runtime import sharded
from engine.runtime.context import StepReporter, TaskContext
from engine.runtime.devices import DeviceSetup, memory_info
from engine.runtime.loop import Checkpoints, Restored, TrainingLoop
from engine.runtime.summaries import Summaries


@dataclass(frozen=True)
class MeshInfo:
    mesh: dtensor.Mesh
    client: int
    clients: int
    local_batch_index: tuple[int, ...]  # the batch coordinate of each local device, in local order
    owned: tuple[int, ...]  # replicas (batch indices) this client reports: it holds their model-0 device

    def component_of(self, replica: int) -> int:
        """Position among the local components of the device reporting ``replica``."""
        locations = self.mesh.local_device_locations()
        return next(i for i, loc in enumerate(locations) if loc["batch"] == replica and loc["model"] == 0)


def make_mesh(config: RunConfig, setup: DeviceSetup) -> MeshInfo:
    """The ``batch`` x ``model`` mesh; multi-client when the launcher set ``DTENSOR_NUM_CLIENTS`` > 1."""
    p = config.parallelism
    dims = [(layers.BATCH, p.mesh_batch), (layers.MODEL, p.mesh_model)]
    wanted = p.mesh_batch * p.mesh_model
    clients = int(os.environ.get("DTENSOR_NUM_CLIENTS", "1") or 1)
    if clients > 1:
        dtensor.initialize_accelerator_system(setup.kind)
        found = dtensor.num_global_devices(setup.kind)
        if found != wanted:
            raise ValueError(f"parallelism.mesh: batch x model = {p.mesh_batch} x {p.mesh_model} = {wanted} does "
                             f"not match the {found} {setup.kind} devices of the {clients} DTensor clients")
        mesh = dtensor.create_distributed_mesh(dims, device_type=setup.kind)
        client = dtensor.client_id()
    else:
        if setup.count != wanted:
            raise ValueError(f"parallelism.mesh: batch x model = {p.mesh_batch} x {p.mesh_model} = {wanted} does "
                             f"not match the {setup.count} {setup.kind} devices of this worker")
        mesh = dtensor.create_mesh(dims, devices=[n.replace("/device:", "") for n in setup.names],
                                   device_type=setup.kind)
        client = 0
    locations = mesh.local_device_locations()
    owned = tuple(sorted(loc["batch"] for loc in locations if loc["model"] == 0))
    return MeshInfo(mesh, client, clients, tuple(loc["batch"] for loc in locations), owned)


def _batches(config: RunConfig) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Global batches, the same stream (data, shuffle, seed) as a single data-parallel replica reads."""
    for x, y in data_mod.make_dataset(config).as_numpy_iterator():
        if config.model.name in ("mlp", "script") and x.ndim > 2:  # the mesh feeds rows of features
            x = x.reshape(x.shape[0], -1)
        yield x, y


def shard_batch(info: MeshInfo, array: np.ndarray, layout: dtensor.Layout) -> tf.Tensor:
    """A host batch as a DTensor sharded on ``batch``: each local device gets its replica's rows."""
    per = array.shape[0] // info.mesh.dim_size(layers.BATCH)
    return dtensor.pack([array[b * per:(b + 1) * per] for b in info.local_batch_index], layout)


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
        per_replica = global_batch // self.replicas
        local_names = [n.lstrip("/").replace("device:", "") for n in setup.names]
        client_text = f", client {info.client} of {info.clients}" if info.clients > 1 else ""
        ctx.emitter.info(f"DTensor mesh batch {p.mesh_batch} × model {p.mesh_model} over {mesh.size} {setup.kind} "
                         f"devices, {mesh.num_local_devices()} on this task{client_text}",
                         strategy="DTensor", mesh={"batch": p.mesh_batch, "model": p.mesh_model},
                         client=info.client, clients=info.clients, replica_ids=list(info.owned),
                         devices=[str(d) for d in mesh.local_devices()],
                         device_ids=[int(i) for i in mesh.local_device_ids()],
                         coordinates=[dict(loc) for loc in mesh.local_device_locations()])

        model = sharded.build_for_config(config, mesh)
        builder = layers.Builder(mesh, config.training.seed)
        optimizer = self.optimizer = layers.Optimizer(config.training.optimizer, config.training.learning_rate,
                                                      model.params, builder)
        # the sharded variables and their optimizer slots; every client saves its own shards
        ckpt = tf.train.Checkpoint(**{_ckpt_key(p.name): p.var for p in model.params},
                                   **{_ckpt_key(f"{p.name}/{k}"): v
                                      for p, slot in zip(model.params, optimizer.slots, strict=True)
                                      for k, v in slot.items()},
                                   iterations=optimizer.iterations)
        self.checkpoints = Checkpoints(ctx, ckpt, primary=True)
        placement = layers.describe(model.params, mesh)
        if info.client == 0:
            ctx.emitter.emit("placement", mesh={"batch": p.mesh_batch, "model": p.mesh_model}, devices=mesh.size,
                             model=model.name, variables=placement)
            lines = [layers.describe_line(r) for r in placement]
            ctx.emitter.info(f"{model.name}: {len(placement)} parameters on the mesh\n" + "\n".join(lines),
                             lines=lines)

        self.x_layout = dtensor.Layout([layers.BATCH, layers.U], mesh)  # features (flattened) or token ids
        self.y_layout = dtensor.Layout([layers.BATCH], mesh)
        classes = config.data.classes

        @tf.function
        def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_example = layers.per_example_loss(model.forward(x), y, classes)
                loss = tf.reduce_mean(per_example)
            grads = tape.gradient(loss, model.variables)
            optimizer.apply(grads)
            return per_example

        self.train_step = train_step
        self.summaries = Summaries(RunFolder(ctx.run_dir).tensorboard(ctx.task))
        self.reporter = StepReporter(ctx.emitter, info.owned, per_replica, config.training.metrics_hz, local_names,
                                     memory_info, self.summaries)
        self.batches = _batches(config)
        self.result: tf.Tensor | None = None

    def _replica_losses(self) -> list[float]:
        assert self.result is not None
        components = dtensor.unpack(self.result)
        return [float(np.mean(components[self.info.component_of(r)].numpy())) for r in self.info.owned]

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
        x, y = next(self.batches)  # every step is its own group (steps_per_execution is 1 in this mode)
        self.result = self.train_step(shard_batch(self.info, x, self.x_layout),
                                      shard_batch(self.info, y, self.y_layout))

    def report(self, step: int, *, force: bool) -> None:
        self.reporter.step_done(step, self._replica_losses, force=force)

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
            self.reporter.flush(step, self._replica_losses)

    def save(self, step: int) -> str | None:
        path = self.checkpoints.save(step)
        self.reporter.restart_clock()
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
                   reports=adapter.reporter.reports, mesh={"batch": p.mesh_batch, "model": p.mesh_model},
                   client=adapter.info.client)
    return summary
