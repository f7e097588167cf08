"""Launch and stop a run: one supervisor per host, one folder per run, one stream of events.

The single owner of a run's processes. It never imports TensorFlow and never
blocks its caller for long: events arrive on reader threads, are persisted to
``events.jsonl``, folded into a :class:`~engine.observe.telemetry.RunState` and handed
to listeners from one dispatcher thread.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from engine.contract import config as config_mod
from engine.contract import datasets, events
from engine.contract.config import ConfigError, Host, Problem, RunConfig
from engine.contract.plan import TaskPlan, plan_tasks, primary_roles, resolve_ports
from engine.contract.run_folder import OVERLONG, RunFolder, bounded_lines, default_runs_root
from engine.control import netns, preflight
from engine.observe.telemetry import RunState

STOP_TIMEOUT = 3.0
LOCAL_GROUP = "localhost"  # the supervisor of every host that is this machine
MAX_WORKER_RESTARTS = 10  # async: a worker that keeps dying is restarted at most this often
Listener = Callable[[dict[str, Any]], None]


def launch_problems(config: RunConfig, *, deep: bool = False) -> list[Problem]:
    """What stands between ``config`` and a launch, found without starting a task.

    The quick checks (the config's own rules) always run; ``deep`` adds the data files
    and the user's script (checked in a subprocess, as it imports TensorFlow). The app
    re-checks on every edit with the quick ones; the launcher runs them all.
    """
    problems = config_mod.validate(config)
    if deep and not problems:
        problems = preflight.preflight(datasets.absolute_paths(config))
    return problems


@dataclass
class _Supervisor:
    host: str
    proc: subprocess.Popen[bytes]
    tasks: list[str]
    reader: threading.Thread | None = None
    generation: int = 0
    stdin_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, line: str) -> bool:
        with self.stdin_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode("utf-8") + b"\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False


class Run:
    """One launch of a config. ``start()``, then ``wait()`` or ``stop()``; listeners see every event."""

    def __init__(self, config: RunConfig, *, runs_root: str | Path | None = None, run_dir: str | Path | None = None,
                 python: str | None = None, task_env: dict[str, str] | None = None,
                 isolate: bool | None = None, checked: bool = False) -> None:
        self.config = config
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self.python = python or sys.executable
        self.task_env = dict(task_env or {})
        self.isolate = isolate  # None: on unless CLUSTERDECK_NETNS=0
        self.checked = checked  # the caller ran launch_problems(deep=True) already (off its UI thread)
        self.isolated = False
        self.state = RunState(total_steps=config.total_steps(),
                              tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()])
        self.plans: list[TaskPlan] = []
        self._folder: RunFolder | None = None
        self._listeners: list[Listener] = []
        self._supervisors: list[_Supervisor] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._stop_requested = ""
        self._failure: tuple[str, str] | None = None
        self._stopping = False
        self._writer: events.EventWriter | None = None
        self._bad = events.ReadStats()
        self._base_config = config  # ports still 'auto': re-resolved on a whole-run restart
        self._restarting = threading.Event()
        self._restart_lock = threading.Lock()
        self.restarts_used = 0
        self.started = False

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

    def add_listener(self, listener: Listener) -> None:
        """``listener(event)`` is called on the dispatcher thread for every event, in order."""
        with self._lock:
            self._listeners.append(listener)

    def start(self) -> Path:
        """Validate, pick ports, write the run folder and start every host's supervisor."""
        self.config = datasets.absolute_paths(self.config)  # tasks run in the run folder
        self._base_config = self.config
        problems = launch_problems(self.config, deep=not self.checked)
        if problems:
            raise ConfigError(problems)
        if self._run_dir is None:
            self._folder = RunFolder.create(self.runs_root, self.config.name)
            self._run_dir = self._folder.path
        else:
            self._run_dir.mkdir(parents=True, exist_ok=True)
            self._folder = RunFolder(self._run_dir)
        run_dir = self._run_dir
        self._resolve()
        self.folder.checkpoints.mkdir(exist_ok=True)
        self._writer = events.EventWriter(self.folder.events)
        self._write_meta("running")
        self._dispatcher = threading.Thread(target=self._dispatch, name="run-dispatch", daemon=True)
        self._dispatcher.start()
        self.started = True
        self._emit_run("starting")
        self._decide_isolation()
        try:
            self._start_supervisors()
        except Exception:
            self.stop(reason="start-up failed")
            raise
        self._emit_run("running")
        watcher = threading.Thread(target=self._watch, name="run-watch", daemon=True)
        watcher.start()
        return run_dir

    def stop(self, reason: str = "stopped by the user", wait: bool = True) -> None:
        """End every process of the run: supervisors stop their tasks, stragglers are killed."""
        with self._lock:
            if not self._stop_requested and self._failure is None:
                self._stop_requested = reason
            if self._stopping:
                already = True
            else:
                self._stopping = True
                already = False
        if already:
            if wait:
                self.wait(STOP_TIMEOUT + 2)
            return
        if wait:
            self._stop_all()
        else:
            threading.Thread(target=self._stop_all, name="run-stop", daemon=True).start()

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run ends (or ``timeout``); returns the run state."""
        self._done.wait(timeout)
        return self.state.state

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def pids(self) -> list[int]:
        """Every process of the run we know of: supervisors and tasks."""
        out = [s.proc.pid for s in self._supervisors]
        with self._lock:
            out += [t.pid for t in self.state.tasks.values() if t.pid]
        return out

    def send(self, task: str, command: str) -> bool:
        """A command to the supervisor of ``task`` (``restart TASK``, ``signal TASK SIGKILL``)."""
        for s in self._supervisors:
            if task in s.tasks:
                return s.send(command)
        return False

    # -- starting

    def _resolve(self) -> None:
        """Pick ports for this generation of the run and write the resolved config the tasks read."""
        resolved = config_mod.replace(self._base_config, cluster=resolve_ports(self._base_config.cluster))
        self.config = resolved
        self.plans = plan_tasks(resolved)
        self.folder.write_config(resolved)

    def _start_supervisors(self) -> None:
        # every local host is this machine: one supervisor (and one network namespace) for them all
        by_host: dict[str, list[TaskPlan]] = {}
        local = {h.name for h in self.config.cluster.hosts if h.is_local}
        for plan in self.plans:
            key = LOCAL_GROUP if plan.host in local else plan.host
            by_host.setdefault(key, []).append(plan)
        for host, plans in by_host.items():
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

    def _start_supervisor(self, host: str, plans: list[TaskPlan]) -> None:
        host_dir = self.folder.host_dir(host)
        host_dir.mkdir(parents=True, exist_ok=True)
        remote = None if host == LOCAL_GROUP else next(h for h in self.config.cluster.hosts if h.name == host)
        restartable = [p.name for p in plans if self.config.parallelism.mode == "async" and p.role == "worker"]
        spec = {"run_dir": str(self.run_dir.resolve()), "host": host,
                "python": remote.python if remote is not None else self.python,
                "tasks": [p.to_dict() for p in plans], "env": self.task_env,
                "restart_on_failure": restartable, "max_task_restarts": MAX_WORKER_RESTARTS,
                # a remote host has no copy of the run folder: it writes the config its tasks read
                "config_yaml": config_mod.dumps(self.config)}
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if remote is not None:
            cmd = ssh_command(remote, [remote.python, "-m", "engine.control.supervisor"])
        else:
            cmd = [self.python, "-m", "engine.control.supervisor"]
            if self.isolated:
                cmd = netns.wrap(cmd)
        with open(self.folder.supervisor_log(host), "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True)
        sup = _Supervisor(host=host, proc=proc, tasks=[p.name for p in plans], generation=self.restarts_used)
        self._supervisors.append(sup)
        sup.send(json.dumps(spec))
        assert proc.stdout is not None
        sup.reader = threading.Thread(target=self._read, args=(sup, proc.stdout), name=f"read-{host}", daemon=True)
        sup.reader.start()

    # -- the event path

    def _read(self, sup: _Supervisor, stream: IO[bytes]) -> None:
        try:
            for line in bounded_lines(stream):
                if line is OVERLONG:
                    self._bad.note_bad(b"over-long line")
                    continue
                event = events.decode(line)
                if event is None:
                    if line.strip():
                        self._bad.note_bad(line)
                    continue
                if sup.generation:
                    event["generation"] = sup.generation  # which restart of the run it belongs to
                self._queue.put(event)
        finally:
            sup.proc.wait()

    def _watch(self) -> None:
        """Ends the run once every supervisor has exited and its stream is drained (restarts aside)."""
        while True:
            with self._restart_lock:
                current = list(self._supervisors)
            for sup in current:
                if sup.reader is not None:
                    sup.reader.join()
            with self._restart_lock:
                if not self._restarting.is_set() and current == self._supervisors:
                    break
            time.sleep(0.05)
        self._queue.put(None)

    def _emit_run(self, state: str, **fields: Any) -> None:
        self._queue.put(events.make("run", "launcher", state=state, **fields))

    def _dispatch(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                self._finish()
                return
            self._deliver(event)
            self._apply_policy(event)

    def _deliver(self, event: dict[str, Any]) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.write(event)
            self.state.apply(event)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - a broken view must not stop the run
                print(f"clusterdeck: a run listener failed: {exc!r}", file=sys.stderr)

    def _apply_policy(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "status" or self._stopping:
            return
        if event.get("generation", 0) != self.restarts_used:
            return  # from the tasks of an earlier start, stopped by a restart
        state = event.get("state")
        name = str(event.get("task", ""))
        if state == "failed":
            if event.get("will_restart"):
                return  # its supervisor brings it back (async workers)
            if self._restarting.is_set():
                return  # a whole-run restart is already under way
            if self.restarts_used < self.config.training.restarts:
                self.restarts_used += 1
                self._restarting.set()
                reason = f"{name} failed: {event.get('reason', '')}"
                threading.Thread(target=self._restart_all, args=(reason,), name="run-restart", daemon=True).start()
                return
            with self._lock:
                if self._failure is None:
                    self._failure = blame(name, str(event.get("reason", "failed")))
            self.stop(reason=f"{name} failed", wait=False)
        elif state == "finished":
            roles = primary_roles(self.config.parallelism.mode)
            with self._lock:
                primaries = [t for t in self.state.tasks.values() if t.role in roles]
                all_done = bool(primaries) and all(t.state == "finished" for t in primaries)
            if all_done:
                with self._lock:
                    self._stop_requested = self._stop_requested or "finished"
                self.stop(reason="finished", wait=False)

    def _finish(self) -> None:
        with self._lock:
            if self._failure is not None:
                task, reason = self._failure
                final = {"state": "failed", "reason": f"{task}: {reason}", "failed_task": task}
            elif self._stop_requested and self._stop_requested != "finished":
                final = {"state": "stopped", "reason": self._stop_requested}
            else:
                roles = primary_roles(self.config.parallelism.mode)
                primaries = [t for t in self.state.tasks.values() if t.role in roles]
                if primaries and all(t.state == "finished" for t in primaries):
                    final = {"state": "finished", "reason": ""}
                else:
                    bad = [t for t in primaries if t.state != "finished"]
                    task = bad[0].name if bad else ""
                    final = {"state": "failed", "failed_task": task,
                             "reason": f"{task}: ended without finishing" if task else "no task finished"}
        if self._bad.bad:
            self._deliver(events.make("info", "launcher", message=f"{self._bad.bad} malformed event line(s) "
                                      "skipped", bad_lines=self._bad.bad))
        self._deliver(events.make("run", "launcher", **final))
        with self._lock:
            self._write_meta(final["state"])
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self._done.set()

    def _restart_all(self, reason: str) -> None:
        """Stop every task and start them all again; they resume from the last checkpoint."""
        self._emit_run("restarting", reason=reason, restart=self.restarts_used,
                       restarts_allowed=self.config.training.restarts)
        try:
            with self._restart_lock:
                old = list(self._supervisors)
                self._stop_supervisors(old)
                for sup in old:
                    if sup.reader is not None:
                        sup.reader.join(timeout=5)
                if self._stopping:
                    return
                self._supervisors = []
                self._resolve()
                self._start_supervisors()
            self._emit_run("running", restart=self.restarts_used)
        except Exception as exc:  # noqa: BLE001 - a failed restart fails the run, visibly
            with self._lock:
                self._failure = self._failure or ("launcher", f"restart failed: {exc}")
            self.stop(reason="restart failed", wait=False)
        finally:
            self._restarting.clear()

    # -- stopping

    def _stop_supervisors(self, sups: list[_Supervisor]) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT - 0.4
        for sup in sups:
            sup.send("stop")
        for sup in sups:
            try:
                sup.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill_leftovers(sups)

    def _stop_all(self) -> None:
        with self._restart_lock:
            self._stop_supervisors(list(self._supervisors))

    def _kill_leftovers(self, sups: list[_Supervisor]) -> None:
        for sup in sups:
            if sup.proc.poll() is None:
                _kill_group(sup.proc.pid)
        with self._lock:
            pids = [t.pid for t in self.state.tasks.values() if t.pid]
        for pid in pids:
            if _is_task_process(pid):
                _kill_group(pid, only_if_leader=True)
        for sup in sups:
            try:
                sup.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            if sup.proc.stdin is not None:
                try:
                    sup.proc.stdin.close()
                except OSError:
                    pass

    # -- run folder

    def _write_meta(self, state: str) -> None:
        if self._run_dir is None:
            return
        self.folder.write_meta(name=self.config.name, state=state, mode=self.config.parallelism.mode,
                               summary=self.state.summary())


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


def ssh_command(host: Host, remote_cmd: list[str]) -> list[str]:
    """The user's own OpenSSH client (their ~/.ssh/config, agent and keys) running ``remote_cmd`` on ``host``.

    ``CLUSTERDECK_SSH_CONFIG`` names another ssh config file (``ssh -F``).
    """
    cmd = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    extra_config = os.environ.get("CLUSTERDECK_SSH_CONFIG")
    if extra_config:
        cmd += ["-F", extra_config]
    if host.ssh_user:
        cmd += ["-l", host.ssh_user]
    if host.ssh_port != 22:
        cmd += ["-p", str(host.ssh_port)]
    # the remote shell parses the command line: quote every word
    cmd += [host.ssh_target, shlex.join(remote_cmd)]
    return cmd


def _is_task_process(pid: int) -> bool:
    """True when ``pid`` still is a ClusterDeck task (a recycled pid must never be killed)."""
    try:
        return "engine.runtime.task" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _kill_group(pid: int, only_if_leader: bool = False) -> None:
    try:
        if only_if_leader and os.getpgid(pid) != pid:
            os.kill(pid, signal.SIGKILL)
            return
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_blocking(config: RunConfig, **kwargs: Any) -> Run:
    """Start a run and wait for its end (stopping it on Ctrl+C)."""
    run = Run(config, **kwargs)
    run.start()
    try:
        run.wait()
    except KeyboardInterrupt:
        run.stop()
        run.wait()
    return run
