"""Remote hosts over SSH, against a real sshd started on 127.0.0.1 with a throw-away key."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task, replace
from engine.contract.plan import free_port
from engine.control.launcher import Run
from engine.control.transports import SshTransport, SupervisorLaunch, log_tail, ssh_command
from tests.conftest import require, wait_gone, wait_while_live

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def test_ssh_command_quotes_the_remote_command_and_uses_the_users_client() -> None:
    host = Host(name="gpu box", address="10.0.0.5", ssh_host="gpubox", ssh_user="ana", ssh_port=2200,
                python="/opt/my env/bin/python")
    cmd = ssh_command(host, [host.python, "-m", "engine.control.supervisor"])
    assert cmd[0] == "ssh" and "BatchMode=yes" in cmd
    assert cmd[cmd.index("-l") + 1] == "ana" and cmd[cmd.index("-p") + 1] == "2200"
    assert cmd[-3:-1] == ["--", "gpubox"]  # "--" ends ssh's options: the destination is never one
    assert cmd[-1] == "'/opt/my env/bin/python' -m engine.control.supervisor"
    plain = Host(name="b", address="10.0.0.6")
    assert ssh_command(plain, ["python3"])[-3:-1] == ["--", "10.0.0.6"]
    assert not plain.is_local and not host.is_local
    assert Host(name="c", address="localhost").is_local
    assert not Host(name="d", address="127.0.0.1", ssh_host="alias").is_local


def test_the_login_check_that_makes_the_shared_connection_starts_no_remote_shell() -> None:
    # ssh -N: it logs in and leaves the shared connection; the remote shell (its rc files: a pyenv or conda init,
    # tens to hundreds of ms of the host's CPU) first starts for the supervisor's session
    host = Host(name="b", address="10.0.0.6", ssh_host="b")
    cmd = ssh_command(host, None, mux="/tmp/cd-mux", master=True)
    # -f too: before OpenSSH 8.7 a master made with -N and ControlPersist alone still opened a session
    assert cmd[-4:] == ["-f", "-N", "--", "b"] and "ControlMaster=auto" in cmd
    with pytest.raises(ValueError):
        ssh_command(host, None, mux="/tmp/cd-mux")  # a session with no command and no shared connection to make
    with pytest.raises(ValueError):
        ssh_command(host, None, master=True)


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Path]:
    """An sshd on 127.0.0.1 that accepts one throw-away key; yields an ssh config naming it 'cdtest'."""
    require(os.path.exists(SSHD) and shutil.which("ssh") is not None,
            "OpenSSH server/client not installed (.ci/run installs them)")
    d = tmp_path / "ssh"
    d.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id")], check=True)
    shutil.copy(d / "id.pub", d / "authorized_keys")
    port = free_port()
    user = os.environ.get("USER") or __import__("getpass").getuser()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\nPubkeyAuthentication yes\n"
        f"KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\nPidFile {d / 'sshd.pid'}\n"
        "PermitRootLogin yes\nAcceptEnv CLUSTERDECK_*\nLogLevel VERBOSE\n", encoding="utf-8")  # its sessions
    (d / "config").write_text(
        f"Host cdtest\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d / 'id'}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        "  SendEnv CLUSTERDECK_TEST_SESSION\n",
        encoding="utf-8")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=open(d / "sshd.log", "wb"))
    try:
        deadline = time.monotonic() + 10
        while True:
            probe = subprocess.run(["ssh", "-F", str(d / "config"), "-o", "BatchMode=yes", "cdtest", "true"],
                                   capture_output=True, timeout=10)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"test sshd did not accept the key: {probe.stderr.decode()[-500:]}")
            time.sleep(0.2)
        yield d / "config"
    finally:
        proc.terminate()
        proc.wait(5)


@pytest.mark.cluster
def test_run_on_a_remote_host_over_ssh(sshd: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    remote = Host(name="remote", address="127.0.0.1", ssh_host="cdtest", python=sys.executable,
                  tasks=(Task("worker", 0), Task("worker", 1)))
    cfg = config_mod.default_config()
    cfg = replace(cfg, name="ssh-run", cluster=Cluster(hosts=(remote,)),
                  training=replace(cfg.training, steps=100_000))
    run = Run(cfg, runs_root=runs_root)
    got_steps: dict[int, int] = {}
    both = threading.Event()

    def on_event(e: dict) -> None:
        if e["kind"] == "step":
            got_steps[e["replica"]] = e["step"]
            if len(got_steps) == 2:
                both.set()

    run.add_listener(on_event)
    run.start()
    assert wait_while_live(run, both, 120), run.state.summary()
    # the events came back over the SSH connection; the multi-host warning was shown
    assert any(e.get("warning") == "ports-exposed" for e in run.state.infos)
    pids = [t.pid for t in run.state.tasks.values() if t.pid]
    assert len(pids) == 2
    from engine.control import transports

    mux = transports.ssh_mux_path(remote)
    assert mux is not None, "the supervisor's session went through the login check's shared connection"
    t0 = time.monotonic()
    run.stop()
    assert wait_gone(pids, 5) == [], "remote tasks left running after stop"
    assert time.monotonic() - t0 < 6
    assert run.wait(5) == "stopped"
    # the shared connection ended with the run: no ssh master left for ControlPersist's 30 s
    assert not os.path.exists(mux) and transports.ssh_mux_path(remote) is None


FAKE_SSH = """#!/bin/sh
# a stand-in ssh: logs its argv, one word per line, then fails as ssh does when it cannot connect
for word in "$@"; do printf '%s\\n' "$word"; done > "$FAKE_SSH_LOG"
echo "ssh: Could not resolve hostname: Name or service not known" >&2
exit 255
"""


def test_a_host_named_like_an_option_reaches_ssh_after_double_dash(runs_root: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared preset's ``ssh_host: "-oProxyCommand=..."`` must never be read by ssh as an option."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    log = tmp_path / "argv.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    hostile = "-oProxyCommand=touch /tmp/x"
    host = Host(name="remote", address="10.0.0.7", ssh_host=hostile, tasks=(Task("worker", 0), Task("worker", 1)))
    # the transport itself, whatever the config lets through
    launch = SupervisorLaunch(group="remote", host=host, command=["python3", "-m", "engine.control.supervisor"],
                              env=dict(os.environ), log=tmp_path / "supervisor.log")
    transport = SshTransport()
    proc = transport.start(launch)
    assert proc.wait(10) == 255
    argv = log.read_text().splitlines()
    assert argv[-3:] == ["--", hostile, "python3 -m engine.control.supervisor"]
    why = transport.failure(launch, 255, log_tail(launch.log))
    assert why.startswith(f"ssh to {hostile} failed") and "Could not resolve" in why
    # and a whole run, where the config lets such a name through (the config's own check is the first defence)
    cfg = config_mod.default_config()
    cfg = replace(cfg, cluster=Cluster(hosts=(host,)))
    if config_mod.validate(cfg):
        return
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    assert run.wait(20) == "failed"
    assert log.read_text().splitlines()[-2] == hostile
    assert run.state.failed_task == "supervisor@remote" and "Could not resolve" in run.state.reason


def _mux_check(config: Path, mux: str, *args: str) -> int:
    return subprocess.run(["ssh", "-F", str(config), "-o", f"ControlPath={mux}", "-O", *args, "cdtest"],
                          capture_output=True, timeout=10).returncode


def test_the_login_check_leaves_one_shared_connection_that_the_supervisors_session_uses(
        sshd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.control import reachability, transports

    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    host = Host(name="remote", address="127.0.0.1", ssh_host="cdtest", python=sys.executable)
    assert transports.ssh_mux_path(host) is None  # no login check made one yet: a session of its own
    log = sshd.parent / "sshd.log"
    sessions = log.read_text(errors="replace").count("Starting session:")
    assert reachability.login_problem(host) is None
    assert log.read_text(errors="replace").count("Starting session:") == sessions, "the login check ran a session"
    mux = transports.ssh_mux_path(host)
    try:
        assert mux is not None and os.path.dirname(mux).endswith(f"clusterdeck-ssh-{os.getuid()}")
        assert oct(os.stat(os.path.dirname(mux)).st_mode & 0o777) == "0o700"
        assert _mux_check(sshd, mux, "check") == 0, "the login check left no shared connection"
        # sshd stops listening: a new connection is refused, the shared one still carries a supervisor's session
        pid = int((sshd.parent / "sshd.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        assert wait_gone([pid], 5) == []
        launch = SupervisorLaunch(group="remote", host=host, env=dict(os.environ), log=tmp_path / "supervisor.log",
                                  command=["sh", "-c", "read line && echo got $line"])
        proc = SshTransport().start(launch)
        out, _ = proc.communicate(b"spec\n", timeout=20)
        assert (proc.returncode, out) == (0, b"got spec\n"), launch.log.read_text()
        assert log.read_text(errors="replace").count("Starting session:") == sessions + 1  # the first session
        plain = subprocess.run(ssh_command(host, ["true"]), capture_output=True, timeout=20)
        assert plain.returncode == 255 and b"refused" in plain.stderr  # what a session of its own would have met
        # the next launch's login check logs in afresh: the gone sshd is named, the earlier connection notwithstanding
        problem = reachability.login_problem(host)
        assert problem is not None and "ssh cannot log in" in problem and "Connection refused" in problem, problem
    finally:
        if mux is not None:
            _mux_check(sshd, mux, "exit")


def test_a_remote_command_in_the_users_ssh_config_is_named_by_the_login_check(
        sshd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ssh refuses a command line where the config gives the host a RemoteCommand: the supervisor could never start
    from engine.control import reachability

    own = tmp_path / "own_config"
    own.write_text(sshd.read_text().replace("Host cdtest\n", "Host cdtest\n  RemoteCommand echo hello\n"),
                   encoding="utf-8")
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(own))
    host = Host(name="remote", address="127.0.0.1", ssh_host="cdtest")
    problem = reachability.login_problem(host)
    assert problem is not None and "Cannot execute command-line and remote command" in problem, problem
    reachability.close_logins(config_mod.replace(config_mod.default_config(), cluster=Cluster(hosts=(host,))))


def test_the_users_own_connection_sharing_and_the_switch_are_honoured(
        sshd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.control import transports

    host = Host(name="remote", address="127.0.0.1", ssh_host="cdtest")
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    assert transports.ssh_mux_path(host, fresh=True) is not None
    monkeypatch.setenv(transports.SSH_MUX_ENV, "0")
    assert transports.ssh_mux_path(host, fresh=True) is None
    assert "ControlPath" not in " ".join(ssh_command(host, ["true"], mux=transports.ssh_mux_path(host, fresh=True)))
    monkeypatch.delenv(transports.SSH_MUX_ENV)
    own = tmp_path / "own_config"
    own.write_text(sshd.read_text().replace("Host cdtest\n", f"Host cdtest\n  ControlMaster auto\n"
                                                             f"  ControlPath {tmp_path}/%C\n"), encoding="utf-8")
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(own))
    assert transports.ssh_mux_path(host, fresh=True) is None  # theirs applies, untouched


def test_ssh_failing_on_a_shared_connection_is_still_said_as_ssh_said_it(tmp_path: Path) -> None:
    # the shared connection's own complaint goes to its log (ssh -E), not to the session's stderr
    host = Host(name="lab3", address="10.99.0.13", ssh_host="lab3")
    launch = SupervisorLaunch(group="lab3", host=host, command=["python3"], env={}, log=tmp_path / "supervisor.log")
    transport = SshTransport()
    shared_log = tmp_path / "mux.log"
    shared_log.write_text("Warning: Permanently added '10.99.0.13' (ED25519) to the list of known hosts.\n")
    transport._mux_logs["lab3"] = (shared_log, shared_log.stat().st_size)
    assert "killed by a signal there" in transport.failure(launch, 255, [])  # nothing from ssh: the remote end
    with open(shared_log, "a") as fh:
        fh.write("Timeout, server 10.99.0.13 not responding.\n")
    assert transport.failure(launch, 255, []) == "ssh to lab3 failed: Timeout, server 10.99.0.13 not responding."
