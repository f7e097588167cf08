"""Transports: how the launcher starts a supervisor somewhere and gets its byte streams back.

A run has one supervisor (``python -m engine.control.supervisor``) per host group. A *transport*
only starts that program where the group lives and hands back a :class:`subprocess.Popen` whose
``stdin`` takes the launcher's JSON lines (the spec, then commands) and whose ``stdout`` carries the
supervisor's events; everything above it (the spec, commands, events, the lifecycle, stopping, the
run folder) is shared by every transport. Kinds:

- :class:`LocalTransport`: a plain subprocess on this machine.
- :class:`NetnsTransport`: the same inside a private network namespace (``unshare -rn``, see
  :mod:`engine.control.netns`), so TensorFlow's unauthenticated ports are unreachable from outside.
- :class:`SshTransport`: the user's own ``ssh`` client runs the supervisor on a remote host.
- ``slurm`` (``engine.control.slurm.SlurmTransport``): ``srun`` inside a Slurm allocation; found
  through :data:`KINDS` and imported only when a config has such a host.

Writing a transport (implement :class:`Transport`; subclassing :class:`BaseTransport` gives the
optional hooks as no-ops)::

    class MyTransport(BaseTransport):
        kind = "mine"
        background = True      # prepare() may take long: Run.start() returns at once (state "pending")

        def prepare(self, ctx):                # once per run, before any supervisor starts
            while not ready():
                if ctx.stop.wait(2):           # the user stopped the run: give up soon
                    raise TransportStopped()
                ctx.report(job_id="123", reason="Resources")   # a run event: state "pending"
            return ctx.config                  # or a config with the allocated node names filled in

        def start(self, launch):               # once per supervisor (and again after a whole-run restart)
            return subprocess.Popen([...launch.command...], stdin=PIPE, stdout=PIPE,
                                    stderr=open(launch.log, "ab"), start_new_session=True)

        def failure(self, launch, exit_code, log_tail):   # the supervisor ended while its tasks ran
            return "job killed by its time limit"          # the run fails blamed on supervisor@<host>

        def why_ended(self, launch):           # it exited cleanly while its tasks ran: the scheduler's doing?
            return "job killed by its time limit"          # ("" where nothing else could have ended it)

        def release(self):                     # the run ended (any way): cancel the job, free nodes
            subprocess.run(["scancel", job_id])

Contract:

- ``start`` must not block for long and must not read the streams; the launcher reads ``stdout`` on
  its own thread and writes ``stdin``. The process's stderr goes to ``launch.log``
  (``hosts/<host>/supervisor.log``): its tail is what :meth:`Transport.failure` may quote.
- Closing the supervisor's stdin (or killing the process :meth:`Transport.kill` names) must end the
  supervisor, which then stops its tasks: ``ssh`` and ``srun`` relay that end of input.
- ``prepare`` runs on the launcher's start thread (its own thread when ``background``); it must
  return soon after ``ctx.stop`` is set (raise :class:`TransportStopped`). Any other exception fails
  the run with its message. ``ctx.report(**fields)`` shows queue state as a ``run`` event with state
  ``pending`` (``job_id``, ``reason`` as the scheduler words it, e.g. ``Resources``, ``PartitionDown``).
- ``release`` is called once at the end of every run that called ``prepare`` (finished, failed,
  stopped, or a failed start), after the supervisors were stopped; it must not raise.
- ``failure`` turns a supervisor's unexpected end into the reason the run reports (never the
  generic "ended without finishing"): a scheduler transport asks its scheduler why.

Host names and addresses are validated by the config; ``ssh`` also gets ``--`` before the
destination, so a name starting with ``-`` can never be read as an option.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import secrets
import shlex
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engine.contract import events
from engine.contract.config import Host, RunConfig
from engine.contract.run_folder import RunFolder
from engine.contract.task_logs import is_noise
from engine.control import netns, process_end

SUPERVISOR_MODULE = "engine.control.supervisor"


class TransportStopped(Exception):
    """Raised by :meth:`Transport.prepare` when the run was stopped while it waited."""


@dataclass(frozen=True)
class SupervisorLaunch:
    """What a transport needs to start one supervisor."""

    group: str  # the supervisor's name: a host's name, or "localhost" for every local host
    host: Host | None  # the config's host; None for this machine
    command: list[str]  # the supervisor's command line, as run on the target (its python first)
    env: dict[str, str]  # the environment of a process started here
    log: Path  # where its stderr goes: hosts/<group>/supervisor.log


@dataclass
class PrepareContext:
    """Handed to :meth:`Transport.prepare`."""

    config: RunConfig  # the resolved config about to be planned
    folder: RunFolder
    stop: threading.Event  # set when the user stops the run
    emit: Callable[[dict[str, Any]], None]  # the launcher's event queue

    def report(self, **fields: Any) -> None:
        """A ``run`` event with state ``pending`` (``job_id``, ``reason`` …) for the app and the CLI."""
        self.emit(events.make("run", "launcher", state="pending", **fields))


@runtime_checkable
class Transport(Protocol):
    """Starts supervisors somewhere and gives back their byte streams (see the module docstring)."""

    kind: str
    background: bool

    def prepare(self, ctx: PrepareContext) -> RunConfig: ...

    def start(self, launch: SupervisorLaunch) -> subprocess.Popen[bytes]: ...

    def kill(self, proc: subprocess.Popen[bytes]) -> None: ...

    def failure(self, launch: SupervisorLaunch, exit_code: int, log_tail: list[str]) -> str: ...

    def why_ended(self, launch: SupervisorLaunch) -> str: ...

    def release(self) -> None: ...


class BaseTransport:
    """No-op ``prepare``/``release``, a process-group ``kill`` and a plain ``failure`` message."""

    kind = "base"
    background = False

    def prepare(self, ctx: PrepareContext) -> RunConfig:
        return ctx.config

    def start(self, launch: SupervisorLaunch) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        process_end.kill_popen_group(proc)  # started with start_new_session: its own group

    def failure(self, launch: SupervisorLaunch, exit_code: int, log_tail: list[str]) -> str:
        return _with_tail(f"the supervisor {describe_exit(exit_code)}", log_tail)

    def why_ended(self, launch: SupervisorLaunch) -> str:
        """Why a supervisor that exited cleanly while its tasks ran was ended by what runs it (a scheduler's time
        limit, a cancel), or "" where nothing but the supervisor could have ended it."""
        return ""

    def release(self) -> None:
        return None

    def _popen(self, cmd: list[str], launch: SupervisorLaunch) -> subprocess.Popen[bytes]:
        launch.log.parent.mkdir(parents=True, exist_ok=True)
        with open(launch.log, "ab") as log:
            return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    env=launch.env, start_new_session=True)


class LocalTransport(BaseTransport):
    """The supervisor as a plain subprocess of the launcher."""

    kind = "local"

    def start(self, launch: SupervisorLaunch) -> subprocess.Popen[bytes]:
        return self._popen(list(launch.command), launch)


class NetnsTransport(LocalTransport):
    """A local supervisor (and so every task) inside a fresh private network namespace."""

    kind = "netns"

    def start(self, launch: SupervisorLaunch) -> subprocess.Popen[bytes]:
        cmd = list(launch.command)
        if cmd[1:] == ["-m", SUPERVISOR_MODULE]:  # it brings the loopback up itself: no helper process
            return self._popen(netns.wrap_supervisor(cmd), launch)
        return self._popen(netns.wrap(cmd), launch)


class SshTransport(BaseTransport):
    """The supervisor on a remote host through the user's own OpenSSH client.

    Where the login check before the launch left a shared connection to the host (:func:`ssh_mux_path`), the
    supervisor's session goes through it: no second connection, key exchange and login."""

    kind = "ssh"

    def __init__(self) -> None:
        self._mux_logs: dict[str, tuple[Path, int]] = {}  # group: its shared connection's log, and its size then
        self._muxes: dict[str, Host] = {}  # every shared connection a supervisor of the run went through: its host

    def start(self, launch: SupervisorLaunch) -> subprocess.Popen[bytes]:
        assert launch.host is not None, "an ssh supervisor needs its host"
        mux = ssh_mux_path(launch.host)
        if mux is not None:
            log = ssh_mux_log(mux)
            self._mux_logs[launch.group] = (log, _size(log))
            self._muxes[mux] = launch.host
        return self._popen(ssh_command(launch.host, list(launch.command), mux=mux), launch)

    def release(self) -> None:
        """The run ended: its shared connections end with it (never left to linger ``ControlPersist`` seconds)."""
        muxes, self._muxes = self._muxes, {}
        close_shared_connections(muxes)

    def failure(self, launch: SupervisorLaunch, exit_code: int, log_tail: list[str]) -> str:
        """Who ended: the ssh client here (a signal), ssh itself (its own complaint quoted), or the supervisor there
        (its own last words quoted, never ssh's chatter or TensorFlow's start-up lines). Over a shared connection
        ssh's own complaint (``Timeout, server … not responding``) is in that connection's log, not the session's."""
        target = launch.host.ssh_target if launch.host is not None else launch.group
        ssh_said = [line for line in log_tail if ssh_error(line)]
        if exit_code == 255 and not ssh_said and launch.group in self._mux_logs:
            ssh_said = [line for line in log_lines_after(*self._mux_logs[launch.group]) if ssh_error(line)][-2:]
        theirs = [line for line in log_tail if not ssh_error(line) and not ssh_chatter(line)]
        if exit_code < 0:  # the ssh process here ended by a signal: the client, not the remote supervisor
            return _with_tail(f"the ssh client on this machine (to {target}) {describe_exit(exit_code)}; the "
                              f"supervisor on {target} ended with its connection", [])
        if exit_code == 255:
            if ssh_said:  # ssh's own failure: connect, authenticate, connection lost
                return _with_tail(f"ssh to {target} failed", ssh_said[-2:])
            # 255 without a word from ssh: the remote command ended by a signal (OpenSSH passes no status)
            return _with_tail(f"the supervisor on {target} (over ssh) ended abruptly, most likely killed by a "
                              "signal there (ssh itself reported no error)", theirs)
        return _with_tail(f"the supervisor on {target} (over ssh) {describe_remote_exit(exit_code)}", theirs)


#: What OpenSSH's client prints when it fails itself (connect, authenticate, keep-alive, host keys).
SSH_ERRORS = ("ssh:", "Permission denied", "Connection closed", "Connection refused", "Connection timed out",
              "Connection reset", "Could not resolve hostname", "Host key verification failed",
              "kex_exchange_identification", "Broken pipe", "not responding", "No route to host",
              "Network is unreachable", "Bad configuration option", "Too many authentication failures",
              "client_loop:", "Timeout, server")


#: What an ssh client says that is neither a failure nor the remote command's words.
SSH_CHATTER = ("Warning: Permanently added", "to the list of known hosts")


def ssh_error(line: str) -> bool:
    """Whether a line of an ssh client's stderr is its own complaint (not the remote command's output)."""
    return any(marker in line for marker in SSH_ERRORS)


def ssh_chatter(line: str) -> bool:
    return any(marker in line for marker in SSH_CHATTER)


def ssh_complaint(lines: list[str]) -> str:
    """ssh's own complaint among ``lines`` (its stderr), TensorFlow's start-up lines and ssh's chatter left out."""
    meaningful = [line.strip() for line in lines if line.strip() and not is_noise(line) and not ssh_chatter(line)]
    said = [line for line in meaningful if ssh_error(line)] or meaningful
    return " | ".join(said[-2:])[:500]


#: Seconds ssh may take to reach a host before it gives up (a host that is down is named, not waited for).
SSH_CONNECT_TIMEOUT_S = 10


def ssh_command(host: Host, remote_cmd: list[str] | None, *, connect_timeout: float = SSH_CONNECT_TIMEOUT_S,
                mux: str | None = None, master: bool = False) -> list[str]:
    """The user's own OpenSSH client (their ~/.ssh/config, agent and keys) running ``remote_cmd`` on ``host``.

    ``CLUSTERDECK_SSH_CONFIG`` names another ssh config file (``ssh -F``). ``--`` ends ssh's options,
    so the destination is never read as one. A connection that gets no answer for 15 s (3 keep-alives 5 s
    apart) is given up; so is a host that does not answer within ``connect_timeout`` seconds.

    ``mux`` (:func:`ssh_mux_path`): the session goes through the shared connection at that control socket where
    there is one, else connects as it would without (OpenSSH's ``ControlMaster=no``); with ``master`` it makes
    that connection, kept :data:`SSH_PERSIST_S` seconds after its last session, and ssh's own messages go to the
    host's log (:func:`ssh_mux_log`: the shared connection outlives this command, and what it says later is there).
    ``remote_cmd`` None with ``master``: no session at all (``ssh -f -N``): ssh connects, logs in, leaves the
    shared connection in the background and exits 0 (255 where it cannot), and the remote shell never starts (its rc
    files cost a session tens to hundreds of ms of the host's CPU: a ``pyenv`` or ``conda`` init). ``-f``, not
    ``ControlPersist`` alone: before OpenSSH 8.7 a master made with ``-N`` and no ``-f`` still opened a session
    (bz3290). Run it with standard output and error to ``/dev/null``: before OpenSSH 8.5 the background master kept
    the caller's standard error open (ssh's own words are in the host's log, ``-E``, either way).
    """
    cmd = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
           "-o", f"ConnectTimeout={max(1, round(connect_timeout))}", *_ssh_host_options(host)]
    if mux is not None:
        cmd += ["-o", f"ControlPath={mux}"]
        cmd += (["-o", "ControlMaster=auto", "-o", f"ControlPersist={SSH_PERSIST_S}", "-E", str(ssh_mux_log(mux))]
                if master else ["-o", "ControlMaster=no"])
    if remote_cmd is None:
        if mux is None or not master:  # ssh -N with no shared connection to make would stay connected for ever
            raise ValueError("ssh -N (no remote command) only makes a shared connection: it needs mux and master")
        return [*cmd, "-f", "-N", "--", host.ssh_target]
    # the remote shell parses the command line: quote every word
    cmd += ["--", host.ssh_target, shlex.join(remote_cmd)]
    return cmd


#: ``0`` turns the shared connection off: every ssh of a launch connects and logs in on its own.
SSH_MUX_ENV = "CLUSTERDECK_SSH_MUX"
#: Seconds a shared connection to a host stays up after its last session ended (OpenSSH's ``ControlPersist``).
SSH_PERSIST_S = 30
#: The longest control socket folder: a socket's path has about 104 bytes; a name here is 29, and ssh adds 17 to it
#: while it makes one.
_MUX_FOLDER_MAX = 48


#: The shared connection the latest login check made to each host (its control socket), by :func:`_host_key`.
_latest_mux: dict[str, str] = {}
_latest_mux_lock = threading.Lock()


def _host_key(host: Host) -> str:
    """A host as ssh would be asked to reach it (destination, user, port, the ssh config named)."""
    key = "\0".join((host.ssh_target, host.ssh_user, str(host.ssh_port), os.environ.get("CLUSTERDECK_SSH_CONFIG", "")))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:20]


def ssh_mux_path(host: Host, *, fresh: bool = False) -> str | None:
    """The control socket through which the launcher's ssh sessions to ``host`` share one connection (OpenSSH's
    ``ControlMaster``): ``fresh`` (the login check before a launch) a new one, for a connection it makes itself
    (a real login every time: an sshd gone is found even while an earlier connection lives on); else the one the
    latest login check made, where it is still there, so the supervisor's session needs no connection, key exchange
    and login of its own. None (each session connects on its own, as without) where ``CLUSTERDECK_SSH_MUX=0``,
    where the user's own ssh config sets ``ControlMaster`` or ``ControlPath`` for the host (theirs applies,
    untouched), where no private folder for the socket can be had, or where no login check made one."""
    if os.environ.get(SSH_MUX_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    folder = _mux_folder()
    if folder is None or _users_own_mux(host):
        return None
    key = _host_key(host)
    if fresh:
        path = os.path.join(folder, f"{key}-{secrets.token_hex(4)}")
        with _latest_mux_lock:
            _latest_mux[key] = path
        return path
    with _latest_mux_lock:
        path = _latest_mux.get(key, "")
    return path if path and os.path.exists(path) else None


def close_shared_connections(muxes: dict[str, Host]) -> None:
    """End the shared connections at these control sockets (``ssh -O exit``, each with its host), at once and in
    parallel; one already gone is nothing to end."""
    procs = []
    for mux, host in muxes.items():
        if not os.path.exists(mux):
            continue
        cmd = ssh_command(host, ["true"], mux=mux)
        at = cmd.index("--")
        try:
            procs.append(subprocess.Popen([*cmd[:at], "-O", "exit", *cmd[at:at + 2]], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError:
            continue
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ssh_mux_log(mux: str) -> Path:
    """Where ssh's own messages of a host's shared connections go (``ssh -E``; one file per host)."""
    return Path(mux.rpartition("-")[0] + ".log")


def _mux_folder() -> str | None:
    """This user's private folder of control sockets (made 0700; refused when it is not one: a link, another
    user's, open to others), or None."""
    folder = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), f"clusterdeck-ssh-{os.getuid()}")
    if len(folder) > _MUX_FOLDER_MAX or "%" in folder:  # ssh expands % in a ControlPath
        return None
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


#: Seconds the user's ssh settings for a host (``ssh -G``) are kept (a launch asks twice per host: its login check,
#: its supervisor's start, a second or two apart).
_SETTINGS_KEEP_S = 30.0
_settings: dict[tuple[str, ...], tuple[float, dict[str, str] | None]] = {}
_settings_lock = threading.Lock()


def _ssh_settings(host: Host) -> dict[str, str] | None:
    """The user's ssh settings for ``host`` as ssh resolves them (``ssh -G``, keys lowercased), or None where they
    cannot be read."""
    key = (host.ssh_target, host.ssh_user, str(host.ssh_port), os.environ.get("CLUSTERDECK_SSH_CONFIG", ""))
    now = time.monotonic()
    with _settings_lock:
        known = _settings.get(key)
    if known is not None and now - known[0] < _SETTINGS_KEEP_S:
        return known[1]
    settings = _ask_ssh_settings(host)
    with _settings_lock:
        _settings[key] = (now, settings)
    return settings


def _users_own_mux(host: Host) -> bool:
    """Whether the user's ssh config chooses connection sharing for ``host`` itself; True where that cannot be told
    (their choice is then left alone)."""
    settings = _ssh_settings(host)
    if settings is None:
        return True
    return settings.get("controlmaster", "false") != "false" or settings.get("controlpath", "none") != "none"


def users_remote_command(host: Host) -> bool:
    """Whether the user's ssh config gives ``host`` a ``RemoteCommand`` (ssh then refuses a command line of its
    own: the supervisor cannot start, and a login check that runs a command says so before launch)."""
    settings = _ssh_settings(host)
    return settings is not None and settings.get("remotecommand", "none") != "none"


def _ssh_host_options(host: Host) -> list[str]:
    """How ssh is told which config, user and port reach ``host`` (``CLUSTERDECK_SSH_CONFIG``: ``ssh -F``)."""
    options = []
    extra_config = os.environ.get("CLUSTERDECK_SSH_CONFIG")
    if extra_config:
        options += ["-F", extra_config]
    if host.ssh_user:
        options += ["-l", host.ssh_user]
    if host.ssh_port != 22:
        options += ["-p", str(host.ssh_port)]
    return options


def _ask_ssh_settings(host: Host) -> dict[str, str] | None:
    cmd = ["ssh", "-G", *_ssh_host_options(host)]
    try:
        done = subprocess.run([*cmd, "--", host.ssh_target], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=5.0)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    return {key.lower(): value.strip() for key, _, value in (line.partition(" ") for line in lines)}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_lines_after(path: Path, offset: int, max_bytes: int = 65536) -> list[str]:
    """The lines of ``path`` written after its first ``offset`` bytes (at most the last ``max_bytes`` of them)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(offset, end - max_bytes) if end >= offset else max(0, end - max_bytes))
            data = fh.read()
    except OSError:
        return []
    return [line.strip()[:500] for line in data.decode("utf-8", "replace").splitlines() if line.strip()]


#: Transport kinds by name: a class, or "module:Class" imported when first needed.
KINDS: dict[str, type[BaseTransport] | str] = {
    "local": LocalTransport,
    "netns": NetnsTransport,
    "ssh": SshTransport,
    "slurm": "engine.control.slurm:SlurmTransport",
}


def kind_of(host: Host | None, *, isolated: bool = False) -> str:
    """The transport kind a host group needs: this machine (``netns`` when isolated), or the host's
    own ``kind`` (``slurm``), else ``ssh``."""
    if host is None:
        return "netns" if isolated else "local"
    kind = str(getattr(host, "kind", "") or "")
    return kind if kind in KINDS and kind not in ("local", "netns") else "ssh"


def make(kind: str) -> Transport:
    """A new transport of ``kind`` (one per kind per run)."""
    entry = KINDS.get(kind)
    if entry is None:
        raise ValueError(f"unknown transport {kind!r}; expected one of {', '.join(KINDS)}")
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    transport: Transport = entry()  # type: ignore[operator]
    return transport


def supervisor_command(python: str) -> list[str]:
    return [python, "-m", SUPERVISOR_MODULE]


def local_env() -> dict[str, str]:
    """The environment of a supervisor started here: ours, with this checkout first on the path."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


describe_exit = process_end.describe_exit


def describe_remote_exit(code: int) -> str:
    """An exit code relayed by ssh or a shell: 128 + N reads as the signal N that most likely ended it."""
    if 128 < code < 128 + 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"exited with code {code} (ended by {name}, most likely)"
    return describe_exit(code)


def log_tail(path: Path, lines: int = 3, max_bytes: int = 4096) -> list[str]:
    """The last non-empty lines of a log (a supervisor's stderr), read from its end only."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    # TensorFlow's start-up chatter (absl, oneDNN) and ssh's (known hosts) are never "the message" of a failure
    return [line.strip()[:500] for line in text if line.strip() and not is_noise(line) and not ssh_chatter(line)][-lines:]


def _with_tail(message: str, tail: list[str]) -> str:
    return f"{message}: {' | '.join(tail)}" if tail else message
