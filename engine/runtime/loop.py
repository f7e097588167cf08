"""The one training loop of every strategy, and the checkpoints of a task.

:class:`TrainingLoop` owns what every mode does the same way: restore and say so ("resumed from
checkpoint ckpt-N at step N"), the ``running`` status, the warm-up before throughput is timed,
reporting, the checkpoint cadence, the final checkpoint, and a stop on request (``SIGTERM``: the
last steps reported, a checkpoint written, :class:`engine.runtime.stop.Stopped` raised).

What differs per strategy is an :class:`Adapter`: how a step runs (``strategy.run`` in a
``tf.function``, ``ClusterCoordinator.schedule``, a DTensor function), how its figures are read,
where checkpoints go.

Steps run in groups of ``training.steps_per_execution`` (Keras' name: one function runs a group of
steps in a ``tf.range`` loop, so the Python dispatch of a step is paid once per group). The loop
alone decides where a group ends (:class:`Groups`): after that many steps, and wherever it needs
every step so far done (the end of the warm-up, a checkpoint, the last step), so that tasks stepping
in lock-step cut the same groups and run the same collectives; they agree to stop at a group's end.

The adapters are :mod:`engine.runtime.data_parallel` (Mirrored and MultiWorkerMirrored),
:mod:`engine.runtime.async_ps` (ParameterServerStrategy) and :mod:`engine.runtime.model_parallel` (DTensor).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tensorflow as tf

from engine.contract import checkpoint_state
from engine.contract.run_folder import RunFolder
from engine.runtime import fault_hooks
from engine.runtime.context import TaskContext
from engine.runtime.stop import Stopped


@dataclass(frozen=True)
class Restored:
    step: int
    checkpoint: str


class Adapter(Protocol):
    """What a strategy gives the loop."""

    #: examples of one step (for throughput): a synchronous step's global batch, an asynchronous step's
    #: one worker batch (``global_batch_size / workers``)
    global_batch: int
    #: whether this task steps in lock-step with others (they agree on the step to stop after)
    lockstep: bool
    #: steps per group (``training.steps_per_execution``; 1: every step runs on its own)
    per_execution: int

    def restore(self) -> Restored | None:
        """Restore the run's latest checkpoint, if any (every task of the run restores the same one)."""

    def run_step(self, step: int, *, last: bool) -> None:
        """Take training step ``step``; ``last``: it ends its group, so run (or schedule) the group now."""

    def report(self, step: int, *, force: bool) -> None:
        """Count step ``step`` as done and report figures when due (``force``: now)."""

    def settle(self) -> None:
        """Return once every step taken so far has finished (a group not run yet runs first)."""

    def steps_held(self, counted: int) -> int:
        """After :meth:`settle`: the steps the training state holds, ``counted`` unless a step the loop saw
        fail had already updated it (a peer lost after the all-reduce: its optimizer counted the step)."""

    def flush(self, step: int) -> None:
        """Report what is still unreported, up to step ``step``."""

    def save(self, step: int) -> str | None:
        """Write a checkpoint of step ``step``; the path (None where this task writes none)."""

    def final_losses(self) -> list[float]:
        """The last loss of each replica this task reports."""

    def close(self) -> None:
        """Release what the adapter holds (summaries, scratch folders, barriers)."""

    # optional: ``validator`` (an engine.runtime.validation.Validator on the one task that validates, else
    # None) and ``summaries`` (where its figures also go)


class TrainingLoop:
    """Train ``config.total_steps()`` steps with an :class:`Adapter`; returns the run's summary."""

    def __init__(self, ctx: TaskContext, adapter: Adapter) -> None:
        self.ctx = ctx
        self.adapter = adapter
        ctx.keep(adapter)  # its datasets and strategy are never torn down: the task exits without it
        self.total = ctx.config.total_steps()
        self.start = 0
        self.done = 0  # the last step known to have finished
        self.window_eps: float | None = None
        self.elapsed = 0.0
        self.cause_why: str | None = None  # what a peer whose SIGTERM was not ClusterDeck's said of it

    def run(self) -> dict[str, Any]:
        ctx, adapter = self.ctx, self.adapter
        restored = adapter.restore()
        if restored is not None:
            self.start = restored.step
            ctx.emitter.info(f"resumed from checkpoint {os.path.basename(restored.checkpoint)} at step "
                             f"{restored.step}: model and optimizer state restored",
                             checkpoint=restored.checkpoint, step=restored.step, resumed_step=restored.step)
        start, total = self.start, self.total
        self.done = start
        every = ctx.config.training.checkpoint_every
        # steady-state throughput, measured the same way with and without telemetry (the benchmark reads it)
        warm_until = start + max(1, min(50, (total - start) // 5))
        window_start: float | None = None
        if start < total:
            ctx.emitter.status("running", step=start, total=total)
        delay = fault_hooks.step_delay(ctx.task)
        agreement = StopAgreement(RunFolder(ctx.run_dir).scratch("stop") / "step" if adapter.lockstep else None,
                                  task=ctx.task)
        validator = getattr(adapter, "validator", None)
        validate_every = ctx.config.validation.every if ctx.config.validation.enabled else 0
        # every task cuts its groups where validation runs, so tasks in lock-step run the same groups
        groups = Groups(adapter.per_execution, total, cuts=(warm_until,), every=every, also_every=validate_every)
        target: int | None = None
        t0 = time.perf_counter()
        try:
            for step in range(start + 1, total + 1):
                end = groups.end_of(step)
                # a stop is agreed at the end of a group: one the peers run whole, as this task does. A peer's
                # proposal is read where a group starts (it cannot be one this task has begun: the proposer
                # writes it before it runs that group, which this task cannot finish without it)
                if step == groups.first or ctx.stop.requested:
                    target = agreement.stop_after(ctx.stop.requested, step - 1, end, external=ctx.stop.external)
                if target is not None and step - 1 >= target:
                    break
                if delay:
                    time.sleep(delay)
                adapter.run_step(step, last=step == end)
                if step == warm_until:
                    adapter.settle()
                    window_start = time.perf_counter()
                adapter.report(step, force=step == total or step == start + 1)
                self.done = step
                if every and step % every == 0 and step < total:
                    adapter.save(step)
                if validator is not None and validate_every and step % validate_every == 0 and step < total:
                    adapter.settle()
                    self._validate(step)
            if not ctx.stop.requested:
                adapter.settle()
        except (tf.errors.OpError, RuntimeError):
            if not ctx.stop.requested:
                raise
            # a peer stopped first and the collective it left failed: the step before is the last one
        self.elapsed = time.perf_counter() - t0
        cause_task: str | None = None
        if target is not None and not ctx.stop.requested and self.done < total:
            # stopped at a step a peer proposed: a stop, never a finish (the steps after were not taken, and a
            # checkpoint named by the run's total would hold earlier weights)
            cause_task = agreement.external_proposer
            ctx.stop.follow()
            self.cause_why = agreement.external_why
        if ctx.stop.requested and self.done < total:
            self._stop(cause_task=cause_task)
        if window_start is not None and total > warm_until:
            self.window_eps = (total - warm_until) * adapter.global_batch / (time.perf_counter() - window_start)
        adapter.flush(total)
        adapter.save(total)
        if validator is not None and validate_every and total > start:
            self._validate(total)
        adapter.close()
        return {"steps": total, "start": start, "final_loss": adapter.final_losses(),
                "window_examples_per_sec": self.window_eps}

    def _validate(self, step: int) -> None:
        from engine.runtime import validation

        adapter: Any = self.adapter
        if getattr(adapter, "validation_reported", True):
            validation.emit(self.ctx, adapter.validator, step, getattr(adapter, "summaries", None))
        else:
            adapter.validator.evaluate()

    def _stop(self, cause_task: str | None = None) -> None:
        """Stopped on request (or with a peer, ``cause_task`` where that peer's SIGTERM was not ClusterDeck's):
        report the last steps, write a checkpoint, raise :class:`Stopped`."""
        ctx, adapter = self.ctx, self.adapter
        step = self.done
        path: str | None = None
        try:
            adapter.settle()
            step = adapter.steps_held(step)  # the checkpoint is named by what it holds
            adapter.flush(step)
            path = adapter.save(step) if step > self.start else None
        except Exception as exc:  # noqa: BLE001 - a stop must end; say what was not saved
            ctx.emitter.info(f"stopped at step {step}: no final checkpoint ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''})", stopped_step=step)
        else:
            if path:
                ctx.emitter.info(f"stopped at step {step}: final checkpoint {os.path.basename(path)} written",
                                 stopped_step=step, checkpoint=path)
        try:
            adapter.close()
        except Exception:  # noqa: BLE001 - closing is best effort on the way out
            pass
        raise Stopped(step, path, external=ctx.stop.external, cause_task=cause_task,
                      cause_why=self.cause_why)


class Groups:
    """Where the groups of steps end: every ``size`` steps, counted from the previous end, and at every
    cut (a step after which the loop needs every step done: the warm-up's end, a checkpoint every
    ``every`` steps, the last step). The same for every task of a run that starts at the same step."""

    def __init__(self, size: int, total: int, *, cuts: tuple[int, ...] = (), every: int = 0,
                 also_every: int = 0) -> None:
        self.size = max(1, size)
        self.total = total
        self.cuts = cuts
        self.every = every
        self.also_every = also_every
        self.first = 0  # the first step of the current group (0: none yet)
        self.end = 0  # its last step

    def end_of(self, step: int) -> int:
        """The last step of the group ``step`` is in (steps are asked in order, from the run's first)."""
        if step > self.end:
            self.first = step
            end = min(step + self.size - 1, self.total)
            for every in (self.every, self.also_every):
                if every:
                    end = min(end, -(-step // every) * every)  # the next checkpoint (validation) at or after step
            for cut in self.cuts:
                if step <= cut < end:
                    end = cut
            self.end = end
        return self.end


class StopAgreement:
    """The step after which tasks that train in lock-step (MultiWorkerMirrored workers, DTensor clients)
    all stop, so that they write the same final checkpoint (DTensor's save is itself collective).

    The first task asked to stop after taking step ``k`` proposes the last step of the group step
    ``k + 1`` is in (``k + 1`` where every step is its own group) in a file of the run folder (created
    once, atomically); every task reads it between steps. A peer cannot finish that group before the
    proposer has started it, that is after the file was written, so none has passed the step when it
    reads it, and every task runs that group whole. Without a shared run folder (``path`` None) a task
    stops at once. A file older than this task is a previous start's and is ignored.

    The file also names the proposer and whether its SIGTERM was ClusterDeck's (``"548 worker:1 1 from pid 9
    (kill)"``: a stop by someone else, and who sent it): its peers then say they stopped with it
    (:attr:`external_proposer`, :attr:`external_why`).
    """

    def __init__(self, path: Path | None, task: str = "") -> None:
        self.path = path
        self.task = task
        self.since = time.time() - 1.0
        self.target: int | None = None
        #: the proposer, where its SIGTERM was not ClusterDeck's (its peers stop because of it), and who sent it
        self.external_proposer: str | None = None
        self.external_why: str | None = None

    def stop_after(self, requested: bool, done: int, group_end: int | None = None, *,
                   external: str | bool | None = None) -> int | None:
        """The step to stop after, or None to go on; ``done`` is the last step taken, ``group_end`` the
        last step of the group the next step is in (default: the next step); ``external``: this task's
        SIGTERM was not ClusterDeck's (why, or True)."""
        if self.target is not None:
            return self.target
        if self.path is None:
            return done if requested else None
        self.target = self._read()
        if self.target is None and requested:
            self.target = self._propose(group_end if group_end is not None else done + 1, external)
        return self.target

    def _read(self) -> int | None:
        try:
            if self.path is None or self.path.stat().st_mtime < self.since:
                return None
            fields = self.path.read_text(encoding="utf-8").split(maxsplit=3)
            step = int(fields[0])
        except (OSError, ValueError, IndexError):
            return None
        if len(fields) >= 3 and fields[2] == "1" and fields[1] != self.task:
            self.external_proposer = fields[1]
            self.external_why = fields[3] if len(fields) > 3 else None
        return step

    def _propose(self, step: int, external: str | bool | None = None) -> int:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        why = f" {external}" if isinstance(external, str) else ""
        tmp.write_text(f"{step} {self.task or '-'} {1 if external else 0}{why}", encoding="utf-8")
        try:
            if self.path.exists() and self._read() is None:
                self.path.unlink(missing_ok=True)  # a previous start's
            os.link(tmp, self.path)  # fails when another task proposed first: its step wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        found = self._read()
        return found if found is not None else step


class Checkpoints:
    """A task's checkpoints: the run's folder for the primary task, its scratch folder otherwise.

    Every task restores the latest checkpoint of the run's folder (the primary's), so all replicas
    continue from the same step with the same variables. A non-primary task still saves where a
    strategy needs every task to save (MultiWorkerMirrored), into its scratch folder in the run
    folder, emptied at start and removed by :meth:`close`.
    """

    def __init__(self, ctx: TaskContext, checkpoint: tf.train.Checkpoint, *, primary: bool) -> None:
        self.checkpoint = checkpoint
        self.primary = primary
        self.shared = Path(ctx.checkpoint_dir)
        self.folder = self.shared if primary else Path(ctx.scratch_dir) / "checkpoints"
        if not primary:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.manager = tf.train.CheckpointManager(checkpoint, str(self.folder), max_to_keep=2)

    def restore(self) -> str | None:
        """Restore the run's latest checkpoint into this task's objects; its path, or None."""
        latest = tf.train.latest_checkpoint(str(self.shared)) or checkpoint_state.latest(self.shared)
        if latest:
            self.checkpoint.restore(latest)
        return latest

    def save(self, step: int) -> str | None:
        try:
            path = self.manager.save(checkpoint_number=step)
        finally:  # a save that failed half-way (a peer lost) may have named its checkpoint already
            if self.primary:
                checkpoint_state.repair(self.folder)
        return path if self.primary else None

    def close(self) -> None:
        if not self.primary:
            shutil.rmtree(self.folder.parent, ignore_errors=True)

