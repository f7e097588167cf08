"""The run lifecycle: a pure policy deciding when a run finishes, fails (and whom to blame), restarts
or stops. No threads, no processes, no clock of its own.

:class:`Lifecycle` is fed what happens to a run, as small frozen records (:class:`TaskStatus`,
:class:`StepProgress`, :class:`CpuSample`, :class:`SupervisorExited`, :class:`StopRequested`,
:class:`TransportFailed`, :class:`LauncherFailed`, :class:`Tick`, :class:`RestartRequested`), each with the
current time, and answers with actions for the run driver (:mod:`engine.control.run_driver`) to carry out:
:class:`StopRun`, :class:`RestartRun`, :class:`RestartTask`. Once every supervisor is gone,
:meth:`Lifecycle.final` tells the run's end (:class:`Outcome`).

Rules, written once here:

- A run *finishes* when every primary task (:func:`~engine.contract.plan.primary_roles`) finished.
- A task failing for good (its supervisor will not restart it) restarts the whole run while
  ``training.restarts`` allows, else *fails* the run; :func:`blame` names the culprit.
- A supervisor that ends while its tasks still run (killed, or ``ssh`` could not connect) fails the
  run with its own message (blamed on ``supervisor@<host>``); so does the transport (a scheduler's
  job killed). A run folder that cannot be written or vanished fails the run at once, blamed on the
  ``launcher`` (never restarted: it would fail again).
- Progress: with ``training.progress_timeout_s`` > 0, a synchronous run in which no task reports a
  step for that long (the first step gets :data:`FIRST_STEP_FACTOR` times longer) fails, naming the
  task that hangs; an async worker that gets no step for that long is restarted by its supervisor
  like a lost worker; a hung async chief fails the run. Progress is judged by steps: ``step`` events and
  ``progress`` events whose step moved on, and a task reports once per ``1 / training.metrics_hz`` s, so
  the deadline after a step is the timeout plus two report intervals (``metrics_hz: 0.01`` reports every
  100 s: a healthy run is never called hung between its reports).
- A hang whose culprit's host sent nothing at all for :data:`SUPERVISOR_SILENCE_S` while it had been sending
  its samples (a supervisor samples its tasks every 0.5 s) is blamed on that host's supervisor (stopped, frozen or cut off), not on a task.
- Hosts of other machines: one silent for :data:`HOST_PROBE_AFTER_S` is probed by the launcher (:class:`ProbeHost`,
  answered by :class:`HostProbed`). One that does not answer fails the run naming the host (blamed on
  ``supervisor@<host>``: a synchronous run cannot go on without its tasks), except in async runs where it holds
  workers only: they are lost and the run goes on (:class:`HostNotice`); the host is told to be back once it speaks
  again. A peer's report of a task on a host that does not answer names the host, not TensorFlow's heartbeat alone.
- An async host of workers only whose supervisor ends (its ssh connection lost, the supervisor killed) loses its
  workers, not the run: the launcher starts that supervisor again once the host answers (:class:`RelaunchHost`,
  at most ``max_relaunches`` times per host).
- The user's stop wins over anything decided later; the first decided end is kept.
- A restart asked for (:class:`RestartRequested`: ``Run.restart``, a front end) restarts the whole run like a
  fault would (:class:`RestartRun` with ``requested``), only while it runs, and never uses up
  ``training.restarts``: that budget is for faults (:attr:`Lifecycle.restarts_used` counts only those).

The host rules and the progress clocks are :mod:`engine.control.lifecycle_rules`' (:class:`HostRules`,
:class:`ProgressRules`), owned by the lifecycle.

When the run ends by a stop, the tasks still running are reported as the outcome says
(:attr:`Outcome.task_state`, :attr:`Outcome.task_reason`): ``finished`` in a finished run,
"stopped because worker:1 failed" in a failed one, "stopped by the user" only when the user stopped it.

It also defines :class:`RunHandle`, what front ends (CLI, app, scaling report) hold of a run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine.contract import records
from engine.contract.config import TRAINER_ROLES
from engine.contract.plan import primary_roles
from engine.control.lifecycle_rules import (  # noqa: F401 - also read from here
    FIRST_STEP_FACTOR,
    HOST_PROBE_AFTER_S,
    HOST_PROBE_EVERY_S,
    HostRules,
    ProgressRules,
    TaskInfo,
    TaskTrack,
)

if TYPE_CHECKING:
    from engine.observe.telemetry import RunState

#: Seconds without any event from a host (its supervisor samples every 0.5 s) after which a hang there is the
#: supervisor's (SIGSTOP, frozen, its connection stalled), not its tasks'.
SUPERVISOR_SILENCE_S = 10.0
#: A hang found while its host has been quiet this long waits (a live supervisor speaks every 0.5 s) until the
#: host speaks (the task is blamed) or reaches :data:`SUPERVISOR_SILENCE_S` (its supervisor is).
QUIET_HOST_S = 2.0
#: Said of a hang: where the stacks every task dumped on it are (``engine.control.doctor``).
STACKS_NOTE = "; every task's Python stacks: tasks/<task>/stacks.txt"
#: A task "spins" (a likely culprit of a hang) when its recent CPU use is at least this (percent)… (low: tasks
#: pinned to a core that other runs' tasks share get a few percent each, and a task waiting in a collective ~0)
BUSY_CPU = 2.0


#: The wire's state enums (engine/contract/records.py): one set for the runtime, the launcher and the views.
RunPhase = records.RunPhase
TaskPhase = records.TaskState


class EndState(StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


USER_STOP = "stopped by the user"
LAUNCHER = "launcher"  # named as the failed part when the launcher itself cannot go on (its run folder)


@dataclass(frozen=True)
class Outcome:
    """How a run ended (or will end, once its processes are gone)."""

    state: EndState
    reason: str = ""  # why, without repeating failed_task
    failed_task: str = ""

    @property
    def task_state(self) -> TaskPhase:
        """What the tasks still running at the end are reported as."""
        return TaskPhase.FINISHED if self.state is EndState.FINISHED else TaskPhase.STOPPED

    @property
    def task_reason(self) -> str:
        if self.state is EndState.FINISHED:
            return ""
        if self.state is EndState.FAILED:
            return f"stopped because {self.failed_task or 'the run'} failed"
        return self.reason or USER_STOP

    def event_fields(self) -> dict[str, Any]:
        """The fields of the run's final ``run`` event."""
        out: dict[str, Any] = {"state": str(self.state), "reason": self.reason}
        if self.state is EndState.FAILED:
            out["failed_task"] = self.failed_task
        return out


# -- what the policy is fed


@dataclass(frozen=True)
class TaskStatus:
    task: str
    state: TaskPhase
    reason: str = ""
    will_restart: bool = False
    generation: int = 0
    #: the task whose SIGTERM (not ClusterDeck's) stopped this one: it is blamed, not the reporter
    cause_task: str = ""


@dataclass(frozen=True)
class StepProgress:
    """A step event: ``task`` reported ``step``; in async runs ``worker`` ran it."""

    task: str
    step: int
    worker: int | None = None
    generation: int = 0
    #: a ``progress`` event: progress only where its step moved on
    moved_on: bool = False


@dataclass(frozen=True)
class CpuSample:
    task: str
    cpu_percent: float
    generation: int = 0


@dataclass(frozen=True)
class SupervisorExited:
    """A supervisor's stream ended and its process exited with ``exit_code``; ``message`` says why
    in its transport's words (the tail of its log, ssh's complaint)."""

    host: str
    exit_code: int
    message: str = ""
    tasks: tuple[str, ...] = ()
    generation: int = 0


@dataclass(frozen=True)
class StopRequested:
    reason: str = USER_STOP


@dataclass(frozen=True)
class RestartRequested:
    """Restart the whole run from its last checkpoint, asked for (``Run.restart``, a front end), not forced by a
    fault. It never uses up ``training.restarts`` (the fault budget): it is counted apart
    (:attr:`Lifecycle.requested_restarts`). Taken only while the run runs (not starting, restarting or ending)."""

    reason: str = "restart requested by the user"


@dataclass(frozen=True)
class TransportFailed:
    """The transport of ``host`` failed on its own (a scheduler killed the job, its time limit)."""

    host: str
    reason: str


@dataclass(frozen=True)
class LauncherFailed:
    """The launcher cannot go on: its run folder cannot be written or vanished, a restart could not
    start, an internal error. Never restarted (it would fail again); blamed on :data:`LAUNCHER`."""

    reason: str


@dataclass(frozen=True)
class Tick:
    """Time passes (progress deadlines are checked)."""


@dataclass(frozen=True)
class HostProbed:
    """The launcher's answer to :class:`ProbeHost`: ``problem`` says why ``host`` does not answer (its address
    and ports named); empty: it answers."""

    host: str
    problem: str = ""


Input = (TaskStatus | StepProgress | CpuSample | SupervisorExited | StopRequested | TransportFailed | LauncherFailed
         | Tick | HostProbed | RestartRequested)


# -- what it answers


@dataclass(frozen=True)
class StopRun:
    """Stop every supervisor; the tasks still running read ``outcome.task_state``/``task_reason``."""

    outcome: Outcome
    dump_stacks: bool = False  # a hang: ask every task for its stacks first (engine.control.doctor)


@dataclass(frozen=True)
class RestartRun:
    """Stop every task and start them all again (a new generation), from the last checkpoint."""

    reason: str
    restart: int
    restarts_allowed: int
    dump_stacks: bool = False  # a hang: ask every task for its stacks first (engine.control.doctor)
    requested: bool = False  # asked for (RestartRequested), not a fault: ``restart`` is then the generation


@dataclass(frozen=True)
class RestartTask:
    """Have ``task``'s supervisor restart it, as if it were lost (async workers; only a hang does this: its
    stacks are asked for first)."""

    task: str
    reason: str


@dataclass(frozen=True)
class ProbeHost:
    """Ask whether ``host`` (silent for :data:`HOST_PROBE_AFTER_S`) answers at all; feed back :class:`HostProbed`."""

    host: str


@dataclass(frozen=True)
class HostNotice:
    """Say of ``host`` that it does not answer (``unreachable``) or answers again, without ending the run."""

    host: str
    message: str
    unreachable: bool
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class RelaunchHost:
    """Start ``host``'s supervisor again once the host answers: its tasks (async workers only) were lost with it."""

    host: str
    tasks: tuple[str, ...]
    reason: str
    relaunch: int  # the how-manieth for this host


Action = StopRun | RestartRun | RestartTask | ProbeHost | HostNotice | RelaunchHost


_Task = TaskTrack  # what the lifecycle follows of one task


_TF_TASK = re.compile(r"/job:(chief|worker|ps|evaluator)/(?:replica:\d+/)?task:(\d+)")


def blame(reporter: str, reason: str) -> tuple[str, str]:
    """(task to blame, reason). When a task fails because TensorFlow found another one unhealthy
    (heartbeats stopped, a collective aborted by a peer), the run failed because of that other task."""
    lowered = reason.lower()
    if "unhealthy" in lowered or "heartbeat" in lowered or "aborted by" in lowered:
        named = [f"{job}:{index}" for job, index in _TF_TASK.findall(reason)]
        others = [t for t in named if t != reporter]
        if others:
            culprit = others[-1]
            return culprit, f"stopped responding (TensorFlow's heartbeat; reported by {reporter}: {reason})"
    return reporter, reason


def without_name(task: str, reason: str) -> str:
    """``reason`` without a leading ``"<task>: "`` (a reason never repeats the name it is shown with)."""
    prefix = f"{task}: "
    while task and reason.startswith(prefix):
        reason = reason[len(prefix):]
    return reason


def supervisor_name(host: str) -> str:
    """How a failed supervisor is named where a task would be (``failed_task``)."""
    return f"supervisor@{host}"


SECONDHAND_GRACE_S = 3.0  # how long a failure reported by a peer waits for the culprit's own report
#: Seconds a peer's report of a task waits longer while that task's host is being probed.
PROBE_WAIT_S = 3.0


class Lifecycle:
    """The policy of one run. Feed it with :meth:`feed` (one thread at a time); act on what it returns."""

    def __init__(self, tasks: Iterable[TaskInfo], *, mode: str, restarts_allowed: int = 0,
                 progress_timeout_s: float = 0.0, steps_per_execution: int = 1, now: float = 0.0,
                 report_interval_s: float = 0.0, remote_hosts: Iterable[str] = (), max_relaunches: int = 10) -> None:
        self.mode = mode
        self.hosts = HostRules(remote_hosts, max_relaunches)  # what is known of each host
        self.clock = ProgressRules(mode, progress_timeout_s, report_interval_s, steps_per_execution)
        self.restarts_allowed = restarts_allowed
        self.primaries = primary_roles(mode)
        self.tasks: dict[str, _Task] = {t.name: _Task(t) for t in tasks}
        self.phase = RunPhase.STARTING
        self.generation = 0  # bumped by every whole-run restart
        self.requested_restarts = 0  # those of them asked for (RestartRequested), not forced by a fault
        self.outcome: Outcome | None = None
        self.pending_failure: tuple[str, str] | None = None  # decided while a restart was under way
        #: a failure another task reported of ``culprit`` (culprit, reason, until): the culprit's own words, if
        #: they come within SECONDHAND_GRACE_S, say more ("killed by SIGKILL" rather than a peer's heartbeat error)
        self.secondhand: tuple[str, str, float] | None = None
        self.generation_started_at = now

    # -- queries

    @property
    def restarts_used(self) -> int:
        """Whole-run restarts faults used (of ``training.restarts``); requested ones are not counted."""
        return self.generation - self.requested_restarts

    def all_primaries_finished(self) -> bool:
        primaries = [t for t in self.tasks.values() if t.info.role in self.primaries]
        return bool(primaries) and all(t.phase is TaskPhase.FINISHED for t in primaries)

    def final(self) -> Outcome:
        """The run's end, once every supervisor is gone."""
        if self.outcome is not None:
            return self.outcome
        if self.secondhand is not None:
            return Outcome(EndState.FAILED, self.secondhand[1], self.secondhand[0])
        if self.all_primaries_finished():
            return Outcome(EndState.FINISHED)
        primaries = [t for t in self.tasks.values() if t.info.role in self.primaries]
        bad = [t for t in primaries if t.phase is not TaskPhase.FINISHED]
        if not bad:
            return Outcome(EndState.FAILED, "no task finished")
        return Outcome(EndState.FAILED, "ended without finishing", bad[0].info.name)

    # -- feeding

    def feed(self, item: Input, now: float) -> list[Action]:
        if isinstance(item, StepProgress):
            return self.step_seen(item.task, item.step, item.worker, item.generation, now, item.moved_on)
        if isinstance(item, CpuSample):
            return self.cpu_seen(item.task, item.cpu_percent, item.generation, now)
        if isinstance(item, TaskStatus):
            return self._heard_from(item.task, item.generation, now) + self._status(item, now)
        return self._feed(item, now)

    def step_seen(self, task: str, step: int, worker: int | None, generation: int, now: float,
                  moved_on: bool = False) -> list[Action]:
        """A task's step (a :class:`StepProgress`, or a ``step`` event read on the dispatcher's hot path)."""
        said = self._heard_from(task, generation, now)
        if generation == self.generation:
            self.clock.record(self.tasks, task, step, worker, moved_on, now)
        return said

    def cpu_seen(self, task: str, cpu_percent: float, generation: int, now: float) -> list[Action]:
        """A task's CPU sample (a :class:`CpuSample`, or a ``device`` event read on the hot path)."""
        said = self._heard_from(task, generation, now, sampled=True)
        if generation == self.generation and task in self.tasks:
            self.tasks[task].cpu.append(cpu_percent)
        return said

    def _heard_from(self, task: str, generation: int, now: float, sampled: bool = False) -> list[Action]:
        """A current task spoke: its host is alive, and back if it had stopped answering (``sampled``: it samples,
        so its silence means something)."""
        known = self.tasks.get(task)
        if known is None or not known.info.host or generation != self.generation:
            return []
        host = known.info.host
        if sampled:
            self.hosts.sampled.add(host)
        back = self.hosts.heard(host, now)
        return [HostNotice(host, back, False)] if back and self.outcome is None else []

    def _feed(self, item: Input, now: float) -> list[Action]:
        if isinstance(item, SupervisorExited):
            return self._supervisor_exited(item)
        if isinstance(item, StopRequested):
            return self._end(Outcome(EndState.STOPPED, item.reason or USER_STOP))
        if isinstance(item, RestartRequested):
            if self.outcome is not None or self.phase is not RunPhase.RUNNING:
                return []  # starting, restarting or ending: nothing to restart now
            self.generation += 1
            self.requested_restarts += 1
            return [RestartRun(item.reason, self.generation, self.restarts_allowed, requested=True)]
        if isinstance(item, TransportFailed):
            return self._failed(supervisor_name(item.host), item.reason)
        if isinstance(item, LauncherFailed):
            return self._end(Outcome(EndState.FAILED, item.reason, LAUNCHER))
        if isinstance(item, HostProbed):
            return self._probed(item, now)
        if isinstance(item, Tick):
            if self.secondhand is not None and now >= self.secondhand[2] and self.outcome is None:
                return self._secondhand_due(now)
            return self._probes(now) + self._check_progress(now)
        raise TypeError(f"not a lifecycle input: {item!r}")

    def restart_started(self, now: float) -> None:
        """The plumbing began a whole-run restart: a new generation, fresh progress clocks."""
        self.phase = RunPhase.RESTARTING
        self.secondhand = None
        for task in self.tasks.values():
            task.restart()
        self.clock.run_progress_at = None
        self.generation_started_at = now
        self.hosts.reset()

    def restart_done(self) -> list[Action]:
        """The new generation's supervisors are up; a failure met meanwhile fails the run now."""
        if self.outcome is None:
            self.phase = RunPhase.RUNNING
        if self.pending_failure is not None:
            task, reason = self.pending_failure
            self.pending_failure = None
            return self._end(Outcome(EndState.FAILED, reason, task))
        return []

    def started(self) -> None:
        if self.outcome is None:
            self.phase = RunPhase.RUNNING

    # -- rules

    def _status(self, item: TaskStatus, now: float) -> list[Action]:
        if item.generation != self.generation:
            return []  # from the tasks of an earlier start, stopped by a restart
        task = self.tasks.get(item.task)
        if task is None:
            task = self.tasks[item.task] = _Task(TaskInfo(item.task, item.task.split(":")[0]))
        task.phase = item.state
        if item.state is TaskPhase.STARTING:
            task.started_at, task.progress_at, task.last_step = now, None, -1
            task.cpu.clear()
        if self.outcome is not None:
            return []
        if item.state is TaskPhase.FAILED:
            if item.will_restart:
                return []  # its supervisor brings it back (async workers)
            if item.cause_task and item.cause_task != item.task and item.cause_task in self.tasks:
                return self._failed(item.cause_task, f"got a SIGTERM ClusterDeck did not send (reported by "
                                                     f"{item.task}: {without_name(item.task, item.reason)})")
            culprit, why = blame(item.task, without_name(item.task, item.reason or "failed"))
            suspect = self.tasks.get(culprit)
            if culprit != item.task and suspect is not None and not suspect.phase.terminal:
                if self.secondhand is None:
                    self.secondhand = (culprit, why, now + SECONDHAND_GRACE_S)
                if suspect.info.host in self.hosts.unreachable:  # its host does not answer: no words will come
                    return self._secondhand_due(now)
                return []
            return self._failed(culprit, why)
        if item.state is TaskPhase.FINISHED and self.all_primaries_finished():
            return self._end(Outcome(EndState.FINISHED))
        return []

    def _supervisor_exited(self, item: SupervisorExited) -> list[Action]:
        if item.generation != self.generation or self.outcome is not None:
            return []
        self.hosts.gone.add(item.host)
        unfinished = [t for name in item.tasks if (t := self.tasks.get(name)) is not None and not t.phase.terminal]
        if not unfinished and item.exit_code == 0:
            return []  # it ended because its tasks did
        if not unfinished and self.all_primaries_finished():
            return []
        message = item.message or ("ended before its tasks did" if item.exit_code == 0
                                   else f"exited with code {item.exit_code}")
        cut = self.hosts.unreachable.get(item.host)
        if cut is not None:  # ssh gave up on a host that had stopped answering: the network's doing, said first
            message = f"{cut[0]}; then its supervisor's connection ended ({message})"
        if unfinished and _workers_only(self.mode, unfinished) and self.phase is RunPhase.RUNNING:
            count = self.hosts.next_relaunch(item.host)
            if count <= self.hosts.max_relaunches:
                for task in unfinished:  # lost: not overdue while its host comes back
                    task.phase, task.started_at, task.progress_at = TaskPhase.PENDING, None, None
                return [RelaunchHost(item.host, tuple(t.info.name for t in unfinished), message, count)]
            message += (f"; not started again: its supervisor was started again {count - 1} time(s), the most for a "
                        "host of lost async workers")
        return self._failed(supervisor_name(item.host), message)

    # -- hosts of other machines

    def _host_tasks(self, host: str) -> list[_Task]:
        return [t for t in self.tasks.values() if t.info.host == host and not t.phase.terminal
                and t.phase is not TaskPhase.PENDING]

    def _probes(self, now: float) -> list[Action]:
        """Ask about every host of another machine that went silent while its tasks run."""
        if self.outcome is not None or self.phase is not RunPhase.RUNNING:
            return []
        busy = {host: bool(self._host_tasks(host)) for host in self.hosts.remote_hosts}
        return [ProbeHost(host) for host in self.hosts.due_probes(now, busy)]

    def _probed(self, item: HostProbed, now: float) -> list[Action]:
        self.hosts.probing.discard(item.host)
        heard = self.hosts.quiet_since(item.host, now)
        if not item.problem or self.outcome is not None or heard is None:
            return []  # it answers (or spoke meanwhile): a quiet host is judged by the progress rules
        tasks = self._host_tasks(item.host)
        if not tasks:
            return []
        names = ", ".join(t.info.name for t in tasks)
        why = (f"host {item.host} does not answer: {item.problem}; nothing came from it for {now - heard:.0f} s "
               f"(network cut or host down)")
        if _workers_only(self.mode, tasks):
            if item.host in self.hosts.unreachable:
                return []
            self.hosts.unreachable[item.host] = (why, heard)
            return [HostNotice(item.host, f"{why}: {names} on it {'is' if len(tasks) == 1 else 'are'} cut off until it "
                                          "answers again; the run goes on, not restarted (the chief waits for the "
                                          "steps it sent there)", True, tuple(t.info.name for t in tasks))]
        self.hosts.unreachable[item.host] = (why, heard)
        return self._failed(supervisor_name(item.host), f"{why}; {names} on it cannot take part")

    def _secondhand_due(self, now: float) -> list[Action]:
        """A peer's report of a task whose own words did not come: the task is blamed, or its host where the host
        stopped answering (TensorFlow's heartbeat then only tells what the network did)."""
        assert self.secondhand is not None
        culprit, why, due = self.secondhand
        suspect = self.tasks.get(culprit)
        host = suspect.info.host if suspect is not None else ""
        if host in self.hosts.unreachable:
            self.secondhand = None
            return self._failed(supervisor_name(host), f"{self.hosts.unreachable[host][0]}; {culprit} on it {why}")
        if host in self.hosts.probing and now < due + PROBE_WAIT_S:
            return []  # its host is being asked about: its answer decides whom to blame
        self.secondhand = None
        return self._failed(culprit, why)

    def _failed(self, culprit: str, reason: str) -> list[Action]:
        self.secondhand = None  # a decided failure settles any report still waiting for its culprit's words
        if self.outcome is not None:
            return []
        if self.phase is RunPhase.RESTARTING:
            self.pending_failure = self.pending_failure or (culprit, reason)
            return []
        if self.restarts_used < self.restarts_allowed:
            self.generation += 1
            return [RestartRun(f"{culprit}: {reason}", self.restarts_used, self.restarts_allowed)]
        return self._end(Outcome(EndState.FAILED, reason, culprit))

    def _end(self, outcome: Outcome) -> list[Action]:
        if self.outcome is not None:
            return []  # the first decided end is kept
        self.outcome = outcome
        self.phase = RunPhase.STOPPING
        return [StopRun(outcome)]

    # -- progress

    def _check_progress(self, now: float) -> list[Action]:
        if self.clock.progress_timeout_s <= 0 or self.outcome is not None or self.phase is not RunPhase.RUNNING:
            return []
        trainers = [t for t in self.tasks.values() if t.info.role in TRAINER_ROLES and not t.phase.terminal]
        if not trainers:
            return []
        if self.mode == "async":
            chief = [t for t in trainers if t.info.role == "chief"]
            if chief and self.clock.overdue(chief[0], now):
                return self._hung(chief[0], self.clock.hang_reason(chief[0]) + self.hosts.cut_note(), now)
            for worker in trainers:
                if worker.info.role == "worker" and self.clock.overdue(worker, now):
                    if self._silent_host(worker, now) is not None:
                        return self._hung(worker, "", now)
                    reason = self.clock.hang_reason(worker)
                    worker.started_at, worker.progress_at = now, None  # its restart gets a fresh clock
                    return [RestartTask(worker.info.name, reason)]
            return []
        # synchronous: every trainer moves together; the run is hung when none reported a step
        deadline = self.clock.run_deadline(trainers)
        if deadline is None or now <= deadline:
            return []
        culprit = hang_culprit(trainers)
        return self._hung(culprit, self.clock.hang_reason(culprit, run_wide=True), now)

    def _silent_host(self, task: _Task, now: float, quiet: float = QUIET_HOST_S) -> float | None:
        """Seconds ``task``'s host (a sampling one) has sent nothing, where that is past ``quiet``."""
        return self.hosts.silent_for(task.info.host, now, quiet)

    def _hung(self, task: _Task, reason: str, now: float) -> list[Action]:
        """Fail the run for a hang of ``task``, blamed on its host's supervisor where that host went silent."""
        silent = self._silent_host(task, now)
        if silent is not None and silent <= SUPERVISOR_SILENCE_S:
            return []  # its supervisor is quiet too: decided once it speaks again or stays silent
        if silent is not None:
            return self._failed(supervisor_name(task.info.host), (
                f"sent nothing for {silent:.0f} s (not even its samples every 0.5 s): the supervisor is stopped "
                f"(SIGSTOP), frozen or cut off; its tasks ({task.info.name} among them) could not report"))
        actions = self._failed(task.info.name, reason + STACKS_NOTE)
        return [replace(a, dump_stacks=True) if isinstance(a, (StopRun, RestartRun)) else a for a in actions]


def hang_culprit(tasks: Sequence[_Task]) -> _Task:
    """The task most likely to hang a synchronous run, which waits for its slowest task: the one busy
    in a loop while the others wait idle in collectives (its sustained CPU use at least
    :data:`BUSY_CPU` points and 3x anyone else's: relative, as a loaded machine gives a spinning task
    far less than a core), else the one furthest behind (one still starting, that never said it runs, before
    one that waits in its first step; then the lowest last step), else the first."""
    ranked = sorted(tasks, key=lambda t: t.recent_cpu, reverse=True)
    top = ranked[0]
    runner_up = ranked[1].recent_cpu if len(ranked) > 1 else 0.0
    if top.recent_cpu >= BUSY_CPU and top.recent_cpu >= 3 * runner_up:
        return top
    return min(tasks, key=lambda t: (t.phase is not TaskPhase.STARTING, t.last_step))


def _workers_only(mode: str, tasks: Sequence[_Task]) -> bool:
    """Tasks an async run goes on without (its workers; never its chief or a ps)."""
    return mode == "async" and all(t.info.role == "worker" for t in tasks)


def from_event(event: dict[str, Any]) -> Input | None:
    """The policy's view of a decoded event, if it has one."""
    kind = event.get("kind")
    generation = int(event.get("generation", 0) or 0)
    task = str(event.get("task", ""))
    if kind == "status":
        try:
            state = TaskPhase(str(event.get("state", "")))
        except ValueError:
            return None
        return TaskStatus(task, state, str(event.get("reason", "") or ""), bool(event.get("will_restart")),
                          generation, str(event.get("cause_task", "") or ""))
    if kind == "step":
        worker = event.get("worker")
        return StepProgress(task, int(event.get("step", 0)), worker if isinstance(worker, int) else None,
                            generation)
    if kind == "progress":  # steps, without a report's figures (async chiefs, programs)
        step = event.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return StepProgress(task, step, None, generation, moved_on=True)
        return None
    if kind == "device":
        cpu = event.get("cpu_percent")
        if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
            return CpuSample(task, float(cpu), generation)
    return None



def feed_sample(policy: Lifecycle, event: dict[str, Any], now: float) -> list[Action]:
    """``policy.feed(from_event(event), now)``, without making the input for a ``step`` or ``device`` event (the
    dispatcher's hot path: nearly every event of a run is one of these)."""
    kind = event.get("kind")
    if kind == "step":
        worker = event.get("worker")
        return policy.step_seen(str(event.get("task", "")), int(event.get("step", 0)),
                                worker if isinstance(worker, int) else None, int(event.get("generation", 0) or 0), now)
    if kind == "device":
        cpu = event.get("cpu_percent")
        if not isinstance(cpu, (int, float)) or isinstance(cpu, bool):
            return []  # no CPU figure: no input (as from_event)
        return policy.cpu_seen(str(event.get("task", "")), float(cpu), int(event.get("generation", 0) or 0), now)
    item = from_event(event)
    return [] if item is None else policy.feed(item, now)


Listener = Callable[[dict[str, Any]], None]


@runtime_checkable
class RunHandle(Protocol):
    """What a front end holds of a launched run (:class:`engine.control.launcher.Run` is one).

    ``start()`` returns the run folder; ``stop()`` ends it (``wait=False`` returns at once);
    ``wait(timeout)`` returns the run's state; ``done`` is True once the final ``run`` event was
    delivered; listeners get every event, in order, on the run's own thread; ``state`` is the folded
    :class:`~engine.observe.telemetry.RunState`.
    """

    state: RunState

    def start(self) -> Path: ...

    def stop(self, reason: str = ..., wait: bool = ...) -> None: ...

    def wait(self, timeout: float | None = None) -> str: ...

    @property
    def done(self) -> bool: ...

    def add_listener(self, listener: Listener) -> None: ...

    @property
    def run_dir(self) -> Path: ...
