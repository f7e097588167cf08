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
at the first batch of an epoch it equals the mean of the replicas' losses, and ``metrics``: the compiled
metrics Keras logs (running means over every replica, e.g. ``accuracy``); a validation pass gives an
``eval`` event with its ``loss`` and ``metrics``.

**In a ClusterDeck program task** (program mode, :mod:`engine.runtime.program`) the callback is added to
every ``model.fit`` without a line of the program changed, and writes into the task's own events (the
supervisor's pipe and ``tasks/<task>/events.jsonl``) instead of a run folder of its own; replica ids
follow the task's rank as in ClusterDeck's loop.

**Outside ``fit``** (a custom loop calling the hooks itself) Keras' train step never runs, so there is no
per-replica loss to read: the callback records ``logs["loss"]`` for every local replica (and the
examples/s where ``logs`` carry ``size`` or ``batch_size``), and refuses, naming what to pass, when the
loop passes no loss. Legacy tf-keras models (``TF_USE_LEGACY_KERAS=1``) are refused: the callback reads
each replica's loss inside Keras 3's train step, which tf-keras does not have.
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

#: The program session of this task process (program mode), set by :func:`attach`; None: stand-alone.
_session: Any = None


def attach(session: Any) -> None:
    """Make callbacks created without ``run_dir`` or ``config`` write into ``session`` (an
    :class:`engine.runtime.program.ProgramSession`): its emitter, its replica ids, its stop."""
    global _session
    _session = session


def describe_training(model: Any) -> dict[str, Any]:
    """What the compiled model trains with, for the run's ``training`` info event."""
    optimizer = getattr(model, "optimizer", None)
    rate: Any = None
    if optimizer is not None:
        lr = getattr(optimizer, "_learning_rate", None)
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            rate = type(lr).__name__
        else:
            try:
                rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            except (TypeError, ValueError, AttributeError):
                rate = None
    try:
        compiled = model.get_compile_config() or {}
    except (AttributeError, TypeError, ValueError):
        compiled = {}
    loss = compiled.get("loss")
    metrics = compiled.get("metrics") or []
    return {"source": "compile", "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "learning_rate": rate, "loss": _name_of(loss),
            "metrics": [_name_of(m) for m in (metrics if isinstance(metrics, (list, tuple)) else [metrics])],
            "train_step": "custom" if type(model).train_step is not keras.Model.train_step else "keras"}


def _name_of(obj: Any) -> str | None:
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return str(obj.get("class_name") or obj.get("config", {}).get("name") or obj)
    return str(getattr(obj, "name", None) or getattr(obj, "__name__", None) or type(obj).__name__)


def _is_tf_keras(model: Any) -> bool:
    return type(model).__module__.split(".")[0] == "tf_keras" or not isinstance(model, keras.Model)


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
        self._attached: Any = None  # the program session it writes into (program mode)
        self._fit_traced = False  # Keras' train step computed a loss (inside fit): per-replica losses exist
        self._said_outside_fit = False
        self._steps_at_begin = 0

    # -- where the events go

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            self._run_dir = RunFolder.create(default_runs_root(), self.name).path
        return self._run_dir

    # -- hooks

    def set_model(self, model: keras.Model) -> None:
        if _is_tf_keras(model):
            raise TypeError(
                f"ClusterDeckCallback: the model is a {type(model).__module__}.{type(model).__name__}, a legacy "
                f"tf-keras (Keras 2) model (TF_USE_LEGACY_KERAS=1?); tf-keras models are not supported: the "
                f"callback records each replica's loss inside Keras 3's train step, which tf-keras does not "
                f"have. Expected a Keras 3 keras.Model (import keras, TF_USE_LEGACY_KERAS unset), or report "
                f"from your own loop with clusterdeck.report(step, loss=...)")
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
                self._fit_traced = True  # set when the train step is traced: fit's losses are recorded
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
        session = _session if self._run_dir is None and self._config is None else None
        if session is not None:
            self._begin_attached(session, int(steps) * int(epochs) if steps else 0)
            return
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

    def _begin_attached(self, session: Any, steps: int) -> None:
        """Program mode: write into the task's own emitter; the task says running and finished itself."""
        self._attached = session
        self.emitter = session.emitter
        local = len(self._replica_ids)
        self._replica_ids = session.replica_ids(local)
        self._steps_at_begin = self._step
        self._total = self._step + steps if steps else 0
        session.set_total(self._total or None)
        replicas = self._strategy.num_replicas_in_sync
        kind = type(self._strategy).__name__ if tf.distribute.has_strategy() or local > 1 else "no strategy"
        self._info(f"model.fit under {kind}: {replicas} replicas in sync, {local} on this task", strategy=kind,
                   replicas=replicas, local_replicas=local, replica_ids=self._replica_ids)
        if not getattr(session, "said_training", False):
            session.said_training = True
            info = describe_training(self.model)
            self._info(f"training: {info['optimizer']} (learning rate {_rate_text(info['learning_rate'])}), loss "
                       f"{info['loss']}, metrics {', '.join(m for m in info['metrics'] if m) or 'none'} "
                       f"({info['train_step']} train step, from compile)", training=info)
        self._last_clock = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_first_batch = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is None:
            return
        self._step += 1
        self._pending += 1
        if self._attached is not None and self._attached.stop.requested and self.model is not None:
            self.model.stop_training = True  # SIGTERM: fit ends after this batch, the program goes on to its end
        now = time.perf_counter()
        force = self._epoch_first_batch or (self._total and self._step >= self._total)
        self._epoch_first_batch = False
        if not force and now - self._last_report < self.interval:
            return
        self._report(logs or {}, now)

    def _report(self, logs: dict[str, Any], now: float) -> None:
        assert self.emitter is not None
        if self._fit_traced:
            losses = [float(v.numpy()) for v in self._strategy.experimental_local_results(self._loss_var)]
            rows: list[float | None] = [float(v.numpy())
                                        for v in self._strategy.experimental_local_results(self._rows_var)]
        else:
            losses, rows = self._outside_fit(logs)
        now = time.perf_counter()
        step_time = (now - self._last_clock) / max(1, self._pending)
        epoch_loss = logs.get("loss") if self._fit_traced else None
        metrics = {k: v for k, v in ((k, _scalar(v)) for k, v in logs.items() if k not in ("loss", "size", "batch_size"))
                   if v is not None}
        for rid, loss, n in zip(self._replica_ids, losses, rows, strict=True):
            fields: dict[str, Any] = {"replica": rid, "step": self._step, "loss": loss, "step_time": step_time}
            if n is not None:
                fields["examples_per_sec"] = n / step_time if step_time > 0 else 0.0
            if epoch_loss is not None:
                fields["epoch_loss"] = float(epoch_loss)
            if metrics:
                fields["metrics"] = metrics
            self._emit("step", **fields)
        if self._attached is not None:
            self._attached.note_step(self._step, losses)
        self._last_losses = losses
        self._last_report = now
        self._last_clock = now
        self._pending = 0

    def _outside_fit(self, logs: dict[str, Any]) -> tuple[list[float], list[float | None]]:
        """A custom loop calling the hooks itself: its ``logs["loss"]`` for every local replica, or a refusal."""
        loss = _scalar(logs.get("loss"))
        if loss is None:
            raise ValueError(
                f"ClusterDeckCallback: no loss to record at batch {self._step}: outside model.fit the callback "
                f"cannot read each replica's loss (Keras' train step never ran); expected "
                f"on_train_batch_end(batch, logs={{'loss': value}}) from your loop, got logs={logs!r}; or call "
                f"clusterdeck.report(step, loss=...)")
        if not self._said_outside_fit:
            self._said_outside_fit = True
            self._info("ClusterDeckCallback outside model.fit: the loop's logs['loss'] is recorded for every "
                       "replica of this task (per-replica losses need model.fit or clusterdeck.report)",
                       outside_fit=True)
        size = _scalar(logs.get("size", logs.get("batch_size")))
        local = max(1, len(self._replica_ids))
        return [loss] * local, [size / local if size is not None else None] * local

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is not None and logs and _scalar(logs.get("loss")) is not None:
            metrics = {k: v for k, v in ((k, _scalar(v)) for k, v in logs.items() if k != "loss") if v is not None}
            self._emit("eval", step=self._step, loss=_scalar(logs["loss"]), metrics=metrics)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.emitter is None:
            return
        if self._pending:
            self._report(logs or {}, time.perf_counter())
        if self._attached is not None:  # the task says finished, and keeps its emitter
            self.emitter = None
            return
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
        if self._attached is not None:
            assert self.emitter is not None
            self.emitter.emit(kind, **fields)
            return
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
        if self._attached is not None:
            return
        RunFolder(self.run_dir).write_meta(
            name=self.name, state=state, mode="data", source="keras-fit",
            summary=self.state.summary() if self.state is not None else {},
            program=os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "")


def _scalar(value: Any) -> float | None:
    """A float from a number or a scalar tensor or array (None: anything else)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        arr = keras.ops.convert_to_numpy(value)
    except (TypeError, ValueError, AttributeError):
        return None
    return float(arr) if getattr(arr, "size", 0) == 1 else None


def _rate_text(rate: Any) -> str:
    return f"{rate:.4g}" if isinstance(rate, float) else str(rate)
