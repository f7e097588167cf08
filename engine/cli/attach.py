"""``clusterdeck attach RUN`` and ``clusterdeck stop RUN``: a front end on a run another process launched.

Attaching reads the run folder (the history first, as :func:`~engine.observe.run_reader.read_run_folder`
folds it), then follows the events appended to it, in the live view ``clusterdeck run`` shows, until the
run ends or Ctrl+C detaches (the run goes on). Stopping goes through the run's control socket, as Ctrl+C in
the launching terminal would.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from engine.cli.runs_list import RunNotFound, find_run, runs_root_of
from engine.contract.config import ConfigError
from engine.contract.run_folder import LIVE_STATES, RunFolder
from engine.control import control_socket
from engine.control.detach import launcher_alive, read_launcher, run_state

#: How often a follower checks that the run's launcher still lives (seconds).
LIVENESS_S = 0.5
#: What a user may do next, said when attach or stop ends.
_TERMINAL = ("finished", "failed", "stopped")


class FollowedRun:
    """A run folder as the live view's source: its history folded, then its new events as they are appended.

    It is done once the run's final event is read, or once its launcher is gone without one (then its
    state reads ``interrupted``).
    """

    def __init__(self, folder: RunFolder) -> None:
        import numpy as np

        from engine.observe.run_reader import read_run_folder

        self.folder = folder
        with np.errstate(divide="ignore", invalid="ignore"):  # a tier bucket of zero width (series_store) warns
            self.config, self.state, self._reader = read_run_folder(folder.path)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._done = self.state.state in (*_TERMINAL, "interrupted")
        self._checked_at = time.monotonic()

    @property
    def run_dir(self) -> Any:
        return self.folder.path

    @property
    def done(self) -> bool:
        return self._done

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._listeners.append(listener)

    def wait(self, timeout: float | None = None) -> str:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while True:
            self.poll()
            if self._done or time.monotonic() >= deadline:
                return str(self.state.state)
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def poll(self) -> None:
        """Fold what was appended since the last call; end when the run ended or its launcher is gone."""
        if self._done:
            return
        self._fold(self._reader.read_new())
        if self.state.state in _TERMINAL:
            self._done = True
        elif time.monotonic() - self._checked_at >= LIVENESS_S:
            self._checked_at = time.monotonic()
            if not launcher_alive(self.folder):
                self._fold(self._reader.read_new())  # what it wrote before it ended
                if self.state.state not in _TERMINAL:
                    ended = run_state(self.folder)
                    self.state.state = ended if ended in _TERMINAL else "interrupted"
                self._done = True

    def _fold(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.state.apply(event)
            for listener in self._listeners:
                listener(event)


def _channel_problem(folder: RunFolder) -> str | None:
    """Why this user may not watch the run through its channel (another user's run), or None."""
    if not folder.control_socket.exists():
        return None
    try:
        control_socket.request(folder.control_socket, "status", timeout=5.0)
    except control_socket.ChannelRefused as exc:
        return str(exc)
    except control_socket.ControlError:
        return None  # it is ending, or gone: the folder tells the rest
    return None


def attach(args: argparse.Namespace) -> int:
    """Exit 0 when the run finished or Ctrl+C detached, 1 when it ended otherwise, 2 when there is no such run."""
    from rich.console import Console
    from rich.markup import escape

    from engine.cli import live_view

    try:
        folder = find_run(args.run, runs_root_of(args.out))
        refused = _channel_problem(folder)
        if refused is not None:
            raise RunNotFound(f"{args.run}: {refused}")
        run = FollowedRun(folder)
    except RunNotFound as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"clusterdeck: {args.run}: {exc}; expected a run folder", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"clusterdeck: {args.run}: cannot read the run folder ({exc.strerror or exc})", file=sys.stderr)
        return 2
    console = Console()
    name = folder.path.name
    if not run.done:
        console.print(f"attached to {escape(name)} ({run.state.state}); Ctrl+C detaches, the run goes on")
    view = live_view.LiveView(run, console)
    try:
        view.follow()
    except KeyboardInterrupt:
        console.print(f"\ndetached from {escape(name)}; it runs on (clusterdeck attach {escape(name)} to watch "
                      f"again, clusterdeck stop {escape(name)} to stop it)")
        return 0
    console.print()
    live_view.print_summary(console, run)
    if run.state.state == "interrupted":
        info = read_launcher(folder)
        who = f" (pid {info.pid})" if info is not None else ""
        console.print(f"[yellow]interrupted[/]: its launcher{who} is gone and did not record an end; the history "
                      "up to then is shown above")
    return 0 if run.state.state == "finished" else 1


def stop(args: argparse.Namespace) -> int:
    """``clusterdeck stop RUN``: 0 when it is stopped (or had ended already), 1 when it cannot be, 2 no such run."""
    try:
        folder = find_run(args.run, runs_root_of(args.out))
    except RunNotFound as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    name = folder.path.name
    state = run_state(folder)
    if state in _TERMINAL or state == "interrupted":
        print(_ended(name, folder))
        return 0
    try:
        reply = control_socket.request(folder.control_socket, "stop", timeout=60.0,
                                       by=f"clusterdeck stop (pid {os.getpid()})")
    except control_socket.ChannelRefused as exc:
        print(f"clusterdeck: {name}: {exc}", file=sys.stderr)
        return 1
    except control_socket.ChannelGone:
        if launcher_alive(folder) and run_state(folder) in LIVE_STATES:
            print(f"clusterdeck: {name} has no control channel (it was started by the app or an older ClusterDeck); "
                  "stop it where it was started", file=sys.stderr)
            return 1
        print(_ended(name, folder))
        return 0
    except control_socket.ControlError as exc:
        print(f"clusterdeck: {name}: {exc}", file=sys.stderr)
        return 1
    if reply.get("already_ended"):
        print(_ended(name, folder))
        return 0
    total = reply.get("total_steps")
    print(f"{name}: {reply.get('state')} at step {reply.get('step')}" + (f" of {total}" if total else ""))
    return 0 if reply.get("done") else 1


def _ended(name: str, folder: RunFolder) -> str:
    state = run_state(folder) or "ended"
    if state == "interrupted":
        return f"{name} has ended: interrupted (its launcher is gone); nothing to stop"
    return f"{name} has ended ({state}); nothing to stop"
