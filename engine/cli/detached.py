"""``clusterdeck run --detach``: the run in a launcher of its own that outlives the terminal.

The command makes the run folder, then starts itself again as the run's launcher
(``python -m engine.cli run PRESET --detached-launcher --run-dir RUN --ready-fd FD``) in a new session
(no terminal: a closed terminal's SIGHUP never reaches it), its stdout and stderr to ``RUN/launcher.log``.
The launcher checks and starts the run, serves its control socket (:class:`~engine.control.detach.RunHost`)
and says on the ready pipe that the run has started, or why it could not; the command prints where the
run is and how to attach to it and stop it, and returns.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.cli.stopping import StopOnSignal
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.contract.run_folder import RunFolder, default_runs_root
from engine.contract.task_logs import log_tail

Report = Callable[[ConfigError], None]
#: The hidden options of the re-started command (the launcher's side).
LAUNCHER_OPTION = "--detached-launcher"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--detach`` and the launcher's hidden options on ``clusterdeck run``."""
    p.add_argument("--detach", action="store_true",
                   help="start the run in a launcher of its own and return: it keeps running after the terminal "
                        "closes (clusterdeck attach / stop / ls)")
    p.add_argument(LAUNCHER_OPTION, dest="detached_launcher", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", dest="run_dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", dest="ready_fd", type=int, default=None, help=argparse.SUPPRESS)


# --------------------------------------------------------------------------- the command's side


def spawn(args: argparse.Namespace, cfg: RunConfig, runs_root: Path, named: str, report: Report) -> int:
    """Start the detached launcher for ``cfg`` and wait until it says the run started (or why not)."""
    try:
        folder = RunFolder.create(runs_root, cfg.name)
        log = os.open(folder.launcher_log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except (OSError, RuntimeError) as exc:
        report(ConfigError([Problem(named, f"cannot write a run folder in {str(runs_root)!r}: "
                                           f"{getattr(exc, 'strerror', None) or exc}")]))
        return 2
    if args.json:  # where the run is, before its launcher has checked and started it
        print(json.dumps({"kind": "folder", "run_dir": str(folder.path)}), flush=True)
    ready_r, ready_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            proc = subprocess.Popen(_launcher_argv(args, folder.path, ready_w), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, pass_fds=(ready_w,), start_new_session=True)
        finally:
            os.close(ready_w)
            os.close(log)
        answer = _wait_ready(ready_r, proc)
    except KeyboardInterrupt:  # Ctrl-C while it starts (even before Popen returned): the run is not wanted
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        print("clusterdeck: interrupted (Ctrl-C); the detached run was stopped before it started", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        os.close(ready_r)
    assert proc is not None  # Popen raised nothing, or the function returned above
    if answer is None:
        code = proc.wait()
        tail = "\n".join(f"  {line}" for line in log_tail(folder.launcher_log, 12))
        print(f"clusterdeck: the detached launcher ended before the run started (exit {code}); "
              f"{folder.launcher_log}:\n{tail}", file=sys.stderr)
        return 1
    if not answer.get("ok"):
        proc.wait()
        problems = [Problem(str(p.get("field", "")), str(p.get("message", ""))) for p in answer.get("problems", [])]
        report(ConfigError(problems, str(answer.get("source") or cfg.name)))
        _remove_unstarted(folder)
        return 2
    _say_started(args, folder, int(answer.get("pid", proc.pid)), runs_root)
    return 0


def _launcher_argv(args: argparse.Namespace, run_dir: Path, ready_fd: int) -> list[str]:
    argv = [sys.executable, "-m", "engine.cli", "run", args.preset, LAUNCHER_OPTION, "--run-dir", str(run_dir),
            "--ready-fd", str(ready_fd)]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    if args.program is not None:
        argv += ["--program", os.path.abspath(os.path.expanduser(args.program))]
    program_args = getattr(args, "program_args", None)
    if program_args is not None:
        argv += ["--", *program_args]
    return argv


def _wait_ready(fd: int, proc: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    """The launcher's one ready line, or None when it ended without one."""
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            if not sel.select(0.5):
                if proc.poll() is not None and not sel.select(0):
                    return None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            data += chunk
    try:
        answer = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _remove_unstarted(folder: RunFolder) -> None:
    """A run refused before it started leaves no folder behind (only the launcher's log was in it)."""
    try:
        if {p.name for p in folder.path.iterdir()} <= {folder.launcher_log.name}:
            shutil.rmtree(folder.path)
    except OSError:
        pass


def _say_started(args: argparse.Namespace, folder: RunFolder, pid: int, runs_root: Path) -> None:
    if args.json:
        print(json.dumps({"kind": "detached", "run_dir": str(folder.path), "pid": pid}), flush=True)
        return
    try:
        by_name = runs_root.resolve() == default_runs_root().resolve()
    except OSError:
        by_name = False
    ref = folder.path.name if by_name else str(folder.path)
    print(f"started {folder.path.name} detached: its launcher (pid {pid}) keeps it running after this terminal "
          f"closes\nrun folder: {folder.path}\n"
          f"  watch it:  clusterdeck attach {ref}\n"
          f"  stop it:   clusterdeck stop {ref}\n"
          f"  all runs:  clusterdeck ls" + ("" if by_name else f" --out {runs_root}"), flush=True)


# --------------------------------------------------------------------------- the launcher's side


class _Ready:
    """The ready pipe: one JSON line to the command that started this launcher (which may be gone)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def say(self, **message: Any) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, json.dumps(message).encode("utf-8") + b"\n")
        except OSError:
            pass  # the command ended meanwhile (its terminal closed): the run goes on
        finally:
            os.close(self.fd)
            self.fd = None

    def refused(self, exc: ConfigError) -> None:
        self.say(ok=False, source=exc.source,
                 problems=[{"field": p.field, "message": p.message} for p in exc.problems])


def launch(args: argparse.Namespace, cfg: RunConfig) -> int:
    """The detached launcher: check, start and host the run until it ends; SIGTERM and SIGINT stop it,
    SIGHUP means nothing here."""
    ready = _Ready(args.ready_fd)
    if args.run_dir is None:
        ready.refused(ConfigError([Problem(LAUNCHER_OPTION, "expected --run-dir RUN with it")]))
        return 2
    try:
        with StopOnSignal(ignore=(signal.SIGHUP,)) as stopper:
            return _host(cfg, Path(args.run_dir), ready, stopper)
    finally:
        ready.say(ok=False, problems=[{"field": "", "message": "the launcher ended before the run started"}])


def _host(cfg: RunConfig, run_dir: Path, ready: _Ready, stopper: StopOnSignal) -> int:
    from engine.control.detach import RunHost
    from engine.control.launcher import Run, launch_problems
    from engine.control.memory import tune_allocator

    tune_allocator()
    problems = launch_problems(cfg, deep=True)
    if problems:
        ready.refused(ConfigError(problems, cfg.name))
        return 2
    run = Run(cfg, run_dir=run_dir, checked=True)
    try:
        stopper.start(run)
    except ConfigError as exc:
        ready.refused(exc)
        return 2
    try:
        host = RunHost(run, detached=True).start()
    except OSError as exc:
        run.stop(reason=f"no control channel: {exc.strerror or exc}")
        ready.refused(ConfigError([Problem("run folder", f"cannot serve the run's control socket: "
                                                         f"{exc.strerror or exc}")], cfg.name))
        return 1
    ready.say(ok=True, run_dir=str(run.run_dir), pid=os.getpid())
    print(f"clusterdeck: launcher {os.getpid()} hosts {run.run_dir}", flush=True)
    with host:
        while not run.done:
            run.wait(0.5)
    print(f"clusterdeck: the run ended: {run.state.state}", flush=True)
    return stopper.exit_code(run)
