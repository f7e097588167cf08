"""The per-host supervising process: ``python -m engine.control.supervisor``.

It reads one JSON line on stdin (its :class:`~engine.contract.supervisor_spec.SupervisorSpec`: the host's task
plans; a spec of another version is refused, exit code 5, saying why on stderr), starts every task as
its own process (own process group, event pipe, lifeline pipe), relays their
events as JSON lines on stdout (a task's own step and device samples as it wrote them, undecoded:
``events.own_sample``; the launcher decodes them), samples their CPU, memory and GPU use, and
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
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from engine.contract import events
from engine.contract.records import TERMINAL
from engine.contract.run_folder import (
    OVERLONG,
    LineSplitter,
    RunFolder,
)
from engine.contract.supervisor_spec import (  # noqa: F401
    SAMPLE_INTERVAL,
    SPEC_VERSION,
    SpecError,
    SupervisorSpec,
)
from engine.contract.task_plan import INTRA_OP_ENV, CoreShare, cpus, intra_op_threads, share_cores
from engine.control import background, netns, process_end
from engine.control.gpu import GpuSampler
from engine.control.process_end import (  # noqa: F401 - also read from here (doctor, tests)
    RUN_DIR_ENV,
    SUPERVISOR_ENV,
    end_earlier_supervisor,
    kill_run_processes,
)
from engine.control.process_end import has_exited as _has_exited
from engine.control.process_end import signal_group as _signal_group
from engine.control.task_start import (  # noqa: F401 - also read from here (tests)
    MIN_INTER_OP_THREADS,
    OWN_PROCESS_GROUP,
    TaskProcess,
    TaskStarter,
    open_log,
    start_arguments,
)
from engine.control.task_watch import TaskWatch, describe_exit  # noqa: F401 - describe_exit also read from here
from engine.control.warm_tasks import Template

#: Seconds a task gets between SIGTERM (to its process group) and SIGKILL when it is stopped.
TASK_STOP_GRACE = 3.0  # a task gives itself 2.5 s after SIGTERM (engine.runtime.stop): it ends first
#: The record of a host's supervisor in the run folder (``hosts/<host>/``): what a later one takes over.
RECORD_NAME = "supervisor.json"
USER_STOP = "stopped by the user"


class Supervisor:
    """One host's supervisor: starts its tasks (:class:`~engine.control.task_start.TaskStarter`), relays their events
    (:class:`~engine.contract.events.StreamDecoder`), obeys the launcher's commands, watches its tasks
    (:class:`~engine.control.task_watch.TaskWatch`) and stops them all at the end."""

    def __init__(self, spec: SupervisorSpec | dict[str, Any], out: Any = None) -> None:
        if isinstance(spec, dict):  # given in process (tests): a spec of this version
            spec = SupervisorSpec.from_dict({"v": SPEC_VERSION, **spec})
        self.run_dir = Path(spec.run_dir)
        self.folder = RunFolder(self.run_dir)
        refused = self.folder.claim()  # this user's own folder, or nothing is written in it
        if refused:
            raise FolderRefused(f"the run folder {str(self.run_dir)!r} on this host {refused}")
        if spec.config_yaml:  # always the launcher's: a config.yaml found in the folder is never used
            self.folder.write_config_text(spec.config_yaml)
        self.host = spec.host
        self.python = spec.python or sys.executable
        self.extra_env: dict[str, str] = dict(spec.env)
        self.tasks = {plan.name: TaskProcess(plan) for plan in spec.tasks}
        # the host's cores, shared evenly by its tasks (TensorFlow would give each task all of them), unless
        # the user chose the threads: its affinity (a Slurm step's CPUs, a taskset), each training task's own
        self.cpus = cpus()
        self.cores = len(self.cpus)
        self.shares_chosen = INTRA_OP_ENV in os.environ or INTRA_OP_ENV in self.extra_env
        self.shares: dict[str, CoreShare] = ({} if self.shares_chosen else
                                             share_cores([t.plan for t in self.tasks.values()], self.cpus))
        self.intra_op_threads = intra_op_threads(len(self.tasks), self.cores)
        self.sample_interval = spec.sample_interval
        self.out = out if out is not None else sys.stdout.buffer
        self.sel = selectors.DefaultSelector()
        self.gpus = GpuSampler() if any(t.plan.gpu_ids for t in self.tasks.values()) else None
        self.stats = events.ReadStats()
        # tasks the supervisor restarts itself when they fail (async workers), and how often at most
        self.restartable: set[str] = set(spec.restart_on_failure)
        self.max_restarts = spec.max_task_restarts
        self.stopping = False
        self.stop_state = "stopped"  # what tasks stopped by a stop command report: "stopped" or "finished"
        self.stop_reason = USER_STOP
        self.stop_grace = TASK_STOP_GRACE
        self.launcher_gone = False
        self.stdin_lines = LineSplitter()
        self.bad_commands = 0
        self.template: Template | None = None
        self.subreaper = False
        self.token = f"{self.host}/{os.getpid()}-{os.urandom(4).hex()}"  # this supervisor's mark on its tasks
        self.takeover = spec.takeover
        for name, count in spec.restarts.items():  # a host started again keeps its tasks' counts
            if name in self.tasks and isinstance(count, int):
                self.tasks[name].restarts = count
        self.starter = TaskStarter(self)  # environment, warm-start template, each task's process
        self.watch = TaskWatch(self)  # reaping, sampling, log caps

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

    # -- relaying

    def decoder(self, tp: TaskProcess) -> events.StreamDecoder:
        """The reader of ``tp``'s event pipe (its lines, the supervisor's count of bad ones)."""
        if tp.decoder is None or tp.decoder.lines is not tp.lines:
            tp.decoder = events.StreamDecoder(self.stats, tp.lines, events.sample_prefixes(tp.plan.name))
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
            self.relay_lines(tp, decoder.lines.feed(chunk))
            self.flush_out()

    def relay(self, tp: TaskProcess, line: bytes, *, flush: bool = True) -> None:
        """One whole line of ``tp``'s pipe: relayed (:meth:`relay_lines`), a bad line counted."""
        self.relay_lines(tp, [line])
        if flush:
            self.flush_out()

    def relay_lines(self, tp: TaskProcess, lines: list[bytes]) -> None:
        """Whole lines of ``tp``'s pipe, left buffered for :meth:`flush_out`: the task's own samples passed on as it
        wrote them, undecoded (:func:`~engine.contract.events.own_sample`: they name the task itself, and the
        launcher decodes them); every other line decoded, its event forwarded (:meth:`forward`), a bad one counted."""
        for event, line in self.decoder(tp).relayed(lines):
            if event is None:
                self.send_line(line, flush=False)  # the samples in a row, at once
            else:
                self.forward(tp, event, flush=False)

    def forward(self, tp: TaskProcess, event: dict[str, Any], *, flush: bool = True) -> None:
        """A task's event to the launcher (a terminal failure held back until the task is reaped)."""
        event["task"] = tp.plan.name  # a task speaks only for itself
        if event["kind"] == "status" and event.get("state") in TERMINAL:
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
            self.relay_lines(tp, tp.lines.finish())
            self.flush_out()
            try:
                self.sel.unregister(tp.event_fd)
            except (KeyError, ValueError):
                pass
            os.close(tp.event_fd)
            tp.event_fd = None

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
                self.starter.start_task(tp)
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

    def run(self, stdin_fd: int, after_spec: bytes = b"") -> int:
        """Start the tasks, relay, obey, stop; ``after_spec``: what was read of stdin after the spec's line."""
        os.set_blocking(stdin_fd, False)
        self.sel.register(stdin_fd, selectors.EVENT_READ, None)
        for line in self.stdin_lines.feed(after_spec):
            self.command(line)
        self.take_over()
        self.starter.announce_threads()
        self.starter.start_template()
        self.starter.wait_for_template()
        for tp in self.tasks.values():
            if not self.stopping:
                self.starter.start_task(tp)
        next_sample = time.monotonic() + self.sample_interval
        try:
            while not self.stopping:
                timeout = max(0.0, min(0.1, next_sample - time.monotonic()))
                for key, _ in self.sel.select(timeout):
                    if key.data is None:
                        self.read_stdin(key.fd)
                    else:
                        self.read_events(key.data)
                self.watch.reap()
                for tp in self.tasks.values():  # every turn (at most 0.1 s apart): a flooding task's log stays near its cap
                    if tp.proc is not None and not tp.done:
                        self.watch.bound_log(tp)
                if time.monotonic() >= next_sample:
                    self.watch.sample()
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
            self.watch.reap()
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


def read_first_line(fd: int) -> tuple[bytes, bytes] | None:
    """The first line of ``fd`` (the spec) and what came after it in the same reads (the launcher's first commands),
    read in chunks (byte by byte, a spec of tens of kB took tens of milliseconds); None where the input ended first."""
    data = bytearray()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        start = len(data)
        data += chunk
        end = data.find(b"\n", start)
        if end >= 0:
            return bytes(data[:end + 1]), bytes(data[end + 1:])


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
    read = read_first_line(stdin_fd)
    if read is None:
        return 2
    first, after = read
    try:
        spec = SupervisorSpec.from_json(first)
    except SpecError as exc:  # another ClusterDeck version's launcher: said, and quoted by the launcher
        print(f"supervisor: {exc}", file=sys.stderr)
        return 5
    background.yield_to_training()  # its wake-ups never preempt a task (the tasks get the normal policy back)
    try:
        sup = Supervisor(spec)
    except FolderRefused as exc:  # its stderr is what the launcher quotes (supervisor@<host>)
        print(f"supervisor: {exc}", file=sys.stderr)
        return 4
    try:
        return sup.run(stdin_fd, after)
    except SystemExit:
        sup.stopping = True
        sup.stop_tasks(list(sup.tasks.values()), sup.stop_grace)
        kill_run_processes(str(sup.run_dir), sup.token)
        return 143


if __name__ == "__main__":
    sys.exit(main())
