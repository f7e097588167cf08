"""Launch and stop a run: one supervisor per host group, one folder per run, one stream of events.

:class:`Run` is the single owner of a run's processes and its public face (``start``, ``stop``, ``wait``,
``send``, ``pids``, listeners, ``state``). It is taken apart into three rooms:

- process plumbing (:mod:`engine.control.supervisor_links`): each supervisor started through its
  :mod:`transport <engine.control.transports>`, its stream read on a reader thread
  (:class:`~engine.contract.events.StreamDecoder`), stopping a set of them; ending processes is
  :mod:`engine.control.process_end`'s;
- the run driver (:mod:`engine.control.run_driver`, with :mod:`engine.control.host_watch` for hosts of other
  machines): from one dispatcher thread it hands each event to the run's
  :class:`~engine.control.run_record.RunRecord` (``events.jsonl``), folds it into a
  :class:`~engine.observe.telemetry.RunState`, hands it to listeners and feeds it to the lifecycle, then carries
  out what the lifecycle answers (stop, restart the run or a task, probe or relaunch a host) and ends the run;
- the pure rules (:class:`~engine.control.lifecycle.Lifecycle`): when the run finishes, fails, restarts or stops.

This class keeps what is started and how: the folder, the resolved config and its plans, the supervisor groups,
each supervisor's spec (:class:`~engine.contract.supervisor_spec.SupervisorSpec`). It never imports TensorFlow and
never blocks its caller for long. The record keeps ``run.json`` current while the run runs; a run folder that
cannot be written, or vanishes, fails the run within a second or two; the dispatcher survives any error and always
ends the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from engine.contract import config as config_mod
from engine.contract import datasets, events
from engine.contract.config import ConfigError, Host, Problem, RunConfig
from engine.contract.plan import plan_tasks, resolve_ports
from engine.contract.records import TERMINAL
from engine.contract.run_folder import RunFolder, default_runs_root, launcher_identity
from engine.contract.supervisor_spec import SupervisorSpec
from engine.contract.task_plan import TaskPlan
from engine.control import background, netns, preflight, transports, unchosen_code
from engine.control import lifecycle as lc
from engine.control.host_watch import HostWatch
from engine.control.run_core import RunCore
from engine.control.run_driver import (
    LOCAL_GROUP,
    LOST_WITH_HOST,
    MAX_WORKER_RESTARTS,
    TICK_S,
    RunDriver,
    keeping,
    lifecycle_for,
)
from engine.control.run_record import FLUSH_S as FLUSH_S  # the record's flush cadence, also read from here
from engine.control.run_record import RunRecord
from engine.control.supervisor import TASK_STOP_GRACE
from engine.control.supervisor_links import READ_CHUNK, STOP_TIMEOUT, SupervisorLink, line_to_write, read_supervisor
from engine.observe.telemetry import RunState

__all__ = ["LOCAL_GROUP", "Run", "default_runs_root", "launch_problems"]
# also read from here (tests, benchmarks): the plumbing's and the driver's figures
__all__ += ["LOST_WITH_HOST", "READ_CHUNK", "STOP_TIMEOUT", "TASK_STOP_GRACE", "TICK_S"]
_line_to_write = line_to_write

#: Seconds :meth:`Run.stop` waits, once the processes are gone, for the run to be recorded as ended.
RECORD_WAIT_S = 5.0
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


def isolation(wanted: bool, config: RunConfig) -> tuple[bool, str, dict[str, Any]]:
    """Whether a run of ``config`` gets a private network namespace (all-local runs, where wanted and possible),
    and what to say of it: a visible warning wherever ports stay exposed."""
    if not wanted:
        return False, ("network isolation is off: TensorFlow's ports (no authentication) listen on every interface "
                       "of this machine"), {"warning": "ports-exposed"}
    if not config.cluster.is_local:
        return False, ("multi-host cluster: TensorFlow's gRPC ports listen on all interfaces without authentication; "
                       "run it only on a trusted network"), {"warning": "ports-exposed"}
    ok, why = netns.available()
    if ok:
        return True, ("tasks run in a private network namespace: their ports are not reachable from outside this "
                      "run"), {"isolated": True}
    return False, (f"cannot isolate the run's ports ({why}); TensorFlow's ports listen on every interface without "
                   "authentication"), {"warning": "ports-exposed"}


class Run:
    """One launch of a config. ``start()``, then ``wait()`` or ``stop()``; listeners see every event.

    Satisfies :class:`~engine.control.lifecycle.RunHandle`.
    """

    def __init__(self, config: RunConfig, *, runs_root: str | Path | None = None, run_dir: str | Path | None = None,
                 python: str | None = None, task_env: dict[str, str] | None = None,
                 isolate: bool | None = None, checked: bool = False, keep_history: bool = False) -> None:
        self.config = config
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
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
        self._dispatcher: threading.Thread | None = None
        self._yaml_of: tuple[RunConfig, str] | None = None  # the config and its YAML, as the supervisors get it
        # what the run shares with its dispatcher and its host watch
        self.core = RunCore(base_config=config, lifecycle=lc.Lifecycle([], mode=config.parallelism.mode),
                            launcher=launcher_identity(), run_dir=Path(run_dir) if run_dir is not None else None)
        self.driver = RunDriver(self, self.core)  # the dispatcher and the lifecycle's actions
        self.hosts = HostWatch(self, self.core)  # hosts of other machines: probes, relaunches

    # -- public API

    @property
    def run_dir(self) -> Path:
        if self.core.run_dir is None:
            raise RuntimeError("the run has not started")
        return self.core.run_dir

    @property
    def folder(self) -> RunFolder:
        """The run's folder (once started)."""
        if self._folder is None:
            raise RuntimeError("the run has not started")
        return self._folder

    @property
    def restarts_used(self) -> int:
        return self.core.lifecycle.restarts_used

    def add_listener(self, listener: Listener) -> None:
        """``listener(event)`` is called on the dispatcher thread for every event, in order."""
        with self.core.lock:
            self.core.listeners.append(listener)

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
        self.core.base_config = self.config
        problems = launch_problems(self.config, deep=not self.checked)
        if problems:
            raise ConfigError(problems)
        where = self.core.run_dir if self.core.run_dir is not None else self.runs_root
        try:
            if self.core.run_dir is None:
                self._folder = RunFolder.create(self.runs_root, self.config.name)
                self.core.run_dir = self._folder.path
            else:
                self.core.run_dir.mkdir(parents=True, exist_ok=True)
                self._folder = RunFolder(self.core.run_dir)
            where = self.folder.path
            self.resolve()
            self.folder.checkpoints.mkdir(exist_ok=True)
            self.core.record = RunRecord(self.folder, describe=self.driver.describe,
                                         on_failure=self.driver.record_failed)
            self.core.record.write_meta("starting", strict=True)
        except OSError as exc:
            if self.core.record is not None:
                self.core.record.close()
                self.core.record = None
            raise ConfigError([Problem("run folder", f"cannot write the run folder {str(where)!r}: "
                                                     f"{exc.strerror or exc}; expected a writable folder")]) from None
        self.core.lifecycle = lifecycle_for(self.config, time.monotonic())
        self._dispatcher = background.thread(keeping, self, self.driver.dispatch, name="run-dispatch")
        self._dispatcher.start()
        self.started = True
        self.emit_run("starting")
        for warning in preflight.warnings(self.config):  # said, not refused: the app and the CLI show it
            self.emit_info(f"{warning.field}: {warning.message}", warning="machine", field=warning.field)
        wanted = self.isolate if self.isolate is not None else os.environ.get("CLUSTERDECK_NETNS", "1") != "0"
        self.isolated, message, fields = isolation(wanted, self.config)
        self.emit_info(message, **fields)
        self.core.transports = {}
        for host in self.groups(self.config):
            kind = transports.kind_of(self.remote(host), isolated=self.isolated)
            if kind not in self.core.transports:
                self.core.transports[kind] = transports.make(kind)
        threading.Thread(target=keeping, args=(self, self.driver.watch), name="run-watch", daemon=True).start()
        if any(t.background for t in self.core.transports.values()):
            threading.Thread(target=self._launch_in_background, name="run-launch", daemon=True).start()
        else:
            try:
                self._launch()
            except Exception as exc:
                self.driver.decide(lc.LauncherFailed(f"the run could not start: {exc}"))
                self.core.stop_done.wait(STOP_TIMEOUT + 3)
                raise
        return self.run_dir

    def stop(self, reason: str = lc.USER_STOP, wait: bool = True) -> None:
        """End every process of the run: supervisors ask their tasks to end (SIGTERM, then SIGKILL
        after :data:`~engine.control.supervisor.TASK_STOP_GRACE`), stragglers are killed. With ``wait``
        it returns once the processes are gone and, within a few seconds more, the run is recorded as
        ended (``run.json``, the ``run`` event): what reads the run folder next sees it stopped."""
        self.core.stop_asked.set()
        if not self.started:
            return
        self.driver.decide(lc.StopRequested(reason))
        if wait and not self.core.done.is_set():
            self.core.stop_done.wait(STOP_TIMEOUT + 3)
            self.core.done.wait(RECORD_WAIT_S)

    def restart(self, reason: str = "restart requested by the user") -> bool:
        """Restart the whole run from its last checkpoint (every task stopped and started again, a new generation),
        not counted against ``training.restarts`` (that budget is for faults). False where the run does not run
        now (starting, restarting or ending)."""
        if not self.started or self.core.done.is_set():
            return False
        actions = self.driver.feed(lc.RestartRequested(reason))
        self.driver.act(actions)
        return bool(actions)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run ends (or ``timeout``); returns the run state."""
        self.core.done.wait(timeout)
        return self.state.state

    @property
    def done(self) -> bool:
        return self.core.done.is_set()

    def pids(self) -> list[int]:
        """Every process of the run we know of: supervisors and tasks."""
        with self.core.restart_lock:
            out = [s.proc.pid for s in self.core.supervisors]
        with self.core.lock:
            out += [t.pid for t in self.state.tasks.values() if t.pid]
        return out

    def send(self, task: str, command: str, **fields: Any) -> bool:
        """A command to the supervisor of ``task``: ``send("worker:1", "signal", signal="SIGKILL")``,
        ``send("worker:1", "restart", reason=...)`` (see :func:`engine.contract.events.make_command`)."""
        line = events.make_command(command, task=task, **fields)
        with self.core.restart_lock:
            sups = list(self.core.supervisors)
        for s in sups:
            if task in s.tasks:
                return s.send(line)
        return False

    # -- starting

    def resolve(self) -> None:
        """Pick ports for this generation of the run and write the resolved config the tasks read."""
        resolved = config_mod.replace(self.core.base_config, cluster=resolve_ports(self.core.base_config.cluster))
        self.config = resolved
        self.plans = plan_tasks(resolved)
        self.folder.write_config(resolved)

    def groups(self, config: RunConfig) -> dict[str, list[TaskPlan]]:
        """Plans by supervisor: every local host is this machine, one supervisor (and one network
        namespace) for them all; one per other host."""
        local = {h.name for h in config.cluster.hosts if h.is_local}
        by_host: dict[str, list[TaskPlan]] = {}
        for plan in plan_tasks(config) if config is not self.config else self.plans:
            by_host.setdefault(LOCAL_GROUP if plan.host in local else plan.host, []).append(plan)
        return by_host

    def remote(self, group: str) -> Host | None:
        return None if group == LOCAL_GROUP else next(h for h in self.config.cluster.hosts if h.name == group)

    def _launch(self) -> None:
        """Prepare every transport, then start the supervisors."""
        # transports see the drawn config ('auto' ports still open: a scheduler's picks them on its nodes)
        self.core.drawn_config = self.core.base_config
        ctx = transports.PrepareContext(config=self.core.base_config, folder=self.folder, stop=self.core.stop_asked,
                                        emit=self.core.queue.put)
        for transport in self.core.transports.values():
            self.core.prepared.append(transport)
            ctx.config = transport.prepare(ctx)
        if ctx.config is not self.core.base_config:
            self.core.base_config = ctx.config
            self.resolve()
        with self.core.restart_lock:
            if self.core.stopping:
                return
            self.start_supervisors()
        with self.core.lock:
            self.core.lifecycle.started()
        self.emit_run("running")

    def _launch_in_background(self) -> None:
        try:
            self._launch()
        except transports.TransportStopped:
            pass
        except Exception as exc:  # noqa: BLE001 - a failed launch fails the run, visibly
            self.driver.decide(lc.LauncherFailed(f"the run could not start: {exc}"))

    def start_supervisors(self) -> None:
        for host, plans in self.groups(self.config).items():
            self.start_supervisor(host, plans)

    def _config_yaml(self) -> str:
        """The resolved config as every supervisor of this generation gets it (made once, not once per host)."""
        if self._yaml_of is None or self._yaml_of[0] is not self.config:
            self._yaml_of = (self.config, config_mod.dumps(self.config))
        return self._yaml_of[1]

    def emit_info(self, message: str, **fields: Any) -> None:
        self.core.queue.put(events.make("info", "launcher", message=message, **fields))

    def emit_run(self, state: str, **fields: Any) -> None:
        self.core.queue.put(events.make("run", "launcher", state=state, **fields))

    def start_supervisor(self, host: str, plans: list[TaskPlan], *, takeover: bool = False,
                          restarts: dict[str, int] | None = None) -> None:
        remote = self.remote(host)
        restartable = [p.name for p in plans if self.config.parallelism.mode == "async" and p.role == "worker"]
        python = remote.python if remote is not None else self.python
        spec = SupervisorSpec(
            run_dir=str(self.run_dir.resolve()), host=host, python=python, tasks=tuple(plans), env=dict(self.task_env),
            restart_on_failure=tuple(restartable), max_task_restarts=MAX_WORKER_RESTARTS,
            # a host started again (lost, or a whole-run restart) first ends what its earlier supervisor left
            takeover=takeover or self.core.lifecycle.generation > 0, restarts=dict(restarts or {}),
            # a remote host has no copy of the run folder: it writes the config its tasks read
            config_yaml=self._config_yaml())
        transport = self.core.transports[transports.kind_of(remote, isolated=self.isolated)]
        launch = transports.SupervisorLaunch(group=host, host=remote, command=transports.supervisor_command(python),
                                             env=transports.local_env(), log=self.folder.supervisor_log(host))
        proc = transport.start(launch)
        sup = SupervisorLink(launch=launch, transport=transport, proc=proc, tasks=[p.name for p in plans],
                             generation=self.core.lifecycle.generation)
        self.core.supervisors.append(sup)
        sup.send(spec.to_json())
        assert proc.stdout is not None
        sup.reader = background.thread(self._read, sup, proc.stdout, name=f"read-{host}")
        sup.reader.start()

    # -- the event path

    def _read(self, sup: SupervisorLink, stream: IO[bytes]) -> None:
        """The reader thread of ``sup``'s stream (:func:`~engine.control.supervisor_links.read_supervisor`)."""
        read_supervisor(sup, stream, self.core.queue.put, self.core.bad)

    def stop_grace(self, sup: SupervisorLink, task_state: lc.TaskPhase) -> float:
        """Seconds between SIGTERM and SIGKILL for the tasks ``sup`` still runs.

        A finished run's training tasks are done: async servers left serving have nothing to save
        and get none (they would serve on for their stop delay); an evaluator keeps its grace to
        finish evaluating the final checkpoint.
        """
        if task_state is not lc.TaskPhase.FINISHED:
            return TASK_STOP_GRACE
        with self.core.lock:
            live = [t for name in sup.tasks if (t := self.state.tasks.get(name)) is not None
                    and t.state not in TERMINAL]
        return TASK_STOP_GRACE if any(t.name.startswith("evaluator:") for t in live) else 0.0

    # -- the record



