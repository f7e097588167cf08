"""Slurm: allocate a host group's nodes with ``salloc``, start one supervisor per node with ``srun``.

A host of ``kind: slurm`` is a group of nodes that Slurm hands out. One run of it:

1. **Check** the request against ``sinfo`` before submitting (:func:`request_problems`): an unknown
   partition, more nodes than the partition has, more CPUs or GPUs per node than its nodes hold are
   refused with a message naming the field (Slurm itself would only queue such a job, forever, as
   ``PartitionConfig``/``PartitionNodeLimit``).
2. **Allocate** (:class:`Allocation`): ``salloc`` holds the job while its command, a ``cat`` reading
   salloc's stdin, runs; closing that stdin (or the launcher dying) gives the nodes back. While the job
   waits, its id, Slurm's state and reason (``Resources``, ``Priority``, ``PartitionDown``...) are
   reported with an explanation (:func:`explain_reason`), polled from ``scontrol show job``.
3. **Place** the tasks: the drawn tasks in order, in blocks over the allocated nodes (Slurm's default
   distribution, as TensorFlow's ``SlurmClusterResolver`` assumes; see
   :meth:`engine.contract.config.Host.node_tasks`); free ports are chosen *on the nodes* by one short
   step (``python -m engine.control.slurm_step --ports N`` on every node).
4. **Start** one supervisor per node: ``srun --jobid=J --nodes=1 --ntasks=1 -w NODE --overlap ...
   python -m engine.control.slurm_step -- python -m engine.control.supervisor``. srun relays stdin
   and stdout like ssh, so the supervisor protocol is unchanged; :mod:`engine.control.slurm_step`
   binds each task's GPUs to those Slurm gave the step.
5. **End**: ``scancel`` (:meth:`Allocation.release`); a job that Slurm ended (time limit, node
   failure, preemption, a cancel) fails the run with Slurm's state and reason
   (:meth:`SlurmTransport.failure`). A whole-run restart submits a new allocation.

**Batch jobs** (``clusterdeck sbatch``, :mod:`engine.control.slurm_batch`): the launcher itself runs inside a
job ``sbatch`` queued; with :data:`ADOPT_ENV` set to that job's id, step 2 adopts it (no ``salloc``, no queue,
never cancelled here: it ends with its batch script) and a whole-run restart starts again inside it.

:class:`SlurmTransport` is the launcher's transport (``engine.control.transports.KINDS['slurm']``).
Slurm's commands run on this machine, which must be a submit host of the cluster; the run folder must
be on storage every node shares, with ClusterDeck installed for the group's ``python``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.contract import events
from engine.contract.config import Cluster, ConfigError, Host, Problem, RunConfig, replace
from engine.contract.plan import bind_ports, slurm_placement, slurm_tasks_per_node
from engine.control import transports, unchosen_code

#: Slurm job states of a job that has not started yet.
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
                            "CONFIGURING"})
#: States of a job that ended, with what they mean for the user.
ENDED_STATES = {
    "COMPLETED": "ended",
    "CANCELLED": "was cancelled",
    "TIMEOUT": "was killed at its time limit",
    "FAILED": "failed",
    "NODE_FAIL": "lost a node (node failure)",
    "PREEMPTED": "was preempted by another job",
    "OUT_OF_MEMORY": "ran out of memory",
    "BOOT_FAIL": "could not boot its nodes",
    "DEADLINE": "missed its deadline",
    "REVOKED": "was revoked",
    "SPECIAL_EXIT": "ended with a special exit",
}
#: Slurm's reasons for a pending job, explained (``squeue --help`` lists them all).
REASONS = {
    "None": "the scheduler has not looked at the job yet",
    "Resources": "waiting for nodes to become free",
    "Priority": "jobs of higher priority are ahead in the queue",
    "PartitionDown": "the partition is down: the job waits until an administrator brings it up",
    "PartitionInactive": "the partition is inactive: the job waits until an administrator activates it",
    "PartitionConfig": "the request exceeds what the partition allows (nodes, CPUs, GPUs or memory per node): "
                       "it will never start; stop the run and change the slurm block",
    "PartitionNodeLimit": "more nodes than the partition allows: it will never start; stop the run and lower "
                          "slurm.nodes",
    "PartitionTimeLimit": "a time limit beyond the partition's: it will never start; stop the run and lower "
                          "slurm.time_limit",
    "ReqNodeNotAvail": "a required node is unavailable (down, drained or reserved)",
    "NodeDown": "a node the job needs is down",
    "BeginTime": "the job's start time has not come yet",
    "Dependency": "waiting for another job to end",
    "JobHeldUser": "held by the user (scontrol release brings it back)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxJobsPerUserLimit": "the QOS's limit of jobs per user is reached",
    "AssocMaxJobsLimit": "the account's limit of jobs is reached",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "InvalidAccount": "the account is not valid: it will never start; check slurm.account",
    "InvalidQOS": "the QOS is not valid: it will never start; check slurm.qos",
    "Reservation": "waiting for its reservation to start",
    "Licenses": "waiting for licenses",
    "TimeLimit": "its time limit was reached",
    "NonZeroExitCode": "a process of the job failed",
}
#: Pending reasons that never clear by themselves.
HOPELESS_REASONS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount",
                              "InvalidQOS", "BadConstraints"})
POLL_S = 1.0
RELEASE_TIMEOUT = 15.0
#: Set (to the job's id) for a launcher that runs inside a Slurm batch job (``clusterdeck sbatch``): its Slurm
#: group adopts that job's allocation instead of asking ``salloc`` for one (:mod:`engine.control.slurm_batch`).
ADOPT_ENV = "CLUSTERDECK_SLURM_JOB"
#: The step that picks ports on the nodes and the wrapper of each supervisor.
STEP_MODULE = "engine.control.slurm_step"
#: The name a node's supervisor (and its host in the launched config) gets: ``<group>@<node>``.
NODE_SEPARATOR = "@"


class SlurmError(RuntimeError):
    """Slurm refused, failed or is not reachable; the message says what and how to go on."""


# --------------------------------------------------------------------------- Slurm's commands


def slurm_available() -> tuple[bool, str]:
    """(True, '') when Slurm's client commands are installed and its controller answers."""
    missing = [p for p in ("sinfo", "squeue", "salloc", "srun", "scancel", "scontrol") if shutil.which(p) is None]
    if missing:
        return False, f"Slurm's commands are not installed here ({', '.join(missing)} missing)"
    out = _run(["sinfo", "-h", "-o", "%P"], check=False)
    if out.returncode != 0:
        return False, f"sinfo failed: {_first_line(out.stderr) or 'no answer from slurmctld'}"
    return True, ""


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = 30.0,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                             env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} is not installed here: ClusterDeck runs Slurm's own commands on this "
                         "machine, which must be a submit host of the cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(cmd[:3])} did not answer within {timeout:.0f} s (is slurmctld up?)") from None
    if check and out.returncode != 0:
        raise SlurmError(f"{cmd[0]} failed: {_first_line(out.stderr) or f'exit code {out.returncode}'}")
    return out


def _first_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class Partition:
    """A partition as ``sinfo`` shows it (its nodes summed over their states)."""

    name: str
    available: str  # up, down, drain, inact
    nodes: int
    cpus_per_node: int  # the most CPUs of one of its nodes
    gpus_per_node: int  # the most GPUs (gres gpu) of one of its nodes
    time_limit: str
    default: bool


def partitions() -> dict[str, Partition]:
    """Every partition of the cluster, from ``sinfo``."""
    out = _run(["sinfo", "-h", "-o", "%P|%a|%D|%c|%G|%l"])
    found: dict[str, Partition] = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        raw_name, avail, count, cpus, gres, limit = parts
        name = raw_name.rstrip("*")
        old = found.get(name)
        nodes = _int(count)
        part = Partition(name=name, available=avail, nodes=nodes + (old.nodes if old else 0),
                         cpus_per_node=max(_int(cpus.rstrip("+")), old.cpus_per_node if old else 0),
                         gpus_per_node=max(gres_gpus(gres), old.gpus_per_node if old else 0),
                         time_limit=limit, default=raw_name.endswith("*"))
        found[name] = part
    return found


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def gres_gpus(gres: str) -> int:
    """GPUs in a ``sinfo`` GRES text such as ``gpu:4``, ``gpu:a100:8(S:0-1)`` or ``(null)``."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def memory_mb(text: str) -> int:
    """Megabytes of a Slurm memory size (``4G``, ``512M``, ``1024``)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not m:
        raise ValueError(f"not a memory size: {text!r}")
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)]
    return max(1, int(int(m.group(1)) * scale))


def request_problems(host: Host, where: str = "", parts: Mapping[str, Partition] | None = None) -> list[Problem]:
    """What ``sinfo`` says stands between ``host`` (a Slurm group) and an allocation, before submitting.

    ``where`` is the host's config path (``cluster.hosts[0]``). A partition that is down is no problem
    here: the job is submitted and shown pending with Slurm's reason ``PartitionDown``.
    """
    s = host.slurm
    if s is None:
        return [Problem(f"{where}.slurm", "a host of kind 'slurm' needs a slurm block; got none")]
    if parts is None:
        parts = partitions()
    prefix = f"{where}.slurm" if where else f"slurm host {host.name!r}"
    if s.partition:
        part = parts.get(s.partition)
        if part is None:
            names = ", ".join(repr(p) for p in sorted(parts)) or "none"
            return [Problem(f"{prefix}.partition", f"this cluster has no partition {s.partition!r}; expected one "
                                                   f"of {names} (sinfo)")]
    else:
        part = next((p for p in parts.values() if p.default), None)
        if part is None:
            names = ", ".join(repr(p) for p in sorted(parts)) or "none"
            return [Problem(f"{prefix}.partition", f"this cluster has no default partition; expected one of {names}")]
    problems = []
    if s.nodes > part.nodes:
        problems.append(Problem(f"{prefix}.nodes", f"{s.nodes} nodes asked, but partition {part.name!r} has "
                                                   f"{part.nodes} (sinfo); expected at most {part.nodes}. "
                                                   "Slurm would queue the job forever (reason PartitionConfig)"))
    cpus = slurm_tasks_per_node(host) * s.cpus_per_task
    if part.cpus_per_node and cpus > part.cpus_per_node:
        problems.append(Problem(f"{prefix}.cpus_per_task", f"{slurm_tasks_per_node(host)} task(s) per node x "
                                                           f"{s.cpus_per_task} CPUs = {cpus} CPUs per node, but the "
                                                           f"nodes of partition {part.name!r} have at most "
                                                           f"{part.cpus_per_node}; expected at most that"))
    if s.gpus_per_node > part.gpus_per_node:
        problems.append(Problem(f"{prefix}.gpus_per_node", f"{s.gpus_per_node} GPUs per node asked, but the nodes "
                                                           f"of partition {part.name!r} have "
                                                           f"{part.gpus_per_node or 'no'} GPU(s) (sinfo gres); "
                                                           f"expected at most {part.gpus_per_node}"))
    return problems


def check_config(config: RunConfig) -> list[Problem]:
    """:func:`request_problems` of every Slurm group of ``config`` (nothing to do without one)."""
    slurm_hosts = [(i, h) for i, h in enumerate(config.cluster.hosts) if h.is_slurm]
    if not slurm_hosts:
        return []
    unchosen = unchosen_code.slurm_problems(config)  # options that run programs: refused before any salloc
    if unchosen:
        return unchosen
    parts = partitions()
    return [p for i, h in slurm_hosts for p in request_problems(h, f"cluster.hosts[{i}]", parts)]


def allocation_options(host: Host, job_name: str) -> list[str]:
    """The options asking for the group's nodes, as ``salloc`` and ``sbatch`` both read them (the slurm block's
    nodes, tasks per node, CPUs, GPUs, memory, time limit, account and QOS); not ``slurm.sbatch_options``, which
    each command adds last, so that the user's own options win."""
    s = host.slurm
    assert s is not None
    per_node = slurm_tasks_per_node(host)
    cmd = [f"--job-name={job_name}", f"--nodes={s.nodes}", f"--ntasks-per-node={per_node}",
           f"--cpus-per-task={s.cpus_per_task}"]
    if s.partition:
        cmd.append(f"--partition={s.partition}")
    if s.gpus_per_node:
        cmd.append(f"--gres=gpu:{s.gpus_per_node}")
    if s.mem_per_task:
        cmd.append(f"--mem={memory_mb(s.mem_per_task) * per_node}M")
    if s.time_limit:
        cmd.append(f"--time={s.time_limit}")
    if s.account:
        cmd.append(f"--account={s.account}")
    if s.qos:
        cmd.append(f"--qos={s.qos}")
    return cmd


def allocation_command(host: Host, job_name: str) -> list[str]:
    """``salloc`` holding the group's nodes while its command (``cat``, reading salloc's stdin) runs."""
    assert host.slurm is not None
    cmd = ["salloc", *allocation_options(host, job_name), *host.slurm.sbatch_options]
    # salloc runs this here, not on the nodes: the allocation lives as long as our pipe to it
    cmd += ["--", "sh", "-c", "exec cat >/dev/null"]
    return cmd


def step_command(job_id: str, host: Host, command: Sequence[str], *, node: str = "", nodes: int = 1,
                 gpus: bool = True) -> list[str]:
    """``srun`` starting ``command`` as a step of job ``job_id``: one task on ``node`` (or one per node
    of ``nodes``), overlapping the job's other steps."""
    s = host.slurm
    assert s is not None
    cmd = ["srun", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
           "--overlap", "--kill-on-bad-exit=0", f"--job-name={STEP_MODULE.rsplit('.', 1)[-1]}"]
    if node:
        cmd.append(f"--nodelist={node}")
    if gpus:
        cmd.append(f"--cpus-per-task={slurm_tasks_per_node(host) * s.cpus_per_task}")
        if s.gpus_per_node:
            cmd.append(f"--gres=gpu:{s.gpus_per_node}")
        if s.mem_per_task:
            cmd.append("--mem=0")  # the step may use all the job's memory on its node
    cmd += list(s.srun_options)
    return cmd + ["--", *command]


@dataclass(frozen=True)
class JobStatus:
    """A job as ``scontrol show job`` sees it."""

    job_id: str
    state: str  # Slurm's JobState: PENDING, RUNNING, TIMEOUT, ...
    reason: str  # Slurm's Reason: None, Resources, PartitionDown, TimeLimit, ...
    nodes: tuple[str, ...] = ()
    partition: str = ""
    exit_code: str = ""
    restarts: int = 0  # how often the job was requeued (scontrol's Restarts; a batch job sees SLURM_RESTART_COUNT)

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def explain(self) -> str:
        """One sentence for the user: the job, its state and what Slurm's reason means."""
        if self.pending:
            what = REASONS.get(self.reason, "Slurm's reason for the wait")
            where = f" in partition {self.partition!r}" if self.partition else ""
            return f"Slurm job {self.job_id} is pending{where} ({self.reason}): {what}"
        if self.ended:
            why = f" ({self.reason}: {REASONS.get(self.reason, 'Slurm’s reason')})" if self.reason not in ("", "None") \
                else ""
            return f"Slurm job {self.job_id} {ENDED_STATES[self.state]} ({self.state}){why}"
        return f"Slurm job {self.job_id} is {self.state.lower()}"


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=(\S*)")


def job_status(job_id: str) -> JobStatus | None:
    """The job's state and reason (``scontrol show job``); None once Slurm has forgotten it."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    if out.returncode != 0 or "JobState=" not in out.stdout:
        return None
    fields = dict(_FIELD.findall(out.stdout.splitlines()[0]))
    state = fields.get("JobState", "").split("+")[0]
    nodelist = fields.get("NodeList", "")
    nodes = tuple(expand_nodes(nodelist)) if nodelist and nodelist != "(null)" else ()
    return JobStatus(job_id=str(job_id), state=state, reason=fields.get("Reason", ""), nodes=nodes,
                     partition=fields.get("Partition", ""), exit_code=fields.get("ExitCode", ""),
                     restarts=_int(fields.get("Restarts", "0")))


def accounted_status(job_id: str) -> tuple[JobStatus | None, str]:
    """The job as Slurm's accounting (``sacct``) remembers it once the controller has forgotten it, and ``""``;
    or None and why sacct cannot say (not installed, accounting storage disabled, no such job)."""
    try:
        out = _run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "JobIDRaw,State,ExitCode,Partition"],
                   check=False)
    except SlurmError as exc:
        return None, str(exc)
    if out.returncode != 0:
        return None, f"sacct failed: {_first_line(out.stderr) or f'exit code {out.returncode}'}"
    status = parse_sacct(out.stdout, str(job_id))
    return (status, "") if status is not None else (None, f"sacct knows no job {job_id}")


def parse_sacct(text: str, job_id: str) -> JobStatus | None:
    """``sacct -X -n -P -o JobIDRaw,State,ExitCode,Partition`` of ``job_id``: its latest line (a requeued
    job may have one per execution). ``CANCELLED by 1000`` reads as ``CANCELLED``."""
    found: JobStatus | None = None
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or parts[0].strip() != job_id:
            continue
        state = parts[1].split()[0].rstrip("+") if parts[1].split() else ""
        found = JobStatus(job_id=job_id, state=state, reason="",
                          partition=parts[3].strip() if len(parts) > 3 else "", exit_code=parts[2].strip())
    return found


def final_status(job_id: str) -> tuple[JobStatus | None, str]:
    """The job's state from the controller (``scontrol show job``), else from accounting (``sacct``) once the
    controller has forgotten it (``MinJobAge`` after its end); None and why neither can say."""
    status = job_status(job_id)
    if status is not None:
        return status, ""
    status, why = accounted_status(job_id)
    if status is not None:
        return status, ""
    return None, f"the controller no longer knows Slurm job {job_id} (scontrol show job) and {why}"


def expand_nodes(nodelist: str) -> list[str]:
    """A Slurm node list (``node[01-03],gpu7``) as names, in order (``scontrol show hostnames``)."""
    out = _run(["scontrol", "show", "hostnames", nodelist], check=False)
    names = out.stdout.split()
    return names if out.returncode == 0 and names else [nodelist]


def queued(job_id: str) -> bool:
    """True while ``squeue`` still lists the job (pending, running or completing)."""
    out = _run(["squeue", "-h", "-j", str(job_id), "-o", "%i"], check=False)
    return out.returncode == 0 and str(job_id) in out.stdout.split()


def cancel(job_id: str) -> None:
    """``scancel`` the job (and so every step on every node); no error when it has already ended."""
    _run(["scancel", str(job_id)], check=False)


def job_name(run_name: str, group: str) -> str:
    """The job's name in ``squeue``: ``clusterdeck-<run>-<group>``, safe on any command line."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"clusterdeck-{run_name}-{group}").strip("-")
    return text[:100]


# --------------------------------------------------------------------------- one allocation


@dataclass
class Allocation:
    """One ``salloc`` holding the job of one Slurm group."""

    host: Host
    name: str
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    job_id: str = ""
    nodes: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # salloc's own lines (stderr)
    #: the job this launcher runs inside (a batch job, :mod:`engine.control.slurm_batch`): never submitted here,
    #: never cancelled here (it ends when its batch script does)
    adopted: bool = False
    proc: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None
    _got_id: threading.Event = field(default_factory=threading.Event)
    _released: bool = False

    def submit(self, timeout: float = 30.0) -> str:
        """Start ``salloc``; return the job id as soon as Slurm gives one (the job may still wait)."""
        cmd = allocation_command(self.host, self.name)
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, env=self.env, start_new_session=True)
        except FileNotFoundError:
            raise SlurmError("salloc is not installed here: ClusterDeck runs Slurm's own commands on this machine, "
                             "which must be a submit host of the cluster") from None
        self._reader = threading.Thread(target=self._read, name=f"salloc-{self.host.name}", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._got_id.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                if self.job_id:
                    break
                said = "; ".join(self.messages[-3:]) or f"exit code {self.proc.returncode}"
                raise SlurmError(f"Slurm refused the allocation of {self.host.name!r}: {said}")
            if time.monotonic() > deadline:
                self.release()
                raise SlurmError(f"salloc gave no job id within {timeout:.0f} s (is slurmctld up?)")
        return self.job_id

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.strip()
            if not line:
                continue
            self.messages.append(line)
            del self.messages[:-50]
            m = re.search(r"(?:Pending|Granted) job allocation (\d+)|job (\d+) queued", line)
            if m and not self.job_id:
                self.job_id = m.group(1) or m.group(2)
                self._got_id.set()

    def status(self) -> JobStatus | None:
        return job_status(self.job_id) if self.job_id else None

    def wait_running(self, report: Callable[[JobStatus], None], stop: threading.Event,
                     poll: float = POLL_S) -> list[str]:
        """Wait until the job runs; ``report`` each new (state, reason) while it waits. Returns its nodes.

        Raises :class:`transports.TransportStopped` when ``stop`` is set, :class:`SlurmError` when the job
        ends before it runs.
        """
        last: tuple[str, str] | None = None
        while True:
            status = self.status()
            if status is not None and status.running and status.nodes:
                self.nodes = list(status.nodes)
                return self.nodes
            if status is not None and status.ended:
                raise SlurmError(f"{status.explain()} before it started")
            if status is not None and (status.state, status.reason) != last:
                last = (status.state, status.reason)
                report(status)
            if status is None and self.adopted:
                raise SlurmError(f"Slurm job {self.job_id}, which this launcher runs inside ({ADOPT_ENV}), is not "
                                 "known to the controller (scontrol show job)")
            if status is None and self.proc is not None and self.proc.poll() is not None:
                said = "; ".join(self.messages[-3:]) or f"exit code {self.proc.returncode}"
                raise SlurmError(f"the allocation of Slurm job {self.job_id} ended before it started: {said}")
            if stop.wait(poll):
                raise transports.TransportStopped()

    def pick_ports(self, placement: Mapping[str, str], python: str, counts: Mapping[str, int] | None = None,
                   timeout: float = 60.0) -> dict[str, int]:
        """Free ports chosen on the nodes (one short step on every node): task name -> port."""
        wanted: dict[str, list[str]] = {}
        for task, node in placement.items():
            wanted.setdefault(node, []).append(task)
        most = max((len(v) for v in wanted.values()), default=0)
        if most == 0:
            return {}
        cmd = step_command(self.job_id, self.host, [python, "-m", STEP_MODULE, "--ports", str(most)],
                           nodes=len(self.nodes), gpus=False)
        out = _run(cmd, check=False, timeout=timeout, env=self.env)
        found: dict[str, list[int]] = {}
        for line in out.stdout.splitlines():
            try:
                item = json.loads(line)
                found[str(item["node"])] = [int(p) for p in item["ports"]]
            except (ValueError, KeyError, TypeError):
                continue
        ports: dict[str, int] = {}
        for node, tasks in wanted.items():
            got = found.get(node)
            if got is None or len(got) < len(tasks):
                said = _first_line(out.stderr) or f"no answer from node {node}"
                raise SlurmError(f"could not choose ports on node {node} of Slurm job {self.job_id} "
                                 f"({' '.join(cmd[-4:])}): {said}")
            ports.update(zip(tasks, got, strict=False))
        return ports

    def release(self, timeout: float = RELEASE_TIMEOUT) -> None:
        """Give the nodes back: end salloc's command, ``scancel`` the job, wait until squeue drops it."""
        if self._released:
            return
        self._released = True
        if self.adopted:  # the job this launcher runs in: it ends when the batch script does, never cancelled here
            return
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.job_id:
            cancel(self.job_id)
        deadline = time.monotonic() + timeout
        if self.proc is not None:
            try:
                self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=2)
        while self.job_id and queued(self.job_id) and time.monotonic() < deadline:
            time.sleep(0.2)


def split_by_node(config: RunConfig, host: Host, placement: Mapping[str, str], ports: Mapping[str, int]) -> Cluster:
    """``config``'s cluster with Slurm group ``host`` replaced by one host per allocated node:
    ``<group>@<node>``, address the node, ``nodes: 1``, its tasks with the ports chosen there."""
    assert host.slurm is not None
    hosts: list[Host] = []
    for h in config.cluster.hosts:
        if h.name != host.name:
            hosts.append(h)
            continue
        by_node: dict[str, list[Any]] = {}
        for t in h.tasks:
            by_node.setdefault(placement[t.name], []).append(t)
        for node, tasks in by_node.items():
            hosts.append(replace(h, name=f"{h.name}{NODE_SEPARATOR}{node}", address=node, tasks=tuple(tasks),
                                 slurm=replace(host.slurm, nodes=1)))
    return bind_ports(Cluster(hosts=tuple(hosts)), ports)


def group_of(host_name: str) -> tuple[str, str]:
    """(group, node) of a node host made by :func:`split_by_node`."""
    group, _, node = host_name.rpartition(NODE_SEPARATOR)
    return group, node


# --------------------------------------------------------------------------- the transport


class SlurmTransport(transports.BaseTransport):
    """Supervisors inside Slurm allocations: ``salloc`` per Slurm group, ``srun`` per node.

    :meth:`prepare` checks, submits and waits (reporting the queue) in the launcher's background
    thread, then returns the config with each group split into its nodes (``<group>@<node>``, see
    :func:`split_by_node`): the launcher plans ``TF_CONFIG`` and GPUs from it and starts one
    supervisor per node host through :meth:`start`.
    """

    kind = "slurm"
    background = True
    #: The launcher calls release() and prepare() again on a whole-run restart (a new allocation); not when the
    #: allocation is the batch job this launcher runs in (:data:`ADOPT_ENV`): the run restarts inside it.
    resubmit_on_restart = True
    #: Either way the run is placed again on a whole-run restart, with ports chosen afresh on the nodes: a port of
    #: the last generation may still be held there (a task srun has not reaped yet, a connection's port).
    replan_on_restart = True

    def __init__(self, adopt: str | None = None) -> None:
        self.allocations: dict[str, Allocation] = {}
        self._lock = threading.Lock()
        #: the job this launcher runs inside (``clusterdeck sbatch``), adopted instead of submitting one
        self.adopt = (os.environ.get(ADOPT_ENV, "") if adopt is None else adopt).strip()
        if self.adopt:
            self.resubmit_on_restart = False
        self._prepared_once = False

    def prepare(self, ctx: transports.PrepareContext) -> RunConfig:
        config = ctx.config
        groups = [h for h in config.cluster.hosts if h.is_slurm and h.slurm is not None and h.tasks]
        if not groups:
            return config
        ok, why = slurm_available()
        if not ok:
            raise SlurmError(why)
        if self.adopt:
            return self._prepare_adopted(ctx, groups)
        problems = check_config(config)
        if problems:
            raise ConfigError(problems, "slurm")
        env = transports.local_env()
        run_name = ctx.folder.path.name
        for h in groups:
            if ctx.stop.is_set():
                raise transports.TransportStopped()
            alloc = Allocation(host=h, name=job_name(run_name, h.name), env=env)
            with self._lock:
                self.allocations[h.name] = alloc
            alloc.submit()
            ctx.emit(_info(f"Slurm job {alloc.job_id} submitted for {h.name!r} ({h.slurm.nodes if h.slurm else 1} "
                           f"node(s))", job_id=alloc.job_id, host=h.name))
        for h in groups:
            alloc = self.allocations[h.name]

            def report(status: JobStatus, group: str = h.name) -> None:
                message = status.explain()
                # the message first (the CLI prints info events), then the run's state
                ctx.emit(_info(message, job_id=status.job_id, slurm_state=status.state, slurm_reason=status.reason,
                               host=group, **({"warning": "slurm-hopeless"}
                                             if status.reason in HOPELESS_REASONS else {})))
                ctx.report(job_id=status.job_id, reason=status.reason, slurm_state=status.state, host=group,
                           message=message)

            nodes = alloc.wait_running(report, ctx.stop)
            config = self._place(ctx, config, h, alloc, nodes)
        return config

    def _place(self, ctx: transports.PrepareContext, config: RunConfig, h: Host, alloc: Allocation,
               nodes: list[str]) -> RunConfig:
        """The group's tasks placed on the job's nodes, with ports chosen there; the config split by node."""
        placement = slurm_placement(h, nodes)
        ports = alloc.pick_ports(placement, h.python)
        config = replace(config, cluster=split_by_node(config, h, placement, ports))
        where = ", ".join(f"{task} on {node}:{ports[task]}" for task, node in placement.items())
        ctx.emit(_info(f"Slurm job {alloc.job_id} running on {', '.join(nodes)}: {where}",
                       job_id=alloc.job_id, nodes=nodes, host=h.name))
        return config

    def _prepare_adopted(self, ctx: transports.PrepareContext, groups: list[Host]) -> RunConfig:
        """The one Slurm group of a batch job runs in the job's own allocation: no salloc, no queue."""
        if len(groups) > 1:
            names = ", ".join(repr(h.name) for h in groups)
            raise SlurmError(f"Slurm job {self.adopt} (this batch job) can hold one Slurm group, but the config has "
                             f"{len(groups)} ({names}); expected one")
        h = groups[0]
        alloc = Allocation(host=h, name=job_name(ctx.folder.path.name, h.name), env=transports.local_env(),
                           job_id=self.adopt, adopted=True)
        with self._lock:
            self.allocations[h.name] = alloc
        if not self._prepared_once:
            ctx.emit(_info(f"the run adopts Slurm job {self.adopt}, which its launcher runs inside (a batch job): no "
                           "new allocation", job_id=self.adopt, host=h.name))
        self._prepared_once = True

        def report(status: JobStatus) -> None:  # a batch job's launcher runs once its job runs: said, not waited
            ctx.emit(_info(status.explain(), job_id=status.job_id, slurm_state=status.state, host=h.name))

        nodes = alloc.wait_running(report, ctx.stop)
        return self._place(ctx, ctx.config, h, alloc, nodes)

    def _allocation(self, launch: transports.SupervisorLaunch) -> tuple[Allocation, str]:
        group, node = group_of(launch.host.name if launch.host is not None else launch.group)
        with self._lock:
            alloc = self.allocations.get(group)
        if alloc is None or not node:
            raise SlurmError(f"no Slurm allocation holds {launch.group!r}; prepare() must run first")
        return alloc, node

    def start(self, launch: transports.SupervisorLaunch) -> subprocess.Popen[bytes]:
        assert launch.host is not None, "a Slurm supervisor needs its host"
        alloc, node = self._allocation(launch)
        python = launch.command[0]
        command = [python, "-m", STEP_MODULE, "--", *launch.command]
        return self._popen(step_command(alloc.job_id, launch.host, command, node=node), launch)

    def failure(self, launch: transports.SupervisorLaunch, exit_code: int, log_tail: list[str]) -> str:
        try:
            alloc, node = self._allocation(launch)
        except SlurmError:
            return super().failure(launch, exit_code, log_tail)
        ended = self.why_ended(launch)
        if ended:
            return ended
        said = f": {' | '.join(log_tail)}" if log_tail else ""
        return f"the supervisor on node {node} (Slurm job {alloc.job_id}) {transports.describe_exit(exit_code)}{said}"

    def why_ended(self, launch: transports.SupervisorLaunch) -> str:
        """A step's SIGTERM from slurmstepd (a time limit, a cancel) may end the supervisor cleanly before its tasks
        said anything: the job's own end, where Slurm says it ended."""
        try:
            alloc, _ = self._allocation(launch)
        except SlurmError:
            return ""
        status = alloc.status()
        deadline = time.monotonic() + 5.0  # the steps may end a moment before the job's state says why
        while status is not None and not status.ended and time.monotonic() < deadline:
            time.sleep(0.25)
            status = alloc.status()
        return status.explain() if status is not None and status.ended else ""

    def release(self) -> None:
        with self._lock:
            allocs = list(self.allocations.values())
            self.allocations = {}
        for alloc in allocs:
            try:
                alloc.release()
            except SlurmError as exc:
                print(f"clusterdeck: releasing Slurm job {alloc.job_id} failed: {exc}", file=sys.stderr)


def _info(message: str, **fields: Any) -> dict[str, Any]:
    return events.make("info", "launcher", message=message, **fields)
