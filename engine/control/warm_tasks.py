"""The supervisor's side of warm start: its template process, and the tasks forked from it.

What warm start is and which tasks may use it: :mod:`engine.contract.warm_start`. The supervisor
starts one :class:`Template` before its tasks, waits for it (while still obeying its commands), then
asks it for each task it may fork; a task it may not, or any failure of the template, gives a cold
start, so warm start can only make a start faster, never fail it.
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
#: Seconds a fork request may take (a fork of the imported interpreter takes milliseconds).
FORK_TIMEOUT_S = 10.0


class TemplateError(Exception):
    """The template cannot start this task (or any more): start it cold."""


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
        self.error = ""
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
        finally:
            theirs.close()

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
