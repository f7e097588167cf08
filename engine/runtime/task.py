"""Entry point of a task process: ``python -m engine.runtime.task --run-dir DIR``.

Started by the supervisor with ``TF_CONFIG``, ``CLUSTERDECK_TASK`` and
``CLUSTERDECK_DEVICES`` in its environment, an event pipe and a lifeline pipe; or forked,
already imported, from its host's warm-start template (the same module with ``--template-fd``,
:mod:`engine.runtime.template`).
When the supervisor dies the kernel kills the task (``PR_SET_PDEATHSIG``, armed by the
supervisor); where it cannot, the task kills itself when the lifeline closes. So no
task outlives its run. With a ``program`` in the config the task runs the user's program instead of
ClusterDeck's loop (:mod:`engine.runtime.program`). ``SIGTERM`` asks it to stop: a training task reports its
last steps, writes a final checkpoint and exits within
:data:`engine.runtime.stop.STOP_BUDGET_S` seconds (:mod:`engine.runtime.stop`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from engine.contract import config as config_mod
from engine.contract import parent_death, warm_start
from engine.contract.run_folder import STOP_MARKERS_ENV, RunFolder
from engine.runtime import fault_hooks
from engine.runtime.emitter import Emitter
from engine.runtime.program import ProgramFailed
from engine.runtime.stop import EXIT_CODE as STOPPED_EXIT_CODE
from engine.runtime.stop import Stopped, StopSignal, remove_autograph_files


def _watch_lifeline(fd: int) -> None:
    """Kill this process when the lifeline closes; not needed (no thread started) where the kernel already
    kills it with its supervisor (:mod:`engine.contract.parent_death`)."""
    if parent_death.armed():
        return

    def watch() -> None:
        while True:
            try:
                chunk = os.read(fd, 64)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                os.kill(os.getpid(), signal.SIGKILL)
                return

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


#: The run's config as the host's warm-start template read it (the file's bytes, the config): every task forked from
#: the template inherits it and parses nothing where the file still holds those bytes (a config of 64 tasks took a
#: task 20 ms of CPU to parse, on a host starting 8 of them at once).
_preloaded: tuple[bytes, config_mod.RunConfig] | None = None


def preload_config(path: Path) -> None:
    """In the template: read the run's config once for the tasks it forks (any problem: each task reads it itself,
    and says so)."""
    global _preloaded
    try:
        data = path.read_bytes()
        config = config_mod.load(path)
        if path.read_bytes() == data:
            _preloaded = (data, config)
    except Exception:  # noqa: BLE001 - the task reports it where it reads the file itself
        _preloaded = None


def load_config(path: Path) -> config_mod.RunConfig:
    """The run's config: the template's reading where the file still holds what it read, else read now."""
    if _preloaded is not None:
        try:
            if path.read_bytes() == _preloaded[0]:
                return _preloaded[1]
        except OSError:
            pass
    return config_mod.load(path)


def _test_faults(emitter: Emitter) -> None:
    """The faults a test injected (:mod:`engine.runtime.fault_hooks`): a forced failure, a start-up delay."""
    if fault_hooks.should_fail(emitter.task):
        raise RuntimeError(f"test failure requested ({fault_hooks.FAIL})")
    delay = fault_hooks.start_delay()
    if delay > 0:
        emitter.info(f"test delay: sleeping {delay:g} s before start")
        time.sleep(delay)


def summarize_error(exc: BaseException, limit: int = 600) -> str:
    """The lines of an exception a person needs: its type and message, without TF's graph stack dump."""
    message = getattr(exc, "message", None) or str(exc)
    kept = []
    for line in str(message).splitlines():
        text = line.strip()
        if not text or text.startswith(("File ", "Detected at node", "Graph execution error")):
            continue
        if text.startswith("[[") or text.startswith("The error could be from a previous operation"):
            continue
        kept.append(text)
    body = " ".join(kept) or type(exc).__name__
    return f"{type(exc).__name__}: {body}"[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine.runtime.task")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--event-fd", type=int, default=None)
    parser.add_argument("--lifeline-fd", type=int, default=None)
    parser.add_argument("--bare", action="store_true",
                        help="train without telemetry (no events, no files): the benchmark's baseline")
    parser.add_argument("--summary-out", default=None, help="write the final summary here as JSON")
    parser.add_argument(warm_start.TEMPLATE_FLAG, type=int, default=None,
                        help="serve as the host's warm-start template on this socket (engine.runtime.template)")
    args = parser.parse_args(argv)
    if args.template_fd is not None:
        from engine.runtime import template

        preload_config(Path(args.run_dir) / "config.yaml")
        return template.serve(args.template_fd, main)
    run_dir = Path(args.run_dir)
    task = os.environ.get("CLUSTERDECK_TASK", "worker:0")
    events_path = None if args.bare else RunFolder(run_dir).task_events(task)
    # with a pipe, the samples reach the launcher's tiered store: the task's own file keeps the lifecycle only
    emitter = Emitter(task, events_path, None if args.bare else args.event_fd,
                      samples_to_file=args.bare or args.event_fd is None)
    # under a supervisor, a SIGTERM it did not send (no stop marker) is this task's failure, not the run's stop
    supervised = not args.bare and os.environ.get(STOP_MARKERS_ENV) == "1"
    stop = StopSignal(RunFolder(run_dir).stop_marker(task) if supervised else None)
    # before any thread starts (TF's own included): SIGTERM is taken by our watcher thread, not TF's handler
    stop.watch(on_timeout=lambda: _stopped_late(emitter, stop))
    if args.lifeline_fd is not None:
        _watch_lifeline(args.lifeline_fd)
    if not args.bare:  # SIGUSR1 dumps every thread's stack; profile requests (engine.runtime.diagnostics)
        from engine.runtime import diagnostics

        diagnostics.arm(run_dir, task, emitter.info)
        emitter.after_write = diagnostics.look
    code = 0
    try:
        config = load_config(run_dir / "config.yaml")
        _test_faults(emitter)
        simulated = fault_hooks.simulated_step()
        if simulated > 0:  # a test's stand-in for a task: no TensorFlow at all (benchmarks of launching at scale)
            summary = _simulate(config, emitter, stop, simulated)
        else:
            summary = _train(config, run_dir, emitter, stop, bare=args.bare)
        if args.summary_out:
            Path(args.summary_out).write_text(json.dumps(summary), encoding="utf-8")
        _last_word(emitter, "finished", **{k: v for k, v in summary.items()
                                           if k in ("steps", "final_loss", "window_examples_per_sec")})
    except Stopped as exc:
        if exc.external:  # someone else's SIGTERM: this task's failure (the run restarts or fails naming it)
            _last_word(emitter, "failed", reason=exc.reason(task), step=exc.step, checkpoint=exc.checkpoint)
        elif exc.cause_task:  # stopped with a peer that got such a SIGTERM: that peer is the cause
            _last_word(emitter, "stopped", reason=exc.reason(task), step=exc.step, checkpoint=exc.checkpoint,
                       cause_task=exc.cause_task)
        else:
            _last_word(emitter, "stopped", reason="SIGTERM", step=exc.step, checkpoint=exc.checkpoint)
        code = STOPPED_EXIT_CODE
    except KeyboardInterrupt:
        _last_word(emitter, "stopped", reason="interrupted")
        code = 130
    except ProgramFailed as exc:
        if stop.requested:  # ended by the stop (e.g. a collective cut off by a peer that left): not a failure
            _stopped(emitter, stop)
        reason = (summarize_error(exc.error) if exc.error is not None else "") + exc.where
        _last_word(emitter, "failed", reason=reason.strip(), traceback=exc.trace[-4000:])
        sys.stderr.write(exc.trace)
        code = 1
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the user as an event
        if stop.requested:  # a stop cut through whatever the task was doing: not a failure
            _stopped(emitter, stop)
        trace = traceback.format_exc()  # before the last word removes the autograph files it may quote
        _last_word(emitter, "failed", reason=summarize_error(exc), traceback=trace[-4000:])
        sys.stderr.write(trace)
        code = 1
    _exit(emitter, code)


def _train(config: config_mod.RunConfig, run_dir: Path, emitter: Emitter, stop: StopSignal, *,
           bare: bool) -> dict[str, Any]:
    """The task's training (or the user's program) in its mode; the run's summary."""
    from engine.runtime.context import TaskContext  # imports nothing heavy
    from engine.runtime.keras_import import import_keras

    import_keras()  # first, without the notebook extras

    ctx = TaskContext.from_env(config, run_dir, emitter, stop)
    from engine.runtime import nan_guard

    nan_guard.configure(config, emitter)  # training.on_nan: a NaN or infinite loss fails the task, or warns
    mode = config.parallelism.mode
    if config.program is not None:  # the user's own program, unchanged (engine.runtime.program)
        from engine.runtime import program

        return program.run(ctx)
    if mode == "data":
        from engine.runtime import data_parallel

        return data_parallel.main(ctx, telemetry=not bare)
    if mode == "async":
        from engine.runtime import async_ps

        return async_ps.main(ctx)
    if mode == "model":
        from engine.runtime import model_parallel

        return model_parallel.main(ctx)
    raise ValueError(f"parallelism.mode: unknown mode {mode!r}")


def _simulate(config: config_mod.RunConfig, emitter: Emitter, stop: StopSignal, every: float) -> dict[str, Any]:
    """A simulated task (:data:`engine.runtime.fault_hooks.SIMULATE`): what a training task says from its start
    (``running``, then a ``step`` event of its replica, one every ``every`` seconds), without TensorFlow; a stop
    ends it as a training task's does (:class:`~engine.runtime.stop.Stopped`)."""
    _, _, index = emitter.task.rpartition(":")
    replica = int(index) if index.isdigit() else 0
    total = config.total_steps()
    emitter.status("running", step=0, total=total)
    started = time.perf_counter()
    for step in range(1, total + 1):
        if stop.requested:
            raise Stopped(step - 1, None, external=stop.external)
        emitter.emit("step", replica=replica, step=step, loss=1.0 / step, examples_per_sec=1.0 / every,
                     step_time=every)
        time.sleep(every)
    return {"steps": total, "final_loss": [1.0 / max(1, total)],
            "window_examples_per_sec": total / max(1e-9, time.perf_counter() - started)}


def _exit(emitter: Emitter, code: int) -> NoReturn:
    emitter.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # TF's runtime can hang in its own shutdown (servers, collectives); the work is saved: leave now.
    os._exit(code)


def _last_word(emitter: Emitter, state: str, **fields: Any) -> None:
    """The task's terminal status, autograph's source files removed first: ``os._exit`` runs none of the ``atexit``
    handlers that would remove them, and once every task has said its last word the run's end may stop this process
    before it gets there."""
    remove_autograph_files()
    emitter.status(state, **fields)


def _stopped(emitter: Emitter, stop: StopSignal) -> NoReturn:
    """A stop cut through what the task was doing: stopped, or failed where the SIGTERM was not ClusterDeck's."""
    if stop.external:
        _last_word(emitter, "failed", reason=stop.external)
    else:
        _last_word(emitter, "stopped", reason="SIGTERM")
    _exit(emitter, STOPPED_EXIT_CODE)


def _stopped_late(emitter: Emitter, stop: StopSignal) -> None:
    """The stop budget is spent (a server's wait, or a step that never returned): say so before the end."""
    if stop.external:  # a server too: a SIGTERM not ClusterDeck's is this task's failure
        emitter.status("failed", reason=stop.external)
    elif stop.late_reason is not None:
        emitter.status("stopped", reason=stop.late_reason)
    emitter.close()


if __name__ == "__main__":
    sys.exit(main())
