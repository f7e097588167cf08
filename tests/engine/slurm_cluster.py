"""A one-node Slurm cluster on 127.0.0.1 for the Slurm tests (and for ``.ci/services/slurm.sh``).

:func:`ensure` writes a ``slurm.conf`` (node ``localhost``, partition :data:`PARTITION`), starts
``munged`` (as user munge), ``slurmctld`` and ``slurmd`` unless they already serve that config, and
waits until ``sinfo`` shows the node idle. :meth:`Cluster.stop` ends only the daemons it started,
by their pid files. Needs root and Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge``.

The config keeps the tests short: ``OverTimeLimit=0`` and ``KillWait=2`` (a job over its limit
ends at the next check of the controller), ``SlurmdParameters=config_overrides`` with 16 CPUs (jobs
of several tests fit at once on a 2-core machine) and ``SelectTypeParameters=CR_CPU`` (memory is
not a consumable resource).

Command line: ``python -m tests.engine.slurm_cluster up|down|status``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The first line of every slurm.conf written here: a config that starts with it may be rewritten.
MARKER = "# written by ClusterDeck's test cluster (tests/engine/slurm_cluster.py)"
PARTITION = "debug"
NODE = "localhost"
NODE_CPUS = 16
#: Where state, spool, logs and pid files live (and the config, when /etc/slurm is not ours).
DEFAULT_DIR = Path(os.environ.get("CLUSTERDECK_SLURM_DIR", "/tmp/clusterdeck-slurm"))
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "salloc", "srun", "scancel", "scontrol")


def missing_programs() -> list[str]:
    """Slurm and munge programs this machine lacks (empty: all installed)."""
    sbin = ("/usr/sbin", "/usr/local/sbin", "/sbin")
    out = []
    for name in (*DAEMONS, *CLIENTS):
        if shutil.which(name) is None and not any(Path(d, name).exists() for d in sbin):
            out.append(name)
    return out


def _program(name: str) -> str:
    for d in ("/usr/sbin", "/usr/local/sbin", "/sbin"):
        if Path(d, name).exists():
            return str(Path(d, name))
    return shutil.which(name) or name


def _memory_mb() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return max(512, int(line.split()[1]) // 1024 - 256)
    except OSError:
        pass
    return 2048


def slurm_conf(folder: Path) -> str:
    """The text of the test cluster's ``slurm.conf`` keeping its state under ``folder``."""
    return "\n".join([
        MARKER,
        "ClusterName=clusterdeck",
        f"SlurmctldHost={NODE}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "OverTimeLimit=0",
        "KillWait=2",
        "MinJobAge=300",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log",
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={_memory_mb()} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        "",
    ])


def _is_ours(conf: Path) -> bool:
    try:
        with open(conf, encoding="utf-8") as fh:
            return fh.readline().rstrip("\n") == MARKER
    except OSError:
        return False


def jobs_named(part: str) -> list[str]:
    """Ids of the jobs in squeue whose name holds ``part``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=10, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if part in line.split(maxsplit=1)[-1]]


def conf_path(folder: Path = DEFAULT_DIR) -> Path:
    """Where the cluster's config goes: Slurm's default place when free (or ours), else ``folder``."""
    explicit = os.environ.get("SLURM_CONF")
    if explicit:
        return Path(explicit)
    if not SYSTEM_CONF.exists() or _is_ours(SYSTEM_CONF):
        return SYSTEM_CONF
    return folder / "slurm.conf"


def _env(conf: Path) -> dict[str, str]:
    env = dict(os.environ)
    if conf != SYSTEM_CONF:
        env["SLURM_CONF"] = str(conf)
    return env


def node_state(conf: Path) -> str:
    """``sinfo``'s state of the node (``idle``, ``mix``, ``down*``...), or '' when nobody answers."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%t"], capture_output=True, text=True,
                             timeout=10, env=_env(conf))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def _munge_works() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=5)
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Cluster:
    """A running one-node cluster; ``started`` names the daemons this process started (and may stop)."""

    conf: Path
    folder: Path
    started: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands need to reach this cluster."""
        return _env(self.conf)

    def stop(self) -> None:
        """End the daemons this object started (slurmd, slurmctld, munged), by pid; nothing else."""
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(name)
            if name not in self.started or pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.started.clear()


def _start_munged(cluster: Cluster) -> None:
    if _munge_works():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run([_program("mungekey"), "--create", "--keyfile", str(key)], check=True, timeout=30)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    for d in (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")):
        d.mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _program("munged")], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not _munge_works():
        if time.monotonic() > deadline:
            raise RuntimeError("munged did not start (munge -n | unmunge fails)")
        time.sleep(0.1)
    pid = _read_pid(Path("/run/munge/munged.pid"))
    if pid is not None:
        cluster.pids["munged"] = pid
        cluster.started.append("munged")


def _start_daemon(cluster: Cluster, name: str, args: list[str]) -> None:
    pid_file = cluster.folder / f"{name}.pid"
    pid = _read_pid(pid_file)
    if pid is not None and _alive(pid):
        cluster.pids[name] = pid
        return
    out = subprocess.run([_program(name), "-f", str(cluster.conf), *args], capture_output=True, text=True,
                         timeout=60, env=cluster.env)
    if out.returncode != 0:
        raise RuntimeError(f"{name} did not start: {out.stderr.strip()[-2000:]}")
    deadline = time.monotonic() + 15
    while (pid := _read_pid(pid_file)) is None or not _alive(pid):
        if time.monotonic() > deadline:
            log = (cluster.folder / f"{name}.log")
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{name} did not stay up; its log ends:\n{tail}")
        time.sleep(0.05)
    cluster.pids[name] = pid
    cluster.started.append(name)


def ensure(folder: Path = DEFAULT_DIR, timeout: float = 60.0) -> Cluster:
    """The test cluster, up and with its node idle: reused when already serving our config, else started."""
    missing = missing_programs()
    if missing:
        raise RuntimeError(f"Slurm is not installed (missing {', '.join(missing)}); run .ci/services/slurm.sh")
    conf = conf_path(folder)
    if conf.exists() and not _is_ours(conf):
        raise RuntimeError(f"{conf} is not a config of ClusterDeck's test cluster; unset SLURM_CONF or remove it")
    cluster = Cluster(conf=conf, folder=folder)
    if _munge_works() and node_state(conf).rstrip("*~#") in ("idle", "mix", "alloc") and conf.exists():
        for name in ("slurmctld", "slurmd"):
            pid = _read_pid(folder / f"{name}.pid")
            if pid is not None:
                cluster.pids[name] = pid
        return cluster  # already up: someone else owns the daemons
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf.parent.mkdir(parents=True, exist_ok=True)
    tmp = conf.with_name(f".{conf.name}.tmp")
    tmp.write_text(slurm_conf(folder), encoding="utf-8")
    os.replace(tmp, conf)
    try:
        _start_munged(cluster)
        _start_daemon(cluster, "slurmctld", ["-i"])
        _start_daemon(cluster, "slurmd", ["-N", NODE])
        deadline = time.monotonic() + timeout
        state = ""
        while (state := node_state(conf)) != "idle":
            if state.startswith(("down", "drain")):
                subprocess.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"], capture_output=True,
                               timeout=10, env=cluster.env)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node is {state or 'not answering'} after {timeout:.0f} s, not idle")
            time.sleep(0.2)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "up":
        cluster = ensure()
        print(f"one-node Slurm up: config {cluster.conf}, partition {PARTITION}, node {NODE} idle")
        if cluster.conf != SYSTEM_CONF:
            print(f"export SLURM_CONF={cluster.conf}")
        return 0
    if command == "down":
        conf = conf_path()
        cluster = Cluster(conf=conf, folder=DEFAULT_DIR, started=["slurmd", "slurmctld"])
        for name in cluster.started:
            pid = _read_pid(DEFAULT_DIR / f"{name}.pid")
            if pid is not None:
                cluster.pids[name] = pid
        cluster.stop()
        return 0
    if command == "status":
        state = node_state(conf_path())
        print(state or "down")
        return 0 if state else 1
    print("usage: python -m tests.engine.slurm_cluster up|down|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
