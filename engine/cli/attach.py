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

from engine.cli.runs_list import RunNotFound, add_runs_option, find_run, runs_root_of
from engine.contract.config import ConfigError
from engine.contract.records import TERMINAL
from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, RunFolder
from engine.control import control_socket, slurm, slurm_batch
from engine.control.detach import launcher_alive, read_launcher, run_state
from engine.control.remote_protocol import looks_remote

#: How often a follower checks that the run's launcher still lives (seconds).
LIVENESS_S = 0.5
#: What a user may do next, said when attach or stop ends.


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
        self._done = self.state.state in (*TERMINAL, INTERRUPTED)
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
        if self.state.state in TERMINAL:
            # a Slurm batch job being requeued ends one execution, not the run: stay on through it
            if not (slurm_batch.is_batch_run(self.folder) and run_state(self.folder) in LIVE_STATES):
                self._done = True
        elif time.monotonic() - self._checked_at >= LIVENESS_S:
            self._checked_at = time.monotonic()
            if not launcher_alive(self.folder):
                self._fold(self._reader.read_new())  # what it wrote before it ended
                if self.state.state not in TERMINAL:
                    ended = run_state(self.folder)
                    self.state.state = ended if ended in TERMINAL else INTERRUPTED
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

    if looks_remote(args.run):
        return attach_remote(args)
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
    if run.state.state == INTERRUPTED:
        info = read_launcher(folder)
        who = f" (pid {info.pid})" if info is not None else ""
        console.print(f"[yellow]interrupted[/]: its launcher{who} is gone and did not record an end; the history "
                      "up to then is shown above")
    return 0 if run.state.state == "finished" else 1


def stop(args: argparse.Namespace) -> int:
    """``clusterdeck stop RUN``: 0 when it is stopped (or had ended already), 1 when it cannot be, 2 no such run."""
    if looks_remote(args.run):
        return stop_remote(args)
    try:
        folder = find_run(args.run, runs_root_of(args.out))
    except RunNotFound as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    name = folder.path.name
    state = run_state(folder)
    if state in TERMINAL or state == INTERRUPTED:
        print(_ended(name, folder))
        return 0
    by = f"clusterdeck stop (pid {os.getpid()})"
    try:
        reply = control_socket.request(folder.control_socket, "stop", timeout=60.0, by=by)
    except control_socket.ChannelRefused as exc:
        print(f"clusterdeck: {name}: {exc}", file=sys.stderr)
        return 1
    except control_socket.ChannelGone:
        if slurm_batch.is_batch_run(folder):  # queued, or its launcher on a compute node: through Slurm
            try:
                print(slurm_batch.stop_run(folder, by=by))
            except slurm.SlurmError as exc:
                print(f"clusterdeck: {name}: {exc}", file=sys.stderr)
                return 1
            return 0
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


def restart(args: argparse.Namespace) -> int:
    """``clusterdeck restart RUN``: every task stopped and started again from the last checkpoint (0: it began)."""
    try:
        folder = find_run(args.run, runs_root_of(args.out))
    except RunNotFound as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    name = folder.path.name
    if run_state(folder) in (*TERMINAL, INTERRUPTED):
        print(f"clusterdeck: {_ended(name, folder).replace('nothing to stop', 'nothing to restart')}", file=sys.stderr)
        return 1
    try:
        reply = control_socket.request(folder.control_socket, "restart", timeout=10.0,
                                       by=f"clusterdeck restart (pid {os.getpid()})")
    except control_socket.ChannelGone:
        print(f"clusterdeck: {name} has no control channel (its launcher is gone or older); nothing restarted",
              file=sys.stderr)
        return 1
    except control_socket.ControlError as exc:  # refused (another user's run) or a bad answer
        print(f"clusterdeck: {name}: {exc}", file=sys.stderr)
        return 1
    if not reply.get("restarted"):
        print(f"clusterdeck: {name} is {reply.get('state')}: it restarts only while it runs", file=sys.stderr)
        return 1
    print(f"{name}: restarting from its last checkpoint (step {reply.get('step')}); it does not count against "
          "training.restarts")
    return 0


def _ended(name: str, folder: RunFolder) -> str:
    state = run_state(folder) or "ended"
    if state == INTERRUPTED:
        return f"{name} has ended: interrupted (its launcher is gone); nothing to stop"
    return f"{name} has ended ({state}); nothing to stop"


# --------------------------------------------------------------------------- runs on other machines (over ssh)


def add_remote_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote-clusterdeck", dest="remote_command", default=None, metavar="CMD",
                   help="how ClusterDeck starts on the remote machine, e.g. ~/venv/bin/clusterdeck (default: "
                        "clusterdeck on the PATH there, else ~/.local/bin/clusterdeck; or $CLUSTERDECK_REMOTE_COMMAND)")


def _remote_failed(word: str, exc: Exception) -> int:
    print(f"clusterdeck: {exc}", file=sys.stderr)
    return 2


def attach_remote(args: argparse.Namespace) -> int:
    """``clusterdeck attach user@host:RUN``: the same view, its events through ``clusterdeck follow`` over ssh."""
    from rich.console import Console
    from rich.markup import escape

    from engine.cli import live_view
    from engine.control.remote import RemoteError, RemoteRun

    try:
        run = RemoteRun(args.run, remote_command=getattr(args, "remote_command", None)).open()
    except RemoteError as exc:
        return _remote_failed(args.run, exc)
    except KeyboardInterrupt:
        print("clusterdeck: interrupted (Ctrl-C) before the history came; nothing was left running there",
              file=sys.stderr)
        return 130
    console = Console()
    where = run.run_dir
    try:
        if not run.done and run.state.state not in (*TERMINAL, INTERRUPTED):
            console.print(f"attached to {escape(where)} ({run.state.state}) over ssh; Ctrl+C detaches, the run goes on")
        view = live_view.LiveView(run, console)
        try:
            view.follow()
        except KeyboardInterrupt:
            console.print(f"\ndetached from {escape(where)}; it runs on there (clusterdeck attach {escape(where)} to "
                          f"watch again, clusterdeck stop {escape(where)} to stop it)")
            return 0
    finally:
        run.close()
    console.print()
    live_view.print_summary(console, run)
    if run.lost is not None:
        console.print(f"[yellow]connection lost[/]: {escape(run.lost)}")
        return 1
    if run.state.state == INTERRUPTED:
        console.print("[yellow]interrupted[/]: its launcher is gone and did not record an end; the history up to "
                      "then is shown above")
    return 0 if run.state.state == "finished" else 1


def stop_remote(args: argparse.Namespace) -> int:
    """``clusterdeck stop user@host:RUN`` through a follower there: as ``clusterdeck stop`` says it."""
    from engine.control.remote import RemoteError, remote_stop

    try:
        reply = remote_stop(args.run, remote_command=getattr(args, "remote_command", None))
    except RemoteError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 1 if exc.refused else 2  # as here: a run that cannot be stopped 1, no run (or no machine) 2
    name = args.run
    if reply.get("already_ended"):
        state = reply.get("state") or "ended"
        if state == INTERRUPTED:
            print(f"{name} has ended: interrupted (its launcher is gone); nothing to stop")
        else:
            print(f"{name} has ended ({state}); nothing to stop")
        return 0
    total = reply.get("total_steps")
    print(f"{name}: {reply.get('state')} at step {reply.get('step')}" + (f" of {total}" if total else ""))
    return 0 if reply.get("done") else 1


def add_follow_command(sub: Any) -> None:
    """``clusterdeck follow``: the remote side of attach, ls and stop over ssh (plumbing, not in the help)."""
    p = sub.add_parser("follow",  # no help: left out of the command list (a help of SUPPRESS prints as such)
                       description="The remote side of clusterdeck attach/ls/stop user@host:...: the run's history, then "
                                   "its events, as versioned JSON lines on stdout; commands on stdin.")
    p.add_argument("run", nargs="?", default=None, metavar="RUN", help="a run folder or name (with --list: a runs "
                                                                        "folder)")
    add_runs_option(p)
    p.add_argument("--protocol", type=int, default=None, help="the follower protocol the front end speaks")
    p.add_argument("--points", type=int, default=2000, help="points per curve of the history's first view")
    p.add_argument("--since", type=float, default=None, help="resume: raw samples newer than this wall time")
    p.add_argument("--control", action="store_true", help="commands only: no history, no events")
    p.add_argument("--list", action="store_true", help="list the runs of the runs folder and exit")
    p.set_defaults(func=follow)


def follow(args: argparse.Namespace) -> int:
    """``clusterdeck follow RUN``: 0 when the front end detached or the run ended, 2 when there is no such run."""
    from engine.control.remote_follower import Channel, Closed, Follower, hello_fields
    from engine.control.remote_protocol import PROTOCOL, message

    channel = Channel()
    hello = hello_fields()
    try:
        if args.protocol is not None and args.protocol != PROTOCOL:
            channel.send(message("hello", **hello), message(
                "error", f"this follower speaks protocol {PROTOCOL} (ClusterDeck {hello['version']}); the front end "
                         f"asked for {args.protocol}: install the same version on both machines"))
            return 2
        if args.list:
            return _follow_list(args, channel, hello)
        if not args.run:
            channel.send(message("hello", **hello), message("error", "expected a run folder or a run's name"))
            return 2
        try:
            folder = find_run(args.run, runs_root_of(args.out))
            if not folder.is_run_folder():
                raise RunNotFound(f"{args.run}: not a run folder: it has no config.yaml; expected a run folder")
            refused = _channel_problem(folder)
            if refused is not None:
                channel.send(message("hello", **hello), message("error", f"{args.run}: {refused}", refused=True))
                return 2
        except RunNotFound as exc:
            channel.send(message("hello", **hello), message("error", str(exc)))
            return 2
        except OSError as exc:
            channel.send(message("hello", **hello),
                         message("error", f"{args.run}: cannot read the run folder ({exc.strerror or exc})"))
            return 2
        channel.send(message("hello", **hello, run_dir=str(folder.path.resolve()), state=run_state(folder) or "starting"))
        return Follower(folder, channel, max_points=max(10, args.points), since=args.since,
                        control_only=args.control).run()
    except Closed:
        return 0


def _follow_list(args: argparse.Namespace, channel: Any, hello: dict[str, Any]) -> int:
    from dataclasses import asdict

    from engine.cli.runs_list import listed_runs
    from engine.control.remote_protocol import message

    root = runs_root_of(args.run or args.out)
    rows, why = listed_runs(root)
    channel.send(message("hello", **hello, rows=str(root)))
    if why is not None:
        channel.send(message("error", f"the runs folder {root} {why}; expected a folder of run folders"))
        return 2
    channel.send_all([message("row", r.run, row=asdict(r)) for r in rows])
    channel.send(message("end", f"{len(rows)} runs", state="listed"))
    return 0
