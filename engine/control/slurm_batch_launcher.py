"""The launcher inside a Slurm batch job (``clusterdeck sbatch``): ``python -m engine.control.slurm_batch_launcher
RUN``, exec'd by the job's script. It runs the run in the job's allocation (adopted, never ``salloc``), hosted on the
run's control socket as a detached launcher is, and at the time-limit warning (``USR1``) checkpoints and requeues the
job while ``training.restarts`` allows. What the submit side and readers need is :mod:`engine.control.slurm_batch`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import ConfigError
from engine.contract.records import TERMINAL
from engine.contract.run_folder import RunFolder
from engine.control import slurm
from engine.control.slurm_batch import (
    BATCH_CONFIG,
    BATCH_JSON,
    LAUNCHER,
    LAUNCHER_MODULE,
    STOP_REQUEST,
    _append,
    _int,
    _note,
    _record_end,
    _summary,
    executions,
    read_batch,
    restarts_used,
)


class BatchLauncher:
    """One execution of a batch job: the run in this job's allocation, the time-limit warning, the requeue."""

    def __init__(self, folder: RunFolder, job_id: str) -> None:
        self.folder = folder
        self.job_id = job_id
        self.record = read_batch(folder) or {}
        self.allowed = int(self.record.get("restarts_allowed", 0) or 0)
        self.warned = threading.Event()  # USR1: the time limit is near
        self.signum: int | None = None  # SIGTERM or SIGINT: Slurm (or a user) ends the job
        self.action = ""  # "requeue" or "last": what the warning decided
        self.run: Any = None
        self.stopped_step: int | None = None
        self.checkpoint = ""
        self.used = 0

    # -- signals

    def _on_warning(self, signum: int, frame: Any) -> None:
        self.warned.set()

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None or self.action:
            return  # the run is stopping already (a requeue's own SIGTERM comes after it)
        self.signum = signum
        if self.run is not None:
            self.run.stop(reason=self._signal_reason(signum), wait=False)

    def _signal_reason(self, signum: int) -> str:
        try:
            asked = json.loads((self.folder.path / STOP_REQUEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            asked = None
        if isinstance(asked, dict):
            by = asked.get("by")
            return f"stopped by {by}" if isinstance(by, str) and by else "stopped through Slurm (scancel)"
        return (f"Slurm sent {signal.Signals(signum).name} to job {self.job_id} (scancel, preemption, a requeue or "
                "its time limit): the run stopped")

    # -- the run

    def main(self) -> int:
        previous = {s: signal.signal(s, h) for s, h in ((signal.SIGUSR1, self._on_warning),
                                                          (signal.SIGTERM, self._on_stop_signal),
                                                          (signal.SIGINT, self._on_stop_signal),
                                                          (signal.SIGHUP, signal.SIG_IGN))}
        try:
            return self._execute()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _execute(self) -> int:
        from engine.control.detach import RunHost
        from engine.control.launcher import Run
        from engine.control.memory import tune_allocator

        tune_allocator()
        before = executions(self.folder)
        execution = sum(1 for e in before if e.get("kind") == "start") + 1
        node = socket.gethostname()
        _note(self.folder, "start", execution=execution, job_id=self.job_id, node=node, pid=os.getpid(),
              slurm_restart_count=os.environ.get("SLURM_RESTART_COUNT", ""))
        self.used = restarts_used(executions(self.folder))
        left = self.allowed - self.used
        print(f"clusterdeck: execution {execution} of Slurm job {self.job_id} on {node} (pid {os.getpid()}); "
              f"restarts used {self.used} of {self.allowed}", flush=True)
        if left < 0:
            reason = (f"Slurm job {self.job_id} was requeued (execution {execution}) but no restarts are left "
                      f"(training.restarts: {self.allowed}); the run keeps its last checkpoint")
            return self._refuse("failed", reason, 1)
        try:
            config = config_mod.load(self.folder.path / BATCH_CONFIG)
        except ConfigError as exc:
            return self._refuse("failed", f"the submitted config {BATCH_CONFIG} cannot be read: {exc}", 2)
        # the lifecycle's whole-run restarts count against what the requeues left
        config = config_mod.replace(config, training=config_mod.replace(config.training, restarts=left))
        os.environ[slurm.ADOPT_ENV] = self.job_id  # the Slurm transport adopts this job: no salloc
        run = Run(config, run_dir=self.folder.path, checked=True)
        run.add_listener(self._on_event)
        try:
            run.start()
        except ConfigError as exc:
            return self._refuse("failed", f"the run could not start: {exc}", 2)
        self.run = run
        if self.signum is not None:  # a stop signal while it started
            run.stop(reason=self._signal_reason(self.signum), wait=False)
        try:
            host: Any = RunHost(run, detached=True).start()
        except OSError as exc:  # the run goes on without a channel (attach reads the folder): said in the log
            print(f"clusterdeck: no control channel for this run ({exc.strerror or exc})", file=sys.stderr, flush=True)
            host = None
        print(f"clusterdeck: launcher {os.getpid()} hosts {self.folder.path} in Slurm job {self.job_id}", flush=True)
        try:
            while not run.done:
                run.wait(0.5)
                if self.warned.is_set() and not self.action and self.signum is None:
                    self._time_limit_near(run)
        finally:
            if host is not None:
                host.close()
        state = run.state.state
        print(f"clusterdeck: the run ended: {state}", flush=True)
        code = 0 if state in ("finished", "stopped") else 1
        if state == "stopped" and self.action == "requeue":
            self._requeue(run)
            code = 0
        elif state == "stopped" and self.action == "last":
            self._no_restart_left(run)
        elif state == "stopped" and self.signum is not None:
            self._requeued_by_slurm()
        _note(self.folder, "end", execution=execution, state=state, step=run.state.step,
              signal=signal.Signals(self.signum).name if self.signum is not None else "", action=self.action)
        return code

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "info" and isinstance(event.get("stopped_step"), int) and event.get("checkpoint"):
            step = int(event["stopped_step"])
            if self.stopped_step is None or step >= self.stopped_step:
                self.stopped_step = step
                self.checkpoint = str(event["checkpoint"])
        elif kind == "run" and event.get("state") == "restarting":
            _note(self.folder, "run_restart", job_id=self.job_id, reason=str(event.get("reason", "")))

    def _time_limit_near(self, run: Any) -> None:
        """USR1: stop with a final checkpoint; requeue afterwards if a restart is left."""
        if run.done or run.state.state in TERMINAL:
            return
        used = restarts_used(executions(self.folder))
        if used < self.allowed:
            self.action = "requeue"
            reason = (f"Slurm's time limit is near (USR1 to job {self.job_id}): stopping with a final checkpoint, "
                      f"then requeueing the job (restart {used + 1} of {self.allowed})")
            # said before the run's stopped end is: a reader never takes that end for the run's last word
            _note(self.folder, "requeueing", job_id=self.job_id)
        else:
            self.action = "last"
            reason = (f"Slurm time limit reached: stopping with a final checkpoint; no restarts left "
                      f"(training.restarts: {self.allowed})")
        print(f"clusterdeck: {reason}", flush=True)
        run.stop(reason=reason, wait=False)

    def _saved(self) -> str:
        if self.stopped_step is None:
            return "no final checkpoint was written"
        return f"checkpoint at step {self.stopped_step} written"

    def _requeue(self, run: Any) -> None:
        """The run stopped with its checkpoint: it reads pending again, then the job goes back to the queue."""
        step = self.stopped_step
        resume = f"resumes from step {step}" if step is not None else "resumes from its newest checkpoint"
        message = (f"Slurm time limit near: {self._saved()}; Slurm job {self.job_id} requeued (restart "
                   f"{restarts_used(executions(self.folder)) + 1} of {self.allowed}): the run {resume} when Slurm "
                   "starts the job again")
        self._pending_again(message, f"requeued at its time limit; {resume}", requeued_step=step)
        _note(self.folder, "requeue", job_id=self.job_id, step=step, checkpoint=self.checkpoint)
        out = slurm._run(["scontrol", "requeue", self.job_id], check=False)
        if out.returncode != 0:
            said = slurm._first_line(out.stderr) or f"exit code {out.returncode}"
            _record_end(self.folder, "stopped", f"Slurm time limit reached: {self._saved()}; requeueing Slurm job "
                                                f"{self.job_id} failed (scontrol requeue: {said})")
            return
        # Slurm then holds the job for its credentials' lifetime (BeginTime, about 2 minutes) before it can start again
        print(f"clusterdeck: {message}", flush=True)

    def _pending_again(self, message: str, reason: str, **fields: Any) -> None:
        """The folder says queued again: ``run.json`` pending (no launcher), a ``run`` event pending."""
        try:
            self.folder.launcher_json.unlink()
        except FileNotFoundError:
            pass
        meta = self.folder.read_meta()
        summary = _summary(meta)
        summary.update(state="pending", reason=message)
        self.folder.write_meta(state="pending", launcher=None, summary=summary, ended=None)
        _append(self.folder, [
            events.make("info", LAUNCHER, message=message, job_id=self.job_id, **fields),
            events.make("run", LAUNCHER, state="pending", job_id=self.job_id, reason=reason, slurm_state="REQUEUED",
                        message=message)])

    def _no_restart_left(self, run: Any) -> None:
        reason = (f"Slurm time limit reached: {self._saved()}; no restarts left (training.restarts: "
                  f"{self.allowed})")
        print(f"clusterdeck: {reason}", flush=True)
        _record_end(self.folder, "stopped", reason, job_id=self.job_id,
                    **({"stopped_step": self.stopped_step} if self.stopped_step is not None else {}))

    def _requeued_by_slurm(self) -> None:
        """Stopped by Slurm's SIGTERM: where Slurm queues the job again (preemption, a requeue), say so. While
        this execution ends the job reads COMPLETING; a requeue has already counted one more restart."""
        status = slurm.job_status(self.job_id)
        if status is None:
            return
        if status.state not in slurm.PENDING_STATES and status.restarts <= _int(os.environ.get("SLURM_RESTART_COUNT")):
            return
        resume = (f"resumes from step {self.stopped_step}" if self.stopped_step is not None
                  else "resumes from its newest checkpoint")
        self._pending_again(f"Slurm requeued job {self.job_id} (a preemption, a node failure or scontrol requeue): "
                            f"{self._saved()}; the run {resume} when Slurm starts the job again",
                            f"requeued by Slurm; {resume}")
        _note(self.folder, "requeue", job_id=self.job_id, step=self.stopped_step, checkpoint=self.checkpoint, by="slurm")

    def _refuse(self, state: str, reason: str, code: int) -> int:
        print(f"clusterdeck: {reason}", file=sys.stderr, flush=True)
        try:
            _record_end(self.folder, state, reason, job_id=self.job_id)
        except OSError as exc:
            print(f"clusterdeck: cannot record it in {self.folder.path}: {exc.strerror or exc}", file=sys.stderr)
        _note(self.folder, "end", state=state, reason=reason, signal="", action="refused")
        return code




def main(argv: list[str] | None = None) -> int:
    """``python -m engine.control.slurm_batch RUN_DIR``: the launcher of a batch run, run by its batch script."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: python -m {LAUNCHER_MODULE} RUN_DIR (run by the batch script clusterdeck sbatch writes)",
              file=sys.stderr)
        return 2
    folder = RunFolder(Path(argv[0]).resolve())
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    if not job:
        print(f"clusterdeck: {LAUNCHER_MODULE} runs inside the Slurm batch job of a run (SLURM_JOB_ID is not set); "
              "expected to be started by the run's batch script", file=sys.stderr)
        return 2
    record = read_batch(folder)
    if record is None:
        print(f"clusterdeck: {folder.path}: not a batch run folder (no readable {BATCH_JSON}); expected a folder "
              "clusterdeck sbatch made", file=sys.stderr)
        return 2
    if str(record.get("job_id", "")) not in ("", job):
        print(f"clusterdeck: {folder.path} belongs to Slurm job {record.get('job_id')}, not to job {job}; expected "
              "its own batch script to start it", file=sys.stderr)
        return 2
    return BatchLauncher(folder, job).main()


if __name__ == "__main__":
    sys.exit(main())
