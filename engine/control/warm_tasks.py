"""The supervisor's side of warm start: its template process, and the tasks forked from it.

What warm start is and which tasks may use it: :mod:`engine.contract.warm_start`. The supervisor
starts one :class:`Template` before its tasks, waits for it (while still obeying its commands), then
asks it for each task it may fork; a task it may not, or any failure of the template, gives a cold
start, so warm start can only make a start faster, never fail it.

Nor may it make a start much slower: a template that is not getting anywhere while it imports (stopped by
``SIGSTOP`` or a debugger, or using no CPU at all: stuck) is given up within seconds
(:class:`ReadinessWatch`, read through :attr:`Template.error`, which the supervisor's wait checks on every
turn), and the run says so (``tasks start cold: the warm-start template (pid N) is not answering: ...``,
an ``info`` event of ``supervisor@<host>``) instead of waiting :data:`READY_TIMEOUT_S` in silence.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.contract import warm_start

#: Seconds the template may take to import (several runs starting at once on a busy machine are slow).
READY_TIMEOUT_S = 120.0
#: Seconds a template may stay stopped (``SIGSTOP``, a debugger) while it imports before the tasks start cold.
STOPPED_TIMEOUT_S = 3.0
#: Seconds a template may use no CPU at all while it imports before the tasks start cold (an import that gets
#: anywhere uses some CPU every second, even on a machine busy with several runs starting at once).
IDLE_TIMEOUT_S = 10.0
#: Seconds between two looks at the template's process state and CPU time.
WATCH_INTERVAL_S = 0.25
#: Seconds a fork request may take (a fork of the imported interpreter takes milliseconds).
FORK_TIMEOUT_S = 10.0


class TemplateError(Exception):
    """The template cannot start this task (or any more): start it cold."""


class ReadinessWatch:
    """Whether a process that has not said it is ready (a template importing TensorFlow) still gets anywhere.

    :meth:`stuck` gives the reason it is not answering once it has been stopped (``SIGSTOP``, a debugger:
    psutil's ``stopped`` or ``tracing-stop``) for ``stopped_after`` seconds, or has used no CPU time for
    ``idle_after`` seconds; None while it may still get ready (and once it has ended: its closed socket says so).
    """

    def __init__(self, pid: int, *, stopped_after: float = STOPPED_TIMEOUT_S, idle_after: float = IDLE_TIMEOUT_S,
                 interval: float = WATCH_INTERVAL_S) -> None:
        self.pid = pid
        self.stopped_after = stopped_after
        self.idle_after = idle_after
        self.interval = interval
        self._process: Any = None
        self._cpu: float | None = None
        self._moved_at = time.monotonic()
        self._stopped_since: float | None = None
        self._looked_at = float("-inf")
        self._reason: str | None = None

    def _look(self) -> tuple[str, float] | None:
        """The process's state and CPU seconds, or None where it cannot be read (ended, or no psutil)."""
        try:
            import psutil

            if self._process is None:
                self._process = psutil.Process(self.pid)
            with self._process.oneshot():
                times = self._process.cpu_times()
                return str(self._process.status()), float(times.user + times.system)
        except Exception:  # noqa: BLE001 - an ended process (or no psutil): the socket says the rest
            return None

    def stuck(self, now: float | None = None) -> str | None:
        """Why the process is not answering, or None while it may still get ready."""
        if self._reason is not None:
            return self._reason
        now = time.monotonic() if now is None else now
        if now - self._looked_at < self.interval:
            return None
        self._looked_at = now
        seen = self._look()
        if seen is None:
            return None
        status, cpu = seen
        if status in ("stopped", "tracing-stop"):
            if self._stopped_since is None:
                self._stopped_since = now
            if now - self._stopped_since >= self.stopped_after:
                self._reason = (f"it has been stopped ({'by a debugger' if status == 'tracing-stop' else 'SIGSTOP'}) "
                                f"for {now - self._stopped_since:.0f} s while importing TensorFlow")
            return self._reason
        self._stopped_since = None
        if self._cpu is None or cpu > self._cpu:
            self._cpu, self._moved_at = cpu, now
        elif now - self._moved_at >= self.idle_after:
            self._reason = f"it has used no CPU for {now - self._moved_at:.0f} s while importing TensorFlow"
        return self._reason

    def stopped(self) -> bool:
        """Whether the process is stopped right now (a fork request to it would wait for nothing)."""
        seen = self._look()
        return seen is not None and seen[0] in ("stopped", "tracing-stop")


class ForkedTask:
    """A task forked by the template and reparented to the supervisor: what the supervisor uses of a
    :class:`subprocess.Popen` (``pid``, ``returncode``, :meth:`poll`, :meth:`wait`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost, not its end
                self.returncode = -9
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode


class Template:
    """One template process (``engine.runtime.task --template-fd``), started with ``env``, the
    environment every forked task must share with it in all that is read at import."""

    def __init__(self, python: str, run_dir: Path, env: Mapping[str, str], log: Path,
                 popen_kwargs: Mapping[str, Any], *, gpu_driver: bool = True) -> None:
        self.env = dict(env)
        self.gpu_driver = gpu_driver
        self.ready = False
        self._error = ""
        self.watch: ReadinessWatch | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        cmd = [python, "-m", "engine.runtime.task", warm_start.TEMPLATE_FLAG, str(theirs.fileno()),
               "--run-dir", str(run_dir)]
        try:
            with open(log, "ab") as out:
                self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                    pass_fds=(theirs.fileno(),), cwd=str(run_dir), **popen_kwargs)
        except OSError as exc:
            self.proc = None
            self.error = f"the template could not start: {exc}"
        else:
            self.watch = ReadinessWatch(self.proc.pid)
        finally:
            theirs.close()

    @property
    def error(self) -> str:
        """Why the template cannot serve ('' while it can, or may yet): a failure seen, or, while it imports,
        that it is not answering (:class:`ReadinessWatch`): what the supervisor's wait for it checks on every
        turn, so a stopped or stuck template gives cold starts within seconds, said in an ``info`` event."""
        if not self._error and not self.ready and self.watch is not None:
            why = self.watch.stuck()
            if why is not None:
                self._error = (f"the warm-start template (pid {self.watch.pid}) is not answering: {why}; "
                               "starting the tasks cold instead of waiting for it")
        return self._error

    @error.setter
    def error(self, value: str) -> None:
        self._error = value

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def usable(self) -> bool:
        if self.ready and not self.error and (self.proc is None or self.proc.poll() is not None):
            self.error = "the template ended"
        return self.ready and not self.error

    def read_ready(self) -> None:
        """Read the template's first message (call when its socket is readable): ready, or broken."""
        try:
            data = self.sock.recv(warm_start.MAX_MESSAGE)
        except OSError as exc:
            data, self.error = b"", f"the template's socket failed: {exc}"
        message = warm_start.decode(data) if data else None
        if message is not None and message.get("ready") is True:
            self.ready = True
        elif not self.error:
            code = self.proc.poll() if self.proc is not None else None
            self.error = ("the template ended while importing" + (f" (exit code {code})" if code is not None else "")
                          if not data else "the template said something unexpected")

    def can_fork(self, task_env: Mapping[str, str]) -> bool:
        return self.usable and warm_start.can_fork(self.env, task_env, gpu_driver=self.gpu_driver)

    def fork(self, args: Sequence[str], env: Mapping[str, str], cwd: str, cores: Sequence[int],
             fds: Sequence[int]) -> ForkedTask:
        """Ask for one task (``fds``: its log, event pipe and lifeline, as :data:`warm_start.FDS`); raises
        :class:`TemplateError` (and the template is no longer used) when it cannot."""
        if not self.usable:
            raise TemplateError(self.error or "the template is not ready")
        if self.watch is not None and self.watch.stopped():  # it would never answer: no 10 s wait for nothing
            self.error = f"the warm-start template (pid {self.watch.pid}) is stopped (SIGSTOP or a debugger)"
            raise TemplateError(self.error)
        try:
            socket.send_fds(self.sock, [warm_start.fork_request(args, env, cwd, cores, os.getpid())], list(fds))
            self.sock.settimeout(FORK_TIMEOUT_S)
            try:
                data = self.sock.recv(warm_start.MAX_MESSAGE)
            finally:
                self.sock.settimeout(None)
        except OSError as exc:  # a timeout included
            self.error = f"the template did not answer: {exc}"
            raise TemplateError(self.error) from exc
        reply = warm_start.decode(data) if data else None
        if reply is None or not isinstance(reply.get("pid"), int):
            self.error = str(reply.get("error", "")) if reply else "the template ended"
            raise TemplateError(self.error or "the template gave no pid")
        return ForkedTask(reply["pid"])

    def close(self) -> None:
        """End the template (the tasks it forked are the supervisor's and go on)."""
        self.sock.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def template_env(host_env: Mapping[str, str]) -> dict[str, str]:
    """The template's environment: the one every task of the host starts from (its run folder included,
    which is what finds the run's processes: a forked task's ``/proc`` environment is the template's),
    with every GPU hidden (tasks that may use one start cold)."""
    return dict(host_env, CUDA_VISIBLE_DEVICES="")
