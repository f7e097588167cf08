"""Profiles of every task of a live run at once, asked for and read back without TensorFlow.

A front end writes ``RUN/profile/request.json`` (``{"id", "ms", "t"}``, :func:`request_profile`); every task
looks for it (``engine.runtime.diagnostics``), captures ``ms`` milliseconds of TensorFlow profile while it
trains on, writes the trace in TensorBoard's profile layout (``RUN/tensorboard/plugins/profile/<id>/<task>
.xplane.pb``: one "host" per task), its summary (``RUN/profile/<id>/<task>.summary.json``: top ops and op
types by self time, the ops' time by category) and last ``RUN/profile/<id>/<task>.done``.
:func:`wait_for_profiles` waits for the done files, :func:`read_capture` reads a capture back as plain
dataclasses (the app shows them in a table, ``clusterdeck profile`` prints them), :func:`capture` does all
three. Control and runtime share only the run folder: the file names are repeated here, and a test checks
they agree.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.contract.run_folder import RunFolder, task_folder_name, write_atomic
from engine.control import doctor

#: Bounds of a capture, milliseconds (``engine.runtime.diagnostics.MIN_MS`` / ``MAX_MS``).
MIN_MS, MAX_MS = 10, 60_000
#: Seconds a capture may take beyond its length (a task notices a request at its next report, or within 0.5 s
#: where it only serves; writing and summarising the trace takes a few seconds on a busy machine).
PROFILE_SLACK_S = 30.0
#: Under ``RUN/``: the request file and one folder per capture.
PROFILE_DIR = "profile"
REQUEST_FILE = "request.json"
DONE_SUFFIX = ".done"
SUMMARY_SUFFIX = ".summary.json"  # ``engine.runtime.diagnostics.SUMMARY_SUFFIX``
#: The categories of a summary's ``breakdown`` (shares of the ops' self time), in the order views show them.
CATEGORIES = ("compute", "collective", "input")
#: What views call them: an input pipeline's ops run on threads of their own, beside the step.
CATEGORY_LABELS = {"compute": "compute", "collective": "collectives", "input": "input pipeline"}


class ProfileError(Exception):
    """A capture cannot be asked for (not a run folder, no live task, a length out of bounds)."""


@dataclass(frozen=True)
class OpTime:
    """One op (or op type, ``op`` empty) of a task's capture, by self time."""

    type: str
    op: str
    category: str  # compute, collective, input
    self_us: float
    count: int
    share: float  # of the task's ops' self time (idle left out), 0 to 1

    @staticmethod
    def of(entry: Any) -> OpTime | None:
        if not isinstance(entry, dict):
            return None
        try:
            return OpTime(str(entry.get("type") or "?"), str(entry.get("op") or ""),
                          str(entry.get("category") or "compute"), float(entry.get("self_us") or 0.0),
                          int(entry.get("count") or 0), float(entry.get("share") or 0.0))
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class TaskProfile:
    """What one task's capture left: its trace, or why there is none, and its summary where it has one."""

    task: str
    xplane: Path | None = None  # the trace (absolute)
    error: str = ""  # the capture failed (or never came: ``missing``)
    missing: bool = False  # no done file within the wait
    top_ops: tuple[OpTime, ...] = ()
    top_types: tuple[OpTime, ...] = ()
    breakdown: dict[str, float] = field(default_factory=dict)  # CATEGORIES' shares of the ops' self time
    busy_us: float | None = None  # the ops' self time, summed over threads
    summary_error: str = ""

    @property
    def ok(self) -> bool:
        return self.xplane is not None and not self.error


@dataclass(frozen=True)
class ProfileCapture:
    """A capture of a run's tasks: each task's result, by task."""

    run_dir: Path
    rid: str
    ms: int
    tasks: dict[str, TaskProfile]

    @property
    def trace_dir(self) -> Path:
        """The capture's folder in TensorBoard's layout (one ``<task>.xplane.pb`` per task)."""
        return RunFolder(self.run_dir).tensorboard / "plugins" / "profile" / self.rid

    @property
    def logdir(self) -> Path:
        """What ``tensorboard --logdir`` takes to show it (its Profile tab, run ``rid``)."""
        return RunFolder(self.run_dir).tensorboard

    def written(self) -> list[TaskProfile]:
        return [t for t in self.tasks.values() if t.ok]


def capture_dir(folder: RunFolder, rid: str) -> Path:
    return folder.path / PROFILE_DIR / rid


def done_file(folder: RunFolder, rid: str, task: str) -> Path:
    return capture_dir(folder, rid) / f"{task_folder_name(task)}{DONE_SUFFIX}"


def summary_file(folder: RunFolder, rid: str, task: str) -> Path:
    return capture_dir(folder, rid) / f"{task_folder_name(task)}{SUMMARY_SUFFIX}"


def new_request_id() -> str:
    """A capture's id: its time to the millisecond (TensorBoard lists captures by this name)."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def request_profile(folder: RunFolder, ms: int) -> str:
    """Write ``RUN/profile/request.json``; the request's id (tasks write under ``profile/<id>/``)."""
    rid = new_request_id()
    folder.private_dir(folder.path / PROFILE_DIR)
    write_atomic(folder.path / PROFILE_DIR / REQUEST_FILE, json.dumps({"id": rid, "ms": ms, "t": time.time()}))
    return rid


def wait_for_profiles(folder: RunFolder, rid: str, tasks: Iterable[str], timeout: float,
                      cancelled: Callable[[], bool] | None = None) -> dict[str, dict[str, Any]]:
    """Each task's done file (JSON) under ``profile/<id>/``, waiting up to ``timeout`` s for all of them (or
    until ``cancelled()``)."""
    tasks = list(tasks)
    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    while True:
        for task in tasks:
            path = done_file(folder, rid, task)
            if task not in done and path.is_file():
                try:
                    got = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                done[task] = got if isinstance(got, dict) else {"error": "a malformed done file"}
        if len(done) == len(tasks) or time.monotonic() >= deadline or (cancelled is not None and cancelled()):
            return done
        time.sleep(0.2)


def _ops(entries: Any) -> tuple[OpTime, ...]:
    if not isinstance(entries, list):
        return ()
    return tuple(op for op in (OpTime.of(e) for e in entries) if op is not None)


def task_profile(folder: RunFolder, rid: str, task: str, done: dict[str, Any] | None) -> TaskProfile:
    """One task's result from its done file (None: it never came) and its summary file."""
    if done is None:
        return TaskProfile(task, missing=True, error="no profile came back (its TensorFlow not started yet, or "
                                                     "it is blocked: dump its stacks)")
    if done.get("error"):
        return TaskProfile(task, error=str(done["error"]))
    xplane = done.get("xplane")
    path = folder.path / xplane if isinstance(xplane, str) else None
    summary: dict[str, Any] = {}
    try:
        got = json.loads(summary_file(folder, rid, task).read_text(encoding="utf-8"))
        summary = got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        summary = {"top_ops": done.get("top_ops")}  # a task that wrote no summary file: its done file's ops
    breakdown = summary.get("breakdown")
    busy = summary.get("busy_us")
    return TaskProfile(task, xplane=path, top_ops=_ops(summary.get("top_ops")),
                       top_types=_ops(summary.get("top_types")),
                       breakdown={k: float(v) for k, v in breakdown.items()
                                  if k in CATEGORIES and isinstance(v, (int, float))}
                       if isinstance(breakdown, dict) else {},
                       busy_us=float(busy) if isinstance(busy, (int, float)) else None,
                       summary_error=str(done.get("top_ops_error") or ""))


def read_capture(run_dir: str | Path, rid: str, tasks: Iterable[str] | None = None, ms: int = 0) -> ProfileCapture:
    """A capture read back from the run folder: ``tasks`` (by default every task with a done file)."""
    folder = RunFolder(Path(run_dir))
    where = capture_dir(folder, rid)
    if tasks is None:
        tasks = sorted(_task_of(p.name[:-len(DONE_SUFFIX)], folder) for p in where.glob(f"*{DONE_SUFFIX}"))
    results: dict[str, TaskProfile] = {}
    for task in tasks:
        try:
            done = json.loads(done_file(folder, rid, task).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            done = None
        results[task] = task_profile(folder, rid, task, done if isinstance(done, dict) or done is None
                                     else {"error": "a malformed done file"})
        if not ms and isinstance(done, dict) and isinstance(done.get("ms"), int):
            ms = done["ms"]
    return ProfileCapture(folder.path, rid, ms, results)


def _task_of(name: str, folder: RunFolder) -> str:
    """The task a file name of ``task_folder_name`` stands for (the run's tasks are asked first)."""
    meta = folder.read_meta()
    for task in (meta.get("tasks") or {}) if isinstance(meta, dict) else ():
        if task_folder_name(str(task)) == name:
            return str(task)
    role, _, index = name.rpartition("-")
    return f"{role}:{index}" if role and index.isdigit() else name


def captures(run_dir: str | Path) -> list[str]:
    """The ids of a run folder's captures, oldest first."""
    where = Path(run_dir) / PROFILE_DIR
    return sorted(p.name for p in where.iterdir() if p.is_dir()) if where.is_dir() else []


def live_tasks(run_dir: str | Path) -> list[str]:
    """The tasks a capture asks: those ``run.json`` names not ended."""
    return sorted(doctor.run_task_pids(RunFolder(Path(run_dir))))


def capture(run_dir: str | Path, ms: int, timeout: float = PROFILE_SLACK_S,
            cancelled: Callable[[], bool] | None = None,
            on_requested: Callable[[str, list[str]], None] | None = None) -> ProfileCapture:
    """Profile every live task of the run for ``ms`` milliseconds and read the capture back (blocks for
    ``ms`` plus up to ``timeout`` seconds: call it off a GUI thread). Raises :class:`ProfileError` where no
    capture can be asked for. ``on_requested(id, tasks)`` is told once the request is written."""
    folder = RunFolder(Path(run_dir))
    if not (folder.path / "run.json").is_file():
        raise ProfileError(f"{folder.path} is not a run folder: expected a folder holding run.json")
    if isinstance(ms, bool) or not isinstance(ms, int) or not MIN_MS <= ms <= MAX_MS:
        raise ProfileError(f"ms: expected {MIN_MS} to {MAX_MS} milliseconds, received: ms={ms!r}")
    tasks = live_tasks(folder.path)
    if not tasks:
        raise ProfileError(f"no live task in {folder.path} (run.json names none running): nothing to profile")
    rid = request_profile(folder, ms)
    if on_requested is not None:
        on_requested(rid, tasks)
    done = wait_for_profiles(folder, rid, tasks, ms / 1000 + timeout, cancelled)
    return ProfileCapture(folder.path, rid, ms, {t: task_profile(folder, rid, t, done.get(t)) for t in tasks})
