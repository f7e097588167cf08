"""Program mode: the user's own training program, run unchanged inside a task process.

When the config names a ``program``, the chief and worker tasks run it instead of ClusterDeck's loop
(in ``parallelism.mode: async`` the workers and ps tasks serve the standard ``tf.distribute.Server``
and the chief runs the program; in ``model`` mode the workers run it with ``DTENSOR_*`` set). The
task has already written nothing of its own: ``TF_CONFIG`` (and the DTensor variables) come from the
plan, as for ClusterDeck's loop.

**In-process, not exec.** The program runs in the task process itself, with
``runpy.run_path(script, run_name="__main__")``: so the event pipe and ``tasks/<task>/events.jsonl``
(:class:`~engine.runtime.emitter.Emitter`), the parent-death and lifeline guards, the ``SIGTERM``
watcher and the warm start (a task forked from a template that imported TensorFlow already) all still
apply, and ``clusterdeck.report`` and the Keras callback write into the task's own emitter. An
``exec`` would lose the pipe's writer and the warm start, and pay TensorFlow's import again.

What the program sees: ``sys.argv`` is ``[script, *program.args]``; ``sys.path[0]`` is the script's
folder (its sibling modules import); the working folder is the **run folder** (outputs with relative
paths land in the run, never in the user's source folder; ``CLUSTERDECK_PROGRAM_DIR`` names the
script's folder); GPUs asked for but absent are emulated as logical CPU devices (a bare
``MirroredStrategy()`` takes them all; ``MultiWorkerMirroredStrategy`` too, through
:func:`engine.runtime.tf_compat.emulate_multi_worker_devices`).

Ends: the program returning (or ``sys.exit(0)``) is ``finished``; an exception or a non-zero exit is
``failed`` with the exception's last line (the user's assertion message) as the reason, and the
program's own frames as the traceback. ``SIGTERM`` makes the next ``report`` raise
:class:`~engine.runtime.stop.Stopped` (and ``model.fit`` stop after its batch); a program that reports
nothing is ended when the stop budget is spent.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from engine.runtime.context import TaskContext
from engine.runtime.stop import Stopped

#: Seconds after the program's start before its tasks say once that it reports no metrics.
SILENT_AFTER_S = 60.0
#: Seconds a server task (async worker or ps) keeps serving after SIGTERM, as in ClusterDeck's own async mode.
SERVER_STOP_DELAY_S = 1.5
#: What the task says when a program that never checks for a stop is ended.
ENDED_REASON = "SIGTERM: the program was ended (it stops politely at its next report or fit batch)"

_session: ProgramSession | None = None


def current() -> ProgramSession | None:
    """The program session of this process (None outside a ClusterDeck program task)."""
    return _session


class ProgramSession:
    """What the user's program reports, turned into the task's ``step``, ``progress`` and ``info`` events."""

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self.emitter = ctx.emitter
        self.stop = ctx.stop
        hz = ctx.config.training.metrics_hz
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self._lock = threading.Lock()
        self.start = time.perf_counter()
        self._lanes: dict[int | None, _Lane] = {}  # per worker in async mode (None: this task's replicas)
        self.last_step = 0
        self.total: int | None = None
        self.steps_reported = 0
        self.last_losses: list[float] = []
        self.said_silent = False

    # -- who this task's replicas are

    def replica_ids(self, local: int, worker: int | None = None) -> list[int]:
        """Ids of this task's ``local`` replicas: data mode ranks the trainers as ClusterDeck's loop does
        (the chief first); async: the worker that ran the step; model: the DTensor client."""
        mode = self.ctx.config.parallelism.mode
        if mode == "async":
            return [worker if worker is not None else 0]
        if mode == "model":
            return [self.ctx.index + i for i in range(local)]
        from engine.runtime.data_parallel import trainer_rank

        base = trainer_rank(self.ctx.config, self.ctx.role, self.ctx.index) * local
        return list(range(base, base + local))

    # -- reporting

    def check_stop(self, step: int) -> None:
        if self.stop.requested:
            raise Stopped(step, None)

    def set_total(self, total: int | None) -> None:
        if total is None or int(total) <= 0 or int(total) == self.total:
            return
        self.total = int(total)
        self.emitter.emit("progress", step=self.last_step, total=self.total)

    def note_step(self, step: int, losses: list[float]) -> None:
        """A step was reported by the Keras callback (it emits its own events)."""
        self.steps_reported += 1
        self.last_step = max(self.last_step, step)
        self.last_losses = losses

    def report(self, step: int, loss: Any = None, metrics: dict[str, Any] | None = None,
               examples: Any = None, total: int | None = None, worker: Any = None) -> None:
        """See :func:`clusterdeck.report`. Rate-limited per replica (async: per worker), as ``training.metrics_hz``
        says; values are read only when a report is due."""
        self.check_stop(step)
        if total is not None:
            self.set_total(total)
        rank = int(_number(worker) or 0) if worker is not None else None
        with self._lock:
            lane = self._lanes.get(rank)
            if lane is None:
                lane = self._lanes[rank] = _Lane(clock=self.start)
            if examples is not None:
                lane.examples += _number(examples) or 0.0
            now = time.perf_counter()
            if now - lane.emitted < self.interval and not (self.total and step >= self.total):
                return
            steps = max(1, int(step) - lane.step)
            step_time = (now - lane.clock) / steps
            losses = _per_replica(loss) if loss is not None else []
            named = {str(k): _per_replica(v) for k, v in (metrics or {}).items()}
            local = max([len(losses), 1, *(len(v) for v in named.values())])
            ids = self.replica_ids(local, rank)
            with self.emitter.batch():
                for i, rid in enumerate(ids):
                    fields: dict[str, Any] = {"replica": rid, "step": int(step), "step_time": step_time}
                    if losses:
                        fields["loss"] = losses[min(i, len(losses) - 1)]
                    if lane.examples and now > lane.clock:
                        fields["examples_per_sec"] = lane.examples / len(ids) / (now - lane.clock)
                    values = {k: v[min(i, len(v) - 1)] for k, v in named.items() if v}
                    if values:
                        fields["metrics"] = values
                    if rank is not None:
                        fields["worker"] = rank
                    self.emitter.emit("step", **fields)
            lane.emitted = lane.clock = now
            lane.step = int(step)
            lane.examples = 0.0
            self.last_step = max(self.last_step, int(step))
            self.steps_reported += 1
            self.last_losses = losses

    def say_silent(self) -> None:
        """Say once that the program reports no metrics (only CPU, memory, GPU and its log are shown)."""
        with self._lock:
            if self.said_silent or self.steps_reported:
                return
            self.said_silent = True
        self.emitter.info("the program reports no metrics: CPU, memory, GPU and its log are shown; report "
                          "losses with clusterdeck.report(step, loss=...) or train with model.fit",
                          program_metrics=False)


@dataclass
class _Lane:
    """The reporting state of one stream of steps: this task's, or one async worker's."""

    clock: float  # when its figures were last reported (or the program started)
    emitted: float = -float("inf")
    step: int = 0
    examples: float = 0.0


def _number(value: Any) -> float | None:
    """A float from a number, a numpy or TF scalar, or a one-element array (None: not a number)."""
    if hasattr(value, "fetch") and callable(value.fetch):  # a ClusterCoordinator RemoteValue
        value = value.fetch()
    if hasattr(value, "numpy"):
        value = value.numpy()
    try:
        import numpy as np

        arr = np.asarray(value, dtype=np.float64)
        return float(arr.mean()) if arr.size else None
    except (TypeError, ValueError):
        return None


def _per_replica(value: Any) -> list[float]:
    """One float per local replica: a per-replica value of ``strategy.run`` gives each replica's, a plain
    number (float, tensor, RemoteValue) one."""
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
        parts = (strategy.experimental_local_results(value) if strategy is not None
                 else getattr(value, "values", (value,)))
        return [v for v in (_number(p) for p in parts) if v is not None]
    if isinstance(value, (list, tuple)):
        return [v for v in (_number(p) for p in value) if v is not None]
    number = _number(value)
    return [] if number is None else [number]


# --------------------------------------------------------------------------- running the program


def run(ctx: TaskContext) -> dict[str, Any]:
    """Entry of a program-mode task; returns the summary the task's ``finished`` status carries."""
    program = ctx.config.program
    assert program is not None
    mode = ctx.config.parallelism.mode
    if mode == "async" and ctx.role in ("worker", "ps"):
        return serve(ctx)
    global _session
    session = _session = ProgramSession(ctx)
    _setup_devices(ctx)
    _hook_fit(session)
    script = Path(os.path.expanduser(program.script)).resolve()
    ctx.stop.late_reason = ENDED_REASON
    ctx.emitter.status("running", program=str(script), args=list(program.args))
    timer = threading.Timer(SILENT_AFTER_S, session.say_silent)
    timer.daemon = True
    timer.start()
    try:
        _run_path(script, list(program.args))
    finally:
        timer.cancel()
    if ctx.stop.requested:
        raise Stopped(session.last_step, None)
    session.say_silent()
    return {"steps": session.last_step, "final_loss": session.last_losses}


def serve(ctx: TaskContext) -> dict[str, Any]:
    """An async worker or ps task: the standard gRPC server, served until the launcher ends it."""
    import tensorflow as tf

    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    ctx.stop.budget_s = SERVER_STOP_DELAY_S  # the chief's last steps still reach it
    ctx.stop.late_reason = None
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
    ctx.emitter.status("running", target=server.target)
    from engine.runtime import diagnostics

    diagnostics.wait_forever()  # the launcher stops this process when the run ends


def _setup_devices(ctx: TaskContext) -> None:
    """Emulate the GPUs asked for where there are none, so the program's strategy finds as many replicas."""
    if ctx.devices <= 1 and not ctx.gpus_assigned:
        return
    setup = ctx.setup_devices()
    trainers = len(ctx.config.trainer_tasks())
    if setup.kind == "CPU" and setup.count > 1 and trainers > 1 and ctx.config.parallelism.mode == "data":
        from engine.runtime import tf_compat

        try:
            tf_compat.emulate_multi_worker_devices(setup.count)
        except (ImportError, tf_compat.CompatError) as exc:
            ctx.emitter.info(f"one replica per worker: this TensorFlow cannot emulate several devices per worker "
                             f"({exc})")


def _hook_fit(session: ProgramSession) -> None:
    """``keras.Model.fit`` gets a :class:`~engine.runtime.keras_callback.ClusterDeckCallback` (one per model,
    so its step count runs on across ``fit`` calls) unless the program passes one itself."""
    import keras

    from engine.runtime import keras_callback
    from engine.runtime.keras_callback import ClusterDeckCallback

    keras_callback.attach(session)  # the callback writes into this task's emitter (no import back: no cycle)
    original = keras.Model.fit
    if getattr(original, "_clusterdeck_hook", False):
        return

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        callbacks = list(kwargs.get("callbacks") or [])
        if not any(isinstance(c, ClusterDeckCallback) for c in callbacks):
            cb = getattr(self, "_clusterdeck_callback", None)
            if cb is None:
                cb = ClusterDeckCallback()
                object.__setattr__(self, "_clusterdeck_callback", cb)
            callbacks.append(cb)
            kwargs["callbacks"] = callbacks
        return original(self, *args, **kwargs)

    fit._clusterdeck_hook = True  # type: ignore[attr-defined]
    fit.__doc__ = original.__doc__
    keras.Model.fit = fit  # type: ignore[method-assign]


def _run_path(script: Path, args: list[str]) -> None:
    """Run ``script`` as ``python script args...`` would, in this process; raise :class:`ProgramFailed`."""
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    os.environ["CLUSTERDECK_PROGRAM_DIR"] = str(script.parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return
        if isinstance(exc.code, int):
            raise ProgramFailed(None, f"the program exited with code {exc.code}", "") from None
        raise ProgramFailed(None, str(exc.code), "") from None
    except (Stopped, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the program is reported as its own
        raise ProgramFailed(exc, _where(exc, script), _own_traceback(exc, script)) from exc


class ProgramFailed(Exception):
    """The program failed: with ``error`` (its exception; the task summarises it, followed by ``where``, the
    program's line), or without (``where`` says how it exited); ``trace`` holds the program's own frames."""

    def __init__(self, error: BaseException | None, where: str, trace: str) -> None:
        super().__init__(where)
        self.error = error
        self.where = where
        self.trace = trace


def _program_frames(tb: TracebackType | None, script: Path) -> TracebackType | None:
    """The traceback from the program's first frame on (runpy's and ClusterDeck's left out)."""
    while tb is not None and Path(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return tb


def _where(exc: BaseException, script: Path) -> str:
    """`` (train.py, line 12)``: the program's innermost line of its own file in the traceback."""
    tb = _program_frames(exc.__traceback__, script)
    line = None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == script:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" ({script.name}, line {line})" if line is not None else ""


def _own_traceback(exc: BaseException, script: Path) -> str:
    tb = _program_frames(exc.__traceback__, script) or exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb))
