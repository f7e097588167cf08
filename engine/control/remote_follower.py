"""The remote side of ``clusterdeck attach user@host:RUN``: a follower of one run folder on its own machine.

``clusterdeck follow RUN`` (a plumbing command the front end runs through the user's ``ssh``) writes the run's
history and then its live events to stdout in the follower protocol (:mod:`engine.control.remote_protocol`),
and forwards the commands it reads on stdin (``status``, ``stop``) to the run's control socket. It opens no
port and starts nothing: it exits when its stdin closes (the front end detached or its connection dropped) or
once the run has ended, so nothing of it is left on the machine.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from engine.contract import events
from engine.contract.records import TERMINAL
from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, LineSplitter, RunFolder
from engine.control import control_socket
from engine.control.detach import STOP_ANSWER_S, launcher_alive, run_state
from engine.control.remote_protocol import (
    PROTOCOL,
    SILENCE_ENV,
    SILENCE_S,
    blob,
    encode_block,
    message,
    owner_fields,
    version,
)

if TYPE_CHECKING:  # numpy and pyarrow load once the hello is sent
    from engine.observe.run_reader import EventFileReader

__all__ = ["Channel", "Closed", "Follower", "forward", "hello_fields"]

#: How often the folder is read for new events (seconds): the launcher writes samples every 0.5 s.
POLL_S = 0.1
#: How often the run's launcher is checked (seconds).
LIVENESS_S = 0.5
#: Events per write (one system call each).
BATCH = 512


class Closed(Exception):
    """The front end is gone (stdout closed)."""


class Channel:
    """The follower's stdout: whole lines, one write each batch, from several threads."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, *items: dict[str, Any]) -> None:
        self.send_all(list(items))

    def send_all(self, items: list[dict[str, Any]]) -> None:
        for i in range(0, len(items), BATCH):
            data = "".join(events.encode(e) for e in items[i:i + BATCH]).encode("utf-8")
            with self._lock:
                view = memoryview(data)
                while view:
                    try:
                        written = os.write(self.fd, view)
                    except InterruptedError:
                        continue
                    except OSError as exc:  # EPIPE: the front end went away
                        raise Closed(str(exc)) from None
                    view = view[written:]


def hello_fields() -> dict[str, Any]:
    """What every hello says: the protocol, ClusterDeck's version, where and who the follower is."""
    return {"protocol": PROTOCOL, "version": version(), "host": socket.gethostname(), "pid": os.getpid()}


def forward(folder: RunFolder, command: str, by: str | None = None) -> dict[str, Any]:
    """A front end's command sent on to the run's control socket; the launcher's reply, or one saying why not
    (``ok`` false, ``error``; ``refused`` for another user's run). Stopping a run that has ended answers
    ``already_ended``."""
    state = run_state(folder)
    if command == "stop" and state in (*TERMINAL, INTERRUPTED):
        return {"ok": True, "already_ended": True, "done": True, "state": state}
    fields = {"by": by} if by else {}
    try:
        return control_socket.request(folder.control_socket, command, timeout=STOP_ANSWER_S + 40.0 if command == "stop"
                                      else 5.0, **fields)
    except control_socket.ChannelRefused as exc:
        return {"ok": False, "refused": True, "error": str(exc)}
    except control_socket.ChannelGone:
        state = run_state(folder)
        if launcher_alive(folder) and state in LIVE_STATES:
            return {"ok": False, "error": f"{folder.path.name} has no control channel (it was started by the app or an "
                                          "older ClusterDeck); stop it where it was started"}
        return {"ok": True, "already_ended": True, "done": True, "state": state or "ended"}
    except control_socket.ControlError as exc:
        return {"ok": False, "error": str(exc)}


class Follower:
    """Follows one run folder for a front end at the other end of ``channel`` (see the module docstring).

    ``since``: a resumed follower (the front end's connection dropped): the raw samples newer than that wall
    time instead of the curves' first view. ``control_only``: no history and no events, only commands (``clusterdeck
    stop user@host:RUN``); it ends when its stdin closes.
    """

    def __init__(self, folder: RunFolder, channel: Channel, stdin_fd: int = 0, *, max_points: int = 2000,
                 since: float | None = None, control_only: bool = False) -> None:
        self.folder = folder
        self.channel = channel
        self.stdin_fd = stdin_fd
        self.max_points = max_points
        self.since = since
        self.control_only = control_only
        self.state = run_state(folder)
        self._reader: EventFileReader | None = None
        self._splitter = LineSplitter()
        self._commands: list[threading.Thread] = []
        self._checked_at = time.monotonic()
        self._heard_at = time.monotonic()
        self._sending_history = False
        try:
            self.silence_s = float(os.environ.get(SILENCE_ENV, "") or SILENCE_S)
        except ValueError:
            self.silence_s = SILENCE_S

    def run(self) -> int:
        """Follow until stdin closes or the run ends; 0 either way (a front end that went away is no error)."""
        self._sending_history = not self.control_only
        threading.Thread(target=self._watchdog, name="follow-watchdog", daemon=True).start()
        try:
            if not self.control_only:
                self._history()
            self._sending_history = False
            self._heard_at = time.monotonic()  # the front end's pings start once it has the history
            return self._loop()
        except Closed:
            return 0
        except OSError as exc:  # the folder vanished or became unreadable while it was read
            try:
                self.channel.send(message("error", f"{self.folder.path}: cannot read the run folder "
                                                   f"({exc.strerror or exc})"))
            except Closed:
                pass
            return 2

    # -- history

    def _history(self) -> None:
        from engine.contract.series_store import GROUPS, SeriesFollower, SeriesStore
        from engine.observe.run_reader import SERIES, EventFileReader, rows_to_events

        folder = self.folder
        store = SeriesStore(folder.path / SERIES)
        follower = SeriesFollower(store.root, at_end=True) if store.exists() else None  # before any row is read
        self.channel.send_all(list(blob("config", folder.config_yaml.read_bytes())))
        reader = EventFileReader(folder.events, follower)
        reader.series = None  # lifecycle lines first
        sent = 0
        gap: float | None = None
        samples: list[dict[str, Any]] = []
        if follower is not None and self.since is None:
            span = store.span()
            owners = store.owners()
            self.channel.send(message("owners", owners=[owner_fields(o) for o in owners]))
            if span is not None:
                for group in GROUPS:
                    block = store.view(group, self.max_points, span)
                    if len(block):
                        self.channel.send_all(list(blob(f"series:{group}", encode_block(block), group=group,
                                                        t0=span[0])))
        elif follower is not None and self.since is not None:
            owners_by_id = {o.id: o for o in store.owners()}
            earliest = None
            for group in GROUPS:
                block = store.read_level(group, "raw", newer_than=self.since)
                if len(block):
                    earliest = min(earliest or float("inf"), float(block.t_first.min()))
                    samples += rows_to_events(group, block.take(block.t_first > self.since), owners_by_id)
            if earliest is not None and earliest > self.since + 1.0:
                gap = earliest - self.since
            samples.sort(key=lambda e: float(e["t"]))
        while batch := reader.read_new():
            self._track(batch)
            self.channel.send_all(batch)
            sent += len(batch)
        self.channel.send_all(samples)
        reader.series = follower
        self._reader = reader
        fields: dict[str, Any] = {"state": self.state, "lifecycle": sent, "samples": len(samples)}
        if gap is not None:
            fields["gap_s"] = gap
        self.channel.send(message("history", **fields))

    def _track(self, batch: list[dict[str, Any]]) -> None:
        for event in batch:
            if event["kind"] == "run" and event.get("state") in TERMINAL:
                self.state = str(event["state"])

    # -- live

    def _loop(self) -> int:
        while True:
            try:
                ready, _, _ = select.select([self.stdin_fd], [], [], POLL_S)
            except InterruptedError:
                ready = []
            if ready:
                try:
                    chunk = os.read(self.stdin_fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    return 0  # the front end detached: nothing stays behind
                self._heard_at = time.monotonic()
                for line in self._splitter.feed(chunk):
                    self._command(line)
            if self.control_only:
                continue
            self._send_new()
            if self._ended():
                self._send_new()
                for t in self._commands:
                    t.join(STOP_ANSWER_S + 45.0)  # a stop in flight is answered before the end
                self.channel.send(message("end", f"the run ended: {self.state}", state=self.state))
                return 0

    def _watchdog(self) -> None:
        """End this process once the front end was silent for :attr:`silence_s` with no command in flight, even
        when the main thread is blocked writing to a connection nobody reads any more."""
        while True:
            time.sleep(min(1.0, self.silence_s / 4))
            busy = self._sending_history or any(t.is_alive() for t in self._commands)
            if busy:
                self._heard_at = time.monotonic()
            elif time.monotonic() - self._heard_at > self.silence_s:
                os._exit(0)

    def _send_new(self) -> None:
        assert self._reader is not None
        batch = self._reader.read_new()
        if batch:
            self._track(batch)
            self.channel.send_all(batch)

    def _ended(self) -> bool:
        if self.state in TERMINAL:
            return True
        if time.monotonic() - self._checked_at < LIVENESS_S:
            return False
        self._checked_at = time.monotonic()
        if launcher_alive(self.folder):
            return False
        self._send_new()  # what it wrote before it ended
        if self.state not in TERMINAL:
            ended = run_state(self.folder)
            self.state = ended if ended in TERMINAL else INTERRUPTED
        return True

    # -- commands

    def _command(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        ident = request.get("id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or request.get("v") != control_socket.CONTROL_VERSION:
            self._reply(ident, {"ok": False, "error": f"expected a request with \"v\": {control_socket.CONTROL_VERSION}"
                                                      f", got {line[:80]!r}"})
            return
        command = request.get("command")
        if command == "ping":  # the front end is there (heard above): no answer
            return
        if command not in control_socket.COMMANDS:
            self._reply(ident, {"ok": False, "error": f"unknown command {command!r}; expected one of "
                                                      f"{', '.join(control_socket.COMMANDS)}"})
            return
        by = request.get("by") if isinstance(request.get("by"), str) else None
        thread = threading.Thread(target=lambda: self._reply(ident, forward(self.folder, command, by)),
                                  name=f"follow-{command}", daemon=True)
        self._commands = [t for t in self._commands if t.is_alive()] + [thread]
        thread.start()

    def _reply(self, ident: Any, reply: dict[str, Any]) -> None:
        try:
            self.channel.send(message("reply", f"reply to {ident}", id=ident if isinstance(ident, int) else None,
                                      reply=reply))
        except Closed:
            pass
