"""Model parallelism: a DTensor mesh ``batch`` x ``model`` over the devices of the worker tasks.

One worker task is a single DTensor client owning the whole mesh; several
worker tasks are one client each (``DTENSOR_*`` set by the launcher), and the
mesh spans their devices in task order. Inputs and labels are sharded on
``batch``; parameters as :mod:`engine.runtime.dtensor_layers` lays them out.

Telemetry: a ``step`` event per data-parallel replica (an index on the
``batch`` axis) with the mean loss over its batch shard, reported by the
client holding that replica's ``model``-index-0 device; ``device`` events per
local device; a ``placement`` event with every parameter's live layout.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from engine.contract.config import RunConfig
from engine.contract.run_folder import RunFolder
from engine.runtime import data as data_mod
from engine.runtime import dtensor_layers as layers
from engine.runtime import sharded
from engine.runtime.context import StepReporter, TaskContext
from engine.runtime.devices import DeviceSetup, memory_info
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
        if config.model.name == "mlp" and x.ndim > 2:
            x = x.reshape(x.shape[0], -1)
        yield x, y


def shard_batch(info: MeshInfo, array: np.ndarray, layout: dtensor.Layout) -> tf.Tensor:
    """A host batch as a DTensor sharded on ``batch``: each local device gets its replica's rows."""
    per = array.shape[0] // info.mesh.dim_size(layers.BATCH)
    return dtensor.pack([array[b * per:(b + 1) * per] for b in info.local_batch_index], layout)


def _ckpt_key(name: str) -> str:
    return name.replace("/", "__")


def main(ctx: TaskContext) -> dict[str, Any]:
    if ctx.role != "worker":
        raise ValueError(f"parallelism 'model' runs worker tasks only (one DTensor client each), not {ctx.role!r}")
    config = ctx.config
    setup = ctx.setup_devices()
    info = make_mesh(config, setup)
    mesh, p = info.mesh, config.parallelism
    global_batch = config.training.global_batch_size
    replicas = p.mesh_batch
    if global_batch % replicas:
        raise ValueError(f"training.global_batch_size: {global_batch} is not divisible by the mesh 'batch' axis "
                         f"size {replicas}")
    per_replica = global_batch // replicas
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
    optimizer = layers.Optimizer(config.training.optimizer, config.training.learning_rate, model.params, builder)
    # the sharded variables and their optimizer slots; every client saves its own shards
    ckpt = tf.train.Checkpoint(**{_ckpt_key(p.name): p.var for p in model.params},
                               **{_ckpt_key(f"{p.name}/{k}"): v for p, slot in zip(model.params, optimizer.slots,
                                                                                   strict=True)
                                  for k, v in slot.items()},
                               iterations=optimizer.iterations)
    manager = tf.train.CheckpointManager(ckpt, str(ctx.checkpoint_dir), max_to_keep=2)
    start = 0
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)
        start = int(round(float(optimizer.iterations.numpy())))
        ctx.emitter.info(f"restored checkpoint {os.path.basename(manager.latest_checkpoint)} (step {start})",
                         checkpoint=manager.latest_checkpoint)
    placement = layers.describe(model.params, mesh)
    if info.client == 0:
        ctx.emitter.emit("placement", mesh={"batch": p.mesh_batch, "model": p.mesh_model}, devices=mesh.size,
                         model=model.name, variables=placement)
        lines = [layers.describe_line(r) for r in placement]
        ctx.emitter.info(f"{model.name}: {len(placement)} parameters on the mesh\n" + "\n".join(lines), lines=lines)

    x_layout = dtensor.Layout([layers.BATCH, layers.U], mesh)  # features (flattened) or token ids
    y_layout = dtensor.Layout([layers.BATCH], mesh)
    classes = config.data.classes

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = layers.per_example_loss(model.forward(x), y, classes)
            loss = tf.reduce_mean(per_example)
        grads = tape.gradient(loss, model.variables)
        optimizer.apply(grads)
        return per_example

    def replica_losses(per_example: tf.Tensor) -> list[float]:
        components = dtensor.unpack(per_example)
        return [float(np.mean(components[info.component_of(r)].numpy())) for r in info.owned]

    total = config.total_steps()
    summaries = Summaries(RunFolder(ctx.run_dir).tensorboard(ctx.task))
    reporter = StepReporter(ctx.emitter, info.owned, per_replica, config.training.metrics_hz, local_names,
                            memory_info, summaries)
    batches = _batches(config)
    for _ in range(start):  # the data stream carries on where the checkpoint left it
        next(batches)
    every = config.training.checkpoint_every
    warm_until = start + max(1, min(50, (total - start) // 5))
    window_start: float | None = None
    result: tf.Tensor | None = None
    ctx.emitter.status("running", step=start, total=total)
    for step in range(start + 1, total + 1):
        x, y = next(batches)
        result = train_step(shard_batch(info, x, x_layout), shard_batch(info, y, y_layout))
        if step == warm_until:
            replica_losses(result)
            window_start = time.perf_counter()
        reporter.step_done(step, functools.partial(replica_losses, result),
                           force=step == total or step == start + 1)
        if every and step % every == 0 and step < total:
            manager.save(checkpoint_number=step)
            reporter.restart_clock()
    final = replica_losses(result) if result is not None else []
    manager.save(checkpoint_number=total)
    summaries.close()
    window_eps = None
    if window_start is not None and total > warm_until:
        window_eps = (total - warm_until) * global_batch / (time.perf_counter() - window_start)
    if info.clients > 1:
        # every client has finished its last step before any leaves (the first to exit ends the coordination service)
        dtensor.barrier(mesh, "clusterdeck-end")
    return {"steps": total, "start": start, "replicas": replicas, "final_loss": final,
            "window_examples_per_sec": window_eps, "replica_ids": list(info.owned), "reports": reporter.reports,
            "mesh": {"batch": p.mesh_batch, "model": p.mesh_model}, "client": info.client}
