"""Reachability before launch on multi-host clusters: every task's address and port, checked from here in a few
seconds, instead of a hang found by the progress timeout a minute later.

Checked from this machine (the launcher's), before any supervisor starts:

- each other host's address resolves;
- each of its tasks' ports answers as a free port does (a refused connection: the host is up and nothing
  listens there yet); a port that accepts is taken (a leftover of an earlier run), one that gives no answer
  within the timeout is cut off (the host down, a firewall dropping, a wrong address);
- each task of this machine can bind its port (TensorFlow's server listens on ``0.0.0.0:<port>``).

Each host reached over SSH is also logged in to (:func:`login_problems`: ``ssh ... true`` with the launcher's own
options, in parallel, a few seconds at most): a host whose sshd is gone, a refused key or an unknown alias is named
before any supervisor starts, not as a failed run after the others started.

While a run runs, a host that went silent is probed (:func:`probe_host`): whether anything at its address answers
on its tasks' ports (a refused connection is an answer: the host is up). The lifecycle decides what a host that
does not answer means (``engine.control.lifecycle``: ``ProbeHost``).

What this cannot see: whether host A reaches host B when neither is this machine (a firewall between two
remote hosts). That check needs code on every host, so it belongs to the supervisors: a supervisor command
``probe`` (``{"targets": ["host:port", ...]}``) answered by an ``info`` event per unreachable target, sent by
the launcher once every supervisor is up and before it lets the tasks start. Not built: it needs a start
barrier in the supervisor (engine/control/supervisor.py) that the launcher releases.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.contract.config import Host, Problem, RunConfig

#: Seconds the whole check may take (names resolved and ports tried in parallel).
TIMEOUT_S = 3.0

Resolver = Callable[[str], str]


@dataclass(frozen=True)
class Target:
    """A task's address and port as the cluster names them; ``local``: on this machine."""

    task: str
    host: str
    address: str
    port: int | None
    local: bool = False


def targets(config: RunConfig) -> list[Target]:
    """The tasks to check: every task of a cluster with a host other than this machine (none otherwise; a
    Slurm group's nodes are not known before its allocation and are left out)."""
    hosts = [h for h in config.cluster.hosts if not h.is_slurm]
    if all(h.is_local for h in hosts):
        return []
    return [Target(t.name, h.name, "127.0.0.1" if h.is_local else h.address.strip(), t.port, h.is_local)
            for h in hosts for t in h.tasks]


def resolve(address: str) -> str:
    """The first IPv4 (else IPv6) address of ``address``; raises ``OSError``."""
    infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def check_target(target: Target, timeout: float, resolver: Resolver = resolve) -> str | None:
    """What is wrong with ``target`` (a sentence naming its host and port), or None."""
    where = f"{target.task} on host {target.host!r} ({target.address}:{target.port or 'auto'})"
    if target.local:
        return _bind_problem(target, where)
    try:
        ip = resolver(target.address)
    except OSError as exc:
        return f"{where}: the address {target.address!r} does not resolve ({exc.strerror or exc}); expected a host " \
               "name or IP address this machine can resolve"
    if target.port is None:
        return None  # an 'auto' port is picked on that host: only its address can be checked from here
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            code = s.connect_ex((ip, target.port))
        except TimeoutError:
            code = errno.ETIMEDOUT
        except OSError as exc:
            code = exc.errno or errno.EHOSTUNREACH
    if code == errno.ECONNREFUSED:
        return None  # up, and nothing listens there yet: what a task's port should be before launch
    if code == 0:
        return f"{where}: port {target.port} is already taken (something accepts connections there: a leftover " \
               "of an earlier run?); expected a free port"
    if code in (errno.ETIMEDOUT, errno.EAGAIN, errno.EINPROGRESS):
        return f"{where}: no answer within {timeout:g} s (the host is down, a firewall drops the port, or the " \
               "address is wrong); expected the port to be reachable from this machine"
    return f"{where}: unreachable ({errno.errorcode.get(code, code)}: {_strerror(code)}); expected the port to be " \
           "reachable from this machine"


def _bind_problem(target: Target, where: str) -> str | None:
    if target.port is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", target.port))  # noqa: S104 - where TensorFlow's server will listen
        except OSError as exc:
            return f"{where}: port {target.port} cannot be bound on this machine ({exc.strerror or exc}); " \
                   "expected a free port"
    return None


def _strerror(code: int) -> str:
    try:
        import os

        return os.strerror(code)
    except ValueError:
        return "unknown error"


def check(items: list[Target], timeout: float = TIMEOUT_S, resolver: Resolver = resolve) -> list[str]:
    """Every problem of ``items``, checked in parallel within about ``timeout`` seconds (a target that has not
    answered by then is named as such)."""
    results: dict[int, str | None] = {}
    lock = threading.Lock()

    def one(i: int, target: Target) -> None:
        problem = check_target(target, max(0.2, timeout - 0.5), resolver)
        with lock:
            results[i] = problem

    threads = [threading.Thread(target=one, args=(i, t), daemon=True) for i, t in enumerate(items)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    out = []
    with lock:
        for i, target in enumerate(items):
            if i not in results:
                out.append(f"{target.task} on host {target.host!r} ({target.address}:{target.port or 'auto'}): "
                           f"no answer within {timeout:g} s (the name did not resolve in time?)")
            elif results[i] is not None:
                out.append(str(results[i]))
    return out


def problems(config: RunConfig, timeout: float = TIMEOUT_S, resolver: Resolver = resolve) -> list[Problem]:
    """:func:`check` of the config's cluster as launch problems (empty for a cluster of this machine only)."""
    return [Problem("cluster", message) for message in check(targets(config), timeout, resolver)]


# -- logging in over SSH before launch

#: Seconds ssh may take to connect (its ConnectTimeout) in the login check; the whole check takes at most a
#: couple of seconds more.
LOGIN_TIMEOUT_S = 4.0


def ssh_hosts(config: RunConfig) -> list[Host]:
    """The hosts a supervisor reaches over SSH (machines other than this one, not Slurm groups)."""
    return [h for h in config.cluster.hosts if not h.is_local and not h.is_slurm]


def login_problem(host: Host, timeout: float = LOGIN_TIMEOUT_S) -> str | None:
    """Why the launcher cannot log in to ``host`` the way it will start its supervisor (the same ``ssh`` client,
    config, user, port and options), or None.

    Where the connection is to be shared (:func:`transports.ssh_mux_path`), the check makes it and runs nothing
    there (``ssh -f -N``: the supervisor's session is the first to start the remote shell, which saves each host a
    session and its shell's rc files per launch); else, and where the user's ssh config gives the host a
    ``RemoteCommand`` (which refuses a command of ClusterDeck's: said here, before launch), it runs ``true``. What
    only a session meets (a login shell that fails, an sshd ``ForceCommand``) is then named by the supervisor's
    start, the first session, instead of by this check."""
    from engine.control import transports  # the one place an ssh command line is made

    # the connection it makes is shared: the supervisor's session then goes through it (transports.ssh_mux_path)
    mux = transports.ssh_mux_path(host, fresh=True)
    log, offset = (transports.ssh_mux_log(mux), 0) if mux is not None else (None, 0)
    if log is not None:
        offset = _fresh_log(log)
    quiet = mux is not None and not transports.users_remote_command(host)
    cmd = transports.ssh_command(host, None if quiet else ["true"], connect_timeout=timeout, mux=mux, master=True)
    where = f"host {host.name!r} ({host.ssh_target}, ssh port {host.ssh_port})"
    # ssh -f -N: its output to /dev/null (an older ssh's background master keeps its standard error; its words
    # are in the log)
    output = subprocess.DEVNULL if quiet else subprocess.PIPE
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=output, stderr=output, timeout=timeout + 2.0,
                              env=dict(os.environ))
    except FileNotFoundError:
        return f"{where}: no ssh client on this machine; expected OpenSSH's ssh"
    except subprocess.TimeoutExpired:
        return f"{where}: ssh did not log in within {timeout + 2.0:g} s; expected to log in without a prompt"
    if done.returncode == 0:
        return None
    # ssh's own words went to the shared connection's log (ssh -E), the remote command's to stderr
    lines = transports.log_lines_after(log, offset) if log is not None else []
    said = transports.ssh_complaint(lines + (done.stderr or b"").decode("utf-8", "replace").splitlines())
    if done.returncode == 255:
        return f"{where}: ssh cannot log in: {said or 'ssh failed without a word'}; expected to log in over SSH " \
               "without a prompt (BatchMode: a key or an agent)"
    return f"{where}: a command run over ssh exited with code {done.returncode}" + (f": {said}" if said else "")


#: A shared connection's log (ssh's own messages) is started afresh past this size.
MUX_LOG_MAX = 1 << 20


def _fresh_log(log: Path) -> int:
    """The size of a shared connection's log now (0 once one that grew too long was removed)."""
    try:
        size = log.stat().st_size
    except OSError:
        return 0
    if size <= MUX_LOG_MAX:
        return size
    try:
        log.unlink()
    except OSError:
        return size
    return 0


def close_logins(config: RunConfig) -> None:
    """End the shared connections the login checks left for ``config``'s hosts (a launch refused after them: no
    supervisor will use them, and none is left to linger)."""
    from engine.control import transports

    muxes = {mux: h for h in ssh_hosts(config) if (mux := transports.ssh_mux_path(h)) is not None}
    transports.close_shared_connections(muxes)


def login_problems(config: RunConfig, timeout: float = LOGIN_TIMEOUT_S) -> list[Problem]:
    """:func:`login_problem` of every SSH host, in parallel, as launch problems."""
    hosts = ssh_hosts(config)
    results: dict[int, str | None] = {}
    threads = [threading.Thread(target=lambda i=i, h=h: results.__setitem__(i, login_problem(h, timeout)),
                                daemon=True) for i, h in enumerate(hosts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout + 3.0)
    return [Problem("cluster", str(results[i])) for i in range(len(hosts)) if results.get(i)]


# -- is a silent host still there?

#: Seconds a probe of a silent host waits for any of its ports to answer.
PROBE_TIMEOUT_S = 1.5


def probe_host(address: str, ports: Sequence[int], timeout: float = PROBE_TIMEOUT_S,
               resolver: Resolver = resolve) -> str:
    """Empty when anything at ``address`` answers on one of ``ports`` within ``timeout`` (a connection accepted, or
    refused: the host is up); else why not, naming the address and ports."""
    try:
        ip = resolver(address)
    except OSError as exc:
        return f"its address {address!r} no longer resolves ({exc.strerror or exc})"
    ports = [p for p in ports if p] or [22]
    answered = threading.Event()
    codes: list[int] = []
    lock = threading.Lock()

    def one(port: int) -> None:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                code = s.connect_ex((ip, port))
            except TimeoutError:
                code = errno.ETIMEDOUT
            except OSError as exc:
                code = exc.errno or errno.EHOSTUNREACH
        with lock:
            codes.append(code)
        if code in (0, errno.ECONNREFUSED):
            answered.set()

    threads = [threading.Thread(target=one, args=(port,), daemon=True) for port in ports]
    for th in threads:
        th.start()
    answered.wait(timeout + 0.2)
    if answered.is_set():
        return ""
    where = f"{ip} (port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))})"
    with lock:
        errors = sorted({c for c in codes if c not in (errno.ETIMEDOUT, errno.EAGAIN, errno.EINPROGRESS)})
    if errors:
        return f"{where} unreachable from this machine ({'; '.join(_strerror(c) for c in errors)})"
    return f"no answer from {where} within {timeout:g} s"
