"""The per-host supervising process: ``python -m engine.control.supervisor``.

It reads one JSON line on stdin (the host's task plans), starts every task as
its own process (own process group, event pipe, lifeline pipe), relays their
events as JSON lines on stdout, samples their CPU, memory and GPU use, and
stops them all when told or when its launcher is gone (stdin closed, stdout
broken). The same program runs wherever a transport starts it (locally, in a
network namespace, over SSH, under ``srun``).

Commands on stdin are versioned JSON lines (:func:`engine.contract.events.make_command`):
``stop`` (with the state and reason the stopped tasks report, and their grace),
``restart`` (a task, as if it were lost) and ``signal``. A line that is not a valid
command is counted and ignored.

Restarting a task: the tasks named in ``restart_on_failure`` (async workers) are restarted when they fail, at
most ``max_task_restarts`` times each (the launcher's ``MAX_WORKER_RESTARTS``, 10); the failure past that
limit says the limit was reached.

Stopping a task: SIGTERM to its process group, then SIGKILL to the group after the grace
(:data:`TASK_STOP_GRACE` unless the command says otherwise): a task may use the grace to
flush its last steps and write a final checkpoint. When a task's process ends, its whole
process group is killed at once (children of a user's script go with it), and at the end
every process still carrying the run's folder in ``CLUSTERDECK_RUN_DIR`` *and this supervisor's own mark* in
``CLUSTERDECK_SUPERVISOR`` is killed: never the tasks of another supervisor of the run (a later one of this host,
started again after its connection was lost, or another host's where hosts share a machine's processes).

Taking over: a supervisor the launcher starts again for a host (``takeover`` in the spec: its earlier one lost its
connection, or a whole-run restart) first ends what an earlier supervisor of this run and host left on this
machine: that supervisor (named in ``hosts/<host>/supervisor.json``, checked against its start time, machine
and boot) and every process carrying its mark. Its tasks would otherwise hold their ports, and a cut-off
supervisor that hears of its lost launcher late would still be running them.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.contract import events, parent_death, warm_start
from engine.contract.plan import (
    CUDA_ORDER,
    CUDA_ORDER_ENV,
    INTER_OP_ENV,
    INTRA_OP_ENV,
    CoreShare,
    TaskPlan,
    intra_op_threads,
    share_cores,
)
from engine.contract.run_folder import OVERLONG, STOP_MARKERS_ENV, LineSplitter, RunFolder
from engine.contract.task_logs import LOG_CAP_BYTES, LOG_HEAD_BYTES, cap_log, log_tail
from engine.control import background, machine_fit, netns, process_end
from engine.control.gpu import GpuSampler, driver_present, task_gpu_figures
from engine.control.process_end import (  # noqa: F401 - also read from here (doctor, tests)
    RUN_DIR_ENV,
    SUPERVISOR_ENV,
    end_earlier_supervisor,
    kill_run_processes,
)
from engine.control.process_end import has_exited as _has_exited
from engine.control.process_end import signal_group as _signal_group
from engine.control.warm_tasks import READY_TIMEOUT_S, ForkedTask, Template, TemplateError, template_env

SAMPLE_INTERVAL = 0.5
#: How a task is started: in a process group of its own (what a stop signals, children included), inside the
#: supervisor's session. A session per task would put each task in a scheduling group of its own wherever the
#: kernel groups processes by session (autogroup), and the run's tasks, which wait on each other every step,
#: would be scheduled as unrelated programs: async runs trained at 0.90 of their bare loop that way, and 1.00
#: in one session (docs/benchmarks.md, 1e).
OWN_PROCESS_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                                     else {"preexec_fn": os.setpgrp})
#: Seconds a task gets between SIGTERM (to its process group) and SIGKILL when it is stopped.
TASK_STOP_GRACE = 3.0  # a task gives itself 2.5 s after SIGTERM (engine.runtime.stop): it ends first
#: The fewest inter-op threads a task gets (unless the user chose): TensorFlow sizes its inter-op pool by the
#: cores it sees, and with one thread (a one-core host) an async worker's first group of steps never ended.
MIN_INTER_OP_THREADS = 2
#: The record of a host's supervisor in the run folder (``hosts/<host>/``): what a later one takes over.
RECORD_NAME = "supervisor.json"
USER_STOP = "stopped by the user"


def start_arguments(cores: tuple[int, ...]) -> dict[str, Any]:
    """``Popen`` arguments of a task: its own process group (:data:`OWN_PROCESS_GROUP`), ``SIGKILL`` when the
    supervisor ends (:mod:`engine.contract.parent_death`), the normal
    scheduling policy (the supervisor runs as background work, :mod:`engine.control.background`) and, for
    a task given ``cores``, its CPU affinity, each set in the child before it runs anything, so every thread
    it starts inherits them. The supervisor starts no thread, so running that between fork and exec is safe."""
    group = OWN_PROCESS_GROUP.get("preexec_fn")
    pin_to = cores if cores and hasattr(os, "sched_setaffinity") else ()
    parent = os.getpid()

    def prepare() -> None:
        if group is not None:
            group()
        parent_death.arm(parent)  # the task dies with the supervisor (else it watches its lifeline)
        background.restore_in_child()
        if pin_to:
            os.sched_setaffinity(0, pin_to)

    return {**OWN_PROCESS_GROUP, "preexec_fn": prepare}


def _cores_text(cores: list[int]) -> str:
    if len(cores) == 1:
        return f"core {cores[0]}"
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"cores {cores[0]}-{cores[-1]}"
    return "cores " + ",".join(map(str, cores))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class TaskProcess:
    plan: TaskPlan
    proc: subprocess.Popen[bytes] | ForkedTask | None = None
    event_fd: int | None = None
    lifeline_fd: int | None = None
    lines: LineSplitter = field(default_factory=LineSplitter)
    decoder: events.StreamDecoder | None = None  # the reader of its event pipe over ``lines``
    ps: psutil.Process | None = None
    terminal_state: str = ""  # the task's own last terminal status, if it sent one
    reason: str = ""
    traceback: str = ""
    frozen_samples: int = 0
    done: bool = False
    stopping: bool = False
    restarts: int = 0
    restart_requested: bool = False
    cause_task: str = ""  # the task whose SIGTERM (not ClusterDeck's) stopped this one
    log_cut: bool = False  # its log was cut (said once)


class Supervisor:
    def __init__(self, spec: dict[str, Any], out: Any = None) -> None:
        self.run_dir = Path(spec["run_dir"])
        self.folder = RunFolder(self.run_dir)
        refused = self.folder.claim()  # this user's own folder, or nothing is written in it
        if refused:
            raise FolderRefused(f"the run folder {str(self.run_dir)!r} on this host {refused}")
        if spec.get("config_yaml"):  # always the launcher's: a config.yaml found in the folder is never used
            self.folder.write_config_text(spec["config_yaml"])
        self.host = spec.get("host", "local")
        self.python = spec.get("python") or sys.executable
        self.extra_env: dict[str, str] = dict(spec.get("env", {}))
        self.tasks = {d["name"]: TaskProcess(TaskPlan.from_dict(d)) for d in spec["tasks"]}
        # the host's cores, shared evenly by its tasks (TensorFlow would give each task all of them), unless
        # the user chose the threads: its affinity (a Slurm step's CPUs, a taskset), each training task's own
        self.cpus = machine_fit.cpus()
        self.cores = len(self.cpus)
        self.shares_chosen = INTRA_OP_ENV in os.environ or INTRA_OP_ENV in self.extra_env
        self.shares: dict[str, CoreShare] = ({} if self.shares_chosen else
                                             share_cores([t.plan for t in self.tasks.values()], self.cpus))
        self.intra_op_threads = intra_op_threads(len(self.tasks), self.cores)
        self.sample_interval = float(spec.get("sample_interval", SAMPLE_INTERVAL))
        self.out = out if out is not None else sys.stdout.buffer
        self.sel = selectors.DefaultSelector()
        self.gpus = GpuSampler() if any(t.plan.gpu_ids for t in self.tasks.values()) else None
        self.stats = events.ReadStats()
        # tasks the supervisor restarts itself when they fail (async workers), and how often at most
        self.restartable: set[str] = set(spec.get("restart_on_failure", ()))
        self.max_restarts = int(spec.get("max_task_restarts", 10))
        self.stopping = False
        self.stop_state = "stopped"  # what tasks stopped by a stop command report: "stopped" or "finished"
        self.stop_reason = USER_STOP
        self.stop_grace = TASK_STOP_GRACE
        self.launcher_gone = False
        self.stdin_lines = LineSplitter()
        self.bad_commands = 0
        self.template: Template | None = None
        self.subreaper = False
        self.token = f"{self.host}/{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this supervisor's mark on its tasks
        self.takeover = bool(spec.get("takeover"))
        for name, count in dict(spec.get("restarts", {})).items():  # a host started again keeps its tasks' counts
            if name in self.tasks and isinstance(count, int):
                self.tasks[name].restarts = count

    # -- output

    def send(self, event: dict[str, Any], *, flush: bool = True) -> None:
        self.send_line(events.encode(event).encode("utf-8"), flush=flush)

    def send_line(self, line: bytes, *, flush: bool = True) -> None:
        """Write ``line`` to the launcher; ``flush`` False leaves it buffered for the next :meth:`flush_out`
        (the events relayed from one read of a task's pipe go out in one write: one wake-up of the launcher)."""
        if self.launcher_gone:
            return
        try:
            self.out.write(line)
        except (BrokenPipeError, OSError, ValueError):
            self.launcher_gone = True
        if flush:
            self.flush_out()

    def flush_out(self) -> None:
        if self.launcher_gone:
            return
        try:
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.launcher_gone = True

    # -- starting

    def task_dir(self, name: str) -> Path:
        return self.folder.task_dir(name)

    def host_env(self) -> dict[str, str]:
        """The environment every task of this host starts with, before its own variables."""
        env = dict(os.environ)
        env.update(self.extra_env)
        env.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env[RUN_DIR_ENV] = str(self.run_dir)
        env[SUPERVISOR_ENV] = self.token  # the template's too: a forked task's /proc environment is the template's
        env[CUDA_ORDER_ENV] = CUDA_ORDER  # the template's too: tasks fork from it with the plan's env unchanged
        env[STOP_MARKERS_ENV] = "1"  # a SIGTERM without the task's marker is not ours (engine.runtime.stop)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the engine package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def start_template(self) -> None:
        """Start the warm-start template (:mod:`engine.contract.warm_start`) where it can serve: some task
        of this host sees no GPU (or none can, without NVIDIA's driver), the supervisor can adopt the
        forked tasks, and nobody turned it off."""
        env = self.host_env()
        gpu_driver = driver_present()
        if not parent_death.available() or not warm_start.template_useful(
                env, [tp.plan.gpu_ids for tp in self.tasks.values()], gpu_driver=gpu_driver):
            return
        self.subreaper = self.subreaper or parent_death.become_subreaper()
        if not self.subreaper:
            return
        log = self.folder.supervisor_log(self.host)
        self.folder.private_dir(log.parent)
        self.template = Template(self.python, self.run_dir, template_env(env), log, start_arguments(()),
                                 gpu_driver=gpu_driver)
        if self.template.error:
            self.template_failed(self.template.error)

    def wait_for_template(self) -> None:
        """Until the template has imported everything (or failed, or a stop came), obeying commands."""
        template = self.template
        if template is None:
            return
        self.sel.register(template.fileno(), selectors.EVENT_READ, template)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while not template.ready and not template.error and not self.stopping:
                if time.monotonic() >= deadline:
                    template.error = f"the template did not import the runtime within {READY_TIMEOUT_S:g} s"
                    break
                for key, _ in self.sel.select(0.1):
                    if key.data is None:
                        self.read_stdin(key.fd)
                    elif key.data is template:
                        template.read_ready()
                if self.launcher_gone:
                    self.stopping = True
        finally:
            self.sel.unregister(template.fileno())
        if template.error:
            self.template_failed(template.error)

    def template_failed(self, why: str) -> None:
        """Start the tasks cold from now on, and say why."""
        if self.template is None:
            return
        self.template.close()
        self.template = None
        self.send(events.make("info", f"supervisor@{self.host}", message=f"tasks start cold: {why}"))

    def announce_threads(self) -> None:
        """Say how the host's cores are shared, where several tasks share them and nobody chose otherwise."""
        if len(self.tasks) < 2 or self.shares_chosen:
            return
        pinned = {name: list(share.cores) for name, share in self.shares.items() if share.cores}
        where = ""
        if pinned:
            where = "; the training tasks run on cores of their own: " + ", ".join(
                f"{name} on {_cores_text(cores)}" for name, cores in pinned.items())
        self.send(events.make(
            "info", f"supervisor@{self.host}", cores=self.cores, intra_op_threads=self.intra_op_threads,
            task_cores=pinned,
            message=f"{len(self.tasks)} tasks share {self.cores} core(s) on this host: each task runs "
                    f"{self.intra_op_threads} intra-op thread(s){where} ({INTRA_OP_ENV}; set it to choose)"))

    def start_task(self, tp: TaskProcess) -> None:
        plan = tp.plan
        tdir = self.folder.private_dir(self.task_dir(plan.name))  # never through a planted link
        self.folder.stop_marker(plan.name).unlink(missing_ok=True)  # a new life: no stop asked of it yet
        ev_r, ev_w = os.pipe()
        life_r, life_w = os.pipe()
        env = self.host_env()
        env.update(plan.env)
        share = self.shares.get(plan.name)  # none where the user chose the threads (they are in env already)
        if share is not None:
            for key, value in share.env.items():
                env.setdefault(key, value)
        if self.cores < MIN_INTER_OP_THREADS:  # a one-core host: TensorFlow's pool of one inter-op thread hangs
            env.setdefault(INTER_OP_ENV, str(MIN_INTER_OP_THREADS))
        cores = share.cores if share else ()
        args = ["--run-dir", str(self.run_dir)]
        with os.fdopen(open_log(tdir / "log.txt"), "ab") as log:
            warm = self.template is not None and self.template.can_fork(env)
            if self.template is not None and self.template.error:  # it ended since the last task
                self.template_failed(self.template.error)
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {plan.name}"
                      f"{' (forked, warm)' if warm else ''}\n".encode())
            log.flush()
            tp.proc = None
            if warm:
                assert self.template is not None
                try:
                    tp.proc = self.template.fork(args, env, str(self.run_dir), cores,
                                                 (log.fileno(), ev_w, life_r))
                except TemplateError as exc:
                    log.write(f"--- the warm-start template failed ({exc}): starting {plan.name} cold\n".encode())
                    log.flush()
                    self.template_failed(str(exc))
            if tp.proc is None:
                cmd = [self.python, "-m", "engine.runtime.task", *args,
                       "--event-fd", str(ev_w), "--lifeline-fd", str(life_r)]
                tp.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env=env, pass_fds=(ev_w, life_r), cwd=str(self.run_dir),
                                           **start_arguments(cores))
        os.close(ev_w)
        os.close(life_r)
        os.set_blocking(ev_r, False)
        tp.event_fd, tp.lifeline_fd = ev_r, life_w
        tp.lines = LineSplitter()
        tp.done = False
        tp.restart_requested = False
        tp.stopping = False
        tp.terminal_state = ""
        tp.reason = ""
        tp.traceback = ""
        tp.cause_task = ""
        self.sel.register(ev_r, selectors.EVENT_READ, tp)
        try:
            tp.ps = psutil.Process(tp.proc.pid)
            tp.ps.cpu_percent(None)
        except psutil.Error:
            tp.ps = None
        self.send(events.make("status", plan.name, state="starting", pid=tp.proc.pid, host=plan.host,
                              role=plan.role, gpu_ids=list(plan.gpu_ids), devices=plan.devices,
                              cores=list(cores), restarts=tp.restarts))

    # -- relaying

    def decoder(self, tp: TaskProcess) -> events.StreamDecoder:
        """The reader of ``tp``'s event pipe (its lines, the supervisor's count of bad ones)."""
        if tp.decoder is None or tp.decoder.lines is not tp.lines:
            tp.decoder = events.StreamDecoder(self.stats, tp.lines)
        return tp.decoder

    def read_events(self, tp: TaskProcess) -> None:
        assert tp.event_fd is not None
        decoder = self.decoder(tp)
        while True:
            try:
                chunk = os.read(tp.event_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close_events(tp)
                return
            for event, _ in decoder.feed(chunk):
                self.forward(tp, event, flush=False)
            self.flush_out()

    def relay(self, tp: TaskProcess, line: bytes, *, flush: bool = True) -> None:
        """One whole line of ``tp``'s pipe: its event forwarded, a bad line counted."""
        event = self.decoder(tp).decode_line(line)
        if event is not None:
            self.forward(tp, event, flush=flush)

    def forward(self, tp: TaskProcess, event: dict[str, Any], *, flush: bool = True) -> None:
        """A task's event to the launcher (a terminal failure held back until the task is reaped)."""
        event["task"] = tp.plan.name  # a task speaks only for itself
        if event["kind"] == "status" and event.get("state") in ("finished", "failed", "stopped"):
            tp.terminal_state = event["state"]
            tp.reason = str(event.get("reason", ""))
            tp.cause_task = str(event.get("cause_task", "") or "")
            if event["state"] == "failed":
                # held back: one failed event goes out when the process is reaped, saying
                # whether the task will be restarted
                tp.reason = tp.reason or "failed"
                tp.traceback = str(event.get("traceback", ""))
                return
        self.send(event, flush=flush)

    def close_events(self, tp: TaskProcess) -> None:
        if tp.event_fd is not None:
            for event, _ in self.decoder(tp).finish():
                self.forward(tp, event)
            try:
                self.sel.unregister(tp.event_fd)
            except (KeyError, ValueError):
                pass
            os.close(tp.event_fd)
            tp.event_fd = None

    # -- watching

    def reap(self) -> None:
        for tp in self.tasks.values():
            if tp.done or tp.proc is None:
                continue
            if tp.proc.returncode is None:
                if not _has_exited(tp.proc):
                    continue
                # its group first (still reserved by the unreaped leader): no child of it survives it
                _signal_group(tp.proc.pid, signal.SIGKILL, group_only=True)
            code = tp.proc.wait()
            if tp.event_fd is not None:
                self.read_events(tp)
                self.close_events(tp)
            if tp.lifeline_fd is not None:
                os.close(tp.lifeline_fd)
                tp.lifeline_fd = None
            tp.done = True
            name = tp.plan.name
            if tp.terminal_state == "finished":
                pass  # the task said so itself (a stop racing its exit changes nothing)
            elif tp.stopping or self.stopping:
                if self.launcher_gone:
                    self.send(events.make("status", name, state="stopped", exit_code=code,
                                          reason="the launcher is gone"))
                else:
                    why = {"reason": self.stop_reason} if self.stop_reason else {}
                    self.send(events.make("status", name, state=self.stop_state, exit_code=code, **why))
            else:
                allowed = name in self.restartable or tp.restart_requested
                will_restart = allowed and tp.restarts < self.max_restarts and not self.stopping
                if tp.terminal_state == "failed" or (tp.terminal_state == "stopped" and tp.cause_task):
                    reason = tp.reason  # its own words (a stop it was not asked for names the task that caused it)
                else:
                    reason = describe_exit(code) if code != 0 else "exited without finishing"
                if allowed and not will_restart and not self.stopping:  # it would be restarted, but no more
                    reason = (f"{reason}; not restarted again: it was restarted {tp.restarts} time(s), the most a "
                              f"lost async worker is restarted (max_task_restarts {self.max_restarts})")
                extra: dict[str, Any] = {"traceback": tp.traceback} if tp.traceback else {}
                if tp.cause_task:
                    extra["cause_task"] = tp.cause_task
                self.send(events.make("status", name, state="failed", exit_code=code, reason=reason,
                                      log_tail=log_tail(self.task_dir(name) / "log.txt"),
                                      will_restart=will_restart, **extra))
                if will_restart:
                    tp.restarts += 1
                    self.send(events.make("status", name, state="restarting", reason=reason,
                                          restarts=tp.restarts))
                    self.start_task(tp)
        if self.subreaper:
            self.reap_orphans()

    def reap_orphans(self) -> None:
        """As a child subreaper (warm start) the supervisor adopts what its tasks leave behind when they
        end before their own children: reap those that ended (the tasks themselves are reaped above)."""
        known = {tp.proc.pid for tp in self.tasks.values() if tp.proc is not None and tp.proc.returncode is None}
        template = self.template.proc if self.template is not None else None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in known:
                return
            if template is not None and info.si_pid == template.pid:
                template.poll()  # a template that ended: its next fork request fails, and tasks start cold
                template = None
                continue
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return

    def bound_log(self, tp: TaskProcess) -> None:
        """Cut the task's ``log.txt`` where it passed its cap (``task_logs.cap_log``); say so once per task."""
        path = self.task_dir(tp.plan.name) / "log.txt"
        try:
            if os.lstat(path).st_size <= LOG_CAP_BYTES:
                return
        except OSError:
            return
        dropped = cap_log(path)
        if dropped and not tp.log_cut:
            tp.log_cut = True
            self.send(events.make("info", tp.plan.name, log_cut=dropped, message=(
                f"its log passed {LOG_CAP_BYTES // (1024 * 1024)} MiB and was cut: tasks/"
                f"{path.parent.name}/log.txt keeps its first {LOG_HEAD_BYTES // (1024 * 1024)} MiB and its latest "
                "output (it is cut again whenever it passes the cap; this is said once)")))

    def sample(self) -> None:
        gpu_samples = self.gpus.sample() if self.gpus is not None and self.gpus.available else []
        for tp in self.tasks.values():
            if tp.done or tp.ps is None:
                continue
            try:
                with tp.ps.oneshot():
                    cpu = tp.ps.cpu_percent(None)
                    rss = tp.ps.memory_info().rss
                    status = tp.ps.status()
            except psutil.Error:
                continue
            if status == psutil.STATUS_STOPPED and not tp.stopping and not self.stopping:
                tp.frozen_samples += 1
                if tp.frozen_samples >= 2:  # stopped for a whole sample interval: frozen, not a blip
                    tp.frozen_samples = 0
                    tp.terminal_state = "failed"
                    tp.reason = "frozen: the process was stopped (SIGSTOP) and made no progress"
                    _signal_group(tp.ps.pid, signal.SIGKILL)
                    continue
            else:
                tp.frozen_samples = 0
            fields: dict[str, Any] = {"cpu_percent": cpu, "rss_bytes": rss, "pid": tp.ps.pid}
            fields.update(task_gpu_figures(gpu_samples, list(tp.plan.gpu_ids), tp.ps.pid))
            self.send(events.make("device", tp.plan.name, **fields), flush=False)
        self.flush_out()  # every task's figures in one write

    # -- stopping

    def stop_tasks(self, tps: list[TaskProcess], grace: float = TASK_STOP_GRACE) -> None:
        """SIGTERM to each task's process group, SIGKILL to the groups of those still there after ``grace``."""
        by_proc = {id(tp.proc): tp for tp in tps if tp.proc is not None}

        def stopping(proc: Any) -> None:
            tp = by_proc[id(proc)]
            tp.stopping = True
            mark_stop(self.folder.stop_marker(tp.plan.name))  # this SIGTERM is ours: the task stops, not fails

        process_end.terminate_groups([tp.proc for tp in tps if tp.proc is not None], grace, stopping)
        for tp in tps:
            tp.stopping = True

    def command(self, line: bytes) -> None:
        """One command line from the launcher; anything else is counted and ignored."""
        if not line.strip():
            return
        cmd = None if line is OVERLONG else events.decode_command(line)
        if cmd is None or ("task" in cmd and cmd["task"] not in self.tasks) or (
                cmd["command"] == "signal" and not isinstance(getattr(signal, cmd["signal"], None), signal.Signals)):
            self.bad_commands += 1
            if self.bad_commands <= 3:
                self.send(events.make("info", f"supervisor@{self.host}", message="a malformed command was ignored: "
                                      + line[:120].decode("utf-8", "replace").strip()))
            return
        if cmd["command"] == "stop":
            self.stopping = True
            state = cmd.get("state", "stopped")
            self.stop_state = state if state in ("stopped", "finished") else "stopped"
            self.stop_reason = str(cmd.get("reason", USER_STOP if self.stop_state == "stopped" else ""))
            self.stop_grace = max(0.0, min(60.0, float(cmd.get("grace_s", TASK_STOP_GRACE))))
        elif cmd["command"] == "restart":
            # as if it were lost: reported failed (with the reason), then restarted by reap()
            tp = self.tasks[cmd["task"]]
            tp.restart_requested = True
            tp.terminal_state = "failed"
            tp.reason = str(cmd.get("reason", "restart requested"))
            if tp.proc is not None and not _has_exited(tp.proc):
                _signal_group(tp.proc.pid, signal.SIGKILL)
            elif tp.done:
                tp.restarts += 1
                self.start_task(tp)
        elif cmd["command"] == "signal":
            tp = self.tasks[cmd["task"]]
            if tp.proc is not None and not _has_exited(tp.proc):
                os.kill(tp.proc.pid, getattr(signal, cmd["signal"]))

    def read_stdin(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.launcher_gone = True
            self.stopping = True
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        for line in self.stdin_lines.feed(chunk):
            self.command(line)

    def take_over(self) -> None:
        """End what an earlier supervisor of this run and host left here (``takeover``), then record this one."""
        record = self.folder.host_dir(self.host) / RECORD_NAME
        if self.takeover:
            ended = end_earlier_supervisor(record, str(self.run_dir), self.host, self.token)
            if ended:
                self.send(events.make("info", f"supervisor@{self.host}", ended_pids=ended, message=(
                    f"ended {len(ended)} process(es) an earlier supervisor of this host left running (pids "
                    f"{', '.join(map(str, ended))}): this host was started again")))
        try:
            write_record(self.folder, record, self.token)
        except OSError:
            pass  # without it a later supervisor finds the earlier one's tasks by their mark only

    def run(self, stdin_fd: int) -> int:
        os.set_blocking(stdin_fd, False)
        self.sel.register(stdin_fd, selectors.EVENT_READ, None)
        self.take_over()
        self.announce_threads()
        self.start_template()
        self.wait_for_template()
        for tp in self.tasks.values():
            if not self.stopping:
                self.start_task(tp)
        next_sample = time.monotonic() + self.sample_interval
        try:
            while not self.stopping:
                timeout = max(0.0, min(0.1, next_sample - time.monotonic()))
                for key, _ in self.sel.select(timeout):
                    if key.data is None:
                        self.read_stdin(key.fd)
                    else:
                        self.read_events(key.data)
                self.reap()
                for tp in self.tasks.values():  # every turn (at most 0.1 s apart): a flooding task's log stays near its cap
                    if tp.proc is not None and not tp.done:
                        self.bound_log(tp)
                if time.monotonic() >= next_sample:
                    self.sample()
                    next_sample = time.monotonic() + self.sample_interval
                if self.launcher_gone:
                    self.stopping = True
                if all(tp.done for tp in self.tasks.values()):
                    break
        finally:
            self.stop_tasks(list(self.tasks.values()), self.stop_grace)
            for tp in self.tasks.values():
                if tp.event_fd is not None:
                    self.read_events(tp)
            self.reap()
            for tp in self.tasks.values():
                self.close_events(tp)
                if tp.lifeline_fd is not None:
                    os.close(tp.lifeline_fd)
                    tp.lifeline_fd = None
            for tp in self.tasks.values():
                if tp.proc is None and not tp.done:  # stopped before it was started
                    tp.done = True
                    self.send(events.make("status", tp.plan.name, state="stopped",
                                          reason=self.stop_reason or USER_STOP))
            if self.template is not None:
                self.template.close()
            kill_run_processes(str(self.run_dir), self.token)
            if self.stats.bad:
                self.send(events.make("info", f"supervisor@{self.host}", message=f"{self.stats.bad} malformed "
                                      "event line(s) from tasks were skipped", bad_lines=self.stats.bad))
            if self.bad_commands:
                self.send(events.make("info", f"supervisor@{self.host}", message=f"{self.bad_commands} malformed "
                                      "command line(s) were ignored", bad_commands=self.bad_commands))
            if self.gpus is not None:
                self.gpus.close()
        return 0


def open_log(path: Path) -> int:
    """A task's log opened for appending, never through a symbolic link: a link planted at its name is replaced
    by a file of the run's own (and the log says so)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except OSError:
        if not path.is_symlink():
            raise
    path.unlink()
    fd = os.open(path, flags | os.O_EXCL, 0o600)
    os.write(fd, b"--- clusterdeck: this log was a symbolic link (planted in the run folder): replaced, never followed\n")
    return fd


class FolderRefused(Exception):
    """The run folder on this host is not this user's own (``RunFolder.claim``)."""


def mark_stop(marker: Path) -> None:
    """Create a task's stop marker (best effort: without it the task reports the SIGTERM as not ours)."""
    try:  # never a folder made for it: a run folder that vanished stays gone
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError:
        pass


def write_record(folder: RunFolder, record: Path, token: str) -> None:
    """``hosts/<host>/supervisor.json``: this supervisor's pid, start time, mark and machine."""
    folder.private_dir(record.parent)
    me = psutil.Process()
    data = json.dumps({"pid": me.pid, "created": me.create_time(), "token": token, **process_end.machine()})
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(data)
    os.replace(tmp, record)


def main() -> int:
    if netns.LOOPBACK_FLAG in sys.argv[1:]:  # started alone in a fresh network namespace (NetnsTransport)
        try:
            netns.loopback_up()
        except OSError as exc:
            print(f"supervisor: cannot bring the network namespace's loopback up: {exc}", file=sys.stderr)
            return 3
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the launcher, which says stop
    stdin_fd = sys.stdin.fileno()
    first = b""
    while not first.endswith(b"\n"):
        chunk = os.read(stdin_fd, 1)
        if not chunk:
            return 2
        first += chunk
    spec = json.loads(first)
    background.yield_to_training()  # its wake-ups never preempt a task (the tasks get the normal policy back)
    try:
        sup = Supervisor(spec)
    except FolderRefused as exc:  # its stderr is what the launcher quotes (supervisor@<host>)
        print(f"supervisor: {exc}", file=sys.stderr)
        return 4
    try:
        return sup.run(stdin_fd)
    except SystemExit:
        sup.stopping = True
        sup.stop_tasks(list(sup.tasks.values()), sup.stop_grace)
        kill_run_processes(str(sup.run_dir), sup.token)
        return 143


if __name__ == "__main__":
    sys.exit(main())
