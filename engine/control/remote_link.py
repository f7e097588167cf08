"""One connection to a follower: ``ssh … clusterdeck follow`` as a process, its lines, and what it says first.

:class:`Link` starts the user's own ssh client (:func:`engine.control.remote_protocol.ssh_argv`) in a session of
its own (Ctrl+C in the terminal reaches the front end, which detaches, never ssh) and reads the follower's
stdout on a thread; :func:`hello` checks the follower's protocol and turns a missing or old ClusterDeck, a
failed login or a refused run into one line naming the host; :func:`read_history` reads what a follower
sends before its live events; :func:`control` sends one command on a connection of its own.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.contract import events
from engine.contract.records import TERMINAL
from engine.contract.run_folder import INTERRUPTED, bounded_lines
from engine.control.remote_protocol import (
    MISSING_MARK,
    PROTOCOL,
    BlobAssembler,
    RemoteTarget,
    command_line,
    decode_block,
    is_message,
    owner_of,
    remote_shell,
    ssh_argv,
    version,
)

__all__ = ["END", "REMOTE_COMMAND_ENV", "History", "Link", "RemoteError", "control", "hello", "read_history"]

#: How ClusterDeck is started on the remote machine when the user says (a shell prefix: ``~/venv/bin/clusterdeck``).
REMOTE_COMMAND_ENV = "CLUSTERDECK_REMOTE_COMMAND"
#: Seconds the follower has to say hello once ssh started (connect and log in included).
HELLO_TIMEOUT_S = 30.0
#: Seconds without a line while the history comes.
HISTORY_IDLE_S = 60.0
#: A link's stream ended.
END = object()


class RemoteError(Exception):
    """A remote run cannot be reached, read or controlled; the one-line message names the host and what is wrong.
    ``refused``: the run is there but its launcher (or its channel's owner check) refused the request."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def remote_command(given: str | None) -> str | None:
    """The command that starts ClusterDeck there: ``given``, else ``$CLUSTERDECK_REMOTE_COMMAND``, else the default."""
    return given or os.environ.get(REMOTE_COMMAND_ENV) or None


def by() -> str:
    """Who asks, as the launcher records it."""
    return f"clusterdeck on {socket.gethostname()} over ssh (pid {os.getpid()})"


class Link:
    """One ``ssh … clusterdeck follow`` process: its decoded lines in :attr:`lines` (then ``END``), its stderr's
    tail, and its stdin for commands."""

    def __init__(self, target: RemoteTarget, args: list[str], remote_command: str | None) -> None:
        self.target = target
        self.remote_command = remote_command
        self.argv = ssh_argv(target, remote_shell(remote_command, args))
        self.lines: queue.Queue[Any] = queue.Queue()
        self.stderr: deque[str] = deque(maxlen=40)
        self.bad = 0
        self._send_lock = threading.Lock()
        try:
            # its own session: Ctrl+C in the terminal reaches the front end, which detaches, not ssh
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise RemoteError(f"{target.login}: cannot start ssh ({exc.strerror or exc}); expected OpenSSH's ssh "
                              "client on the PATH") from None
        self._err = threading.Thread(target=self._read_stderr, name="remote-stderr", daemon=True)
        self._out = threading.Thread(target=self._read_stdout, name="remote-stdout", daemon=True)
        self._err.start()
        self._out.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in bounded_lines(self.proc.stdout):
                event = events.decode(line)
                if event is None:
                    self.bad += 1
                    continue
                self.lines.put(event)
        except (OSError, ValueError):
            pass
        self.lines.put(END)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in bounded_lines(self.proc.stderr, 4096):
                text = line.decode("utf-8", "replace").strip()
                if text:
                    self.stderr.append(text[:500])
        except (OSError, ValueError):
            pass

    def get(self, timeout: float) -> Any:
        """The next line (or ``END``); None when none came within ``timeout`` seconds."""
        try:
            return self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def send(self, data: bytes) -> bool:
        with self._send_lock:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                return False
            try:
                stdin.write(data)
                stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def close(self, wait_s: float = 3.0) -> None:
        """Close the follower's stdin (it exits) and end ssh; its process group is killed if it lingers."""
        with self._send_lock:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, 9)
                except OSError:
                    pass
                self.proc.wait()
        self._err.join(2)
        self._out.join(2)
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def failure(self) -> str:
        """Why the follower ended without a word (ssh failed, no ClusterDeck there, …), for a user, on one line."""
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self._err.join(2)
        tail = [line for line in self.stderr if line]
        said = " | ".join(tail[-3:])
        where = self.target.login
        from engine.control.transports import ssh_error

        if any(MISSING_MARK in line for line in tail):
            return (f"{where}: ClusterDeck is not installed there (no clusterdeck command on the PATH of a "
                    "non-interactive ssh login, nor ~/.local/bin/clusterdeck); install the same version there "
                    f"({version()}), or name its command with --remote-clusterdeck CMD (or ${REMOTE_COMMAND_ENV})")
        if any("invalid choice: 'follow'" in line for line in tail):
            return (f"{where}: its ClusterDeck is older than remote attach (it has no 'follow' command; version there: "
                    f"{self._remote_version()}, here: {version()}); install the same version there")
        if code == 127 or any("not found" in line for line in tail):
            return (f"{where}: {self.remote_command or 'clusterdeck'} was not found there ({said or 'exit 127'}); "
                    f"expected the command that starts ClusterDeck there (--remote-clusterdeck CMD)")
        if any("No module named" in line for line in tail):
            return (f"{where}: {self.remote_command or 'clusterdeck'} cannot import ClusterDeck there ({tail[-1]}); "
                    f"install ClusterDeck {version()} there")
        if code == 255 or any(ssh_error(line) for line in tail):
            return f"{where}: ssh failed: {said or f'exit {code}'}"
        if code is None:
            return f"{where}: the follower did not answer within {HELLO_TIMEOUT_S:g} s"
        return f"{where}: the follower ended before it answered (exit {code}){': ' + said if said else ''}"

    def _remote_version(self) -> str:
        """``clusterdeck --version`` there (only asked when its follower is missing)."""
        argv = ssh_argv(self.target, f"exec {self.remote_command or 'clusterdeck'} --version")
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        return (out.stdout.strip().split() or ["unknown"])[-1]


def hello(link: Link, timeout: float = HELLO_TIMEOUT_S) -> dict[str, Any]:
    """The follower's hello (its protocol checked), or a :class:`RemoteError` naming the host and what is wrong.
    An ``error`` right after it (no such run, another user's run) is raised too."""
    where = link.target.login
    deadline = time.monotonic() + timeout
    first = link.get(deadline - time.monotonic())
    if first is None:
        said = " | ".join(list(link.stderr)[-2:])
        link.close(0.5)
        raise RemoteError(f"{where}: no answer within {timeout:g} s (ssh connected and logged in, but the follower "
                          f"did not start{': ' + said if said else ''})")
    if first is END:
        raise RemoteError(link.failure())
    if not is_message(first) or first.get("follow") != "hello":
        raise RemoteError(f"{where}: the follower's first line is not its hello; expected ClusterDeck {version()} "
                          "there")
    theirs = first.get("protocol")
    if theirs != PROTOCOL:
        raise RemoteError(f"{where}: ClusterDeck {first.get('version', '?')} there speaks follower protocol {theirs}, "
                          f"this ClusterDeck ({version()}) speaks {PROTOCOL}; install the same version on both machines")
    if "run_dir" not in first and "rows" not in first:
        error = link.get(min(10.0, max(0.1, deadline - time.monotonic())))
        if isinstance(error, dict) and is_message(error) and error.get("follow") == "error":
            raise RemoteError(f"{where}: {error.get('message')}", refused=error.get("refused") is True)
    return first


@dataclass
class History:
    """What a follower sends before its live events."""

    state: str = ""  # the folder's state (``interrupted`` where its launcher died)
    config_text: str = ""
    view: dict[str, Any] = field(default_factory=dict)  # the curves' first view by group (``Block``)
    owners: dict[int, Any] = field(default_factory=dict)  # its owners by id
    t0: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # lifecycle events (and, resumed, newer samples)
    gap_s: float | None = None  # resumed: samples this much older than the drop are only summaries there


def read_history(link: Link) -> History:
    """Read up to the follower's ``history`` line; :class:`RemoteError` when the stream ends or stalls first."""
    blobs = BlobAssembler()
    out = History()
    where = link.target.login
    while True:
        item = link.get(HISTORY_IDLE_S)
        if item is None or item is END:
            raise RemoteError(f"{where}: the connection ended while the history came"
                              + (f" ({link.failure()})" if item is END else f" (nothing for {HISTORY_IDLE_S:g} s)"))
        if not is_message(item):
            out.events.append(item)
            continue
        what = item["follow"]
        if what == "history":
            out.state = str(item.get("state", ""))
            gap = item.get("gap_s")
            out.gap_s = float(gap) if isinstance(gap, (int, float)) else None
            return out
        if what == "error":
            raise RemoteError(f"{where}: {item.get('message')}")
        if what == "owners":
            out.owners = {o.id: o for o in (owner_of(f) for f in item.get("owners") or [])}
        elif what == "blob":
            try:
                whole = blobs.add(item)
            except ValueError as exc:
                raise RemoteError(f"{where}: the history came damaged ({exc})") from None
            if whole is None:
                continue
            name, data, extra = whole
            if name == "config":
                out.config_text = data.decode("utf-8", "replace")
            elif name.startswith("series:"):
                try:
                    out.view[name[7:]] = decode_block(data)
                except ValueError as exc:
                    raise RemoteError(f"{where}: {exc}") from None
                if isinstance(extra.get("t0"), (int, float)):
                    out.t0 = float(extra["t0"])


def checked(target: RemoteTarget, command: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The launcher's reply, or :class:`RemoteError` (``refused``) saying why it refused."""
    if not reply.get("ok"):
        raise RemoteError(f"{target.login}: {reply.get('error') or f'{command} was refused'}", refused=True)
    return reply


def control(target: RemoteTarget, command: str, given_command: str | None, timeout: float,
            **fields: Any) -> dict[str, Any]:
    """One command through a follower of its own (``--control``: no history, no events)."""
    link = Link(target, ["--protocol", str(PROTOCOL), "--control", "--", target.path], remote_command(given_command))
    try:
        said = hello(link)
        if said.get("state") in (*TERMINAL, INTERRUPTED) and command == "stop":
            return {"ok": True, "already_ended": True, "done": True, "state": said["state"],
                    "run_dir": said.get("run_dir")}
        if not link.send(command_line(command, 1, **fields)):
            raise RemoteError(link.failure())
        deadline = time.monotonic() + timeout
        while True:
            item = link.get(deadline - time.monotonic())
            if item is None:
                raise RemoteError(f"{target.login}: no answer to {command!r} within {timeout:g} s")
            if item is END:
                raise RemoteError(link.failure())
            if is_message(item) and item.get("follow") == "reply":
                reply: dict[str, Any] = item["reply"] if isinstance(item.get("reply"), dict) else {}
                return checked(target, command, {**reply, "run_dir": reply.get("run_dir", said.get("run_dir"))})
    finally:
        link.close(1.0)
