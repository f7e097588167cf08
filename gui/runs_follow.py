"""A run that another process launches, as the app's session sees it: followed through its folder.

:class:`FolderRun` satisfies :class:`gui.run_session.WatchedRun`. A thread of its own reads what the run's
launcher appends to the folder (``events.jsonl`` and the samples' raw tier, through
:class:`~engine.observe.run_reader.EventFileReader`) and hands the events to the listeners, as the
launcher's dispatcher thread does for a run started in the app. It is done once the run's final event is
read, or once its launcher is gone without one (then it ended ``interrupted``).

Stopping goes through the run's owner-only control socket (:mod:`engine.control.control_socket`), off the
GUI thread; what the launcher answers (refused: another user's run; gone) is kept for the session to tell.
A run the app starts detached is spawned as ``clusterdeck run PRESET --detach --json --out RUNS`` (the
engine's own detach path, :mod:`engine.cli.detached`): the launcher lives in a session of its own and
outlives the app. No Qt here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import engine
from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import Problem, RunConfig
from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, RunFolder
from engine.contract.series_store import SeriesFollower
from engine.control import control_socket
from engine.control.detach import launcher_alive, read_launcher, run_state
from engine.observe.run_reader import SERIES, EventFileReader
from engine.observe.telemetry import TERMINAL

#: How often the folder is read for new events (seconds).
POLL_S = 0.25
#: How often the launcher's liveness is checked (seconds).
LIVENESS_S = 0.5
#: Seconds a stop request may take: the launcher answers once the run has ended.
STOP_TIMEOUT_S = 60.0
#: Seconds the detached launcher may take to say it started (it checks the data and the user's script first).
SPAWN_TIMEOUT_S = 300.0

Listener = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Notice:
    """Something the run's session should tell the user: ``kind`` is ``refused`` (a stop this user may not
    make), ``gone`` (nothing serves the run any more) or ``info``."""

    kind: str
    text: str


def detached_argv(preset: Path, runs_root: Path) -> list[str]:
    """The command that starts ``preset`` detached under ``runs_root`` and says where, as a JSON line."""
    return [sys.executable, "-m", "engine.cli", "run", str(preset), "--detach", "--json", "--out", str(runs_root)]


def _engine_env() -> dict[str, str]:
    """This environment, with the folder holding ``engine`` first on the launcher's import path."""
    env = dict(os.environ)
    source = str(Path(engine.__file__).resolve().parents[1])
    path = env.get("PYTHONPATH", "")
    if source not in path.split(os.pathsep):
        env["PYTHONPATH"] = source + (os.pathsep + path if path else "")
    return env


def launch_ready(config: RunConfig) -> RunConfig:
    """``config`` as a launcher elsewhere must read it: its data file, model script and program made absolute
    against this process's folder (what :meth:`engine.control.launcher.Run.start` does in the app)."""
    config = datasets.absolute_paths(config)
    program = config.program
    if program is not None and program.script.strip():
        config = config_mod.replace(config, program=config_mod.replace(
            program, script=os.path.abspath(os.path.expanduser(program.script))))
    return config


def folder_pids(folder: RunFolder) -> list[int]:
    """The processes ``run.json`` and ``launcher.json`` name on this machine: launcher, supervisors, tasks."""
    import socket

    meta = folder.read_meta()
    out: list[int] = []
    info = read_launcher(folder)
    if info is not None and info.host == socket.gethostname():
        out.append(info.pid)
    launcher = meta.get("launcher")
    if isinstance(launcher, dict) and isinstance(launcher.get("pid"), int) \
            and launcher.get("host") == socket.gethostname():
        out.append(launcher["pid"])
    for group in ("supervisors", "tasks"):
        entries = meta.get(group)
        if isinstance(entries, dict):
            out += [e["pid"] for e in entries.values() if isinstance(e, dict) and isinstance(e.get("pid"), int)]
    return sorted(set(p for p in out if p > 0))


class FolderRun:
    """A run followed through its folder; :meth:`start` begins following, :meth:`close` lets it go (it runs on)."""

    def __init__(self, folder: RunFolder | None, reader: EventFileReader | None = None) -> None:
        self._folder = folder
        self._reader = reader
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._notices: list[Notice] = []
        self._stop_thread: threading.Thread | None = None
        self._spawn: tuple[RunConfig, Path] | None = None
        self._spawn_proc: subprocess.Popen[str] | None = None
        self._cancelled = False
        self.final_state: str | None = None  # where no final event says how it ended (interrupted)
        self.start_problems: list[Problem] | None = None  # a detached start the launcher refused
        self.detached = folder is not None and _detached(folder)

    # ------------------------------------------------------------------ making one

    @classmethod
    def spawn(cls, config: RunConfig, runs_root: Path) -> FolderRun:
        """A run of ``config`` to be started detached under ``runs_root`` (by :meth:`start`)."""
        run = cls(None)
        run._spawn = (launch_ready(config), Path(runs_root))
        run.detached = True
        return run

    @property
    def run_dir(self) -> Path | None:
        return self._folder.path if self._folder is not None else None

    @property
    def cancelled(self) -> bool:
        """Stopped before its launcher said it started (nothing runs)."""
        return self._cancelled

    # ------------------------------------------------------------------ WatchedRun

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def pids(self) -> list[int]:
        return folder_pids(self._folder) if self._folder is not None else []

    def stop(self, reason: str = "", wait: bool = False) -> None:
        """Ask the launcher to stop the run (through its control socket, on a thread); before the launcher has
        said it started, the start is called off. What the launcher answers comes as a :class:`Notice`."""
        with self._lock:
            if self._folder is None:
                self._cancelled = True
                proc = self._spawn_proc
                if proc is not None and proc.poll() is None:
                    with contextlib.suppress(OSError):
                        proc.send_signal(signal.SIGINT)  # the command stops the launcher it started, then ends
                return
            if self._stop_thread is not None and self._stop_thread.is_alive():
                return  # one request at a time: the launcher answers every stop with the same end
            self._stop_thread = threading.Thread(target=self._request_stop, name="run-stop", daemon=True)
            self._stop_thread.start()
        if wait:
            self._stop_thread.join(STOP_TIMEOUT_S)

    def take_notices(self) -> list[Notice]:
        with self._lock:
            out, self._notices = self._notices, []
        return out

    # ------------------------------------------------------------------ following

    def start(self) -> FolderRun:
        self._thread = threading.Thread(target=self._follow, name="run-follow", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 2.0) -> None:
        """Stop following (the run itself goes on); waits ``timeout`` seconds at most for the thread."""
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _follow(self) -> None:
        try:
            if self._spawn is not None and not self._start_detached():
                return
            self._loop()
        except Exception as exc:  # noqa: BLE001 - a reader's failure ends the following, never the app
            self._notify("info", f"stopped following the run: {exc!r}")
            if self.final_state is None:
                self.final_state = INTERRUPTED
        finally:
            self._done.set()

    def _loop(self) -> None:
        folder, reader = self._folder, self._reader
        assert folder is not None and reader is not None
        checked = time.monotonic()
        while not self._closed.is_set():
            if self._deliver(reader.read_new()):
                self._closed.wait(POLL_S)  # what the launcher writes after its last run event
                self._deliver(reader.read_new())
                return
            if time.monotonic() - checked >= LIVENESS_S:
                checked = time.monotonic()
                if not launcher_alive(folder):
                    if self._deliver(reader.read_new()):
                        return
                    ended = run_state(folder)
                    self.final_state = ended if ended in TERMINAL else INTERRUPTED
                    return
            self._closed.wait(POLL_S)

    def _deliver(self, events: list[dict[str, Any]]) -> bool:
        """Hand ``events`` to the listeners; True when one of them ends the run."""
        with self._lock:
            listeners = list(self._listeners)
        ended = False
        for event in events:
            for listener in listeners:
                listener(event)
            if event.get("kind") == "run" and event.get("state") in TERMINAL:
                ended = True
        return ended

    def _notify(self, kind: str, text: str) -> None:
        with self._lock:
            self._notices.append(Notice(kind, text))

    # ------------------------------------------------------------------ stopping

    def _request_stop(self) -> None:
        folder = self._folder
        assert folder is not None
        name = folder.path.name
        try:
            reply = control_socket.request(folder.control_socket, "stop", timeout=STOP_TIMEOUT_S,
                                           by=f"ClusterDeck app (pid {os.getpid()})")
        except control_socket.ChannelRefused as exc:
            self._notify("refused", f"Cannot stop {name}: {exc}")
            return
        except control_socket.ChannelGone:
            if launcher_alive(folder) and run_state(folder) in LIVE_STATES:
                self._notify("refused", f"Cannot stop {name}: it has no control channel (it was started by an "
                                        "older ClusterDeck); stop it where it was started")
            else:
                self._notify("gone", f"{name} had already ended; nothing to stop")
            return
        except control_socket.ControlError as exc:
            self._notify("refused", f"Cannot stop {name}: {exc}")
            return
        if reply.get("already_ended"):
            self._notify("gone", f"{name} had already ended; nothing to stop")

    # ------------------------------------------------------------------ starting detached

    def _start_detached(self) -> bool:
        """Run ``clusterdeck run --detach`` for the config; True once the launcher said the run started."""
        assert self._spawn is not None
        config, runs_root = self._spawn
        fd, name = tempfile.mkstemp(prefix="clusterdeck-", suffix=".yaml")
        preset = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(config_mod.dumps(config))
            with self._lock:
                if self._cancelled:
                    return False
                self._spawn_proc = proc = subprocess.Popen(
                    detached_argv(preset, runs_root), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, env=_engine_env())
            try:
                out, err = proc.communicate(timeout=SPAWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate()
        except OSError as exc:
            self.start_problems = [Problem("", f"the detached launcher could not start: {exc.strerror or exc}")]
            return False
        finally:
            preset.unlink(missing_ok=True)  # read by now: the run folder keeps its own config.yaml
        answer, problems = _read_answer(out)
        if answer is None:
            if self._cancelled:
                return False
            tail = " ".join((err or "").strip().splitlines()[-6:]) or f"exit status {proc.returncode}"
            self.start_problems = problems or [Problem("", f"the detached launcher did not start the run: {tail}")]
            return False
        folder = RunFolder(answer["run_dir"])
        with self._lock:
            self._folder = folder
            self._reader = EventFileReader(folder.events, SeriesFollower(folder.path / SERIES))
        if self._cancelled:  # Stop came while it started: it stops now, through its channel
            self.stop()
        return True


def _read_answer(out: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The ``detached`` line of ``clusterdeck run --detach --json`` (None without one), and its error lines."""
    answer: dict[str, Any] | None = None
    problems: list[Problem] = []
    for line in (out or "").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if item.get("kind") == "detached" and isinstance(item.get("run_dir"), str):
            answer = item
        elif item.get("kind") == "error":
            problems.append(Problem(str(item.get("field", "")), str(item.get("message", ""))))
    return answer, problems


def _detached(folder: RunFolder) -> bool:
    info = read_launcher(folder)
    return info is not None and info.detached


def attach_folder(path: Path, reader: EventFileReader) -> FolderRun:
    """A run folder already read up to ``reader``, followed from there on."""
    return FolderRun(RunFolder(path), reader)
