"""Runs on another machine, as the app shows them: reached through the user's own ``ssh`` (:mod:`engine.control.remote`).

:class:`RemoteFollow` satisfies :class:`gui.run_session.WatchedRun` around an opened
:class:`~engine.control.remote.RemoteRun`, as :class:`gui.runs_follow.FolderRun` does around a local folder: the
session calls :meth:`RemoteFollow.poll` from its drain timer on the GUI thread (the remote run folds its events
into its own ``RunState``, which is the one the session shows, and calls the listeners there); stopping and
detaching (seconds over ssh) happen on threads of their own, and what they answer comes back as
:class:`~gui.runs_follow.Notice`. :func:`remote_entries` turns ``clusterdeck ls`` there into the Runs panel's
rows. No Qt here.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

from engine.cli.runs_list import RunRow
from engine.contract.run_folder import INTERRUPTED
from engine.control.remote import REMOTE_TASK, RemoteError, RemoteRun, RunSummary, remote_list, remote_stop
from engine.control.remote_protocol import RemoteTarget
from engine.observe.telemetry import TERMINAL
from gui.runs_follow import Notice
from gui.runs_scan import RunEntry

#: Seconds a dropped connection is re-made before the run reads lost (the engine's default).
RECONNECT_S = 60.0

_LOST = re.compile(r"connection to (?P<host>\S+) lost \(.*\); reconnecting$", re.S)
_BACK = re.compile(r"reconnected to (?P<host>\S+) after [\d.]+ s: .*?(?P<n>\d+) events caught up", re.S)


def connection_note(text: str) -> str:
    """The status bar's words for a note the remote feed makes about its connection."""
    lost = _LOST.match(text)
    if lost:
        return f"Connection to {lost['host']} lost; reconnecting…"
    back = _BACK.match(text)
    if back:
        return f"Back on {back['host']}: {back['n']} events caught up"
    return text[:1].upper() + text[1:]


class RemoteFollow:
    """A remote run followed live; :meth:`open` connects (blocking: call it off the GUI thread)."""

    def __init__(self, remote: RemoteRun) -> None:
        self.remote = remote
        self._lock = threading.Lock()
        self._notices: list[Notice] = []
        self._stopping: threading.Thread | None = None
        self._closing: threading.Thread | None = None

    @classmethod
    def open(cls, target: str, remote_command: str | None = None) -> RemoteFollow:
        """Connect to ``target`` (``user@host:/path/to/run``) and read its history; :class:`RemoteError` (one line
        naming the host) when it cannot."""
        return cls(RemoteRun(target, remote_command=remote_command, reconnect_s=RECONNECT_S).open())

    # ------------------------------------------------------------------ what the session reads

    @property
    def where(self) -> str:
        """``user@host:/abs/path``: the run, as ssh reaches it."""
        return str(replace(self.remote.target, path=self.remote.remote_dir or self.remote.target.path))

    @property
    def login(self) -> str:
        return self.remote.target.login

    @property
    def name(self) -> str:
        return self.where.rstrip("/").rsplit("/", 1)[-1]

    @property
    def config(self) -> Any:
        return self.remote.config

    @property
    def state(self) -> Any:
        return self.remote.state

    @property
    def done(self) -> bool:
        return self.remote.done

    @property
    def lost(self) -> str | None:
        return self.remote.lost

    @property
    def final_state(self) -> str | None:
        """``lost`` once the connection was given up before the run's end was heard (it may go on there)."""
        state = self.remote.state
        if self.remote.lost and state is not None and state.state not in (*TERMINAL, INTERRUPTED):
            return "lost"
        return None

    def add_listener(self, listener: Any) -> None:
        self.remote.add_listener(listener)

    def pids(self) -> list[int]:
        return []  # its processes are on the other machine

    def poll(self) -> int:
        """Fold what arrived (listeners called here, on the caller's thread); how many events. The connection's own
        notes (lost, reconnected) are also kept as notices for the status bar."""
        events = self.remote.poll()
        for event in events:
            if event.get("kind") == "info" and event.get("task") == REMOTE_TASK:
                self._notify("info", connection_note(str(event.get("message", ""))))
        return len(events)

    def take_notices(self) -> list[Notice]:
        with self._lock:
            out, self._notices = self._notices, []
        return out

    # ------------------------------------------------------------------ stopping and detaching

    def stop(self, reason: str = "", wait: bool = False) -> None:
        """Stop the run there, over the same connection (on a thread: the answer comes once it has ended)."""
        with self._lock:
            if self._stopping is not None and self._stopping.is_alive():
                return
            self._stopping = threading.Thread(target=self._request_stop, name="remote-stop", daemon=True)
            self._stopping.start()
        if wait:
            self._stopping.join(90)

    def _request_stop(self) -> None:
        try:
            reply = self.remote.stop()
        except RemoteError as exc:
            self._notify("refused", f"Cannot stop {self.name}: {exc}")
            return
        if reply.get("already_ended"):
            self._notify("gone", f"{self.name} had already ended there; nothing to stop")

    def close(self) -> None:
        """Detach (the follower there ends; the run goes on); returns at once, the ssh client ends on a thread."""
        with self._lock:
            if self._closing is not None:
                return
            self._closing = threading.Thread(target=self.remote.close, name="remote-close", daemon=True)
            self._closing.start()

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """Wait for :meth:`close` to be done (tests, quitting); True when it is."""
        thread = self._closing
        if thread is not None:
            thread.join(timeout)
        return thread is not None and not thread.is_alive()

    def _notify(self, kind: str, text: str) -> None:
        with self._lock:
            self._notices.append(Notice(kind, text))


# ---------------------------------------------------------------------- the Runs panel's remote rows


def remote_entry(summary: RunSummary, location: RemoteTarget) -> RunEntry:
    """The Runs panel's row for a run ``clusterdeck ls`` lists at ``location``."""
    row = RunRow(run=summary.run, path=summary.path, name=summary.name, mode=summary.mode, state=summary.state,
                 step=summary.step, total_steps=summary.total_steps, started=summary.started,
                 duration_s=summary.duration_s, detached=summary.detached, hosts=summary.hosts)
    return RunEntry(row=row, hosts=summary.hosts, owner_uid=-1, launcher_host=location.login, launcher_pid=None,
                    remote=str(replace(location, path=summary.path)))


def remote_entries(location: RemoteTarget) -> list[RunEntry]:
    """The runs of ``location``'s runs folder (blocking: ssh there); :class:`RemoteError` when they cannot be
    listed."""
    return [remote_entry(s, location) for s in remote_list(location)]


def stop_remote(target: str) -> tuple[str, str]:
    """Stop the run at ``target`` over a connection of its own (blocks until it has ended): ``(kind, text)`` as
    :func:`gui.runs_commands.stop_through_channel` says it."""
    name = target.rstrip("/").rsplit("/", 1)[-1]
    try:
        reply = remote_stop(target)
    except RemoteError as exc:
        return "refused", f"Cannot stop {name}: {exc}"
    if reply.get("already_ended"):
        return "ended", f"{name} had already ended there; nothing to stop"
    step, total = reply.get("step"), reply.get("total_steps")
    return "stopped", f"{name}: {reply.get('state')} at step {step}" + (f" of {total}" if total else "")
