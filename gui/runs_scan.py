"""The runs under the runs folder, as the Runs panel lists them, kept up to date cheaply.

Each row is what ``clusterdeck ls`` says of a run (:func:`engine.cli.runs_list.run_row`: ``run.json`` and
``launcher.json``, no event is read) plus the kinds of host it runs on. A scan lists the folder and stats
each run's ``run.json`` and ``launcher.json``: a run whose files did not change keeps its row; only a live
run's row is made again each time (its duration grows, and its launcher may have died). No Qt here.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from engine.cli.runs_list import RunRow, is_run, run_row
from engine.contract.records import TERMINAL, RunPhase
from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, RunFolder
from engine.control.detach import launcher_alive

#: The states a run may be listed in, for the panel's filter ("live" ones read "running").
STATES = (RunPhase.RUNNING.value, *TERMINAL, INTERRUPTED)


@dataclass(frozen=True)
class RunEntry:
    """One run of the list: ``ls``'s row, the kinds of its hosts, its owner and where its launcher runs; ``remote``:
    how ssh reaches a run on another machine (``user@host:/path``; "" for a run here)."""

    row: RunRow
    hosts: str
    owner_uid: int
    launcher_host: str
    launcher_pid: int | None
    remote: str = ""

    @property
    def path(self) -> Path:
        return Path(self.row.path)

    @property
    def live(self) -> bool:
        return self.row.state in LIVE_STATES

    @property
    def key(self) -> str:
        """What names it across the app: its folder here, or ``user@host:/path`` there."""
        return self.remote or str(self.row.path)

    @property
    def mine(self) -> bool:
        """Another user's run here is not; a remote run's owner is checked there (its channel refuses others)."""
        return bool(self.remote) or self.owner_uid == os.getuid()

    @property
    def state_group(self) -> str:
        """The filter's word for its state: every live state is ``running``."""
        return "running" if self.live else self.row.state


def _stamp(path: Path) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (0, 0)
    return (info.st_mtime_ns, info.st_size)


def entry_of(path: Path) -> RunEntry:
    """The list's entry for the run folder at ``path`` (reads its ``run.json`` and ``launcher.json``)."""
    folder = RunFolder(path)
    row = run_row(folder)
    meta = folder.read_meta()
    try:
        owner = os.stat(path).st_uid
    except OSError:
        owner = -1
    launcher = meta.get("launcher") if isinstance(meta.get("launcher"), dict) else {}
    assert isinstance(launcher, dict)
    pid = launcher.get("pid")
    return RunEntry(row=row, hosts=row.hosts, owner_uid=owner,
                    launcher_host=str(launcher.get("host", "") or socket.gethostname()),
                    launcher_pid=pid if isinstance(pid, int) else None)


@dataclass(frozen=True)
class Scan:
    """What one look at the runs folder found: its runs (oldest first) and why it could not be read, if so."""

    entries: list[RunEntry]
    problem: str | None = None
    missing: bool = False  # the folder does not exist yet (no run has been made)


class RunsScanner:
    """Lists the runs under ``root``; :meth:`scan` again costs a directory listing and two stats per run."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._known: dict[str, tuple[tuple[int, int], tuple[int, int], RunEntry]] = {}
        self._not_runs: dict[str, int] = {}  # folders that are no run, by their modification time

    def scan(self) -> Scan:
        try:
            with os.scandir(self.root) as it:
                children = [e for e in it if not e.name.startswith(".") and _is_dir(e)]
        except FileNotFoundError:
            self._known.clear()
            return Scan([], missing=True)
        except NotADirectoryError:
            return Scan([], problem=f"{self.root} is a file, not a folder of runs")
        except OSError as exc:
            return Scan([], problem=f"{self.root} cannot be read ({exc.strerror or exc})")
        entries: list[RunEntry] = []
        seen: set[str] = set()
        for child in sorted(children, key=lambda e: e.name):
            path = Path(child.path)
            known = self._known.get(child.name)
            if known is None and not self._is_new_run(child):
                continue
            seen.add(child.name)
            meta_stamp, launcher_stamp = _stamp(path / "run.json"), _stamp(path / "launcher.json")
            if known is not None and known[0] == meta_stamp and known[1] == launcher_stamp and not known[2].live:
                entries.append(known[2])
                continue
            try:
                entry = entry_of(path) if known is None or known[:2] != (meta_stamp, launcher_stamp) \
                    else _aged(known[2])
            except OSError:
                continue  # it went away meanwhile
            self._known[child.name] = (meta_stamp, launcher_stamp, entry)
            entries.append(entry)
        for name in set(self._known) - seen:
            del self._known[name]
        return Scan(entries)

    def _is_new_run(self, child: os.DirEntry[str]) -> bool:
        try:
            mtime = child.stat().st_mtime_ns
        except OSError:
            return False
        if self._not_runs.get(child.name) == mtime:
            return False
        try:
            found = is_run(Path(child.path))
        except OSError:  # another user's private folder
            found = False
        if not found:
            self._not_runs[child.name] = mtime  # looked at again once something is written into it
        else:
            self._not_runs.pop(child.name, None)
        return found

    def forget(self, path: Path) -> None:
        """Read ``path``'s run again at the next scan (it was stopped or deleted from here)."""
        self._known.pop(Path(path).name, None)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _aged(entry: RunEntry) -> RunEntry:
    """A live run's entry with its duration brought up to now and its state checked (its launcher may have died),
    without reading its files again when they did not change."""
    if not entry.live:
        return entry
    if not launcher_alive(RunFolder(entry.path)):
        return entry_of(entry.path)  # read again: it now reads interrupted
    row = entry.row
    started = _started(row.started)
    duration = max(0.0, time.time() - started) if started is not None else row.duration_s
    return replace(entry, row=replace(row, duration_s=duration))


def _started(stamp: str) -> float | None:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError, OverflowError):
        return None
