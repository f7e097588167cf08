"""Stream an existing ``model.fit`` into a ClusterDeck run folder.

::

    from engine.runtime.keras_callback import ClusterDeckCallback

    with strategy.scope():
        model = build_and_compile()
    model.fit(ds, epochs=3, callbacks=[ClusterDeckCallback(run_dir="runs/my-fit")])

``fit`` under MultiWorkerMirroredStrategy does not work in Keras 3 (keras-team/keras#20585);
ClusterDeck's own data-parallel runtime covers that case. The folder gets what a launched run has (``config.yaml``, ``run.json``, ``events.jsonl`` and
``tasks/<task>/events.jsonl``, the same versioned events), so ``clusterdeck`` and the desktop
app reopen it, live or finished.

**Per-replica loss.** ``fit`` hands callbacks only the loss averaged over all replicas (and over
the epoch so far). This callback records each replica's own loss as well: it wraps the model's
loss computation so that every replica writes its mean loss over its own slice of the batch into
a per-replica (sync-on-read) variable, and reads each replica's copy when it reports. With
``MirroredStrategy`` a replica is one device of this process (replica ids ``0..n-1``); without a
strategy there is one replica. Step events also carry ``epoch_loss``, the running mean Keras logs:
at the first batch of an epoch it equals the mean of the replicas' losses.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.run_folder import RunFolder, default_runs_root
from engine.observe.telemetry import RunState
from engine.runtime import tf_compat
from engine.runtime.emitter import Emitter


class ClusterDeckCallback(keras.callbacks.Callback):
    """Per-replica ``step`` events of ``model.fit``, at most ``metrics_hz`` reports per second.

    ``run_dir``: the run folder (created; default: a new folder under ``$CLUSTERDECK_RUNS`` or ``runs``).
    ``task``: the task name the events carry. ``name``: the run's name. ``config``: the run's
    config to record (default: this task with as many emulated devices as replicas, and ``model``
    and ``data`` of kind ``script`` with no file named: the app reopens the folder, and a relaunch
    asks for the files first). A ``fit`` that raises leaves the run ``running`` in ``run.json``.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, task: str = "worker:0",
                 metrics_hz: float = 20.0, name: str = "keras-fit",
                 config: config_mod.RunConfig | None = None) -> None:
        super().__init__()
        if metrics_hz <= 0 or not math.isfinite(metrics_hz):
            raise ValueError(f"metrics_hz: expected a number > 0, got {metrics_hz!r}")
        role, _, index = task.partition(":")
        if role not in config_mod.ROLES or not index.isdigit():
            raise ValueError(f"task: expected 'role:index' with a role of {config_mod.ROLES}, got {task!r}")
        self.task = task
        self.name = name
        self.interval = 1.0 / metrics_hz
        self._config = config
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self.emitter: Emitter | None = None
        self._stream: events.EventWriter | None = None
        self.state: RunState | None = None
        self._strategy: Any = tf.distribute.get_strategy()
        self._loss_var: Any = None
        self._rows_var: Any = None
        self._replica_ids: list[int] = []
        self._step = 0
        self._epoch_first_batch = True
        self._last_report = -math.inf
        self._last_clock = 0.0
        self._pending = 0
        self._last_losses: list[float] = []
        self._total = 0

    # -- where the events go

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            self._run_dir = RunFolder.create(default_runs_root(), self.name).path
        return self._run_dir

    # -- hooks

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        with self._strategy.scope():
            kwargs = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ,
                      "aggregation": tf.VariableAggregation.SUM, "dtype": tf.float32}
            self._loss_var = tf.Variable(0.0, name="clusterdeck_replica_loss", **kwargs)
            self._rows_var = tf.Variable(0.0, name="clusterdeck_replica_examples", **kwargs)
        self._wrap_loss(model)

    def _wrap_loss(self, model: keras.Model) -> None:
        """Record each replica's own mean loss and batch size where ``train_step`` computes the loss."""
        if getattr(model, "_clusterdeck_wrapped", None) is self:
            return
        loss_var, rows_var = self._loss_var, self._rows_var

        def record(loss: Any, kwargs: dict[str, Any], args: tuple[Any, ...]) -> None:
            if kwargs.get("training", True) and loss is not None and not tf.distribute.in_cross_replica_context():
                y_pred = kwargs.get("y_pred", args[2] if len(args) > 2 else None)
                # the trainer divides the loss by the replicas in sync; undo it to read this replica's mean
                in_sync = tf.distribute.get_replica_context().num_replicas_in_sync
                loss_var.assign(tf.cast(loss, tf.float32) * float(in_sync))
                if y_pred is not None:
                    rows_var.assign(tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float32))

        tf_compat.wrap_compute_loss(model, record)
        object.__setattr__(model, "_clusterdeck_wrapped", self)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        replicas = self._strategy.num_replicas_in_sync
        try:
            devices = [str(d) for d in self._strategy.extended.worker_devices]
        except RuntimeError:  # the default strategy (no distribution) has no device list
            devices = []
        local = max(1, len(devices))
        index = int(self.task.partition(":")[2])
        base = index * local if replicas > local else 0
        self._replica_ids = list(range(base, base + local))
        params = self.params or {}
        steps = params.get("steps") or 0
        epochs = params.get("epochs") or 1
        self._total = int(steps) * int(epochs) if steps else 0
        run_dir = self.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        config = self._config or self._default_config(replicas)
        config_mod.save(config, run_dir / "config.yaml")
        task_dir = RunFolder(run_dir).task_dir(self.task)
        # the task's own file, and the run's stream (every event, as a launcher writes it)
        self.emitter = Emitter(self.task, task_dir / "events.jsonl")
        self._stream = events.EventWriter(run_dir / "events.jsonl")
        self.state = RunState(total_steps=self._total, tasks=[(self.task, self.task.split(":")[0], "local")])
        self._emit_run("running")
        self._emit("status", state="running", pid=os.getpid(), step=0, total=self._total)
        kind = type(self._strategy).__name__ if tf.distribute.has_strategy() or devices else "no strategy"
        self._info(f"model.fit under {kind}: {replicas} replicas in sync, {local} on this task", strategy=kind,
                   replicas=replicas, local_replicas=local, replica_ids=self._replica_ids, devices=devices)
        self._write_meta("running")
        self._last_clock = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_first_batch = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is None:
            return
        self._step += 1
        self._pending += 1
        now = time.perf_counter()
        force = self._epoch_first_batch or (self._total and self._step >= self._total)
        self._epoch_first_batch = False
        if not force and now - self._last_report < self.interval:
            return
        self._report(logs or {}, now)

    def _report(self, logs: dict[str, Any], now: float) -> None:
        assert self.emitter is not None
        losses = [float(v.numpy()) for v in self._strategy.experimental_local_results(self._loss_var)]
        rows = [float(v.numpy()) for v in self._strategy.experimental_local_results(self._rows_var)]
        now = time.perf_counter()
        step_time = (now - self._last_clock) / max(1, self._pending)
        epoch_loss = logs.get("loss")
        for rid, loss, n in zip(self._replica_ids, losses, rows, strict=True):
            fields: dict[str, Any] = {"replica": rid, "step": self._step, "loss": loss,
                                      "examples_per_sec": n / step_time if step_time > 0 else 0.0,
                                      "step_time": step_time}
            if epoch_loss is not None:
                fields["epoch_loss"] = float(epoch_loss)
            self._emit("step", **fields)
        self._last_losses = losses
        self._last_report = now
        self._last_clock = now
        self._pending = 0

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is not None and logs and "loss" in logs:
            fields = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            self._emit("eval", step=self._step, **fields)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is None:
            return
        if self._pending:
            self._report(logs or {}, time.perf_counter())
        self._emit("status", state="finished", pid=os.getpid(), steps=self._step, final_loss=self._last_losses)
        self._emit_run("finished")
        self._write_meta("finished")
        self.emitter.close()
        self.emitter = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # -- the run folder

    def _default_config(self, replicas: int) -> config_mod.RunConfig:
        """A config that says what ran: this task, its replicas, and a model and data of the user's own
        (``script`` kinds with no file named: relaunching needs ``model.script`` and ``data.path`` filled in)."""
        role, _, index = self.task.partition(":")
        host = config_mod.Host(name="local", gpus=replicas if replicas > 1 else 0,
                               tasks=(config_mod.Task(role, int(index)),))
        return config_mod.RunConfig(
            name=self.name, cluster=config_mod.Cluster(hosts=(host,)),
            data=config_mod.Data(source="script", size=max(8192, replicas)),
            model=config_mod.Model(name="script"),
            training=config_mod.Training(global_batch_size=replicas, steps=max(1, self._total),
                                         metrics_hz=1.0 / self.interval),
        )

    def _emit(self, kind: str, **fields: Any) -> None:
        assert self.emitter is not None
        event = self.emitter.emit(kind, **fields)
        if self._stream is not None:
            self._stream.write(event)
        self._fold(event)

    def _emit_run(self, state: str) -> None:
        event = events.make("run", "launcher", state=state)
        if self._stream is not None:
            self._stream.write(event)
        self._fold(event)

    def _info(self, message: str, **fields: Any) -> None:
        self._emit("info", message=message, **fields)

    def _fold(self, event: dict[str, Any]) -> None:
        if self.state is not None:
            self.state.apply(events.decode(events.encode(event)) or event)

    def _write_meta(self, state: str) -> None:
        RunFolder(self.run_dir).write_meta(
            name=self.name, state=state, mode="data", source="keras-fit",
            summary=self.state.summary() if self.state is not None else {},
            program=os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "")
