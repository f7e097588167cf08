"""A run's control channel: an owner-only Unix socket in the run folder, served by its launcher.

The protocol is one JSON object per line each way, versioned like the supervisor's commands:
a request ``{"v": 1, "command": "status"}`` gets one reply ``{"v": 1, "ok": true, ...}`` (or
``{"v": 1, "ok": false, "error": "..."}``). Several clients may be connected at once, each on a thread
of its own; a client may send several requests on one connection.

Only the run's owner gets in: the socket is made ``0600`` in a folder that is ``0700``, and every peer's
uid is read from the kernel (``SO_PEERCRED``) and refused unless it is the owner's. A path longer than a
Unix socket may name (about 107 bytes) is reached through ``/proc/self/fd`` of the folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CONTROL_VERSION", "COMMANDS", "ChannelGone", "ChannelRefused", "ControlError", "ControlServer",
           "request"]

CONTROL_VERSION = 1
#: The commands a launcher answers.
COMMANDS = ("status", "stop", "restart")
#: The longest request or reply line (bytes).
MAX_MESSAGE = 64 * 1024
#: What a Unix socket path may hold on Linux (``sun_path`` is 108 bytes with its terminating zero).
MAX_SOCKET_PATH = 107

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlError(Exception):
    """The run's control channel could not answer; the message says why, for a user."""


class ChannelGone(ControlError):
    """No launcher serves the socket (it ended, or the run never had one)."""


class ChannelRefused(ControlError):
    """The channel is another user's: the file system or the launcher refused this peer."""


@contextlib.contextmanager
def _reachable(path: Path) -> Iterator[str]:
    """``path`` as a socket address: itself when short enough, else through an open handle of its folder."""
    text = str(path)
    if len(os.fsencode(text)) <= MAX_SOCKET_PATH:
        yield text
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0))
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of ``conn`` (None where the kernel does not say)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps({"v": CONTROL_VERSION, **message}).encode("utf-8") + b"\n")


def _read_line(conn: socket.socket, buffer: bytearray) -> bytes | None:
    """The next line from ``conn`` (without its newline); None at the end of the stream."""
    while b"\n" not in buffer:
        if len(buffer) > MAX_MESSAGE:
            raise ValueError(f"a message over {MAX_MESSAGE} bytes")
        chunk = conn.recv(4096)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


class ControlServer:
    """Serves ``handler(request) -> reply`` on an owner-only Unix socket at ``path`` until :meth:`close`.

    ``owner_uid`` is the one uid let in (this process's by default). A request that is not a JSON object
    with ``v`` and a known ``command`` gets a reply saying what was expected; the handler never sees it.
    """

    def __init__(self, path: Path, handler: Handler, *, owner_uid: int | None = None) -> None:
        self.path = Path(path)
        self.handler = handler
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self) -> ControlServer:
        """Bind (replacing a stale socket file left by a launcher that died), make it owner-only, serve."""
        with contextlib.suppress(FileNotFoundError):
            if self.path.is_socket():
                self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _reachable(self.path) as address:
                sock.bind(address)
                os.chmod(address, 0o600)
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        accept = threading.Thread(target=self._accept, name="control-accept", daemon=True)
        accept.start()
        return self

    def close(self, grace_s: float = 3.0) -> None:
        """Stop taking connections, remove the socket, and give open requests ``grace_s`` to be answered."""
        self._closed.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with contextlib.suppress(OSError):
            if self.path.is_socket():
                self.path.unlink()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=grace_s)

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            t = threading.Thread(target=self._serve, args=(conn,), name="control-client", daemon=True)
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()]
                self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = peer_uid(conn)
                if uid is not None and uid != self.owner_uid:
                    _send(conn, {"ok": False, "refused": True,
                                 "error": f"this run belongs to uid {self.owner_uid}; you are uid {uid}; only the "
                                          "run's owner may watch or control it through its channel"})
                    _drain(conn)
                    return
                buffer = bytearray()
                while (line := _read_line(conn, buffer)) is not None:
                    _send(conn, self._answer(line))
            except (OSError, ValueError):
                return  # the client went away, or sent a line too long to be a request

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "expected one JSON object per line, got text that is not JSON"}
        if not isinstance(message, dict) or message.get("v") != CONTROL_VERSION:
            return {"ok": False, "error": f"expected a request with \"v\": {CONTROL_VERSION}, got {str(line)[:80]}"}
        command = message.get("command")
        if command not in COMMANDS:
            return {"ok": False, "error": f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}"}
        try:
            return self.handler(message)
        except Exception as exc:  # noqa: BLE001 - a failed request is answered, never kills the launcher
            return {"ok": False, "error": f"{command} failed in the launcher: {exc!r}"}


def _drain(conn: socket.socket, timeout: float = 2.0) -> None:
    """Read what the peer sent until it closes: a socket closed with unread data resets the connection on
    Linux (``ECONNRESET``), and the peer would lose the answer written before the close."""
    conn.settimeout(timeout)
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(4096):
            pass


def request(path: Path, command: str, *, timeout: float = 5.0, **fields: Any) -> dict[str, Any]:
    """Send one ``command`` to the launcher serving ``path`` and return its reply (``ok`` true).

    Raises :class:`ChannelGone` when nothing serves the socket, :class:`ChannelRefused` when it is another
    user's, :class:`ControlError` for a refused request or no answer within ``timeout`` seconds.
    """
    path = Path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    with sock:
        try:
            with _reachable(path) as address:
                sock.connect(address)
        except PermissionError:
            raise ChannelRefused(f"{path}: permission denied; the run's control channel is its owner's alone "
                                 "(another user's run)") from None
        except FileNotFoundError:
            raise ChannelGone(f"{path}: no control channel (its launcher has ended, or never served one)") from None
        except ConnectionRefusedError:
            raise ChannelGone(f"{path}: nothing serves the control channel (its launcher has ended)") from None
        except OSError as exc:
            if exc.errno in (errno.ENOTSOCK, errno.ENOTDIR):
                raise ChannelGone(f"{path}: not a control socket") from None
            raise ControlError(f"{path}: cannot connect ({exc.strerror or exc})") from None
        try:
            try:
                _send(sock, {"command": command, **fields})
            except (BrokenPipeError, ConnectionResetError):
                pass  # the launcher answered and closed before reading (a refusal): its answer is still there
            line = _read_line(sock, bytearray())
        except TimeoutError:
            raise ControlError(f"{path}: the launcher did not answer {command!r} within {timeout:g} s") from None
        except (OSError, ValueError) as exc:
            raise ChannelGone(f"{path}: the launcher closed the channel ({exc})") from None
    if line is None:
        raise ChannelGone(f"{path}: the launcher closed the channel without an answer (it is ending)")
    try:
        reply = json.loads(line)
    except ValueError:
        raise ControlError(f"{path}: the launcher's answer is not JSON") from None
    if not isinstance(reply, dict):
        raise ControlError(f"{path}: the launcher's answer is not a JSON object")
    if reply.get("refused"):
        raise ChannelRefused(str(reply.get("error", "refused")))
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "the launcher refused the request")))
    return reply
