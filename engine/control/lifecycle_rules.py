"""Two pure parts of the run lifecycle, owned by :class:`~engine.control.lifecycle.Lifecycle`: what it knows of
each host (:class:`HostRules`) and the progress clocks a hang is judged by (:class:`ProgressRules`).

No threads, no processes, no clock of their own: the lifecycle passes the time in and turns what they answer into
its actions (``ProbeHost``, ``HostNotice``, ``RelaunchHost``, a hang's failure).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.contract import records
from engine.contract.config import STEPS_PER_EXECUTION_MODES

#: A task's first step may take this many times ``progress_timeout_s`` (imports, tracing, restores).
FIRST_STEP_FACTOR = 3.0
#: Seconds a host of another machine may send nothing (its supervisor samples every 0.5 s) before the launcher asks
#: whether it answers at all (``ProbeHost``).
HOST_PROBE_AFTER_S = 2.0
#: Seconds between two probes of a host that stays silent.
HOST_PROBE_EVERY_S = 3.0

TaskPhase = records.TaskState


@dataclass(frozen=True)
class TaskInfo:
    name: str
    role: str
    host: str = ""


#: A task's CPU samples the lifecycle keeps (its supervisor samples every 0.5 s): ~10 s, within the shortest hang
#: window (``training.progress_timeout_s`` is at least that in the presets, 3x for the first step).
CPU_SAMPLES = 20


@dataclass
class TaskTrack:
    """What the lifecycle follows of one task."""

    info: TaskInfo
    phase: TaskPhase = TaskPhase.PENDING
    started_at: float | None = None  # when its current life began (for the first-step deadline)
    progress_at: float | None = None  # when it last reported (async workers: was credited with) a step
    last_step: int = -1
    cpu: deque[float] = field(default_factory=lambda: deque(maxlen=CPU_SAMPLES))

    def restart(self) -> None:
        """A whole-run restart: a new life, not started yet."""
        self.phase = TaskPhase.PENDING
        self.started_at = self.progress_at = None
        self.last_step = -1
        self.cpu.clear()

    @property
    def recent_cpu(self) -> float:
        """Its mean CPU use over its last :data:`CPU_SAMPLES` samples (~10 s: a task pinned to a core that other work
        shares can spin at 100 % and then get a few percent for seconds, and a waiting task may burst briefly)."""
        return sum(self.cpu) / len(self.cpu) if self.cpu else 0.0


class HostRules:
    """Each host as the lifecycle knows it: when anything last came from it, whether it samples (its silence then
    means something), probes asked and not answered, hosts that do not answer, supervisors gone, relaunches."""

    def __init__(self, remote_hosts: Iterable[str] = (), max_relaunches: int = 10) -> None:
        #: hosts of other machines (probed when silent): the launcher's supervisor groups reached by a transport
        self.remote_hosts = frozenset(remote_hosts)
        self.max_relaunches = max_relaunches
        self.relaunches: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        """A whole-run restart: every host is heard afresh (relaunch counts stay)."""
        self.heard_at: dict[str, float] = {}  # when anything last came from each host (its supervisor alive)
        self.sampled: set[str] = set()  # hosts whose supervisor sent samples (silence is judged only there)
        self.probing: set[str] = set()  # hosts asked about, no answer yet
        self.asked: dict[str, float] = {}  # host -> when it was last asked about
        self.unreachable: dict[str, tuple[str, float]] = {}  # host -> (why, since when): said once per episode
        self.gone: set[str] = set()  # hosts whose supervisor ended (not probed until one speaks again)

    def heard(self, host: str, now: float) -> str:
        """Something came from ``host``: it is alive. Returns what to say where it had stopped answering, else ""."""
        self.heard_at[host] = now
        self.gone.discard(host)
        self.asked.pop(host, None)
        cut = self.unreachable.pop(host, None)
        return "" if cut is None else f"host {host} answers again after {now - cut[1]:.0f} s without a word"

    def silent_for(self, host: str, now: float, quiet: float) -> float | None:
        """Seconds a sampling ``host`` has sent nothing, where that is past ``quiet``."""
        heard = self.heard_at.get(host)
        if heard is None or host not in self.sampled or now - heard <= quiet:
            return None
        return now - heard

    def due_probes(self, now: float, busy: Mapping[str, bool]) -> list[str]:
        """Hosts of other machines to ask about now: silent for :data:`HOST_PROBE_AFTER_S` while ``busy`` (tasks
        running there), not asked within :data:`HOST_PROBE_EVERY_S`, no answer pending."""
        out = []
        for host in sorted(self.remote_hosts & self.sampled - self.gone):
            heard = self.heard_at.get(host)
            if heard is None or now - heard <= HOST_PROBE_AFTER_S or not busy.get(host) or host in self.probing:
                continue
            asked = self.asked.get(host)
            if asked is None or now - asked >= HOST_PROBE_EVERY_S:
                self.asked[host] = now
                self.probing.add(host)
                out.append(host)
        return out

    def quiet_since(self, host: str, now: float) -> float | None:
        """When ``host`` was last heard, where that is more than :data:`HOST_PROBE_AFTER_S` ago (a probe's answer
        counts only then), else None."""
        heard = self.heard_at.get(host)
        return None if heard is None or now - heard <= HOST_PROBE_AFTER_S else heard

    def next_relaunch(self, host: str) -> int:
        """The how-manieth relaunch of ``host`` this would be; counted where within ``max_relaunches``."""
        count = self.relaunches.get(host, 0) + 1
        if count <= self.max_relaunches:
            self.relaunches[host] = count
        return count

    def cut_note(self) -> str:
        """What a hang of the async chief owes to hosts that do not answer (it waits for the steps sent there)."""
        cut = sorted(self.unreachable)
        if not cut:
            return ""
        return (f"; meanwhile host{'s' if len(cut) > 1 else ''} {', '.join(cut)} did not answer: the chief waits for "
                "the steps it sent to the workers there")


class ProgressRules:
    """The progress clocks of a run: when a task (or, synchronous, any task) last moved on, its deadlines, and how a
    hang is said. ``progress_timeout_s`` 0 turns hang detection off."""

    def __init__(self, mode: str, progress_timeout_s: float = 0.0, report_interval_s: float = 0.0,
                 steps_per_execution: int = 1) -> None:
        self.mode = mode
        self.progress_timeout_s = progress_timeout_s
        #: seconds between a task's step reports (``1 / training.metrics_hz``): silence that long is not a hang
        self.report_interval_s = max(0.0, report_interval_s)
        self.steps_per_execution = steps_per_execution  # data and async: a step report comes per group of this many
        self.run_progress_at: float | None = None  # the last step of any task (synchronous runs)

    def record(self, tasks: Mapping[str, TaskTrack], task_name: str, step: int, worker: int | None,
               moved_on: bool, now: float) -> None:
        """A step report of ``task_name`` (``worker`` ran it, async); ``moved_on``: progress only past its last step."""
        task = tasks.get(task_name)
        if moved_on and task is not None and step <= task.last_step:
            return  # a progress report of no new step is no progress
        self.run_progress_at = now
        if task is not None:
            task.progress_at = now
            task.last_step = max(task.last_step, step)
        if self.mode == "async" and worker is not None:
            credited = tasks.get(f"worker:{worker}")
            if credited is not None:
                credited.progress_at = now
                credited.last_step = max(credited.last_step, step)

    def deadline(self, since: float | None, stepped: bool) -> float | None:
        if since is None:
            return None
        if stepped:  # the next report may come a whole report interval (and a slow group) later
            return since + self.progress_timeout_s + 2 * self.report_interval_s
        return since + self.progress_timeout_s * FIRST_STEP_FACTOR

    def overdue(self, task: TaskTrack, now: float) -> bool:
        if task.phase.terminal or task.phase is TaskPhase.PENDING:
            return False
        stepped = task.progress_at is not None
        deadline = self.deadline(task.progress_at if stepped else task.started_at, stepped)
        return deadline is not None and now > deadline

    def run_deadline(self, trainers: list[TaskTrack]) -> float | None:
        """A synchronous run's deadline: every trainer moves together (None: some task is not even started yet)."""
        if self.run_progress_at is not None:
            return self.deadline(self.run_progress_at, True)
        starts = [t.started_at for t in trainers if t.started_at is not None]
        if len(starts) < len(trainers):
            return None  # its supervisor is still coming up
        return self.deadline(max(starts), False)

    def hang_reason(self, task: TaskTrack, run_wide: bool = False) -> str:
        limit = self.progress_timeout_s
        if (self.run_progress_at if run_wide else task.progress_at) is None:
            why = f"hung: no first step within {limit * FIRST_STEP_FACTOR:g} s of starting"
        else:
            why = f"hung: no progress for {limit:g} s (training.progress_timeout_s)"
            if self.report_interval_s >= 1.0:
                why += (f" after a report interval of {self.report_interval_s:g} s (training.metrics_hz "
                        f"{1 / self.report_interval_s:g})")
            if task.last_step >= 0:
                why += f", last step {task.last_step}"
            if self.mode in STEPS_PER_EXECUTION_MODES and self.steps_per_execution > 1:
                who = "a worker" if self.mode == "async" else "a task"
                why += (f"; {who} reports once per {self.steps_per_execution} steps (training.steps_per_execution):"
                        " where so many steps take longer, lower it or raise the timeout")
        if task.cpu:
            why += f"; it used {task.recent_cpu:.0f}% CPU meanwhile"
        return why
