"""The run folder: the one owner of every path of a run, and of writing ``run.json`` and ``config.yaml``.

Layout (README, "A run folder holds")::

    RUN/config.yaml                      the resolved config the tasks ran (ports filled in)
    RUN/run.json                         state, pids, step and summary; kept current while the run runs
    RUN/events.jsonl                     every event, as the launcher received it
    RUN/tasks/<role>-<index>/events.jsonl   what that task emitted, written by the task itself
    RUN/tasks/<role>-<index>/log.txt     its stdout and stderr
    RUN/tensorboard/<role>-<index>/      TensorBoard summaries of that task's replicas
    RUN/hosts/<host>/supervisor.log      a supervisor's own messages
    RUN/checkpoints/                     the run's checkpoints
    RUN/scratch/<role>-<index>/          throw-away files of a task (never outside the run folder)

Every writer (launcher, supervisor, task runtime, Keras callback, export, app, test fixtures) goes
through :class:`RunFolder`; ``run.json`` and ``config.yaml`` are replaced atomically, so a reader
never sees half a file. :func:`bounded_lines` is the one reader that splits a byte stream into
lines of bounded length (event pipes, ``ssh`` and ``srun`` streams, event files, logs).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from engine.contract import config as config_mod
from engine.contract.config import RunConfig

#: The longest line any reader accepts (an event, a command); longer ones are cut.
MAX_LINE_BYTES = 64 * 1024
#: What a line cut for being over :data:`MAX_LINE_BYTES` reads as (decoders reject it).
OVERLONG = b"\x00over-long line"
RUN_JSON = "run.json"
CONFIG_YAML = "config.yaml"
RUNS_ENV = "CLUSTERDECK_RUNS"


def task_folder_name(task: str) -> str:
    """``worker:1`` -> ``worker-1``: the folder name of a task (also of its TensorBoard run)."""
    return task.replace(":", "-")


def host_folder_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", host) or "host"


def default_runs_root() -> Path:
    """Where new run folders go: ``$CLUSTERDECK_RUNS``, else ``./runs``."""
    return Path(os.environ.get(RUNS_ENV, "runs"))


def bounded_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Lines of a binary stream, each at most ``limit`` bytes: the rest of a longer line is skipped and
    the line reads as :data:`OVERLONG`. Ends at end of stream. Safe for pipes (never reads ahead)."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while True:
                rest = stream.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
            yield OVERLONG
            continue
        yield line


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a temporary file in the same folder, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass


class RunFolder:
    """The folder of one run. Creating the object touches nothing; :meth:`create` makes a new one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._meta_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def create(cls, root: str | os.PathLike[str] | None, name: str) -> RunFolder:
        """A new, empty run folder ``<root>/<YYYYmmdd-HHMMSS>-<name>[-n]`` (never an existing one)."""
        base = Path(root) if root is not None else default_runs_root()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:60] or "run"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            candidate = base / (f"{stamp}-{slug}" + (f"-{n}" if n else ""))
            try:
                candidate.mkdir(exist_ok=False)
                return cls(candidate)
            except FileExistsError:
                continue
        raise RuntimeError(f"cannot create a run folder under {base}")

    # -- paths

    @property
    def config_yaml(self) -> Path:
        return self.path / CONFIG_YAML

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def task_dir(self, task: str) -> Path:
        return self.path / "tasks" / task_folder_name(task)

    def task_events(self, task: str) -> Path:
        return self.task_dir(task) / "events.jsonl"

    def task_log(self, task: str) -> Path:
        return self.task_dir(task) / "log.txt"

    def tensorboard(self, task: str) -> Path:
        return self.path / "tensorboard" / task_folder_name(task)

    def scratch(self, task: str) -> Path:
        """A task's throw-away folder (checkpoints of non-primary workers, temporary files)."""
        return self.path / "scratch" / task_folder_name(task)

    def host_dir(self, host: str) -> Path:
        return self.path / "hosts" / host_folder_name(host)

    def supervisor_log(self, host: str) -> Path:
        return self.host_dir(host) / "supervisor.log"

    def is_run_folder(self) -> bool:
        return self.config_yaml.is_file()

    # -- config.yaml

    def write_config(self, config: RunConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_yaml, config_mod.dumps(config))

    def write_config_text(self, text: str) -> None:
        """A config as YAML text (a remote supervisor writes the one its launcher sent)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_yaml, text)

    def read_config(self, *, check: bool = False) -> RunConfig:
        return config_mod.load(self.config_yaml, check=check)

    # -- run.json

    def read_meta(self) -> dict[str, Any]:
        """``run.json`` as a dict; ``{}`` when it is missing or unreadable."""
        try:
            meta = json.loads(self.run_json.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def write_meta(self, **fields: Any) -> dict[str, Any]:
        """Update ``run.json`` with ``fields`` (atomic). ``created`` is set once and kept; ``updated`` is now."""
        with self._meta_lock:
            meta = self.read_meta()
            meta.update(fields)
            meta.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
            meta["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.run_json, json.dumps(meta, indent=2, default=str))
            return meta
