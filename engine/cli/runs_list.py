"""``clusterdeck ls`` and how a command finds the run a user names (a folder, or a name under the runs folder).

A run's state is what its folder says, corrected where its launcher is gone: a run still marked running
whose launcher no longer lives reads *interrupted* (:meth:`RunFolder.effective_state`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.cli.folders import expand_folder
from engine.contract.run_folder import CONFIG_YAML, LIVE_STATES, RUN_JSON, RUNS_ENV, RunFolder, default_runs_root
from engine.control.launcher_info import RunRow

__all__ = ["RunNotFound", "RunRow", "find_run", "listed_runs", "ls", "run_row", "runs_root_of"]

_STAMP = "%Y-%m-%dT%H:%M:%S"


class RunNotFound(Exception):
    """The run a user named is not there, or not a run; the message says what was expected."""


def add_runs_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"the runs folder (as for run --out; default: ${RUNS_ENV}, else {default_runs_root()})")


def runs_root_of(out: str | None) -> Path:
    return expand_folder(out) if out else default_runs_root()


def _readable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be opened as a folder of runs (None: it can)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "no such folder"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not os.path.isdir(path):
        return "is a file, not a folder"
    if not os.access(path, os.R_OK | os.X_OK):
        owner = f"; it belongs to uid {info.st_uid}, you are uid {os.getuid()}" if info.st_uid != os.getuid() else ""
        return f"permission denied{owner}"
    return None


def is_run(path: Path) -> bool:
    return (path / CONFIG_YAML).is_file() or (path / RUN_JSON).is_file()


def find_run(word: str, root: Path) -> RunFolder:
    """The run ``word`` names: a run folder's path, else a run under ``root`` by its folder name (or the one
    folder name holding ``word``). Raises :class:`RunNotFound` saying what was expected."""
    expected = f"expected a run folder or the name of a run under {root} (clusterdeck ls lists them)"
    path = expand_folder(word)
    if "/" in word or word.startswith((".", "~")) or path.is_dir():
        why = _readable_dir(path)
        if why is not None:
            raise RunNotFound(f"{word}: {why}; {expected}")
        if not is_run(path):
            raise RunNotFound(f"{word}: not a run folder (it has no {CONFIG_YAML} or {RUN_JSON}); {expected}")
        return RunFolder(path)
    why = _readable_dir(root)
    if why is not None:
        raise RunNotFound(f"{word}: the runs folder {root}: {why}; {expected}")
    exact = root / word
    if exact.is_dir() and is_run(exact):
        return RunFolder(exact)
    matches = [p for p in run_dirs(root) if word in p.name]
    if len(matches) > 1:  # the one still running among finished namesakes is the one meant
        from engine.control.detach import run_state

        live = [p for p in matches if run_state(RunFolder(p)) in LIVE_STATES]
        matches = live if len(live) == 1 else matches
    if len(matches) == 1:
        return RunFolder(matches[0])
    if not matches:
        raise RunNotFound(f"no run named {word!r} under {root} (clusterdeck ls lists them); expected a run folder "
                          "or a run's name")
    names = ", ".join(p.name for p in matches[-5:])
    raise RunNotFound(f"{word!r} names {len(matches)} runs under {root} (the newest: {names}); expected the whole "
                      "name of one")


def run_dirs(root: Path) -> list[Path]:
    """The run folders directly under ``root``, by name (oldest first); another user's unreadable ones left out."""
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    out = []
    for p in children:
        try:
            if is_run(p):
                out.append(p)
        except OSError:  # another user's folder among ours
            continue
    return out


def _parse(stamp: Any) -> float | None:
    try:
        return time.mktime(time.strptime(str(stamp), _STAMP))
    except (TypeError, ValueError, OverflowError):
        return None


def host_kinds(meta: dict[str, Any]) -> str:
    """``local``, ``ssh``, ``slurm`` (joined with ``+``) from ``run.json``'s supervisors; ``""`` before any."""
    kinds: list[str] = []
    supervisors = meta.get("supervisors")
    for sup in supervisors.values() if isinstance(supervisors, dict) else ():
        kind = str(sup.get("transport", "")) if isinstance(sup, dict) else ""
        kind = "local" if kind in ("netns", "") else kind
        if kind not in kinds:
            kinds.append(kind)
    return " + ".join(kinds)


def config_facts(folder: RunFolder) -> tuple[str, str]:
    """The mode and the host kinds its ``config.yaml`` names (a folder whose config cannot be read: ``-``)."""
    try:
        config = folder.read_config(check=False)
    except Exception:  # noqa: BLE001 - a folder whose config cannot be read still lists
        return "-", "-"
    kinds: list[str] = []
    for host in config.cluster.hosts:
        kind = "slurm" if host.kind == "slurm" else "local" if host.is_local else "ssh"
        if kind not in kinds:
            kinds.append(kind)
    return config.parallelism.mode, " + ".join(kinds) or "-"


def run_row(folder: RunFolder) -> RunRow:
    """What ``ls`` says of one run folder, from its ``run.json`` and ``launcher.json`` (no event is read)."""
    from engine.control.detach import read_launcher, run_state

    meta = folder.read_meta()
    launcher = read_launcher(folder)
    state = run_state(folder, meta) or "unknown"
    raw_summary = meta.get("summary")
    summary: dict[str, Any] = raw_summary if isinstance(raw_summary, dict) else {}
    step = meta.get("step", summary.get("steps", 0))
    total = summary.get("total_steps")
    started = _parse(meta.get("created"))
    if state in LIVE_STATES:
        end: float | None = time.time()
    else:
        end = _parse(meta.get("ended")) or _parse(meta.get("updated"))
    duration = end - started if started is not None and end is not None else None
    mode, hosts = str(meta.get("mode", "") or ""), host_kinds(meta)
    if not mode or not hosts:  # not recorded (yet): what its config says
        named_mode, named_hosts = config_facts(folder)
        mode, hosts = mode or named_mode, hosts or named_hosts
    return RunRow(run=folder.path.name, path=str(folder.path), name=str(meta.get("name", "") or folder.path.name),
                  mode=mode, state=state, hosts=hosts, step=int(step) if isinstance(step, int) else 0,
                  total_steps=total if isinstance(total, int) else None, started=str(meta.get("created", "") or "-"),
                  duration_s=max(0.0, duration) if duration is not None else None,
                  detached=launcher is not None and launcher.detached)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def listed_runs(root: Path) -> tuple[list[RunRow], str | None]:
    """The runs under ``root``, oldest first, and why the folder cannot be read (None: it can; a folder that does
    not exist holds no runs)."""
    why = _readable_dir(root)
    if why == "no such folder":
        return [], None
    if why is not None:
        return [], why
    return [run_row(RunFolder(p)) for p in run_dirs(root)], None


def ls(args: argparse.Namespace) -> int:
    """``clusterdeck ls``: the runs under the runs folder, oldest first (``ls user@host[:DIR]``: there, over ssh)."""
    where = getattr(args, "where", None)
    if where and not os.path.isdir(os.path.expanduser(where)):
        return _ls_remote(args, where)
    root = runs_root_of(where or args.out)  # a folder here: as --out
    why = _readable_dir(root)
    if why is not None:
        if why == "no such folder":
            print(f"no runs yet ({root} does not exist)")
            return 0
        print(f"clusterdeck: the runs folder {root} {why}; expected a folder of run folders", flush=True)
        return 2
    rows = [run_row(RunFolder(p)) for p in run_dirs(root)]
    return _print_rows(rows, args.json, str(root))


def _ls_remote(args: argparse.Namespace, where: str) -> int:
    import sys

    from engine.control.remote import RemoteError, remote_list

    if args.out:
        if ":" in where.split("/", 1)[0].rsplit("@", 1)[-1] or where.startswith("ssh://"):
            print(f"clusterdeck: {where}: names its folder already; expected --out or HOST:DIR, not both",
                  file=sys.stderr)
            return 2
        where = f"{where}:{args.out}"  # --out DIR names the folder there
    try:
        rows = remote_list(where, remote_command=getattr(args, "remote_command", None))
    except RemoteError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    return _print_rows(rows, args.json, where)


def _print_rows(rows: list[Any], as_json: bool, root: str) -> int:
    if as_json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    if not rows:
        print(f"no runs in {root}")
        return 0
    table = [("RUN", "MODE", "STATE", "STEP", "STARTED", "DURATION", "WHERE")]
    for r in rows:
        step = f"{r.step} of {r.total_steps}" if r.total_steps else str(r.step)
        state = f"{r.state} (detached)" if r.detached and r.state in LIVE_STATES else r.state
        table.append((r.run, r.mode, state, step, r.started.replace("T", " "), _duration(r.duration_s),
                      getattr(r, "hosts", "") or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0
