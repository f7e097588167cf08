"""Launch and stop a run: one supervisor per host group, one folder per run, one stream of events.

:class:`Run` is the single owner of a run's processes, and only their plumbing: it starts each
supervisor through its :mod:`transport <engine.control.transports>`, reads their events on reader
threads, and from one dispatcher thread hands each event to the run's
:class:`~engine.control.run_record.RunRecord` (``events.jsonl``), folds it into a
:class:`~engine.observe.telemetry.RunState`, hands it to listeners and feeds it to the run's
:class:`~engine.control.lifecycle.Lifecycle`, which decides when the run finishes, fails, restarts or
stops. It never imports TensorFlow and never blocks its caller for long.

Hosts of other machines: one that went silent is probed on a thread of its own (``reachability.probe_host``) when
the lifecycle asks (``ProbeHost``); a host that does not answer has its supervisor's connection ended at once when
the run stops (it cannot hear a stop). An async host of workers only whose supervisor ended is started again once it
answers (``RelaunchHost``): its lost workers reported failed (to be restarted), the new supervisor taking over what
the earlier one left there (``takeover`` in its spec), the others training on meanwhile.

The record keeps ``run.json`` current while the run runs (state, the launcher's pid, host and start
token, supervisors' and tasks' pids, step, summary) from what :class:`Run` describes. A run folder that
cannot be written, or vanishes, fails the run within a second or two; the dispatcher survives any error
and always ends the run.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from engine.contract import config as config_mod
from engine.contract import datasets, events
from engine.contract.config import ConfigError, Host, Problem, RunConfig
from engine.contract.plan import TaskPlan, plan_tasks, resolve_ports
from engine.contract.run_folder import RunFolder, default_runs_root, launcher_identity
from engine.control import background, doctor, netns, preflight, reachability, transports, unchosen_code
from engine.control import lifecycle as lc
from engine.control.run_record import FLUSH_S as FLUSH_S  # the record's flush cadence, also read from here
from engine.control.run_record import RunRecord
from engine.control.supervisor import RUN_DIR_ENV, TASK_STOP_GRACE, kill_run_processes
from engine.observe.telemetry import RunState

__all__ = ["LOCAL_GROUP", "Run", "default_runs_root", "launch_problems"]

#: How long the launcher waits for supervisors to stop their tasks (they give each task
#: :data:`~engine.control.supervisor.TASK_STOP_GRACE` after SIGTERM) before killing what is left.
STOP_TIMEOUT = TASK_STOP_GRACE + 1.5
#: Seconds :meth:`Run.stop` waits, once the processes are gone, for the run to be recorded as ended.
RECORD_WAIT_S = 5.0
LOCAL_GROUP = "localhost"  # the supervisor of every host that is this machine
MAX_WORKER_RESTARTS = 10  # async: a worker that keeps dying is restarted at most this often
TICK_S = 0.5  # progress deadlines and the run folder are checked this often
READ_CHUNK = 1 << 16  # bytes a reader takes from a supervisor's stream at once
Listener = Callable[[dict[str, Any]], None]


def launch_problems(config: RunConfig, *, deep: bool = False) -> list[Problem]:
    """What stands between ``config`` and a launch, found without starting a task.

    The quick checks (the config's own rules) always run; ``deep`` adds the data files
    and the user's script (checked in a subprocess, as it imports TensorFlow). The app
    re-checks on every edit with the quick ones; the launcher runs them all.
    """
    problems = config_mod.validate(config)
    if not problems and not deep:  # code a shared preset would run unchosen is refused on every path to a launch
        problems = unchosen_code.problems(config)
    if deep and not problems:
        problems = preflight.preflight(datasets.absolute_paths(config))
    return problems


@dataclass
class _Supervisor:
    launch: transports.SupervisorLaunch
    transport: transports.Transport
    proc: subprocess.Popen[bytes]
    tasks: list[str]
    reader: threading.Thread | None = None
    generation: int = 0
    stdin_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def group(self) -> str:
        return self.launch.group

    def send(self, line: str) -> bool:
        with self.stdin_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode("utf-8") if line.endswith("\n") else line.encode("utf-8") + b"\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def close_stdin(self) -> None:
        with self.stdin_lock:
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass


@dataclass(frozen=True)
class _SupervisorGone:
    """Queued by a reader once its supervisor's stream ended and the process exited."""

    sup: _Supervisor
    exit_code: int


@dataclass(frozen=True)
class _HostAnswer:
    """Queued by a probe of a silent host: why it does not answer, or "" (it does)."""

    host: str
    problem: str


#: Marks an event the launcher says of a task on a lost host: shown and recorded, but not news from that host.
LOST_WITH_HOST = "lost_with_host"


class Run:
    """One launch of a config. ``start()``, then ``wait()`` or ``stop()``; listeners see every event.

    Satisfies :class:`~engine.control.lifecycle.RunHandle`.
    """

    def __init__(self, config: RunConfig, *, runs_root: str | Path | None = None, run_dir: str | Path | None = None,
                 python: str | None = None, task_env: dict[str, str] | None = None,
                 isolate: bool | None = None, checked: bool = False, keep_history: bool = False) -> None:
        self.config = config
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self.python = python or sys.executable
        self.task_env = dict(task_env or {})
        self.isolate = isolate  # None: on unless CLUSTERDECK_NETNS=0
        self.checked = checked  # the caller ran launch_problems(deep=True) already (off its UI thread)
        self.isolated = False
        # the latest figures of every task and replica; curves only when asked (``keep_history``): the
        # app folds the events into its own state, and a headless run draws none
        self.state = RunState(total_steps=config.total_steps(),
                              tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()],
                              keep_history=keep_history)
        self.plans: list[TaskPlan] = []
        self.started = False
        self._folder: RunFolder | None = None
        self._listeners: list[Listener] = []
        self._supervisors: list[_Supervisor] = []
        self._transports: dict[str, transports.Transport] = {}
        self._prepared: list[transports.Transport] = []
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._lock = threading.RLock()  # the lifecycle, the state fold, listeners
        self._restart_lock = threading.Lock()  # the set of supervisors while it is replaced
        self._done = threading.Event()
        self._stop_asked = threading.Event()  # the user (or an end) asked to stop: prepare() gives up
        self._stop_done = threading.Event()
        self._stopping = False
        self._restarting = threading.Event()
        self._record: RunRecord | None = None  # events.jsonl and run.json, once started
        self._bad = events.ReadStats()
        self._base_config = config  # ports still 'auto': re-resolved on a whole-run restart
        self._lifecycle = lc.Lifecycle([], mode=config.parallelism.mode)
        self._launcher = launcher_identity()
        self._relaunching: set[str] = set()  # hosts waiting to be started again (their workers were lost)
        self._cut: set[str] = set()  # hosts a probe found not answering (a stop does not wait for them)

    # -- public API

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            raise RuntimeError("the run has not started")
        return self._run_dir

    @property
    def folder(self) -> RunFolder:
        """The run's folder (once started)."""
        if self._folder is None:
            raise RuntimeError("the run has not started")
        return self._folder

    @property
    def restarts_used(self) -> int:
        return self._lifecycle.restarts_used

    def add_listener(self, listener: Listener) -> None:
        """``listener(event)`` is called on the dispatcher thread for every event, in order."""
        with self._lock:
            self._listeners.append(listener)

    def start(self) -> Path:
        """Validate, pick ports, write the run folder and start every host's supervisor.

        Where a transport prepares in the background (a scheduler's queue), this returns at once and
        the supervisors start once it is done.
        """
        self.config = datasets.absolute_paths(self.config)  # tasks run in the run folder
        program = self.config.program
        if program is not None and program.script.strip():  # the user's program too (engine.runtime.program)
            self.config = config_mod.replace(self.config, program=config_mod.replace(
                program, script=os.path.abspath(os.path.expanduser(program.script))))
        self._base_config = self.config
        problems = launch_problems(self.config, deep=not self.checked)
        if problems:
            raise ConfigError(problems)
        where = self._run_dir if self._run_dir is not None else self.runs_root
        try:
            if self._run_dir is None:
                self._folder = RunFolder.create(self.runs_root, self.config.name)
                self._run_dir = self._folder.path
            else:
                self._run_dir.mkdir(parents=True, exist_ok=True)
                self._folder = RunFolder(self._run_dir)
            where = self.folder.path
            self._resolve()
            self.folder.checkpoints.mkdir(exist_ok=True)
            self._record = RunRecord(self.folder, describe=self._describe, on_failure=self._record_failed)
            self._record.write_meta("starting", strict=True)
        except OSError as exc:
            if self._record is not None:
                self._record.close()
                self._record = None
            raise ConfigError([Problem("run folder", f"cannot write the run folder {str(where)!r}: "
                                                     f"{exc.strerror or exc}; expected a writable folder")]) from None
        training = self.config.training
        self._lifecycle = lc.Lifecycle(
            [lc.TaskInfo(t.name, t.role, h.name) for h, t in self.config.cluster.tasks()],
            mode=self.config.parallelism.mode, restarts_allowed=training.restarts,
            # a user's program reports when it likes (or never): no hang is inferred from its silence
            progress_timeout_s=0.0 if self.config.program is not None else
            float(getattr(training, "progress_timeout_s", 0.0) or 0.0),
            steps_per_execution=training.steps_per_execution, now=time.monotonic(),
            report_interval_s=1.0 / training.metrics_hz if training.metrics_hz > 0 else 0.0,
            remote_hosts=[h.name for h in self.config.cluster.hosts if transports.kind_of(
                None if h.is_local else h) == "ssh"],
            max_relaunches=MAX_WORKER_RESTARTS)
        self._dispatcher = background.thread(self._dispatch, name="run-dispatch")
        self._dispatcher.start()
        self.started = True
        self._emit_run("starting")
        for warning in preflight.warnings(self.config):  # said, not refused: the app and the CLI show it
            self._emit_info(f"{warning.field}: {warning.message}", warning="machine", field=warning.field)
        self._decide_isolation()
        self._transports = {}
        for host in self._groups(self.config):
            kind = transports.kind_of(self._remote(host), isolated=self.isolated)
            if kind not in self._transports:
                self._transports[kind] = transports.make(kind)
        threading.Thread(target=self._watch, name="run-watch", daemon=True).start()
        if any(t.background for t in self._transports.values()):
            threading.Thread(target=self._launch_in_background, name="run-launch", daemon=True).start()
        else:
            try:
                self._launch()
            except Exception as exc:
                self._act(self._feed(lc.LauncherFailed(f"the run could not start: {exc}")))
                self._stop_done.wait(STOP_TIMEOUT + 3)
                raise
        return self.run_dir

    def stop(self, reason: str = lc.USER_STOP, wait: bool = True) -> None:
        """End every process of the run: supervisors ask their tasks to end (SIGTERM, then SIGKILL
        after :data:`~engine.control.supervisor.TASK_STOP_GRACE`), stragglers are killed. With ``wait``
        it returns once the processes are gone and, within a few seconds more, the run is recorded as
        ended (``run.json``, the ``run`` event): what reads the run folder next sees it stopped."""
        self._stop_asked.set()
        if not self.started:
            return
        self._act(self._feed(lc.StopRequested(reason)))
        if wait and not self._done.is_set():
            self._stop_done.wait(STOP_TIMEOUT + 3)
            self._done.wait(RECORD_WAIT_S)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run ends (or ``timeout``); returns the run state."""
        self._done.wait(timeout)
        return self.state.state

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def pids(self) -> list[int]:
        """Every process of the run we know of: supervisors and tasks."""
        with self._restart_lock:
            out = [s.proc.pid for s in self._supervisors]
        with self._lock:
            out += [t.pid for t in self.state.tasks.values() if t.pid]
        return out

    def send(self, task: str, command: str, **fields: Any) -> bool:
        """A command to the supervisor of ``task``: ``send("worker:1", "signal", signal="SIGKILL")``,
        ``send("worker:1", "restart", reason=...)`` (see :func:`engine.contract.events.make_command`)."""
        line = events.make_command(command, task=task, **fields)
        with self._restart_lock:
            sups = list(self._supervisors)
        for s in sups:
            if task in s.tasks:
                return s.send(line)
        return False

    # -- starting

    def _resolve(self) -> None:
        """Pick ports for this generation of the run and write the resolved config the tasks read."""
        resolved = config_mod.replace(self._base_config, cluster=resolve_ports(self._base_config.cluster))
        self.config = resolved
        self.plans = plan_tasks(resolved)
        self.folder.write_config(resolved)

    def _groups(self, config: RunConfig) -> dict[str, list[TaskPlan]]:
        """Plans by supervisor: every local host is this machine, one supervisor (and one network
        namespace) for them all; one per other host."""
        local = {h.name for h in config.cluster.hosts if h.is_local}
        by_host: dict[str, list[TaskPlan]] = {}
        for plan in plan_tasks(config) if config is not self.config else self.plans:
            by_host.setdefault(LOCAL_GROUP if plan.host in local else plan.host, []).append(plan)
        return by_host

    def _remote(self, group: str) -> Host | None:
        return None if group == LOCAL_GROUP else next(h for h in self.config.cluster.hosts if h.name == group)

    def _launch(self) -> None:
        """Prepare every transport, then start the supervisors."""
        # transports see the drawn config ('auto' ports still open: a scheduler's picks them on its nodes)
        self._drawn_config = self._base_config
        ctx = transports.PrepareContext(config=self._base_config, folder=self.folder, stop=self._stop_asked,
                                        emit=self._queue.put)
        for transport in self._transports.values():
            self._prepared.append(transport)
            ctx.config = transport.prepare(ctx)
        if ctx.config is not self._base_config:
            self._base_config = ctx.config
            self._resolve()
        with self._restart_lock:
            if self._stopping:
                return
            self._start_supervisors()
        with self._lock:
            self._lifecycle.started()
        self._emit_run("running")

    def _launch_in_background(self) -> None:
        try:
            self._launch()
        except transports.TransportStopped:
            pass
        except Exception as exc:  # noqa: BLE001 - a failed launch fails the run, visibly
            self._act(self._feed(lc.LauncherFailed(f"the run could not start: {exc}")))

    def _start_supervisors(self) -> None:
        for host, plans in self._groups(self.config).items():
            self._start_supervisor(host, plans)

    def _decide_isolation(self) -> None:
        """Private network namespace for all-local runs; a visible warning wherever ports stay exposed."""
        wanted = self.isolate if self.isolate is not None else os.environ.get("CLUSTERDECK_NETNS", "1") != "0"
        self.isolated = False
        if not wanted:
            self._emit_info("network isolation is off: TensorFlow's ports (no authentication) listen on every "
                            "interface of this machine", warning="ports-exposed")
            return
        if not self.config.cluster.is_local:
            self._emit_info("multi-host cluster: TensorFlow's gRPC ports listen on all interfaces without "
                            "authentication; run it only on a trusted network", warning="ports-exposed")
            return
        ok, why = netns.available()
        if ok:
            self.isolated = True
            self._emit_info("tasks run in a private network namespace: their ports are not reachable from "
                            "outside this run", isolated=True)
        else:
            self._emit_info(f"cannot isolate the run's ports ({why}); TensorFlow's ports listen on every "
                            "interface without authentication", warning="ports-exposed")

    def _emit_info(self, message: str, **fields: Any) -> None:
        self._queue.put(events.make("info", "launcher", message=message, **fields))

    def _emit_run(self, state: str, **fields: Any) -> None:
        self._queue.put(events.make("run", "launcher", state=state, **fields))

    def _start_supervisor(self, host: str, plans: list[TaskPlan], *, takeover: bool = False,
                          restarts: dict[str, int] | None = None) -> None:
        remote = self._remote(host)
        restartable = [p.name for p in plans if self.config.parallelism.mode == "async" and p.role == "worker"]
        python = remote.python if remote is not None else self.python
        spec = {"run_dir": str(self.run_dir.resolve()), "host": host, "python": python,
                "tasks": [p.to_dict() for p in plans], "env": self.task_env,
                "restart_on_failure": restartable, "max_task_restarts": MAX_WORKER_RESTARTS,
                # a host started again (lost, or a whole-run restart) first ends what its earlier supervisor left
                "takeover": takeover or self._lifecycle.generation > 0, "restarts": restarts or {},
                # a remote host has no copy of the run folder: it writes the config its tasks read
                "config_yaml": config_mod.dumps(self.config)}
        transport = self._transports[transports.kind_of(remote, isolated=self.isolated)]
        launch = transports.SupervisorLaunch(group=host, host=remote, command=transports.supervisor_command(python),
                                             env=transports.local_env(), log=self.folder.supervisor_log(host))
        proc = transport.start(launch)
        sup = _Supervisor(launch=launch, transport=transport, proc=proc, tasks=[p.name for p in plans],
                          generation=self._lifecycle.generation)
        self._supervisors.append(sup)
        sup.send(events.encode(spec))
        assert proc.stdout is not None
        sup.reader = background.thread(self._read, sup, proc.stdout, name=f"read-{host}")
        sup.reader.start()

    # -- the event path

    def _read(self, sup: _Supervisor, stream: IO[bytes]) -> None:
        """A supervisor's stream: what each read brings (up to :data:`READ_CHUNK` bytes) is decoded
        (:class:`~engine.contract.events.StreamDecoder`), and its events go to the dispatcher as one list of
        ``(event, line to write)``."""
        read = getattr(stream, "read1", None) or stream.read
        decoder = events.StreamDecoder(self._bad)
        suffix = b',"generation":%d}\n' % sup.generation if sup.generation else b""
        try:
            while True:
                chunk = read(READ_CHUNK)
                batch: list[tuple[dict[str, Any], bytes | None]] = []
                for event, line in decoder.feed(chunk) if chunk else decoder.finish():
                    if suffix:
                        event["generation"] = sup.generation  # which restart of the run it belongs to
                    batch.append((event, _line_to_write(line, suffix)))
                if batch:
                    self._queue.put(batch)
                if not chunk:
                    break
        except (OSError, ValueError):
            pass  # the stream broke: the supervisor is gone
        finally:
            self._queue.put(_SupervisorGone(sup, sup.proc.wait()))

    def _watch(self) -> None:
        """Ends the run once every supervisor has exited and its stream is drained (restarts aside)."""
        while True:
            with self._restart_lock:
                current = list(self._supervisors)
            for sup in current:
                if sup.reader is not None:
                    sup.reader.join()
            with self._restart_lock:
                launched = bool(self._supervisors) or self._stopping
                if launched and not self._restarting.is_set() and not self._relaunching \
                        and current == self._supervisors:
                    break
            time.sleep(0.05)
        self._queue.put(None)

    def _dispatch(self) -> None:
        """The dispatcher thread: never dies without ending the run."""
        next_tick = time.monotonic() + TICK_S
        try:
            while True:
                item: _Item | _Tick
                try:
                    item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
                except queue.Empty:
                    item = _TICK
                if item is None:
                    break
                if time.monotonic() >= next_tick:  # a steady stream of events must not starve the ticks
                    next_tick = time.monotonic() + TICK_S
                    if not isinstance(item, _Tick):
                        self._handle_safely(_TICK)
                if isinstance(item, list):
                    for event, line in item:
                        self._handle_safely(event, line)
                else:
                    self._handle_safely(item)
                self._recorder().catch_up(self._queue.empty)  # events.jsonl, run.json: per burst
        finally:
            self._finish()

    def _handle_safely(self, item: dict[str, Any] | _SupervisorGone | _HostAnswer | _Tick,
                       line: bytes | None = None) -> None:
        try:
            self._handle(item, line)
        except Exception as exc:  # noqa: BLE001 - the run must end visibly, never hang
            traceback.print_exc(file=sys.stderr)
            self._act(self._feed(lc.LauncherFailed(f"internal error of the launcher: {exc!r}")))

    def _handle(self, item: dict[str, Any] | _SupervisorGone | _HostAnswer | _Tick, line: bytes | None = None) -> None:
        if isinstance(item, _Tick):
            self._recorder().check_folder()
            self._act(self._feed(lc.Tick()))
            self._recorder().update_meta()
        elif isinstance(item, _SupervisorGone):
            sup = item.sup
            message = ""
            if not self._stopping and item.exit_code != 0:
                tail = transports.log_tail(sup.launch.log)
                message = sup.transport.failure(sup.launch, item.exit_code, tail)
            self._act(self._feed(lc.SupervisorExited(sup.group, item.exit_code, message, tuple(sup.tasks),
                                                     sup.generation)))
        elif isinstance(item, _HostAnswer):
            self._act(self._feed(lc.HostProbed(item.host, item.problem)))
        else:
            self._deliver(item, line)
            if item.get(LOST_WITH_HOST):
                return  # the launcher's word of a lost task: no news from its host
            policy_input = lc.from_event(item)
            if policy_input is not None:
                self._act(self._feed(policy_input))

    def _deliver(self, event: dict[str, Any], line: bytes | None = None) -> None:
        """``event`` into the run's file (``line`` as received where it can be kept), the state and the
        listeners."""
        with self._lock:
            self._recorder().write_event(event, line)
            self.state.apply(event)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - a broken view must not stop the run
                print(f"clusterdeck: a run listener failed: {exc!r}", file=sys.stderr)

    # -- the lifecycle

    def _feed(self, item: lc.Input) -> list[lc.Action]:
        with self._lock:
            return self._lifecycle.feed(item, time.monotonic())

    def _act(self, actions: list[lc.Action]) -> None:
        for action in actions:
            if isinstance(action, lc.RestartTask) or getattr(action, "dump_stacks", False):  # a hang: who waits where
                self._ask_for_stacks(action)
            if isinstance(action, lc.StopRun):
                with self._restart_lock:
                    if self._stopping:
                        continue
                    self._stopping = True
                self._stop_asked.set()
                threading.Thread(target=self._stop_all, args=(action.outcome,), name="run-stop", daemon=True).start()
            elif isinstance(action, lc.RestartRun):
                self._restarting.set()
                threading.Thread(target=self._restart_all, args=(action,), name="run-restart", daemon=True).start()
            elif isinstance(action, lc.RestartTask):
                self._emit_info(f"{action.task}: {action.reason}; its supervisor restarts it", task_hung=action.task)
                self.send(action.task, "restart", reason=action.reason)
            elif isinstance(action, lc.ProbeHost):
                threading.Thread(target=self._probe_host, args=(action.host,), name=f"probe-{action.host}",
                                 daemon=True).start()
            elif isinstance(action, lc.HostNotice):
                (self._cut.add if action.unreachable else self._cut.discard)(action.host)
                self._emit_info(action.message, host=action.host, host_unreachable=action.unreachable,
                                **({"warning": "host-unreachable", "lost_tasks": list(action.tasks)}
                                   if action.unreachable else {}))
            elif isinstance(action, lc.RelaunchHost):
                self._relaunch_host(action)

    # -- hosts of other machines

    def _host_problem(self, host: str) -> str:
        """Why ``host`` does not answer on its tasks' ports (its address named), or "" (it answers)."""
        remote = self._remote(host)
        if remote is None:
            return ""
        return reachability.probe_host(remote.address.strip(), [t.port for t in remote.tasks if t.port])

    def _probe_host(self, host: str) -> None:
        try:
            problem = self._host_problem(host)
        except Exception as exc:  # noqa: BLE001 - a probe that breaks says nothing, it never ends the run
            problem = ""
            print(f"clusterdeck: probing host {host} failed: {exc!r}", file=sys.stderr)
        (self._cut.add if problem else self._cut.discard)(host)
        self._queue.put(_HostAnswer(host, problem))

    def _relaunch_host(self, action: lc.RelaunchHost) -> None:
        """Report ``action.host``'s tasks lost, then start its supervisor again on a thread once it answers."""
        with self._lock:
            restarts = {name: (t.restarts or 0) + 1 for name in action.tasks
                        if (t := self.state.tasks.get(name)) is not None}
        for name in action.tasks:
            why = f"lost with host {action.host}: {action.reason}"
            self._queue.put(events.make("status", name, state="failed", reason=why, will_restart=True,
                                        **{LOST_WITH_HOST: action.host}))
            self._queue.put(events.make("status", name, state="restarting", restarts=restarts.get(name, 1),
                                        reason=f"{why}; its host's supervisor is started again once it answers",
                                        **{LOST_WITH_HOST: action.host}))
        with self._restart_lock:
            self._relaunching.add(action.host)
        threading.Thread(target=self._relaunch, args=(action, restarts), name=f"relaunch-{action.host}",
                         daemon=True).start()

    def _relaunch(self, action: lc.RelaunchHost, restarts: dict[str, int]) -> None:
        host = action.host
        try:
            waited = 0
            while not self._stop_asked.is_set():
                problem = self._host_problem(host)
                if not problem:
                    break
                waited += 1
                if waited == 1:
                    self._emit_info(f"host {host} does not answer ({problem}): its supervisor is started again once "
                                    "it does", host=host)
                self._stop_asked.wait(1.0)
            with self._restart_lock:
                if self._stopping or self._stop_asked.is_set():
                    return
                plans = self._groups(self.config).get(host, [])
                self._supervisors = [s for s in self._supervisors if s.group != host]
                self._start_supervisor(host, plans, takeover=True, restarts=restarts)
            self._emit_info(f"host {host}: its supervisor started again for {', '.join(action.tasks)} (relaunch "
                            f"{action.relaunch} of at most {MAX_WORKER_RESTARTS})", host=host, relaunch=action.relaunch)
        except Exception as exc:  # noqa: BLE001 - a relaunch that breaks fails the run, visibly
            self._act(self._feed(lc.LauncherFailed(f"host {host} could not be started again: {exc}")))
        finally:
            with self._restart_lock:
                self._relaunching.discard(host)

    def _ask_for_stacks(self, action: lc.Action) -> None:
        with self._lock:
            live = [n for n, t in self.state.tasks.items() if t.state not in ("finished", "failed", "stopped")]
        if isinstance(action, lc.RestartTask):
            live = [action.task]
        if isinstance(action, lc.RestartTask):
            culprit = action.task
        elif isinstance(action, lc.StopRun):
            culprit = action.outcome.failed_task
        elif isinstance(action, lc.RestartRun):
            culprit = action.reason.split(": ")[0]
        else:
            return  # asked only for a hang
        for message, fields in doctor.dump_for_hang(self.folder, self.send, live, culprit):
            self._emit_info(message, **fields)

    def _resubmit(self) -> bool:
        """A whole-run restart: transports holding a scheduler's allocation (``resubmit_on_restart``, Slurm)
        give it back and queue a new one; the run is then planned on the new nodes. False: stopped meanwhile."""
        again = [t for t in self._prepared if getattr(t, "resubmit_on_restart", False)]
        if not again:
            return True
        ctx = transports.PrepareContext(config=getattr(self, "_drawn_config", self._base_config), folder=self.folder,
                                        stop=self._stop_asked, emit=self._queue.put)
        try:
            for transport in self._transports.values():
                if transport in again:
                    transport.release()
                ctx.config = transport.prepare(ctx)
        except transports.TransportStopped:
            return False
        self._base_config = ctx.config
        return True

    def _restart_all(self, action: lc.RestartRun) -> None:
        """Stop every task and start them all again; they resume from the last checkpoint."""
        self._emit_run("restarting", reason=action.reason, restart=action.restart,
                       restarts_allowed=action.restarts_allowed)
        try:
            with self._restart_lock:
                old = list(self._supervisors)
            self._stop_supervisors(old, lc.TaskPhase.STOPPED, f"restarting the run: {action.reason}")
            for sup in old:
                if sup.reader is not None:
                    sup.reader.join(timeout=5)
            if not self._resubmit():
                return  # stopped while the new allocation waited
            with self._restart_lock:
                if self._stopping:
                    return
                with self._lock:
                    self._lifecycle.restart_started(time.monotonic())
                self._supervisors = []
                self._resolve()
                self._start_supervisors()
            self._emit_run("running", restart=action.restart)
            with self._lock:
                actions = self._lifecycle.restart_done()
            self._act(actions)
        except Exception as exc:  # noqa: BLE001 - a failed restart fails the run, visibly
            with self._lock:
                self._lifecycle.phase = lc.RunPhase.RUNNING
            self._act(self._feed(lc.LauncherFailed(f"the restart failed: {exc}")))
        finally:
            self._restarting.clear()

    def _finish(self) -> None:
        try:
            with self._lock:
                outcome = self._lifecycle.final()
            if self._bad.bad:
                self._deliver(events.make("info", "launcher", message=f"{self._bad.bad} malformed event line(s) "
                                          "skipped", bad_lines=self._bad.bad))
            self._deliver(events.make("run", "launcher", **outcome.event_fields()))
            self._recorder().flush()
            self._kill_leftovers()
            for transport in self._prepared:
                try:
                    transport.release()
                except Exception as exc:  # noqa: BLE001 - a release must not keep the run from ending
                    print(f"clusterdeck: releasing the {transport.kind} transport failed: {exc!r}", file=sys.stderr)
            self._prepared = []
            with self._lock:
                self._recorder().write_meta(str(outcome.state), ended=time.strftime("%Y-%m-%dT%H:%M:%S"))
        except Exception:  # noqa: BLE001 - done must be set whatever happens
            traceback.print_exc(file=sys.stderr)
        finally:
            # closed, and let go: the record holds the run's callbacks, and an ended run must be freed
            # at once (its supervisors' pipes close with it), not at the next garbage collection
            record, self._record = self._record, None  # the dispatcher's alone from start() on
            if record is not None:
                record.close()
            self._stop_done.set()
            self._done.set()

    # -- stopping

    def _stop_supervisors(self, sups: list[_Supervisor], task_state: lc.TaskPhase, reason: str) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT
        for sup in sups:
            grace = self._stop_grace(sup, task_state)
            sup.send(events.make_command("stop", state=str(task_state), reason=reason, grace_s=grace))
            if sup.group in self._cut:  # it cannot hear the stop: its connection ends now, not after the timeout
                sup.transport.kill(sup.proc)
                sup.close_stdin()
        for sup in sups:
            try:
                sup.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for sup in sups:
            sup.transport.kill(sup.proc)
            sup.close_stdin()
        for sup in sups:
            try:
                sup.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass

    def _stop_grace(self, sup: _Supervisor, task_state: lc.TaskPhase) -> float:
        """Seconds between SIGTERM and SIGKILL for the tasks ``sup`` still runs.

        A finished run's training tasks are done: async servers left serving have nothing to save
        and get none (they would serve on for their stop delay); an evaluator keeps its grace to
        finish evaluating the final checkpoint.
        """
        if task_state is not lc.TaskPhase.FINISHED:
            return TASK_STOP_GRACE
        with self._lock:
            live = [t for name in sup.tasks if (t := self.state.tasks.get(name)) is not None
                    and t.state not in ("finished", "failed", "stopped")]
        return TASK_STOP_GRACE if any(t.name.startswith("evaluator:") for t in live) else 0.0

    def _stop_all(self, outcome: lc.Outcome) -> None:
        try:
            with self._restart_lock:
                sups = list(self._supervisors)
            self._stop_supervisors(sups, outcome.task_state, outcome.task_reason)
            self._kill_leftovers()
        finally:
            self._stop_done.set()

    def _kill_leftovers(self) -> None:
        """Whatever of the run still runs on this machine: task processes whose supervisor was killed
        and the children of users' scripts (every task process carries the run folder in its environment)."""
        if self._run_dir is None:
            return
        with self._lock:
            pids = [t.pid for t in self.state.tasks.values() if t.pid]
        for pid in pids:
            if _is_task_process(pid):
                _kill_group(pid)
        kill_run_processes(str(self.run_dir.resolve()))

    # -- the record

    def _recorder(self) -> RunRecord:
        """The run's record (there from :meth:`start` on; the dispatcher starts after it)."""
        if self._record is None:
            raise RuntimeError("the run has not started")
        return self._record

    def _describe(self) -> dict[str, Any]:
        """``run.json``'s fields of the moment: what runs where, and how far it got."""
        with self._lock:
            sups = list(self._supervisors)  # a snapshot (a restart may be replacing them)
            supervisors = {s.group: {"pid": s.proc.pid, "transport": s.transport.kind,
                                     "host": s.launch.host.name if s.launch.host is not None else LOCAL_GROUP}
                           for s in sups}
            tasks = {n: {"pid": t.pid, "state": t.state, "host": t.host} for n, t in self.state.tasks.items()}
            return {"name": self.config.name, "state": str(self._lifecycle.phase),
                    "mode": self.config.parallelism.mode, "launcher": self._launcher, "supervisors": supervisors,
                    "tasks": tasks, "step": self.state.step, "summary": self.state.summary()}

    def _record_failed(self, reason: str) -> None:
        """The run folder can no longer be written or vanished: the run fails, saying why."""
        self._act(self._feed(lc.LauncherFailed(reason)))


class _Tick:
    """A dispatcher turn without an event."""


_TICK = _Tick()
#: What the dispatcher's queue holds: a reader's batch of ``(event, line to write)``, one event (the
#: launcher's own), a supervisor's end, or None (every stream ended).
_Item = list[tuple[dict[str, Any], bytes | None]] | dict[str, Any] | _SupervisorGone | _HostAnswer | None


def _line_to_write(line: bytes, suffix: bytes) -> bytes | None:
    """The line as received, for the run's file (``suffix`` adds the generation as the last field, which
    wins over any earlier one, as in the decoded event); None where it must be encoded again: a line
    with JSON's non-numbers (``NaN``, ``Infinity``: the file holds strict JSON only) or odd spacing."""
    if b"NaN" in line or b"Infinity" in line:
        return None
    if not line.endswith(b"}\n") or not line.startswith(b"{"):
        line = line.strip()
        if not line.endswith(b"}") or not line.startswith(b"{"):
            return None
        line += b"\n"
    return line[:-2] + suffix if suffix else line


def _is_task_process(pid: int) -> bool:
    """True when ``pid`` still is a ClusterDeck task (a recycled pid must never be killed)."""
    try:
        proc = psutil.Process(pid)
        return "engine.runtime.task" in " ".join(proc.cmdline()) and RUN_DIR_ENV in proc.environ()
    except psutil.Error:
        return False


def _kill_group(pid: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
