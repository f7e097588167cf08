"""Transports start a supervisor somewhere and give back its streams; the rest is shared."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from engine.contract.config import Host
from engine.control import netns, transports
from engine.control.transports import LocalTransport, NetnsTransport, SshTransport, SupervisorLaunch
from tests.conftest import ROOT, require, wait_gone

LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
          "print('ready', flush=True); sys.stdin.readline()")


def launch(tmp_path: Path, command: list[str], host: Host | None = None) -> SupervisorLaunch:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return SupervisorLaunch(group="localhost", host=host, command=command, env=env, log=tmp_path / "sup.log")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_kinds_and_the_protocol() -> None:
    assert transports.kind_of(None) == "local" and transports.kind_of(None, isolated=True) == "netns"
    assert transports.kind_of(Host(name="b", address="10.0.0.6")) == "ssh"
    for kind in ("local", "netns", "ssh"):
        made = transports.make(kind)
        assert isinstance(made, transports.Transport) and made.kind == kind
    with pytest.raises(ValueError, match="unknown transport 'nope'"):
        transports.make("nope")


@pytest.mark.parametrize("isolated", [False, True])
def test_a_port_opened_by_the_supervisor_is_reachable_only_without_a_namespace(tmp_path: Path, isolated: bool) -> None:
    if isolated:
        ok, why = netns.available()
        require(ok, f"network namespaces are not available: {why}")
    transport = NetnsTransport() if isolated else LocalTransport()
    port = free_port()
    proc = transport.start(launch(tmp_path, [sys.executable, "-c", LISTEN, str(port)]))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        assert reachable(port) is not isolated
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # end of input ends it, as it ends a supervisor
        assert proc.wait(10) == 0


def test_kill_ends_the_whole_process_group_and_failure_quotes_the_log(tmp_path: Path) -> None:
    transport = LocalTransport()
    code = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('boom: it went wrong', file=sys.stderr, flush=True); print(child.pid, flush=True); "
            "import time; time.sleep(60)")
    where = launch(tmp_path, [sys.executable, "-c", code])
    proc = transport.start(where)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    transport.kill(proc)
    assert proc.wait(5) == -9
    assert wait_gone([child], 5) == [], "the supervisor's child survived kill()"
    message = transport.failure(where, -9, transports.log_tail(where.log))
    assert message == "the supervisor was killed by SIGKILL: boom: it went wrong"


def test_ssh_failure_reads_as_ssh_not_as_a_task() -> None:
    host = Host(name="far", address="10.1.1.1", ssh_host="far.example")
    where = SupervisorLaunch(group="far", host=host, command=["python3"], env={}, log=Path("/nonexistent"))
    assert SshTransport().failure(where, 255, ["ssh: connect to host far.example port 22: Connection refused"]) == (
        "ssh to far.example failed: ssh: connect to host far.example port 22: Connection refused")
    assert SshTransport().failure(where, 1, []) == "the supervisor on far.example (over ssh) exited with code 1"


def test_an_ssh_failure_quotes_ssh_not_its_chatter_nor_tensorflows_start_up_lines(tmp_path: Path) -> None:
    host = Host(name="lab2", address="10.99.0.12", ssh_host="lab2")
    where = SupervisorLaunch(group="lab2", host=host, command=["python3"], env={}, log=tmp_path / "supervisor.log")
    where.log.write_text("\n".join([
        "Warning: Permanently added '10.99.0.12' (ED25519) to the list of known hosts.",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796441802.208458   21041 port.cc:153] oneDNN custom operations are on.",
        "Timeout, server 10.99.0.12 not responding.",
        "I0000 00:00:1796441804.898264   21041 cudart_stub.cc:31] Could not find cuda drivers on your machine",
    ]) + "\n")
    tail = transports.log_tail(where.log)
    assert SshTransport().failure(where, 255, tail) == "ssh to lab2 failed: Timeout, server 10.99.0.12 not responding."
    # a supervisor killed there: no ssh complaint, and nothing of the noise is quoted
    where.log.write_text("Warning: Permanently added '10.99.0.12' (ED25519) to the list of known hosts.\n"
                         "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
    killed = SshTransport().failure(where, 255, transports.log_tail(where.log))
    assert killed == ("the supervisor on lab2 (over ssh) ended abruptly, most likely killed by a signal there (ssh "
                      "itself reported no error)")
    assert SshTransport().failure(where, 143, []) == (
        "the supervisor on lab2 (over ssh) exited with code 143 (ended by SIGTERM, most likely)")
    assert SshTransport().failure(where, -9, ["Timeout, server 10.99.0.12 not responding."]).startswith(
        "the ssh client on this machine (to lab2) was killed by SIGKILL")
    cmd = transports.ssh_command(host, ["true"], connect_timeout=4)
    assert "ConnectTimeout=4" in cmd and "ServerAliveInterval=5" in cmd and cmd[-3:] == ["--", "lab2", "true"]


def test_a_probe_says_whether_anything_answers_at_a_hosts_address() -> None:
    from engine.control import reachability

    port = free_port()
    assert reachability.probe_host("127.0.0.1", [port]) == ""  # refused: the host is up, nothing listens

    def gone(address: str) -> str:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    assert reachability.probe_host("lab9", [port], resolver=gone) == (
        "its address 'lab9' no longer resolves (Name or service not known)")
    # a host that gives no answer at all (a link cut): tests/engine/test_lab.py


FAKE_SSH = """#!/bin/sh
echo "Warning: Permanently added 'x' (ED25519) to the list of known hosts." >&2
echo "ssh: connect to host 10.99.0.13 port 22: Connection refused" >&2
exit 255
"""


def test_the_login_check_names_the_host_and_quotes_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.control import reachability

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    host = Host(name="lab3", address="10.99.0.13", ssh_host="lab3")
    assert reachability.login_problem(host) == (
        "host 'lab3' (lab3, ssh port 22): ssh cannot log in: ssh: connect to host 10.99.0.13 port 22: Connection "
        "refused; expected to log in over SSH without a prompt (BatchMode: a key or an agent)")
