"""A remote run's live events, kept coming across dropped connections, each received once.

:class:`Received` remembers what a front end has (lifecycle events by their text, samples by owner and time)
and says what is new; :class:`Feed` pumps one follower's live lines into a queue on a thread of its own,
routes command replies to their callers, and when the connection drops makes a new one with ``--since`` the
oldest of the owners' newest samples: the follower re-reads the folder and :class:`Received` drops what was
had. What happened is told as ``info`` events of the task :data:`REMOTE_TASK`.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.contract import events
from engine.control.remote_link import END, HELLO_TIMEOUT_S, Link, RemoteError, hello, read_history
from engine.control.remote_protocol import PING_S, RemoteTarget, command_line, is_message

__all__ = ["RECONNECT_S", "REMOTE_TASK", "Feed", "Received"]

#: For how long a dropped connection is re-made before the front end gives up (seconds).
RECONNECT_S = 60.0
#: The task of the notes a front end makes about its connection.
REMOTE_TASK = "remote"


def owner_key(group: str, task: str, replica: Any, device: Any) -> tuple[Any, ...]:
    return (group, replica) if group == "step" else (group, task, device or None)


class Received:
    """What a front end has received: each owner's newest sample time, and the lifecycle events' text."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._last_t: dict[tuple[Any, ...], float] = {}

    def fresh(self, event: dict[str, Any]) -> bool:
        """Whether ``event`` is new (and now had): a sample newer than its owner's newest, a lifecycle event not
        seen before."""
        kind = event["kind"]
        if kind in ("step", "device"):
            key = owner_key(kind, event["task"], event.get("replica"), event.get("device"))
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

    def view(self, view: dict[str, Any], owners: dict[int, Any]) -> None:
        """The curves' first view had: each owner's newest sample in it (a live sample at or before it is had)."""
        import numpy as np

        for group, block in view.items():
            if not len(block):
                continue
            ids = block.owner.astype("int64")
            newest = np.full(int(ids.max()) + 1, -np.inf)
            np.maximum.at(newest, ids, block.t_last)
            for oid in np.unique(ids).tolist():
                owner = owners.get(oid)
                if owner is not None:
                    key = owner_key(group, owner.task, owner.replica, owner.device)
                    self._last_t[key] = max(self._last_t.get(key, float("-inf")), float(newest[oid]))

    def since(self) -> float | None:
        """Where a resumed follower starts: the oldest of the owners' newest samples."""
        return min(self._last_t.values()) if self._last_t else None


class Feed:
    """Live lines of a follower into ``out`` (events, ``("end", state)`` once the run ended, then :data:`END`),
    across dropped connections (for up to ``reconnect_s`` seconds)."""

    def __init__(self, target: RemoteTarget, link: Link, args: Callable[[float | None], list[str]],
                 remote_command: str | None, received: Received, out: queue.Queue[Any], *,
                 reconnect_s: float = RECONNECT_S, hello_timeout: float = HELLO_TIMEOUT_S) -> None:
        self.target = target
        self.remote_command = remote_command
        self.received = received
        self.out = out
        self.reconnect_s = reconnect_s
        self.hello_timeout = hello_timeout
        self.reconnects = 0
        #: Why the feed gave up its connection (the run may go on there), or None.
        self.lost: str | None = None
        #: The state the follower said the run ended in.
        self.end_state: str | None = None
        self._args = args
        self._link: Link | None = link
        self._connecting: Link | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._pump, name="remote-feed", daemon=True)
        self._thread.start()

    @property
    def ssh_pid(self) -> int | None:
        link = self._link
        return link.pid if link is not None else None

    def ask(self, command: str, timeout: float, **fields: Any) -> dict[str, Any] | None:
        """``command`` on the live connection: its reply, or None when there is none to ask on (or it dropped
        before the answer); :class:`RemoteError` when no answer came within ``timeout`` seconds."""
        link = self._link
        if link is None:
            return None
        ident = next(self._ids)
        box: tuple[threading.Event, list[dict[str, Any]]] = (threading.Event(), [])
        self._replies[ident] = box
        try:
            if not link.send(command_line(command, ident, **fields)):
                return None
            if not box[0].wait(timeout):
                raise RemoteError(f"{self.target.login}: no answer to {command!r} within {timeout:g} s")
        finally:
            self._replies.pop(ident, None)
        return box[1][0] if box[1] else None

    def close(self) -> None:
        """The follower there ends (its stdin closes); so does a reconnection under way."""
        self._closed.set()
        with self._lock:
            link, self._link = self._link, None
            connecting = self._connecting
        if connecting is not None:
            connecting.close(1.0)
        if link is not None:
            link.close()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    # -- the pump

    def _pump(self) -> None:
        link = self._link
        pinged = time.monotonic()
        while link is not None and not self._closed.is_set():
            if time.monotonic() - pinged >= PING_S:  # the follower ends itself when it hears nothing
                link.send(command_line("ping", 0))
                pinged = time.monotonic()
            item = link.get(0.5)
            if item is None:
                continue
            if item is END:
                if self._closed.is_set():
                    break
                link = self._reconnect(link)
                continue
            self._route(item)
            if self.end_state is not None:
                break
        ended = {"ok": True, "already_ended": True, "done": True, "state": self.end_state or "ended"}
        self._answer_all(ended if self.end_state is not None else None)
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close(2.0)  # the follower has ended (or the connection is given up)
        self.out.put(END)

    def _route(self, item: dict[str, Any]) -> None:
        if not is_message(item):
            if self.received.fresh(item):
                self.out.put(item)
            return
        what = item["follow"]
        if what == "reply":
            waiting = self._replies.get(item.get("id"))  # type: ignore[arg-type]
            if waiting is not None:
                waiting[1].append(item["reply"] if isinstance(item.get("reply"), dict) else {})
                waiting[0].set()
        elif what == "end":
            self.end_state = str(item.get("state", "") or "ended")
            self.out.put(("end", self.end_state))

    def _reconnect(self, dropped: Link) -> Link | None:
        """Re-make the connection with ``--since`` (the follower re-reads the folder); None when it cannot be."""
        why = dropped.failure()
        dropped.close(0.5)
        started = time.monotonic()
        self._note(f"connection to {self.target.login} lost ({why}); reconnecting")
        delay = 0.5
        while not self._closed.is_set():
            try:
                with self._lock:
                    if self._closed.is_set():
                        return None
                    link = self._connecting = Link(self.target, self._args(self.received.since()),
                                                   self.remote_command)
                try:
                    hello(link, self.hello_timeout)
                    history = read_history(link)
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
            with self._lock:
                if self._closed.is_set():
                    link.close(0.5)
                    return None
                self._link = link
            fresh = [e for e in history.events if self.received.fresh(e)]
            self.reconnects += 1
            gap = (f"; {history.gap_s:.0f} s of samples from before the drop are kept there only as summaries"
                   if history.gap_s is not None else "")
            self._note(f"reconnected to {self.target.login} after {time.monotonic() - started:.1f} s: the history "
                       f"was read again, {len(fresh)} events caught up{gap}")
            for event in fresh:
                self.out.put(event)
            self._answer_all(None)  # commands sent on the dropped link are not known to have arrived
            return link
        return None

    def _note(self, text: str) -> None:
        self.out.put(events.make("info", REMOTE_TASK, message=text))

    def _answer_all(self, reply: dict[str, Any] | None) -> None:
        for event, box in list(self._replies.values()):
            if not event.is_set():
                if reply is not None:
                    box.append(reply)
                event.set()
