"""Runs on other machines, reached through the user's own OpenSSH: attach, list, stop.

A front end runs ``clusterdeck follow`` on the run's machine through ``ssh`` (the options ClusterDeck uses for
its SSH hosts, :func:`engine.control.remote_protocol.ssh_argv`) and reads the follower protocol
(:mod:`engine.control.remote_protocol`) from its stdout; no port is opened and nothing stays behind when the
front end detaches (the follower exits when its stdin closes).

The API the app and the CLI share::

    run = RemoteRun("ana@gpubox:/data/runs/mnist-2024-05-01T10-00-00").open()   # history loaded (RemoteError)
    run.add_listener(on_event)            # called from the thread that calls poll()/wait()/events()
    for event in run.events():            # live events until the run ends (or close())
        ...                               # run.state: the fold (RunState), run.config: its RunConfig
    run.stop()                            # through the run's control socket, there; returns the reply
    run.close()                           # detach: the follower ends, the run goes on

    remote_list("ana@gpubox")             # [RunSummary]: what `clusterdeck ls` says there
    remote_stop("ana@gpubox:/data/runs/x")

A dropped connection is re-made (for up to :data:`RECONNECT_S` seconds) with ``--since`` the newest sample
received: the follower re-reads the folder, and what was already received (lifecycle lines by their text,
samples by owner and time) is dropped, so no event is lost or folded twice. What happened is told as ``info``
events of the task ``remote`` (the live view shows them as notes).
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from engine.contract import events
from engine.contract.run_folder import bounded_lines
from engine.control.remote_protocol import (
    MISSING_MARK,
    PROTOCOL,
    BlobAssembler,
    RemoteTarget,
    TargetError,
    command_line,
    decode_block,
    is_message,
    owner_of,
    remote_shell,
    ssh_argv,
    version,
)

__all__ = ["REMOTE_COMMAND_ENV", "RemoteError", "RemoteRun", "RunSummary", "remote_list", "remote_status",
           "remote_stop"]

#: How ClusterDeck is started on the remote machine when the user says (a shell prefix: ``~/venv/bin/clusterdeck``).
REMOTE_COMMAND_ENV = "CLUSTERDECK_REMOTE_COMMAND"
#: Seconds the follower has to say hello once ssh started (connect and log in included).
HELLO_TIMEOUT_S = 30.0
#: Seconds without a line while the history comes.
HISTORY_IDLE_S = 60.0
#: For how long a dropped connection is re-made before the front end gives up (seconds).
RECONNECT_S = 60.0
#: The task of the notes a front end makes about its connection.
REMOTE_TASK = "remote"
_END = object()  # a link's stream ended


class RemoteError(Exception):
    """A remote run cannot be reached, read or controlled; the one-line message names the host and what is wrong.
    ``refused``: the run is there but its launcher (or its channel's owner check) refused the request."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class RunSummary:
    """One run of a remote runs folder: the fields of ``clusterdeck ls --json`` and the machine it is on."""

    run: str
    path: str
    name: str
    mode: str
    state: str
    step: int
    total_steps: int | None
    started: str
    duration_s: float | None
    detached: bool
    host: str = ""


def _target(target: str | RemoteTarget, *, need_path: bool) -> RemoteTarget:
    if isinstance(target, RemoteTarget):
        return target
    try:
        return RemoteTarget.parse(target, need_path=need_path)
    except TargetError as exc:
        raise RemoteError(str(exc)) from None


def _by() -> str:
    return f"clusterdeck on {socket.gethostname()} over ssh (pid {os.getpid()})"


# --------------------------------------------------------------------------- one connection


class _Link:
    """One ``ssh … clusterdeck follow`` process: its decoded lines in :attr:`lines` (then ``_END``), its stderr's
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
        self.lines.put(_END)

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
        """The next line (or ``_END``); None when none came within ``timeout`` seconds."""
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


def _hello(link: _Link, timeout: float = HELLO_TIMEOUT_S) -> dict[str, Any]:
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
    if first is _END:
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


# --------------------------------------------------------------------------- a followed remote run


class RemoteRun:
    """A run on another machine, followed through ``ssh`` (see the module docstring).

    After :meth:`open`: :attr:`config` (its ``RunConfig``), :attr:`state` (a ``RunState`` folded from its history,
    as a local attach has it), :attr:`run_dir` (``user@host:/path``). Events are folded on the thread that calls
    :meth:`poll`, :meth:`wait` or :meth:`events`; listeners are called there. The source the CLI's live view takes.
    """

    def __init__(self, target: str | RemoteTarget, *, remote_command: str | None = None, max_points: int = 2000,
                 reconnect_s: float = RECONNECT_S, hello_timeout: float = HELLO_TIMEOUT_S) -> None:
        self.target = _target(target, need_path=True)
        self.remote_command = remote_command or os.environ.get(REMOTE_COMMAND_ENV) or None
        self.max_points = max_points
        self.reconnect_s = reconnect_s
        self.hello_timeout = hello_timeout
        self.config: Any = None
        self.state: Any = None
        self.remote_dir = ""
        self.hello: dict[str, Any] = {}
        self.reconnects = 0
        #: Why the front end gave up its connection (the run may go on there), or None.
        self.lost: str | None = None
        #: The state the follower said the run ended in.
        self.end_state: str | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._done = False
        self._closed = threading.Event()
        self._link: _Link | None = None
        self._link_lock = threading.Lock()
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._ids = itertools.count(1)
        self._seen: set[str] = set()
        self._last_t: dict[tuple[Any, ...], float] = {}
        self._pump: threading.Thread | None = None
        self._connecting: _Link | None = None

    # -- the API

    @property
    def run_dir(self) -> str:
        return f"{self.target.login}:{self.remote_dir or self.target.path}"

    @property
    def done(self) -> bool:
        return self._done

    @property
    def ssh_pid(self) -> int | None:
        """The pid of the ssh client of the current connection (None while there is none)."""
        link = self._link
        return link.pid if link is not None else None

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._listeners.append(listener)

    def open(self) -> RemoteRun:
        """Connect, check the follower's version, and fold the run's history; raises :class:`RemoteError`."""
        link = _Link(self.target, self._follow_args(), self.remote_command)
        try:
            # numpy, pyarrow and the fold load while ssh connects and the follower starts there
            import numpy as np

            from engine.contract import config as config_mod
            from engine.contract.config import ConfigError
            from engine.observe.run_reader import load_view, run_state_for

            self.hello = _hello(link, self.hello_timeout)
            self.remote_dir = str(self.hello.get("run_dir", ""))
            config_text, view, owners, t0, lifecycle = self._read_history(link, first=True)
            try:
                self.config = config_mod.loads(config_text, source=self.run_dir, check=False)
            except ConfigError as exc:
                raise RemoteError(f"{self.target.login}: {exc}") from None
            state = run_state_for(self.config)
            with np.errstate(divide="ignore", invalid="ignore"):  # a bucket of zero width (as a local attach)
                state.events += load_view(view, owners, state.history, state, t0=t0)
            for group, block in view.items():  # each owner's newest sample: live ones at or before it are had
                if not len(block):
                    continue
                ids = block.owner.astype("int64")
                newest = np.full(int(ids.max()) + 1, -np.inf)
                np.maximum.at(newest, ids, block.t_last)
                for oid in np.unique(ids).tolist():
                    owner = owners.get(oid)
                    if owner is not None:
                        key = _owner_key(group, owner.task, owner.replica, owner.device)
                        self._last_t[key] = max(self._last_t.get(key, float("-inf")), float(newest[oid]))
            for event in lifecycle:
                if self._fresh(event):
                    state.apply(event)
            ended = self._history_state
            if ended in ("finished", "failed", "stopped", "interrupted") and state.state not in (
                    "finished", "failed", "stopped"):
                state.state = ended
            self.state = state
        except BaseException:
            link.close(1.0)
            raise
        self._link = link
        self._pump = threading.Thread(target=self._follow, name="remote-follow", daemon=True)
        self._pump.start()
        return self

    def poll(self) -> list[dict[str, Any]]:
        """Fold what arrived since the last call (listeners called here); the events folded."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            self._take(item, out)

    def wait(self, timeout: float | None = None) -> str:
        """Fold events for up to ``timeout`` seconds or until the run is done; its state."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self._done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self._take(item, [])
            self.poll()
        return str(self.state.state) if self.state is not None else ""

    def events(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Each event as it is folded, until the run is done, :meth:`close` is called, or ``timeout`` seconds
        pass without one."""
        while not self._done:
            try:
                item = self._queue.get(timeout=timeout if timeout is not None else 0.5)
            except queue.Empty:
                if timeout is not None or self._closed.is_set():
                    return
                continue
            got: list[dict[str, Any]] = []
            self._take(item, got)
            yield from got
        yield from self.poll()

    def status(self, timeout: float = 15.0) -> dict[str, Any]:
        """The launcher's ``status`` reply (through the follower, else a connection of its own)."""
        return self._command("status", timeout)

    def stop(self, timeout: float = 90.0) -> dict[str, Any]:
        """Stop the run as Ctrl+C in its terminal would; the launcher's reply once it has ended (``already_ended``
        where it had). Raises :class:`RemoteError` when it cannot be stopped (another user's run, no channel)."""
        return self._command("stop", timeout, by=_by())

    def close(self) -> None:
        """Detach: the follower there ends (its stdin closes); the run goes on."""
        self._closed.set()
        with self._link_lock:
            link, self._link = self._link, None
            connecting = self._connecting
        if connecting is not None:  # a reconnection under way: its follower ends too
            connecting.close(1.0)
        if link is not None:
            link.close()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(5)

    def __enter__(self) -> RemoteRun:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    def _follow_args(self, since: float | None = None) -> list[str]:
        args = ["--protocol", str(PROTOCOL), "--points", str(self.max_points)]
        if since is not None:
            args += ["--since", repr(since)]
        return [*args, "--", self.target.path if not self.remote_dir else self.remote_dir]

    def _read_history(self, link: _Link, *, first: bool) -> tuple[str, dict[str, Any], dict[int, Any], float | None,
                                                                   list[dict[str, Any]]]:
        """Read up to the ``history`` line: the config, the curves' view and its owners, and the events."""
        blobs = BlobAssembler()
        config_text = ""
        view: dict[str, Any] = {}
        owners: dict[int, Any] = {}
        t0: float | None = None
        got: list[dict[str, Any]] = []
        where = self.target.login
        while True:
            item = link.get(HISTORY_IDLE_S)
            if item is None or item is _END:
                raise RemoteError(f"{where}: the connection ended while the history came"
                                  + (f" ({link.failure()})" if item is _END else f" (nothing for {HISTORY_IDLE_S:g} s)"))
            if not is_message(item):
                got.append(item)
                continue
            what = item["follow"]
            if what == "history":
                self._history_state = str(item.get("state", ""))
                self._gap = item.get("gap_s")
                return config_text, view, owners, t0, got
            if what == "error":
                raise RemoteError(f"{where}: {item.get('message')}")
            if what == "owners":
                owners = {o.id: o for o in (owner_of(f) for f in item.get("owners") or [])}
            elif what == "blob":
                try:
                    whole = blobs.add(item)
                except ValueError as exc:
                    raise RemoteError(f"{where}: the history came damaged ({exc})") from None
                if whole is None:
                    continue
                name, data, extra = whole
                if name == "config":
                    config_text = data.decode("utf-8", "replace")
                elif name.startswith("series:") and first:
                    try:
                        view[name[7:]] = decode_block(data)
                    except ValueError as exc:
                        raise RemoteError(f"{where}: {exc}") from None
                    if isinstance(extra.get("t0"), (int, float)):
                        t0 = float(extra["t0"])
            elif what == "end":
                got.append(item)

    _history_state = ""
    _gap: Any = None

    def _fresh(self, event: dict[str, Any]) -> bool:
        """Whether ``event`` was not received before (samples: newer than the owner's last; lifecycle: by text)."""
        kind = event["kind"]
        if kind in ("step", "device"):
            key = _owner_key(kind, event["task"], event.get("replica"), event.get("device"))
            t = float(event["t"])
            if t <= self._last_t.get(key, float("-inf")):
                return False
            self._last_t[key] = t
            return True
        text = events.encode(event)
        if text in self._seen:
            return False
        self._seen.add(text)
        return True

    def _since(self) -> float | None:
        return min(self._last_t.values()) if self._last_t else None

    def _follow(self) -> None:
        """The pump: live lines to the queue, replies to their callers; a dropped connection re-made."""
        link = self._link
        while link is not None and not self._closed.is_set():
            item = link.get(0.5)
            if item is None:
                continue
            if item is _END:
                if self._closed.is_set() or self.end_state is not None:
                    break
                link = self._reconnect(link)
                continue
            self._route(item)
            if self.end_state is not None:
                break
        self._answer_all({"ok": True, "already_ended": True, "done": True, "state": self.end_state or "ended"}
                         if self.end_state is not None else None)
        with self._link_lock:
            link, self._link = self._link, None
        if link is not None:
            link.close(2.0)  # the follower has ended (or the connection is given up)
        self._queue.put(_END)

    def _route(self, item: dict[str, Any]) -> None:
        if not is_message(item):
            if self._fresh(item):
                self._queue.put(item)
            return
        what = item["follow"]
        if what == "reply":
            waiting = self._replies.get(item.get("id"))  # type: ignore[arg-type]
            if waiting is not None:
                waiting[1].append(item["reply"] if isinstance(item.get("reply"), dict) else {})
                waiting[0].set()
        elif what == "end":
            self.end_state = str(item.get("state", "") or "ended")
            self._queue.put(("end", self.end_state))

    def _reconnect(self, dropped: _Link) -> _Link | None:
        """Re-make the connection with ``--since`` (the follower re-reads the folder); None when it cannot be."""
        why = dropped.failure()
        dropped.close(0.5)
        started = time.monotonic()
        self._note(f"connection to {self.target.login} lost ({why}); reconnecting")
        delay = 0.5
        while not self._closed.is_set():
            try:
                with self._link_lock:
                    if self._closed.is_set():
                        return None
                    link = self._connecting = _Link(self.target, self._follow_args(self._since()), self.remote_command)
                try:
                    _hello(link, self.hello_timeout)
                    _, _, _, _, got = self._read_history(link, first=False)
                except RemoteError:
                    link.close(0.5)
                    raise
                finally:
                    self._connecting = None
            except RemoteError as exc:
                if time.monotonic() - started + delay > self.reconnect_s:
                    self.lost = f"{exc}; gave up after {time.monotonic() - started:.0f} s"
                    self._note(f"connection to {self.target.login} lost: {self.lost}; the run goes on there")
                    return None
                if self._closed.wait(delay):
                    return None
                delay = min(delay * 2, 8.0)
                continue
            with self._link_lock:
                if self._closed.is_set():
                    link.close(0.5)
                    return None
                self._link = link
            fresh = [e for e in got if not is_message(e) and self._fresh(e)]
            ends = [e for e in got if is_message(e) and e.get("follow") == "end"]
            self.reconnects += 1
            gap = f"; samples older than {self._gap:.0f} s before the drop are kept only as summaries there" \
                if isinstance(self._gap, (int, float)) else ""
            self._note(f"reconnected to {self.target.login} after {time.monotonic() - started:.1f} s: the history "
                       f"was read again, {len(fresh)} events caught up{gap}")
            for event in fresh:
                self._queue.put(event)
            for e in ends:
                self._route(e)
            self._answer_all(None)  # commands sent on the dropped link are not known to have arrived
            return link
        return None

    def _note(self, text: str) -> None:
        self._queue.put(events.make("info", REMOTE_TASK, message=text))

    def _answer_all(self, reply: dict[str, Any] | None) -> None:
        for event, box in list(self._replies.values()):
            if not event.is_set():
                if reply is not None:
                    box.append(reply)
                event.set()

    def _take(self, item: Any, out: list[dict[str, Any]]) -> None:
        if item is _END:
            self._done = True
            return
        if isinstance(item, tuple):  # ("end", state)
            if self.state is not None and self.state.state not in ("finished", "failed", "stopped"):
                self.state.state = item[1]
            return
        if self.state is not None:
            self.state.apply(item)
        out.append(item)
        for listener in self._listeners:
            listener(item)

    def _command(self, command: str, timeout: float, **fields: Any) -> dict[str, Any]:
        link = self._link
        if link is None or self._done:
            return _control(self.target, command, self.remote_command, timeout, **fields)
        ident = next(self._ids)
        box: tuple[threading.Event, list[dict[str, Any]]] = (threading.Event(), [])
        self._replies[ident] = box
        try:
            if not link.send(command_line(command, ident, **fields)):
                return _control(self.target, command, self.remote_command, timeout, **fields)
            if not box[0].wait(timeout):
                raise RemoteError(f"{self.target.login}: no answer to {command!r} within {timeout:g} s")
        finally:
            self._replies.pop(ident, None)
        if not box[1]:  # the link dropped before the answer: ask on a connection of its own
            return _control(self.target, command, self.remote_command, timeout, **fields)
        return _checked(self.target, command, box[1][0])


def _owner_key(group: str, task: str, replica: Any, device: Any) -> tuple[Any, ...]:
    return (group, replica) if group == "step" else (group, task, device or None)


def _checked(target: RemoteTarget, command: str, reply: dict[str, Any]) -> dict[str, Any]:
    if not reply.get("ok"):
        raise RemoteError(f"{target.login}: {reply.get('error') or f'{command} was refused'}", refused=True)
    return reply


def _control(target: RemoteTarget, command: str, remote_command: str | None, timeout: float,
             **fields: Any) -> dict[str, Any]:
    """One command through a follower of its own (``--control``: no history, no events)."""
    link = _Link(target, ["--protocol", str(PROTOCOL), "--control", "--", target.path], remote_command)
    try:
        hello = _hello(link)
        if hello.get("state") in ("finished", "failed", "stopped", "interrupted") and command == "stop":
            return {"ok": True, "already_ended": True, "done": True, "state": hello["state"],
                    "run_dir": hello.get("run_dir")}
        if not link.send(command_line(command, 1, **fields)):
            raise RemoteError(link.failure())
        deadline = time.monotonic() + timeout
        while True:
            item = link.get(deadline - time.monotonic())
            if item is None:
                raise RemoteError(f"{target.login}: no answer to {command!r} within {timeout:g} s")
            if item is _END:
                raise RemoteError(link.failure())
            if is_message(item) and item.get("follow") == "reply":
                reply: dict[str, Any] = item["reply"] if isinstance(item.get("reply"), dict) else {}
                return _checked(target, command, {**reply, "run_dir": reply.get("run_dir", hello.get("run_dir"))})
    finally:
        link.close(1.0)


def remote_status(target: str | RemoteTarget, *, remote_command: str | None = None) -> dict[str, Any]:
    """The launcher's ``status`` of a remote run."""
    t = _target(target, need_path=True)
    return _control(t, "status", remote_command or os.environ.get(REMOTE_COMMAND_ENV) or None, 15.0)


def remote_stop(target: str | RemoteTarget, *, remote_command: str | None = None,
                timeout: float = 90.0) -> dict[str, Any]:
    """Stop a remote run (``already_ended`` in the reply where it had ended); :class:`RemoteError` when it cannot."""
    t = _target(target, need_path=True)
    return _control(t, "stop", remote_command or os.environ.get(REMOTE_COMMAND_ENV) or None, timeout, by=_by())


def remote_list(target: str | RemoteTarget, *, remote_command: str | None = None,
                timeout: float = 60.0) -> list[RunSummary]:
    """The runs of a remote runs folder (``user@host``: its default one; ``user@host:/path``: that one), as
    ``clusterdeck ls`` there says them."""
    t = _target(target, need_path=False)
    args = ["--protocol", str(PROTOCOL), "--list"] + (["--", t.path] if t.path else [])
    link = _Link(t, args, remote_command or os.environ.get(REMOTE_COMMAND_ENV) or None)
    names = {f.name for f in fields(RunSummary)}
    try:
        hello = _hello(link)
        if "rows" not in hello:
            raise RemoteError(f"{t.login}: the follower did not list runs; expected ClusterDeck {version()} there")
        out: list[RunSummary] = []
        deadline = time.monotonic() + timeout
        while True:
            item = link.get(deadline - time.monotonic())
            if item is None:
                raise RemoteError(f"{t.login}: the list did not come within {timeout:g} s")
            if item is _END:
                raise RemoteError(link.failure())
            if not is_message(item):
                continue
            if item.get("follow") == "error":
                raise RemoteError(f"{t.login}: {item.get('message')}")
            if item.get("follow") == "row" and isinstance(item.get("row"), dict):
                row = {k: v for k, v in item["row"].items() if k in names}
                try:
                    out.append(RunSummary(**{**row, "host": t.login}))
                except TypeError:
                    continue
            elif item.get("follow") == "end":
                return out
    finally:
        link.close(1.0)

