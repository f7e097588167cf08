"""Ending processes, in one place: signal a process group, kill what is left, and tell whether a pid is still ours.

Every stop of ClusterDeck goes through here (Horovod's ``safe_shell_exec`` is the model): a task's process group
gets SIGTERM and, after its grace, SIGKILL (:func:`terminate_groups`); a supervisor started in a session of its own
is killed with its group (:func:`kill_popen_group`); what is left of a run on this machine is found by the marks
every task process carries in its environment (:data:`RUN_DIR_ENV`, :data:`SUPERVISOR_ENV`) and killed
(:func:`kill_run_processes`); a pid read from a record is killed only while it still is the process the record
names (:func:`is_task_process`, :func:`end_earlier_supervisor`): a recycled pid is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

#: Every task process (and what it starts) carries its run folder here: what is left is found by it.
RUN_DIR_ENV = "CLUSTERDECK_RUN_DIR"
#: … and its supervisor's mark (``<host>/<pid>-<random>``): what a supervisor ends is its own.
SUPERVISOR_ENV = "CLUSTERDECK_SUPERVISOR"


class Child(Protocol):
    """A child process (a ``Popen``, a task forked from the warm-start template)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def signal_group(pid: int, sig: int, group_only: bool = False) -> None:
    """``sig`` to the process group led by ``pid``; where there is none, to ``pid`` itself (unless ``group_only``)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        if group_only:
            return
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(pid: int) -> None:
    """SIGKILL to ``pid``'s group where it leads one, else to ``pid`` alone (never another process's group)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def has_exited(proc: Child) -> bool:
    """Whether ``proc`` ended, without reaping it (its pid, and so its process group id, stays reserved)."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll() is not None
    return info is not None and info.si_pid == proc.pid


def terminate_groups(procs: Sequence[Child], grace: float, before_term: Callable[[Child], None] | None = None) -> None:
    """SIGTERM to each live process's group, SIGKILL to the groups after ``grace`` (or once all ended), then wait
    (2 s at most each). ``before_term`` runs first for each (a stop marker: this SIGTERM is ours)."""
    live = [p for p in procs if not has_exited(p)]
    for proc in live:
        if before_term is not None:
            before_term(proc)
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(has_exited(p) for p in live):
        time.sleep(0.02)
    for proc in live:
        signal_group(proc.pid, signal.SIGKILL)
    for proc in live:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


def kill_popen_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a process started with ``start_new_session`` and its whole group (a supervisor, ssh, srun)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except OSError:
            pass


def is_task_process(pid: int) -> bool:
    """True when ``pid`` still is a ClusterDeck task (a recycled pid must never be killed)."""
    try:
        proc = psutil.Process(pid)
        return "engine.runtime.task" in " ".join(proc.cmdline()) and RUN_DIR_ENV in proc.environ()
    except psutil.Error:
        return False


def kill_tasks(pids: Sequence[int]) -> None:
    """Kill (with its group) each pid that still is a ClusterDeck task."""
    for pid in pids:
        if is_task_process(pid):
            kill_group(pid)


def kill_run_processes(run_dir: str, owner: str | None = None) -> list[int]:
    """Kill every process of this user on this machine whose environment names ``run_dir`` in
    :data:`RUN_DIR_ENV` (tasks and whatever they started, even in a session of its own) and, given an
    ``owner``, carries that supervisor's mark in :data:`SUPERVISOR_ENV`. Returns their pids."""
    return _kill_marked(run_dir, lambda mark: owner is None or mark == owner)


def _kill_marked(run_dir: str, mine: Callable[[Any], bool]) -> list[int]:
    killed = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
            if env.get(RUN_DIR_ENV) != run_dir or not mine(env.get(SUPERVISOR_ENV)):
                continue
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            continue
    return killed


def machine() -> dict[str, str]:
    """What tells this machine (and this boot of it) from another one sharing the run folder."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return {"node": socket.gethostname(), "boot": boot}


def end_earlier_supervisor(record: Path, run_dir: str, host: str, token: str, wait_s: float = 3.0) -> list[int]:
    """Kill the earlier supervisor of ``host`` that ``record`` names (where it is this machine's, of this boot,
    and still that process) and every process of the run marked by any supervisor of ``host`` but ``token``;
    wait up to ``wait_s`` for them to be gone (their ports free). Returns the pids killed."""
    killed: list[int] = []
    try:
        earlier = json.loads(record.read_text())
    except (OSError, ValueError):
        earlier = None
    if isinstance(earlier, dict) and earlier.get("token") != token and all(
            earlier.get(k) == v for k, v in machine().items()):
        try:
            proc = psutil.Process(int(earlier.get("pid", 0)))
            if abs(proc.create_time() - float(earlier.get("created", 0))) < 1.0 and \
                    "engine.control.supervisor" in " ".join(proc.cmdline()):
                proc.kill()
                killed.append(proc.pid)
        except (psutil.Error, ValueError, TypeError):
            pass
    killed += _kill_marked(run_dir, lambda mark: bool(mark) and mark != token and mark.rpartition("/")[0] == host)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) and _live(pid) for pid in killed):
        time.sleep(0.05)
    return killed


def _live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe_exit(code: int, *, was: bool = True) -> str:
    """How a process ended, from its exit status (a negative one: the signal that killed it): ``was killed by
    SIGKILL`` or ``exited with code 2`` (``was=False``: ``killed by SIGKILL``, as a reason of its own)."""
    if code < 0:
        try:
            killed = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            killed = f"killed by signal {-code}"
        return f"was {killed}" if was else killed
    return f"exited with code {code}"
