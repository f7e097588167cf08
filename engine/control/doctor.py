"""The hang doctor: every task's Python stacks, asked for on a hang or on demand, and read back as "who waits where".

A task appends the stacks of all its threads to ``tasks/<task>/stacks.txt`` when it gets ``SIGUSR1``
(:mod:`engine.runtime.diagnostics`, faulthandler: it answers while its main thread is blocked inside
TensorFlow). Whoever asks first appends a marker line (``# dump requested …``), so the newest dump is
what follows the last marker; the task's own header line names its main thread.

Two ways in: the launcher, when the lifecycle decides a run is hung (:func:`dump_for_hang`, through the
supervisors' ``signal`` command: it works on every host whose run folder is shared), and
:func:`dump_stacks` for a run folder (``clusterdeck stacks RUN``), which signals the task pids of this
machine that ``run.json`` names, after checking each is a task of that run.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine.contract.run_folder import RunFolder
from engine.control.supervisor import RUN_DIR_ENV

#: The task's dump file (``engine.runtime.diagnostics.STACKS_FILE``: control and runtime share only the contract).
STACKS_FILE = "stacks.txt"
#: The signal a task dumps its stacks on, by name (the supervisor's ``signal`` command takes names).
DUMP_SIGNAL = "SIGUSR1"
#: Seconds the launcher waits for the dumps of a hung run before it ends it.
HANG_WAIT_S = 1.0
MARKER = "# dump requested"
_HEADER = re.compile(r"^# clusterdeck stacks of (\S+): pid (\d+), main thread (0x[0-9a-f]+)")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)')
#: Path parts of frames that are not the user's nor ClusterDeck's (the innermost "own" frame skips them).
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def short(self) -> str:
        return f"{self.function} ({Path(self.file).name}:{self.line})"


@dataclass
class Dump:
    """One task's newest dump: its threads' frames, innermost first, and which thread is the main one."""

    task: str
    path: Path
    text: str = ""
    threads: dict[str, list[Frame]] = field(default_factory=dict)
    main_thread: str | None = None

    @property
    def main_frames(self) -> list[Frame]:
        if self.main_thread is not None and self.main_thread in self.threads:
            return self.threads[self.main_thread]
        return next(iter(self.threads.values()), [])

    def own_frame(self) -> Frame | None:
        """The main thread's innermost frame of the user's or ClusterDeck's code (not a library's): where to
        look first."""
        return next((f for f in self.main_frames if not any(part in f.file for part in _LIBRARY)), None)

    def where(self) -> str:
        """"waiting in TensorFlow: quick_execute (execute.py:53), from train_step (data_parallel.py:123)"."""
        frames = self.main_frames
        if not frames:
            return "no stacks were dumped" if not self.text else "no main thread found in its dump"
        inner = frames[0]
        own = self.own_frame()
        if "tensorflow" in inner.file:
            what = "waiting in TensorFlow (an op or a tf.function; a collective waits here for its peers)"
        else:
            what = "in Python"
        text = f"{what}: {inner.short()}"
        if own is not None and own is not inner:
            text += f", from {own.short()}"
        return text


def stacks_file(folder: RunFolder, task: str) -> Path:
    return folder.task_dir(task) / STACKS_FILE


def mark_request(folder: RunFolder, task: str, why: str) -> bool:
    """Append the marker a new dump will follow; False where the task never armed its file."""
    path = stacks_file(folder, task)
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"\n{MARKER} at {time.strftime('%Y-%m-%dT%H:%M:%S')} ({why})\n")
        return True
    except OSError:
        return False


def parse(task: str, path: Path, text: str) -> Dump:
    """The newest dump in ``text`` (after the last marker), with the main thread the task's header names."""
    dump = Dump(task, path)
    header_main = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            header_main = int(m.group(3), 16)
    start = text.rfind(MARKER)
    body = text[text.index("\n", start) + 1:] if start >= 0 and "\n" in text[start:] else ""
    dump.text = body.strip()
    current: list[Frame] | None = None
    for line in body.splitlines():
        m = _THREAD.match(line)
        if m:
            current = dump.threads.setdefault(m.group(2), [])
            if header_main is not None and int(m.group(2), 16) == header_main:
                dump.main_thread = m.group(2)
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            current.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    return dump


def read_dump(folder: RunFolder, task: str) -> Dump:
    path = stacks_file(folder, task)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse(task, path, text)


def wait_for_dumps(folder: RunFolder, tasks: Iterable[str], timeout: float) -> dict[str, Dump]:
    """Each task's newest dump, waiting up to ``timeout`` s for every one to have frames."""
    tasks = list(tasks)
    deadline = time.monotonic() + timeout
    before: dict[str, str] = {}
    while True:
        dumps = {t: read_dump(folder, t) for t in tasks}
        # a dump is written thread by thread: whole once its main thread is in, or once it stopped growing
        if all(d.threads and (d.main_thread is not None or d.text == before.get(t)) for t, d in dumps.items()) \
                or time.monotonic() >= deadline:
            return dumps
        before = {t: d.text for t, d in dumps.items()}
        time.sleep(0.1)


def dump_for_hang(folder: RunFolder, send: Callable[..., bool], tasks: Iterable[str], culprit: str,
                  wait_s: float = HANG_WAIT_S) -> list[tuple[str, dict[str, str]]]:
    """Ask ``tasks`` (live ones) for their stacks through their supervisors (``send(task, "signal", signal=…)``),
    wait ``wait_s`` and say where each waits: ``(message, info fields)`` per task, the first saying where the
    files are."""
    asked = [t for t in tasks if mark_request(folder, t, f"hang of {culprit}")
             and send(t, "signal", signal=DUMP_SIGNAL)]
    if not asked:
        return []
    time.sleep(wait_s)
    dumps = wait_for_dumps(folder, asked, 0.0)
    out = [(f"hang of {culprit}: every task's Python stacks are in tasks/<task>/stacks.txt "
            f"({', '.join(str(stacks_file(folder, t).relative_to(folder.path)) for t in asked)})",
            {"stacks": "tasks"})]
    for task, dump in dumps.items():
        out.append((f"{task}: {dump.where()}", {"stacks_of": task,
                                                 "stacks_file": str(dump.path.relative_to(folder.path))}))
    return out


def run_task_pids(folder: RunFolder) -> dict[str, int]:
    """The task pids ``run.json`` names for tasks not ended."""
    meta = folder.read_meta()
    tasks = meta.get("tasks") if isinstance(meta, dict) else None
    out: dict[str, int] = {}
    for name, info in (tasks or {}).items():
        if isinstance(info, dict) and isinstance(info.get("pid"), int) and info.get("state") not in (
                "finished", "failed", "stopped"):
            out[str(name)] = int(info["pid"])
    return out


def is_task_of(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is, on this machine, a task process of the run in ``run_dir`` (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return (proc.environ().get(RUN_DIR_ENV) == str(run_dir.resolve())
                and "engine.runtime.task" in " ".join(proc.cmdline()))
    except psutil.Error:
        return False


def dump_stacks(run_dir: str | Path, timeout: float = 3.0) -> dict[str, Dump | str]:
    """Signal the run's live tasks on this machine for their stacks and return each one's newest dump, or why
    there is none (not on this machine, never armed)."""
    folder = RunFolder(Path(run_dir))
    results: dict[str, Dump | str] = {}
    asked = []
    for task, pid in run_task_pids(folder).items():
        if not is_task_of(pid, folder.path):
            results[task] = f"pid {pid} is not a task of this run on this machine (another host, or it ended)"
        elif not mark_request(folder, task, "asked"):
            results[task] = f"{stacks_file(folder, task)} is missing: the task did not arm its stack dumps"
        else:
            try:
                os.kill(pid, getattr(signal, DUMP_SIGNAL))
                asked.append(task)
            except OSError as exc:
                results[task] = f"cannot signal pid {pid}: {exc.strerror or exc}"
    results.update(wait_for_dumps(folder, asked, timeout))
    return results
