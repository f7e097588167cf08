"""Starting a supervisor's tasks: their environment, the warm-start template, each task's process.

:class:`TaskStarter` is the part of :class:`~engine.control.supervisor.Supervisor` that starts processes: the
environment every task of the host gets (:meth:`TaskStarter.host_env`: the run's marks, the host's core share),
the warm-start template (:mod:`engine.contract.warm_start`: TensorFlow imported once, each task forked from it)
and each task itself (:meth:`TaskStarter.start_task`: cold with ``subprocess`` or forked warm; in a process group
of its own, its log, event pipe and lifeline). Ending them is :mod:`engine.control.process_end`'s.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.contract import events, parent_death, warm_start
from engine.contract.run_folder import STOP_MARKERS_ENV, LineSplitter
from engine.contract.task_plan import CUDA_ORDER, CUDA_ORDER_ENV, INTER_OP_ENV, INTRA_OP_ENV, TaskPlan
from engine.control import background
from engine.control.gpu import driver_present
from engine.control.process_end import RUN_DIR_ENV, SUPERVISOR_ENV
from engine.control.warm_tasks import READY_TIMEOUT_S, ForkedTask, Template, TemplateError, template_env

#: How a task is started: in a process group of its own (what a stop signals, children included), inside the
#: supervisor's session. A session per task would put each task in a scheduling group of its own wherever the
#: kernel groups processes by session (autogroup), and the run's tasks, which wait on each other every step,
#: would be scheduled as unrelated programs: async runs trained at 0.90 of their bare loop that way, and 1.00
#: in one session (docs/benchmarks.md, 1e).
OWN_PROCESS_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                                     else {"preexec_fn": os.setpgrp})
#: The fewest inter-op threads a task gets (unless the user chose): TensorFlow sizes its inter-op pool by the
#: cores it sees, and with one thread (a one-core host) an async worker's first group of steps never ended.
MIN_INTER_OP_THREADS = 2

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


class TaskStarter:
    """Starts the tasks of one supervisor (see the module docstring); its state (the template, the selector, the
    tasks) stays the supervisor's."""

    def __init__(self, sup: Any) -> None:
        self.sup = sup  # the engine.control.supervisor.Supervisor it serves

    def host_env(self) -> dict[str, str]:
        """The environment every task of this host starts with, before its own variables."""
        env = dict(os.environ)
        env.update(self.sup.extra_env)
        env.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env[RUN_DIR_ENV] = str(self.sup.run_dir)
        env[SUPERVISOR_ENV] = self.sup.token  # the template's too: a forked task's /proc environment is the template's
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
                env, [tp.plan.gpu_ids for tp in self.sup.tasks.values()], gpu_driver=gpu_driver):
            return
        self.sup.subreaper = self.sup.subreaper or parent_death.become_subreaper()
        if not self.sup.subreaper:
            return
        log = self.sup.folder.supervisor_log(self.sup.host)
        self.sup.folder.private_dir(log.parent)
        self.sup.template = Template(self.sup.python, self.sup.run_dir, template_env(env), log, start_arguments(()),
                                 gpu_driver=gpu_driver)
        if self.sup.template.error:
            self.template_failed(self.sup.template.error)

    def wait_for_template(self) -> None:
        """Until the template has imported everything (or failed, or a stop came), obeying commands."""
        template = self.sup.template
        if template is None:
            return
        self.sup.sel.register(template.fileno(), selectors.EVENT_READ, template)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while not template.ready and not template.error and not self.sup.stopping:
                if time.monotonic() >= deadline:
                    template.error = f"the template did not import the runtime within {READY_TIMEOUT_S:g} s"
                    break
                for key, _ in self.sup.sel.select(0.1):
                    if key.data is None:
                        self.sup.read_stdin(key.fd)
                    elif key.data is template:
                        template.read_ready()
                if self.sup.launcher_gone:
                    self.sup.stopping = True
        finally:
            self.sup.sel.unregister(template.fileno())
        if template.error:
            self.template_failed(template.error)

    def template_failed(self, why: str) -> None:
        """Start the tasks cold from now on, and say why."""
        if self.sup.template is None:
            return
        self.sup.template.close()
        self.sup.template = None
        self.sup.send(events.make("info", f"supervisor@{self.sup.host}", message=f"tasks start cold: {why}"))

    def announce_threads(self) -> None:
        """Say how the host's cores are shared, where several tasks share them and nobody chose otherwise."""
        if len(self.sup.tasks) < 2 or self.sup.shares_chosen:
            return
        pinned = {name: list(share.cores) for name, share in self.sup.shares.items() if share.cores}
        where = ""
        if pinned:
            where = "; the training tasks run on cores of their own: " + ", ".join(
                f"{name} on {_cores_text(cores)}" for name, cores in pinned.items())
        self.sup.send(events.make(
            "info", f"supervisor@{self.sup.host}", cores=self.sup.cores, intra_op_threads=self.sup.intra_op_threads,
            task_cores=pinned,
            message=f"{len(self.sup.tasks)} tasks share {self.sup.cores} core(s) on this host: each task runs "
                    f"{self.sup.intra_op_threads} intra-op thread(s){where} ({INTRA_OP_ENV}; set it to choose)"))

    def start_task(self, tp: TaskProcess) -> None:
        plan = tp.plan
        tdir = self.sup.folder.private_dir(self.sup.task_dir(plan.name))  # never through a planted link
        self.sup.folder.stop_marker(plan.name).unlink(missing_ok=True)  # a new life: no stop asked of it yet
        ev_r, ev_w = os.pipe()
        life_r, life_w = os.pipe()
        env = self.host_env()
        env.update(plan.env)
        share = self.sup.shares.get(plan.name)  # none where the user chose the threads (they are in env already)
        if share is not None:
            for key, value in share.env.items():
                env.setdefault(key, value)
        if self.sup.cores < MIN_INTER_OP_THREADS:  # a one-core host: TensorFlow's pool of one inter-op thread hangs
            env.setdefault(INTER_OP_ENV, str(MIN_INTER_OP_THREADS))
        cores = share.cores if share else ()
        args = ["--run-dir", str(self.sup.run_dir)]
        with os.fdopen(open_log(tdir / "log.txt"), "ab") as log:
            warm = self.sup.template is not None and self.sup.template.can_fork(env)
            if self.sup.template is not None and self.sup.template.error:  # it ended since the last task
                self.template_failed(self.sup.template.error)
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {plan.name}"
                      f"{' (forked, warm)' if warm else ''}\n".encode())
            log.flush()
            tp.proc = None
            if warm:
                assert self.sup.template is not None
                try:
                    tp.proc = self.sup.template.fork(args, env, str(self.sup.run_dir), cores,
                                                 (log.fileno(), ev_w, life_r))
                except TemplateError as exc:
                    log.write(f"--- the warm-start template failed ({exc}): starting {plan.name} cold\n".encode())
                    log.flush()
                    self.template_failed(str(exc))
            if tp.proc is None:
                cmd = [self.sup.python, "-m", "engine.runtime.task", *args,
                       "--event-fd", str(ev_w), "--lifeline-fd", str(life_r)]
                tp.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env=env, pass_fds=(ev_w, life_r), cwd=str(self.sup.run_dir),
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
        self.sup.sel.register(ev_r, selectors.EVENT_READ, tp)
        try:
            tp.ps = psutil.Process(tp.proc.pid)
            tp.ps.cpu_percent(None)
        except psutil.Error:
            tp.ps = None
        self.sup.send(events.make("status", plan.name, state="starting", pid=tp.proc.pid, host=plan.host,
                              role=plan.role, gpu_ids=list(plan.gpu_ids), devices=plan.devices,
                              cores=list(cores), restarts=tp.restarts))
