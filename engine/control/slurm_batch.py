"""Slurm runs that survive logout: a Slurm group submitted as a batch job, its launcher inside the job.

``clusterdeck sbatch PRESET`` (:func:`submit`) checks the preset, makes the run folder, writes the batch script
into it and submits it with ``sbatch --parsable`` (held until the folder says *pending*, then released), and
returns: the run reads *pending* (the app's *Queued*) with the job id and Slurm's reason until the job starts.

Slurm runs the script on the job's first node. It execs ``python -m engine.control.slurm_batch_launcher RUN``,
the run's launcher: a :class:`~engine.control.launcher.Run` of the run folder whose Slurm transport *adopts* the
job it runs in (:data:`engine.control.slurm.ADOPT_ENV`: no ``salloc``, no nested job; each node's supervisor
still starts with ``srun --jobid=J --overlap``), hosted on the run's control socket as a detached launcher is
(:class:`~engine.control.detach.RunHost`): ``clusterdeck attach``, ``ls`` and ``stop`` find it from the folder.

**The time limit.** ``--signal=B:USR1@S`` warns the launcher S seconds before the limit. It stops the run as the
app's Stop does (each task reports its last steps and writes its final checkpoint) and, while
``training.restarts`` allows, requeues the job (``scontrol requeue``): the run reads pending again, and the next
execution of the script resumes from that checkpoint, its step count carried on. With no restart left it ends
*stopped*: "Slurm time limit reached: checkpoint at step N written; no restarts left". Every execution after the
first counts as one restart, and so does a whole-run restart inside an execution; they are kept in
``slurm-executions.jsonl``, so the limit holds across requeues. A job Slurm requeues by itself (``--requeue``:
a node failure, or preemption where the cluster requeues preempted jobs) resumes the same way from the newest
checkpoint in the folder.

**Files** of a batch run, beside the usual ones: ``slurm-batch.sh`` (the script), ``slurm-batch.json`` (the job
id, the sbatch command, the restarts allowed; written by the submitter only), ``slurm-batch.yaml`` (the config as
submitted: ``config.yaml`` becomes each execution's resolved config, split by node), ``slurm-executions.jsonl``
(one line per execution's start, whole-run restart, requeue and end; the launcher's) and ``launcher.log`` (the
job's output: the launcher's stdout and stderr, appended to by every execution).

**Readers.** :func:`batch_state` tells what a batch run's folder alone cannot: a job cancelled while queued, a
launcher killed with its job (``SIGKILL`` at the time limit, a node lost), a run Slurm requeued. It asks
``scontrol show job``, then ``sacct`` once the controller has forgotten the job (``MinJobAge``).
:func:`stop_run` stops a batch run from anywhere the Slurm commands work: a queued job is cancelled, a running one's
launcher is sent ``SIGTERM`` (it stops the run with its final checkpoint).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract import datasets, events
from engine.contract.config import ConfigError, Host, Problem, RunConfig
from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, RunFolder, write_atomic
from engine.control import slurm
from engine.control.launcher_info import folder_state, read_launcher
from engine.control.slurm import JobStatus, SlurmError

__all__ = ["BATCH_CONFIG", "BATCH_JSON", "BATCH_SCRIPT", "DEFAULT_WARNING_S", "EXECUTIONS", "BatchState",
           "Submitted", "batch_problems", "batch_state", "is_batch_run", "read_batch", "restarts_used",
           "sbatch_command", "stop_run", "submit"]

BATCH_JSON = "slurm-batch.json"
BATCH_SCRIPT = "slurm-batch.sh"
BATCH_CONFIG = "slurm-batch.yaml"
EXECUTIONS = "slurm-executions.jsonl"
#: Written by :func:`stop_run` before it signals a running job's launcher: who asked (the stop's reason).
STOP_REQUEST = "slurm-stop-request.json"
#: Seconds before the time limit at which Slurm warns the launcher (``--signal=B:USR1@S``): time for the tasks'
#: final checkpoint and a requeue. Slurm may send it up to a minute earlier (its timers tick about once a minute).
DEFAULT_WARNING_S = 120
MIN_WARNING_S = 10
MAX_WARNING_S = 65535  # Slurm's limit for --signal's @time
LAUNCHER_MODULE = "engine.control.slurm_batch_launcher"
#: The launcher's word in the run's events (as the launcher's own are).
LAUNCHER = "launcher"


class BatchRefused(SlurmError):
    """The batch job could not be submitted (nothing was left in the queue); the message says why."""


@dataclass(frozen=True)
class Submitted:
    """A batch run just submitted: its job, its folder, and the job's state right after the submission."""

    job_id: str
    folder: RunFolder
    group: str
    status: JobStatus | None
    command: tuple[str, ...]


@dataclass(frozen=True)
class BatchState:
    """A batch run's state as its folder and Slurm tell it together (see :func:`batch_state`)."""

    state: str  # the run's: pending, starting, running, ..., finished, failed, stopped, interrupted
    reason: str  # why (Slurm's explanation where Slurm was asked)
    job_id: str
    slurm_state: str = ""  # Slurm's word (PENDING, RUNNING, COMPLETED, ...) where Slurm was asked


# --------------------------------------------------------------------------- the submitting side


def batch_problems(config: RunConfig) -> list[Problem]:
    """Why ``config`` cannot run as one batch job: it needs exactly one Slurm group and no other host (the
    launcher runs on the job's first node, where no other host of the config is reachable as it would be)."""
    hosts = config.cluster.hosts
    groups = [(i, h) for i, h in enumerate(hosts) if h.is_slurm]
    if not groups:
        kinds = ", ".join(f"{h.name!r}" for h in hosts) or "none"
        return [Problem("cluster.hosts", f"a batch job runs a Slurm group (a host of kind: slurm), but this preset "
                                         f"has none (hosts: {kinds}); expected one, or run it with clusterdeck run")]
    if len(groups) > 1:
        names = ", ".join(repr(h.name) for _, h in groups)
        return [Problem("cluster.hosts", f"a batch job holds one Slurm group, but this preset has {len(groups)} "
                                         f"({names}); expected one: submit one preset per group, or run it with "
                                         "clusterdeck run (one salloc per group)")]
    others = [(i, h) for i, h in enumerate(hosts) if not h.is_slurm]
    if others:
        i, h = others[0]
        return [Problem(f"cluster.hosts[{i}]", f"host {h.name!r} is not a Slurm group: a batch job's launcher runs on "
                                               "a node of the job, which holds every task; expected only the Slurm "
                                               "group, or run it with clusterdeck run")]
    i, h = groups[0]
    if not h.tasks:
        return [Problem(f"cluster.hosts[{i}].tasks", f"the Slurm group {h.name!r} has no tasks; expected at least one")]
    return []


def _group(config: RunConfig) -> Host:
    return next(h for h in config.cluster.hosts if h.is_slurm)


def batch_script(folder: RunFolder, python: str) -> str:
    """The batch script: it execs the run's launcher (so Slurm's ``B:USR1`` warning reaches it), with this
    checkout first on the path, as every supervisor gets it."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    return "\n".join([
        "#!/bin/sh",
        f"# The Slurm batch job of ClusterDeck run {folder.path.name} (clusterdeck sbatch; the sbatch command is in",
        f"# {BATCH_JSON}). Slurm runs it on the job's first node, and again after each requeue: it execs the run's",
        "# launcher, which adopts this job's allocation and resumes from the run's newest checkpoint.",
        f"export PYTHONPATH={shlex.quote(root)}\"${{PYTHONPATH:+:$PYTHONPATH}}\"",
        f"exec {shlex.quote(python)} -m {LAUNCHER_MODULE} {shlex.quote(str(folder.path))}",
        "",
    ])


def sbatch_command(host: Host, folder: RunFolder, *, warning_s: int = DEFAULT_WARNING_S) -> list[str]:
    """``sbatch`` of the run's script: the group's allocation options (as ``salloc`` gets them), the job's output
    into the run folder (appended to by every execution), the time-limit warning to the batch shell only, and
    ``--requeue``; held (``--hold``) until the folder says the run is queued. ``slurm.sbatch_options`` come last:
    the user's own win."""
    assert host.slurm is not None
    name = slurm.job_name(folder.path.name, host.name)
    return ["sbatch", "--parsable", "--hold", *slurm.allocation_options(host, name),
            f"--output={folder.launcher_log}", "--open-mode=append", f"--chdir={folder.path}",
            f"--signal=B:USR1@{warning_s}", "--requeue", *host.slurm.sbatch_options, str(folder.path / BATCH_SCRIPT)]


def submit(config: RunConfig, runs_root: str | Path, *, warning_s: int = DEFAULT_WARNING_S,
           deep: bool = True) -> Submitted:
    """Check ``config``, make its run folder, submit its batch job; return as soon as Slurm has queued it.

    Raises :class:`ConfigError` for a config that cannot be a batch job (nothing made), :class:`SlurmError`
    when Slurm is not here or refuses the job (the run folder is removed again). ``deep`` also checks the data
    files and the user's script (a subprocess), as ``clusterdeck run`` does.
    """
    from engine.control.launcher import launch_problems

    if not MIN_WARNING_S <= warning_s <= MAX_WARNING_S:
        raise ConfigError([Problem("--signal-before", f"expected seconds between {MIN_WARNING_S} and "
                                                      f"{MAX_WARNING_S}, got {warning_s}")], config.name)
    problems = batch_problems(config)
    if problems:
        raise ConfigError(problems, config.name)
    ok, why = slurm.slurm_available()
    if ok and shutil.which("sbatch") is None:
        ok, why = False, "Slurm's sbatch is not installed here"
    if not ok:
        raise SlurmError(f"{why}; a batch job is submitted from a submit host of a Slurm cluster")
    problems = launch_problems(config, deep=deep) or slurm.check_config(config)
    if problems:
        raise ConfigError(problems, config.name)
    config = _absolute(config)  # the job runs in the run folder: relative paths are the submitter's
    host = _group(config)
    folder = RunFolder.create(runs_root, config.name)
    job_id = ""
    try:
        folder.write_config(config)
        write_atomic(folder.path / BATCH_CONFIG, config_mod.dumps(config))
        _empty_series(folder)
        script = folder.path / BATCH_SCRIPT
        write_atomic(script, batch_script(folder, host.python))
        script.chmod(0o700)
        cmd = sbatch_command(host, folder, warning_s=warning_s)
        out = slurm._run(cmd, check=False)
        if out.returncode != 0:
            said = slurm._first_line(out.stderr) or f"exit code {out.returncode}"
            raise BatchRefused(f"sbatch refused the batch job of Slurm group {host.name!r}: {said}")
        job_id = out.stdout.strip().split(";")[0].strip()
        if not job_id.isdigit():
            raise BatchRefused(f"sbatch gave no job id for Slurm group {host.name!r} (it printed "
                               f"{out.stdout.strip()[:80]!r})")
        status = slurm.job_status(job_id)
        write_atomic(folder.path / BATCH_JSON, json.dumps({
            "job_id": job_id, "group": host.name, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "submit_host": socket.gethostname(), "command": cmd, "warning_s": warning_s,
            "restarts_allowed": config.training.restarts}, indent=2))
        queued = JobStatus(job_id, "PENDING", "None", partition=status.partition if status else "")
        message = queued.explain()
        folder.write_meta(name=config.name, state="pending", mode=config.parallelism.mode, step=0, slurm_job=job_id,
                          summary={"state": "pending", "reason": message, "total_steps": config.total_steps()})
        _append(folder, [
            events.make("info", LAUNCHER, message=f"Slurm job {job_id} submitted for {host.name!r} as a batch job: "
                                                  "its launcher runs inside it, on the job's first node",
                        job_id=job_id, host=host.name),
            events.make("info", LAUNCHER, message=message, job_id=job_id, slurm_state="PENDING",
                        slurm_reason="None", host=host.name),
            events.make("run", LAUNCHER, state="pending", job_id=job_id, reason="None", slurm_state="PENDING",
                        host=host.name, message=message)])
        released = slurm._run(["scontrol", "release", job_id], check=False)
        if released.returncode != 0:
            said = slurm._first_line(released.stderr) or f"exit code {released.returncode}"
            raise BatchRefused(f"Slurm job {job_id} could not be released from its hold (scontrol release): {said}")
    except BaseException:
        if job_id:
            slurm.cancel(job_id)
        shutil.rmtree(folder.path, ignore_errors=True)
        raise
    return Submitted(job_id=job_id, folder=folder, group=host.name, status=slurm.job_status(job_id), command=tuple(cmd))


def _absolute(config: RunConfig) -> RunConfig:
    """Data, model and program paths made absolute where the submitter wrote them (as :meth:`Run.start` does)."""
    config = datasets.absolute_paths(config)
    program = config.program
    if program is not None and program.script.strip():
        config = config_mod.replace(config, program=config_mod.replace(
            program, script=os.path.abspath(os.path.expanduser(program.script))))
    return config


def _empty_series(folder: RunFolder) -> None:
    """The run's sample store, empty (as its launcher's writer starts it): a front end that attaches while the job
    is queued then follows the samples its launcher writes later (a reader follows a store that exists)."""
    root = folder.path / "series"  # the launcher's RunRecord writes it there (SeriesWriter)
    root.mkdir(mode=0o700, exist_ok=True)
    os.close(os.open(root / "owners.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644))


def _append(folder: RunFolder, lines: list[dict[str, Any]]) -> None:
    """Events appended to ``events.jsonl`` (whole lines, one write each): the batch side's own word."""
    writer = events.EventWriter(folder.events)
    try:
        for event in lines:
            writer.write(event)
    finally:
        writer.close()


# --------------------------------------------------------------------------- the folder's Slurm record


def read_batch(folder: RunFolder) -> dict[str, Any] | None:
    """``slurm-batch.json`` of a batch run; None for any other run."""
    try:
        data = json.loads((folder.path / BATCH_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_batch_run(folder: RunFolder) -> bool:
    """Whether the run was submitted as a Slurm batch job (``clusterdeck sbatch``)."""
    return (folder.path / BATCH_JSON).is_file()


def executions(folder: RunFolder) -> list[dict[str, Any]]:
    """The lines of ``slurm-executions.jsonl`` (a torn last line is skipped)."""
    try:
        text = (folder.path / EXECUTIONS).read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def restarts_used(lines: list[dict[str, Any]]) -> int:
    """Restarts a batch run has used: every execution after the first, and every whole-run restart inside one."""
    starts = sum(1 for e in lines if e.get("kind") == "start")
    return max(0, starts - 1) + sum(1 for e in lines if e.get("kind") == "run_restart")


def _note(folder: RunFolder, kind: str, **fields: Any) -> None:
    line = json.dumps({"kind": kind, "t": time.time(), "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields})
    fd = os.open(folder.path / EXECUTIONS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def _launcher_alive_here(folder: RunFolder) -> bool:
    """Whether ``launcher.json`` names a launcher on this machine that still runs (then the folder is right)."""
    info = read_launcher(folder)
    return info is not None and info.host == socket.gethostname() and info.alive()


#: Seconds an answer of Slurm about a job is reused by :func:`batch_state` (followers ask twice a second; the
#: controller is shared by every user of the cluster).
STATUS_TTL_S = 2.0
_asked: dict[str, tuple[float, JobStatus | None, str]] = {}
_asked_lock = threading.Lock()


def _job_status(job: str, fresh: bool = False) -> tuple[JobStatus | None, str]:
    now = time.monotonic()
    with _asked_lock:
        cached = _asked.get(job)
    if cached is not None and not fresh and now - cached[0] < STATUS_TTL_S:
        return cached[1], cached[2]
    status, why = slurm.final_status(job)
    with _asked_lock:
        _asked[job] = (time.monotonic(), status, why)
        if len(_asked) > 256:
            _asked.pop(next(iter(_asked)))
    return status, why


def batch_state(folder: RunFolder, state: str | None = None, *, fresh: bool = False) -> BatchState | None:
    """A batch run's state, Slurm asked where its folder cannot know; None for a run that is no batch run.

    ``state`` is what the folder says (``engine.control.detach.run_state``; read here when not given). Slurm is
    asked (``scontrol``, else ``sacct``) only while that state is live, ``interrupted`` or a stop the job may come
    back from, and no launcher is seen alive on this machine: a job cancelled while queued reads *stopped*, one
    Slurm ended with its launcher *failed* (TIMEOUT, NODE_FAIL, ...), one queued again (a requeue) *pending*. A run
    stopped at the time-limit warning whose requeue is under way reads *restarting*, never ended. Slurm's answer
    about a job is reused for :data:`STATUS_TTL_S` seconds unless ``fresh``.
    """
    record = read_batch(folder)
    if record is None:
        return None
    meta = folder.read_meta()
    if state is None:
        state = folder_state(folder, meta)
    summary = meta.get("summary")
    reason = str(summary.get("reason") or "") if isinstance(summary, dict) else ""
    job = str(record.get("job_id") or "")
    # a stop at the warning whose requeue is under way, or a stop by Slurm's signal: the job may come back
    last = _last_word(folder) if state == "stopped" else ""
    if not job or not (state in LIVE_STATES or state in (INTERRUPTED, "") or last):
        return BatchState(state, reason, job)
    if _launcher_alive_here(folder):
        if last == "requeueing":
            return BatchState("restarting", f"requeueing Slurm job {job} at its time limit", job)
        return BatchState(state, reason, job)
    status, why = _job_status(job, fresh)
    if last:
        if status is not None and status.pending:
            return BatchState("pending", status.explain(), job, status.state)
        if status is not None and status.running:
            if last == "requeueing":
                return BatchState("restarting", f"requeueing Slurm job {job} at its time limit", job, status.state)
            if status.restarts > _int(_last_start(folder).get("slurm_restart_count")):  # an execution after it
                return BatchState("starting", status.explain(), job, status.state)
        return BatchState(state, reason, job, status.state if status is not None else "")
    if status is None:
        return BatchState(INTERRUPTED, f"the run's launcher is gone and {why}", job)
    if status.pending:
        return BatchState("pending", status.explain(), job, status.state)
    if not status.ended:  # running (its launcher on another node, or starting), completing
        if state == "pending":  # its launcher is starting, unless this is the execution that requeued it ending
            start = _last_start(folder)
            again = not start or status.restarts > _int(start.get("slurm_restart_count"))
            return BatchState("starting" if again and status.running else "pending", reason, job, status.state)
        return BatchState(state, reason, job, status.state)
    if status.state == "CANCELLED":
        return BatchState("stopped", f"{status.explain()} before its launcher recorded an end", job, status.state)
    if status.state == "COMPLETED":
        return BatchState(INTERRUPTED, f"{status.explain()} without its launcher recording how the run ended",
                          job, status.state)
    return BatchState("failed", status.explain(), job, status.state)


def _last_start(folder: RunFolder) -> dict[str, Any]:
    return next((e for e in reversed(executions(folder)) if e.get("kind") == "start"), {})


def _last_word(folder: RunFolder) -> str:
    """How the last execution ends: ``requeueing`` (stopped at the warning, the requeue under way), ``signal``
    (ended on a signal from Slurm: cancelled, preempted, requeued), else ``""``."""
    lines = [e for e in executions(folder) if e.get("kind") in ("start", "end", "requeueing")]
    if not lines:
        return ""
    if lines[-1].get("kind") == "requeueing":
        return "requeueing"
    return "signal" if lines[-1].get("kind") == "end" and lines[-1].get("signal") else ""


def stop_run(folder: RunFolder, by: str = "") -> str:
    """Stop a batch run through Slurm (from any submit host): a queued job is cancelled and the run recorded
    stopped; a running one's launcher gets ``SIGTERM`` (``scancel --batch``) and stops the run as Ctrl+C would,
    each task writing its final checkpoint. Returns what was done; raises :class:`SlurmError` when it cannot."""
    record = read_batch(folder)
    if record is None or not record.get("job_id"):
        raise SlurmError(f"{folder.path}: not a Slurm batch run (no {BATCH_JSON}); expected a run clusterdeck "
                         "sbatch submitted")
    job = str(record["job_id"])
    now = batch_state(folder, fresh=True)
    state = now.state if now is not None else ""
    who = f"stopped by {by}" if by else "stopped through Slurm"
    if state == "pending":
        slurm.cancel(job)
        reason = f"{who} while queued: Slurm job {job} cancelled"
        _record_end(folder, "stopped", reason)
        return reason
    if state in LIVE_STATES:
        write_atomic(folder.path / STOP_REQUEST, json.dumps({"by": by, "t": time.time()}))
        out = slurm._run(["scancel", "--batch", "--signal=TERM", job], check=False)
        if out.returncode != 0:
            raise SlurmError(f"scancel could not signal the launcher of Slurm job {job}: "
                             f"{slurm._first_line(out.stderr) or f'exit code {out.returncode}'}")
        return f"asked the launcher of Slurm job {job} to stop the run (SIGTERM): its tasks write final checkpoints"
    return f"the run has already ended ({state or 'unknown'})"


def _summary(meta: dict[str, Any]) -> dict[str, Any]:
    summary = meta.get("summary")
    return dict(summary) if isinstance(summary, dict) else {}


def _record_end(folder: RunFolder, state: str, reason: str, **fields: Any) -> None:
    """A batch run's end said by the batch side (no launcher records it): ``run.json`` and a ``run`` event."""
    meta = folder.read_meta()
    summary = _summary(meta)
    summary.update(state=state, reason=reason)
    folder.write_meta(state=state, launcher=None, summary=summary, ended=time.strftime("%Y-%m-%dT%H:%M:%S"))
    _append(folder, [events.make("run", LAUNCHER, state=state, reason=reason, **fields)])

def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0
