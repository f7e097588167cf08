"""The lab of hosts on this machine (``.ci/services/lab.sh``, docs/lab.md) as pytest fixtures.

Each host ``labN`` is a network namespace on the bridge ``cdbr0`` at 10.99.0.(10+N) with its own sshd (root logs
in with the lab's key); the file system is shared, so a run folder and this checkout are the same on every host.
:func:`lab` brings the lab up where it is not (as root), and otherwise skips the test saying why; with ``CI=true``
it fails instead (CI starts the lab: ``.ci/run``). A lab this session brought up is taken down at its end.

Tests of the lab change its hosts (a link cut, a host slowed, an sshd stopped): one test at a time holds the lab
(a lock file shared by pytest-xdist's workers), and whatever a test changed is put back when it ends.
Import the fixtures into a test module: ``from tests.engine.lab import lab_fixture, lab_session_fixture``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from engine.contract.config import Host, Task
from tests.conftest import ROOT, require

LAB_SH = ROOT / ".ci" / "services" / "lab.sh"
DIR = Path(os.environ.get("CLUSTERDECK_LAB_DIR", "/tmp/clusterdeck-lab"))
SSH_CONFIG = DIR / "ssh_config"
HOSTS = 3


def address(n: int) -> str:
    return f"10.99.0.{10 + n}"


def _lab(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(LAB_SH), *args], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"lab.sh {' '.join(args)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done


def why_no_lab() -> str:
    """Why the lab cannot be here (empty: it can)."""
    if sys.platform != "linux":
        return "the lab needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the lab of hosts needs root (network namespaces, links)"
    missing = [p for p in ("ip", "ssh", "ssh-keygen") if shutil.which(p) is None]
    if not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()):
        missing.append("sshd")
    if missing:
        return f"the lab needs {', '.join(missing)} (iproute2, OpenSSH)"
    return ""


@dataclass
class Lab:
    """The lab's hosts, and what a test may do to them (each undone by :meth:`restore`)."""

    ssh_config: Path = SSH_CONFIG
    cut_hosts: set[int] = field(default_factory=set)
    slowed: set[int] = field(default_factory=set)
    stopped_sshd: set[int] = field(default_factory=set)

    def host(self, n: int, *tasks: tuple[str, int]) -> Host:
        """Host ``labN`` reached over ssh (the lab's ssh config names it), running this interpreter."""
        return Host(name=f"lab{n}", address=address(n), ssh_host=f"lab{n}", python=sys.executable,
                    tasks=tuple(Task(role, index) for role, index in tasks))

    def cut(self, n: int) -> None:
        """A partition: the host's link goes down (nothing crosses it either way)."""
        self.cut_hosts.add(n)
        _lab("cut", f"lab{n}")

    def heal(self, n: int) -> None:
        _lab("heal", f"lab{n}")
        self.cut_hosts.discard(n)

    def slow(self, n: int, percent: int) -> None:
        """The host gets ``percent`` of one core from now on (a CPU cgroup's quota on all it runs)."""
        self.slowed.add(n)
        _lab("slow", f"lab{n}", str(percent))

    def stop_sshd(self, n: int) -> None:
        self.stopped_sshd.add(n)
        _lab("sshd-stop", f"lab{n}")

    def processes(self, n: int, marker: str) -> list[psutil.Process]:
        """Processes of host ``labN`` whose command line holds ``marker`` (its network namespace's)."""
        done = subprocess.run(["ip", "netns", "pids", f"cdlab{n}"], capture_output=True, text=True)
        out = []
        for pid in done.stdout.split():
            try:
                proc = psutil.Process(int(pid))
                if marker in " ".join(proc.cmdline()):
                    out.append(proc)
            except (psutil.Error, ValueError):
                continue
        return out

    def restore(self) -> None:
        """Put back what the test changed: links up, speed, sshd."""
        errors = []
        for n in sorted(self.cut_hosts):
            try:
                self.heal(n)
            except RuntimeError as exc:
                errors.append(str(exc))
        for n in sorted(self.slowed):
            _lab("unslow", f"lab{n}", check=False)
        self.slowed.clear()
        for n in sorted(self.stopped_sshd):
            try:
                _lab("sshd-start", f"lab{n}")
            except RuntimeError as exc:
                errors.append(str(exc))
        self.stopped_sshd.clear()
        assert not errors, errors


@pytest.fixture(scope="session", name="lab_session")
def lab_session_fixture() -> Iterator[str]:
    """"" once the lab is up (brought up here if it was not, and then taken down at the end); else why not.

    Every pytest worker's session holds ``users.lock`` shared while it may use the lab; the one that brought the
    lab up takes it down only once it alone holds it (the others' sessions ended)."""
    why = why_no_lab()
    if why:
        yield why
        return
    DIR.mkdir(parents=True, exist_ok=True)
    with open(DIR / "users.lock", "w") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        started = False
        with open(DIR / "tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker at a time looks, and brings it up
            if _lab("status", check=False).returncode != 0:  # absent, or not whole: (re)made, idempotently
                absent = subprocess.run(["ip", "link", "show", "cdbr0"], capture_output=True).returncode != 0
                try:
                    _lab("up")
                    started = absent  # a lab that was there (and only mended here) is left up
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    why = f"the lab of hosts did not come up: {exc}"
        try:
            yield why
        finally:
            if started:
                fcntl.flock(users, fcntl.LOCK_EX)  # waits for the other workers' sessions to end
                _lab("down", check=False)


@pytest.fixture(name="lab")
def lab_fixture(lab_session: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """The lab, held by this test alone; ssh reaches its hosts by name (``CLUSTERDECK_SSH_CONFIG``)."""
    require(not lab_session, lab_session)
    with open(DIR / "tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest worker's lab test waits here
        monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(SSH_CONFIG))
        held = Lab()
        try:
            yield held
        finally:
            held.restore()


def wait_until(condition: object, timeout: float, poll: float = 0.1) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(poll)
    return bool(condition())  # type: ignore[operator]
