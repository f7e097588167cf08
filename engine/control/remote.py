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

A dropped connection is re-made (for up to a minute, :mod:`engine.control.remote_feed`) with ``--since`` the
newest samples received: the follower re-reads the folder, and what was already received (lifecycle lines by
their text, samples by owner and time) is dropped, so no event is lost or folded twice. What happened is told
as ``info`` events of the task ``remote`` (the live view shows them as notes). The connection itself (ssh, the
follower's first words, errors naming the host) is :mod:`engine.control.remote_link`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from engine.contract.records import TERMINAL
from engine.contract.run_folder import INTERRUPTED
from engine.control.launcher_info import RunRow
from engine.control.remote_feed import RECONNECT_S, REMOTE_TASK, Feed, Received
from engine.control.remote_link import (
    END,
    HELLO_TIMEOUT_S,
    REMOTE_COMMAND_ENV,
    Link,
    RemoteError,
    by,
    checked,
    control,
    hello,
    read_history,
)
from engine.control.remote_link import remote_command as resolve_command
from engine.control.remote_protocol import PROTOCOL, RemoteTarget, TargetError, is_message, version

__all__ = ["REMOTE_COMMAND_ENV", "REMOTE_TASK", "RemoteError", "RemoteRun", "RunSummary", "remote_list",
           "remote_status", "remote_stop"]



@dataclass(frozen=True)
class RunSummary(RunRow):
    """One run of a remote runs folder: the fields of ``clusterdeck ls --json`` and the machine it is on."""

    host: str = ""


#: what a remote ``ls --json`` row may say (a newer ClusterDeck may say more: left out)
_SUMMARY_FIELDS = frozenset(RunSummary.__dataclass_fields__) - {"host"}


def _target(target: str | RemoteTarget, *, need_path: bool) -> RemoteTarget:
    if isinstance(target, RemoteTarget):
        return target
    try:
        return RemoteTarget.parse(target, need_path=need_path)
    except TargetError as exc:
        raise RemoteError(str(exc)) from None


class RemoteRun:
    """A run on another machine, followed through ``ssh`` (see the module docstring).

    After :meth:`open`: :attr:`config` (its ``RunConfig``), :attr:`state` (a ``RunState`` folded from its history,
    as a local attach has it), :attr:`run_dir` (``user@host:/path``). Events are folded on the thread that calls
    :meth:`poll`, :meth:`wait` or :meth:`events`, and listeners are called there: call one of them often (a
    timer of the app), or events wait in memory. The source the CLI's live view takes.
    """

    def __init__(self, target: str | RemoteTarget, *, remote_command: str | None = None, max_points: int = 2000,
                 reconnect_s: float = RECONNECT_S, hello_timeout: float = HELLO_TIMEOUT_S) -> None:
        self.target = _target(target, need_path=True)
        self.remote_command = remote_command
        self.max_points = max_points
        self.reconnect_s = reconnect_s
        self.hello_timeout = hello_timeout
        self.config: Any = None
        self.state: Any = None
        self.remote_dir = ""
        self.hello: dict[str, Any] = {}
        self._queue: queue.Queue[Any] = queue.Queue()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._done = False
        self._received = Received()
        self._feed: Feed | None = None

    # -- what the views read

    @property
    def run_dir(self) -> str:
        return f"{self.target.login}:{self.remote_dir or self.target.path}"

    @property
    def done(self) -> bool:
        return self._done

    @property
    def reconnects(self) -> int:
        return self._feed.reconnects if self._feed is not None else 0

    @property
    def lost(self) -> str | None:
        """Why the connection was given up (the run may go on there), or None."""
        return self._feed.lost if self._feed is not None else None

    @property
    def ssh_pid(self) -> int | None:
        """The pid of the ssh client of the current connection (None while there is none)."""
        return self._feed.ssh_pid if self._feed is not None else None

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._listeners.append(listener)

    # -- following

    def open(self) -> RemoteRun:
        """Connect, check the follower's version, and fold the run's history; raises :class:`RemoteError`."""
        command = resolve_command(self.remote_command)
        link = Link(self.target, self._args(None), command)
        try:
            # numpy, pyarrow and the fold load while ssh connects and the follower starts there
            import numpy as np

            from engine.contract import config as config_mod
            from engine.contract.config import ConfigError
            from engine.observe.run_reader import load_view, run_state_for

            self.hello = hello(link, self.hello_timeout)
            self.remote_dir = str(self.hello.get("run_dir", ""))
            history = read_history(link)
            try:
                self.config = config_mod.loads(history.config_text, source=self.run_dir, check=False)
            except ConfigError as exc:
                raise RemoteError(f"{self.target.login}: {exc}") from None
            state = run_state_for(self.config)
            with np.errstate(divide="ignore", invalid="ignore"):  # a bucket of zero width (as a local attach)
                state.events += load_view(history.view, history.owners, state.history, state, t0=history.t0)
            self._received.view(history.view, history.owners)
            for event in history.events:
                if self._received.fresh(event):
                    state.apply(event)
            if history.state in (*TERMINAL, INTERRUPTED) and state.state not in TERMINAL:
                state.state = history.state
            self.state = state
        except BaseException:
            link.close(1.0)
            raise
        self._feed = Feed(self.target, link, self._args, command, self._received, self._queue,
                          reconnect_s=self.reconnect_s, hello_timeout=self.hello_timeout)
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
                if timeout is not None:
                    return
                continue
            got: list[dict[str, Any]] = []
            self._take(item, got)
            yield from got
        yield from self.poll()

    # -- control

    def status(self, timeout: float = 15.0) -> dict[str, Any]:
        """The launcher's ``status`` reply (through the follower, else a connection of its own)."""
        return self._command("status", timeout)

    def stop(self, timeout: float = 90.0) -> dict[str, Any]:
        """Stop the run as Ctrl+C in its terminal would; the launcher's reply once it has ended (``already_ended``
        where it had). :class:`RemoteError` (``refused``) when it cannot be stopped (another user's run, no
        channel)."""
        return self._command("stop", timeout, by=by())

    def close(self) -> None:
        """Detach: the follower there ends (its stdin closes); the run goes on."""
        if self._feed is not None:
            self._feed.close()
        self._queue.put(END)

    def __enter__(self) -> RemoteRun:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    def _args(self, since: float | None) -> list[str]:
        args = ["--protocol", str(PROTOCOL), "--points", str(self.max_points)]
        if since is not None:
            args += ["--since", repr(since)]
        return [*args, "--", self.remote_dir or self.target.path]

    def _take(self, item: Any, out: list[dict[str, Any]]) -> None:
        if item is END:
            self._done = True
            return
        if isinstance(item, tuple):  # ("end", state): the follower saw the run end
            if self.state is not None and self.state.state not in TERMINAL:
                self.state.state = item[1]
            return
        if self.state is not None:
            self.state.apply(item)
        out.append(item)
        for listener in self._listeners:
            listener(item)

    def _command(self, command: str, timeout: float, **fields: Any) -> dict[str, Any]:
        reply = self._feed.ask(command, timeout, **fields) if self._feed is not None and not self._done else None
        if reply is None:  # no live connection (or it dropped before the answer): one of its own
            return control(self.target, command, self.remote_command, timeout, **fields)
        return checked(self.target, command, reply)


def remote_status(target: str | RemoteTarget, *, remote_command: str | None = None) -> dict[str, Any]:
    """The launcher's ``status`` of a remote run."""
    return control(_target(target, need_path=True), "status", remote_command, 15.0)


def remote_stop(target: str | RemoteTarget, *, remote_command: str | None = None,
                timeout: float = 90.0) -> dict[str, Any]:
    """Stop a remote run (``already_ended`` in the reply where it had ended); :class:`RemoteError` when it cannot."""
    return control(_target(target, need_path=True), "stop", remote_command, timeout, by=by())


def remote_list(target: str | RemoteTarget, *, remote_command: str | None = None,
                timeout: float = 60.0) -> list[RunSummary]:
    """The runs of a remote runs folder (``user@host``: its default one; ``user@host:/path``: that one), as
    ``clusterdeck ls`` there says them."""
    t = _target(target, need_path=False)
    args = ["--protocol", str(PROTOCOL), "--list"] + (["--", t.path] if t.path else [])
    link = Link(t, args, resolve_command(remote_command))
    names = {f.name for f in fields(RunSummary)}
    try:
        said = hello(link)
        if "rows" not in said:
            raise RemoteError(f"{t.login}: the follower did not list runs; expected ClusterDeck {version()} there")
        out: list[RunSummary] = []
        deadline = time.monotonic() + timeout
        while True:
            item = link.get(deadline - time.monotonic())
            if item is None:
                raise RemoteError(f"{t.login}: the list did not come within {timeout:g} s")
            if item is END:
                raise RemoteError(link.failure())
            if not is_message(item):
                continue
            if item.get("follow") == "error":
                raise RemoteError(f"{t.login}: {item.get('message')}")
            if item.get("follow") == "row" and isinstance(item.get("row"), dict):
                row = {k: v for k, v in item["row"].items() if k in names}
                try:
                    out.append(RunSummary(**{k: v for k, v in row.items() if k in _SUMMARY_FIELDS}, host=t.login))
                except TypeError:
                    continue
            elif item.get("follow") == "end":
                return out
    finally:
        link.close(1.0)
