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
    RUN/launcher.json                    who serves the run: pid, start token, control socket, detached or not
    RUN/launcher.log                     a detached launcher's own stdout and stderr
    RUN/control.sock                     the run's control channel (owner-only Unix socket) while it runs

Every writer (launcher, supervisor, task runtime, Keras callback, export, app, test fixtures) goes
through :class:`RunFolder`; ``run.json`` and ``config.yaml`` are replaced atomically, so a reader
never sees half a file. :func:`bounded_lines` (blocking streams) and :class:`LineSplitter` (chunks
read from non-blocking pipes) are the one way to split bytes into lines of bounded length (event
pipes, supervisor commands, ``ssh`` and ``srun`` streams, event files, logs).

``run.json`` records who runs the run (``launcher``: pid, host and a start token): a reader on the
same machine can tell a running run from one whose launcher died (:meth:`RunFolder.effective_state`
reads such a run as ``interrupted``, never ``running``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from engine.contract.records import RunPhase

if TYPE_CHECKING:  # the config model (and yaml) is imported only where a config is written or read
    from engine.contract.config import RunConfig

#: The longest line any reader accepts (an event, a command); longer ones are cut.
MAX_LINE_BYTES = 64 * 1024
#: What a line cut for being over :data:`MAX_LINE_BYTES` reads as (decoders reject it).
OVERLONG = b"\x00over-long line"
RUN_JSON = "run.json"
CONFIG_YAML = "config.yaml"
RUNS_ENV = "CLUSTERDECK_RUNS"
#: Set by the supervisor for its tasks: it creates a task's stop marker before it stops it (RunFolder.stop_marker)
STOP_MARKERS_ENV = "CLUSTERDECK_STOP_MARKERS"


def task_folder_name(task: str) -> str:
    """``worker:1`` -> ``worker-1``: the folder name of a task (also of its TensorBoard run)."""
    return task.replace(":", "-")


def host_folder_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", host) or "host"


def expand_user(path: str) -> Path:
    """``path`` with ``~`` or ``~user`` expanded; a ``~user`` this machine does not know is left as written
    (``Path.expanduser`` raises there; the folder checks then name it: ``engine.cli.folders``)."""
    return Path(os.path.expanduser(path))


def default_runs_root() -> Path:
    """Where new run folders go: ``$CLUSTERDECK_RUNS``, else ``runs`` in the per-user data folder
    (``~/.local/share/clusterdeck/runs`` on Linux, ``~/Library/Application Support/clusterdeck/runs``
    on macOS, ``%LOCALAPPDATA%\\clusterdeck\\runs`` on Windows). ``clusterdeck run --out`` and the app's
    own setting override it."""
    env = os.environ.get(RUNS_ENV, "").strip()
    if env:
        return expand_user(env)
    import platformdirs

    return platformdirs.user_data_path("clusterdeck", appauthor=False) / "runs"


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


class LineSplitter:
    """Splits bytes fed in chunks into lines of at most ``limit`` bytes, as :func:`bounded_lines` does:
    the rest of a longer line is dropped and the line reads as :data:`OVERLONG`.

    For non-blocking pipes read with ``os.read`` (the supervisor's task event pipes and its stdin).
    Lines keep their ``\\n``; :meth:`finish` gives what is left after the stream ended.
    """

    __slots__ = ("limit", "_buffer", "_skipping")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._skipping = False  # inside an over-long line: drop bytes up to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._skipping and b"\n" in chunk:
            # the common case, split in C: no line over the limit and none being skipped
            parts = chunk.split(b"\n")
            rest = parts.pop()  # after the last newline: the start of a line still open
            first = bytes(self._buffer) + parts[0] if self._buffer else parts[0]
            limit = self.limit
            if len(first) <= limit and len(rest) <= limit and max(map(len, parts)) <= limit:
                parts[0] = first
                self._buffer.clear()
                self._buffer += rest
                return [part + b"\n" for part in parts]
        return self._feed(chunk)

    def _feed(self, chunk: bytes) -> list[bytes]:
        """:meth:`feed` a piece at a time (where a line is over-long, or skipped)."""
        out: list[bytes] = []
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl + 1
            piece = chunk[start:end]
            start = end
            if self._skipping:
                if nl >= 0:
                    self._skipping = False
                continue
            if len(self._buffer) + len(piece) > self.limit + (1 if nl >= 0 else 0):
                self._buffer.clear()
                out.append(OVERLONG)
                self._skipping = nl < 0
                continue
            self._buffer += piece
            if nl >= 0:
                out.append(bytes(self._buffer))
                self._buffer.clear()
        return out

    def finish(self) -> list[bytes]:
        """The last line of an ended stream (one without a final newline), if any."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._skipping = False
        return [rest] if rest else []


def process_token(pid: int) -> str:
    """A token naming one process for its whole life (boot id and start time on Linux), ``""`` where
    unknown. A pid is reused; a pid with its token is not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
        start = stat[stat.rindex(")") + 2:].split()[19]  # field 22: start time in clock ticks since boot
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as fh:
            boot = fh.read().strip()
    except (OSError, ValueError, IndexError):
        return ""
    return f"{boot}:{start}"


def process_alive(pid: int, token: str = "") -> bool:
    """Whether process ``pid`` (with ``token``, when one was recorded) still runs on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    if _zombie(pid):  # killed and not reaped yet: it runs no more
        return False
    if token:
        return process_token(pid) == token
    return True


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits for its parent to reap it (Linux's ``/proc``; elsewhere: no)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def launcher_identity() -> dict[str, Any]:
    """What ``run.json`` records of the process running a run: pid, host and start token."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "token": process_token(os.getpid())}


#: States of a run whose launcher is still expected to be there to end it.
#: A run's states while its launcher has it; TERMINAL (``engine.contract.records``) once it ended.
LIVE_STATES = tuple(p.value for p in (RunPhase.PENDING, RunPhase.STARTING, RunPhase.RUNNING, RunPhase.RESTARTING,
                                      RunPhase.STOPPING))
#: A folder's state where its launcher is gone without saying how the run ended (read, never sent).
INTERRUPTED = "interrupted"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a temporary file in the same folder, then rename). The temporary
    file is created new (``O_EXCL``, never through a link planted at its name), and the rename replaces whatever
    ``path`` was (a planted link too) without following it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass


def untrusted_folder(path: Path) -> str | None:
    """Why the folder at ``path`` cannot be a run folder of this user (None: it can): a symbolic link, not a
    folder, another user's, or writable by others (a folder of this user's that others may write is made
    private first)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; expected a folder of its own"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return (f"belongs to another user (uid {info.st_uid}, you are {os.getuid()}); a run never uses a folder "
                "someone else made")
    if info.st_mode & 0o022:
        try:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022)
        except OSError as exc:
            return f"can be written by other users and cannot be made private ({exc.strerror or exc})"
    return None


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
                candidate.mkdir(mode=0o700, exist_ok=False)  # fresh and private: nothing planted in it
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

    @property
    def launcher_json(self) -> Path:
        """What finds the run's launcher: pid, start token, control socket (``engine.control.detach``)."""
        return self.path / "launcher.json"

    @property
    def launcher_log(self) -> Path:
        """A detached launcher's stdout and stderr (it has no terminal)."""
        return self.path / "launcher.log"

    @property
    def control_socket(self) -> Path:
        """The run's owner-only control channel while its launcher serves it (``engine.control.control_socket``)."""
        return self.path / "control.sock"

    def task_dir(self, task: str) -> Path:
        return self.path / "tasks" / task_folder_name(task)

    def task_events(self, task: str) -> Path:
        return self.task_dir(task) / "events.jsonl"

    def task_log(self, task: str) -> Path:
        return self.task_dir(task) / "log.txt"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's log folder: a run (sub-folder) per replica and one for validation."""
        return self.path / "tensorboard"

    def claim(self) -> str | None:
        """Make sure this run folder is this user's own (created, private, where missing); why not, or None.
        A supervisor claims its run folder before it writes anything in it (a folder another user made in its
        place, with a planted ``config.yaml`` or a ``log.txt`` linked to a victim file, is refused)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"cannot be created ({exc.strerror or exc})"
        return untrusted_folder(self.path)

    def private_dir(self, path: Path) -> Path:
        """``path`` (inside the run folder) made where missing, refusing a symbolic link or a non-folder on the
        way (a planted ``tasks/worker-0`` link never redirects what is written there). Raises ``OSError``."""
        relative = path.relative_to(self.path)
        current = self.path
        for part in relative.parts:
            current = current / part
            try:
                current.mkdir(mode=0o700)
            except FileExistsError:
                pass
            info = os.lstat(current)
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
                raise OSError(f"{current} is {'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'not a folder'} "
                              "inside the run folder; refusing to write through it")
        return path

    def stop_marker(self, task: str) -> Path:
        """Created by the supervisor before it stops ``task`` (SIGTERM): a SIGTERM without it is not ClusterDeck's
        (``engine.runtime.stop``); removed when the task starts."""
        return self.task_dir(task) / ".stop-requested"

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
        """Replace ``config.yaml`` (atomic). The folder must exist: a vanished run folder is never recreated."""
        from engine.contract import config as config_mod

        write_atomic(self.config_yaml, config_mod.dumps(config))

    def write_config_text(self, text: str) -> None:
        """A config as YAML text (a remote supervisor writes the one its launcher sent)."""
        write_atomic(self.config_yaml, text)

    def read_config(self, *, check: bool = False) -> RunConfig:
        from engine.contract import config as config_mod

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
        """Update ``run.json`` with ``fields`` (atomic). ``created`` is set once and kept; ``updated`` is now.

        The folder must exist (raises ``FileNotFoundError`` otherwise): a vanished run folder is never
        recreated. Any ``OSError`` (a full disk, a read-only folder) reaches the caller.
        """
        with self._meta_lock:
            meta = self.read_meta()
            created = meta.get("created")
            meta.update(fields)
            meta["created"] = created or time.strftime("%Y-%m-%dT%H:%M:%S")
            meta["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            write_atomic(self.run_json, json.dumps(meta, indent=2, default=str))
            return meta

    def effective_state(self, meta: dict[str, Any] | None = None) -> str:
        """The run's state as ``run.json`` tells it, with one correction: a run still marked live
        (``running``, ``starting``…) whose launcher is no longer alive on this machine reads
        ``interrupted``. A launcher on another host cannot be checked: its state is kept.
        ``""`` when there is no readable ``run.json``."""
        meta = self.read_meta() if meta is None else meta
        state = str(meta.get("state", "") or "")
        if state not in LIVE_STATES:
            return state
        launcher = meta.get("launcher")
        if not isinstance(launcher, dict):
            return state
        pid, host, token = launcher.get("pid"), launcher.get("host"), launcher.get("token")
        if not isinstance(pid, int) or host != socket.gethostname():
            return state
        return state if process_alive(pid, str(token or "")) else INTERRUPTED
