"""Runs that outlive the terminal: ``clusterdeck run --detach``, ``ls``, ``attach``, ``stop`` and the control socket.

Real processes throughout: the command in a pseudo-terminal whose closing sends SIGHUP, a detached launcher
killed with SIGKILL, the socket's owner check against another uid.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder, process_token
from engine.control import control_socket
from tests.conftest import ROOT, command_line

TINY = """\
schema: 1
name: tiny-detach
cluster:
  hosts:
  - name: local
    address: localhost
    gpus: 0
    tasks:
    - {role: worker, index: 0, port: auto}
parallelism:
  mode: data
data: {source: synthetic, shape: [32], classes: 4, size: 1024}
model: {name: mlp, hidden: [16]}
training:
  global_batch_size: 32
  steps: 1000000
  optimizer: sgd
  learning_rate: 0.05
  seed: 1
  checkpoint_every: 0
"""


def env_for(tmp_path: Path, tag: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERDECK_RUNS=str(tmp_path / "runs"), CLUSTERDECK_TEST_TAG=tag)


def cli(tmp_path: Path, tag: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=tmp_path, env=env_for(tmp_path, tag),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]


def tagged(tag: str, marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if (p.environ().get("CLUSTERDECK_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE
                    and marker in command_line(p)):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until(check: Any, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    return check()


def status(run_dir: Path) -> dict[str, Any]:
    return control_socket.request(RunFolder(run_dir).control_socket, "status")


def stepping(run_dir: Path, timeout: float = 90) -> int:
    """The run's step once it has trained some (its tasks import TensorFlow first)."""
    step = wait_until(lambda: status(run_dir)["step"] > 20 and status(run_dir)["step"], timeout, 0.3)
    assert step, f"no steps: {status(run_dir)}"
    return int(step)


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


def detach(tmp_path: Path, tag: str, preset: Path) -> Path:
    out = cli(tmp_path, tag, "run", str(preset), "--detach", "--json")
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["kind"] == "detached"
    return Path(answer["run_dir"])


def end(run_dir: Path) -> None:
    """Whatever a failed test left: stop the run through its socket, else kill its launcher."""
    try:
        control_socket.request(RunFolder(run_dir).control_socket, "stop", timeout=30)
    except control_socket.ControlError:
        pass


# --------------------------------------------------------------------------- the control socket (no TensorFlow)


def short_dir() -> Path:
    """A private folder whose socket path fits a Unix socket address (pytest's tmp_path may not)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="cd-sock-"))


def test_the_socket_is_owner_only_and_serves_several_clients_at_once(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 60) / ("y" * 60)  # longer than a socket address may be: reached through its folder
    deep.mkdir(parents=True)
    path = deep / "control.sock"

    def slow(message: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.5)
        return {"ok": True, "state": "running"}

    server = control_socket.ControlServer(path, slow).start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        replies: list[dict[str, Any]] = []
        started = time.monotonic()
        threads = [threading.Thread(target=lambda: replies.append(control_socket.request(path, "status")))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(replies) == 6 and all(r["state"] == "running" for r in replies)
        assert time.monotonic() - started < 2.5, "clients were served one after another"
        with pytest.raises(control_socket.ControlError, match="unknown command 'reboot'; expected one of"):
            control_socket.request(path, "reboot")
    finally:
        server.close()
    assert not path.exists()
    with pytest.raises(control_socket.ChannelGone):
        control_socket.request(path, "status")


def test_a_peer_of_another_uid_is_refused_by_its_credentials() -> None:
    folder = short_dir()
    path = folder / "control.sock"
    server = control_socket.ControlServer(path, lambda m: {"ok": True}, owner_uid=os.getuid() + 4242).start()
    try:
        with pytest.raises(control_socket.ChannelRefused, match=f"belongs to uid {os.getuid() + 4242}"):
            control_socket.request(path, "stop")
    finally:
        server.close()
        folder.rmdir()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_gets_a_clear_refusal_not_a_traceback(tmp_path: Path) -> None:
    folder = short_dir()
    os.chmod(folder, 0o755)  # the folder lets them in; the socket (0600) and its owner check do not
    path = folder / "control.sock"
    server = control_socket.ControlServer(path, lambda m: {"ok": True}).start()
    try:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # another user, in this interpreter (that user may not be able to exec ours)
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    control_socket.request(path, "stop")
                    said = "answered"
                except control_socket.ChannelRefused as exc:
                    said = f"refused: {exc}"
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    said = f"other: {exc!r}"
                os.write(write, said.encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(child, 0)
        said = os.read(read, 4096).decode()
        os.close(read)
        assert said.startswith("refused:") and "the run's control channel is its owner's alone" in said, said
    finally:
        server.close()
        os.rmdir(folder)


# --------------------------------------------------------------------------- bad input (no TensorFlow)


def dead_pid() -> tuple[int, str]:
    proc = subprocess.Popen(["sleep", "30"])
    token = process_token(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, token


def test_ls_attach_and_stop_of_a_run_whose_launcher_died_and_of_what_is_no_run(tmp_path: Path, preset: Path) -> None:
    tag = uuid.uuid4().hex
    runs = tmp_path / "runs"
    folder = RunFolder.create(runs, "orphan")
    folder.write_config(config_mod.load(preset))
    pid, token = dead_pid()
    folder.write_meta(state="running", name="tiny-detach", mode="data", step=42,
                      summary={"total_steps": 1000000, "steps": 42},
                      launcher={"pid": pid, "host": socket.gethostname(), "token": token})
    folder.events.write_text(json.dumps({"v": 1, "kind": "run", "task": "launcher", "t": time.time(),
                                         "state": "running"}) + "\n", encoding="utf-8")
    (runs / "not-a-run").mkdir()

    out = cli(tmp_path, tag, "ls", "--json")
    no_traceback(out)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["run"], r["state"], r["step"], r["total_steps"]) for r in rows] == \
        [(folder.path.name, "interrupted", 42, 1000000)]
    out = cli(tmp_path, tag, "ls")
    assert "interrupted" in out.stdout and "42 of 1000000" in out.stdout, out.stdout

    started = time.monotonic()
    out = cli(tmp_path, tag, "attach", "orphan", timeout=30)
    no_traceback(out)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "interrupted" in out.stdout and "history" in out.stdout
    assert time.monotonic() - started < 20

    out = cli(tmp_path, tag, "stop", "orphan")
    assert out.returncode == 0 and "has ended: interrupted" in out.stdout, out.stdout + out.stderr

    for args, expected in ((("attach", str(runs / "not-a-run")), "not a run folder"),
                           (("attach", "nosuchrun"), "no run named 'nosuchrun'"),
                           (("stop", str(tmp_path / "missing")), "no such folder"),
                           (("attach", str(preset)), "is a file, not a folder")):
        out = cli(tmp_path, tag, *args)
        no_traceback(out)
        assert out.returncode == 2 and expected in out.stderr, (args, out.stderr)


# --------------------------------------------------------------------------- real detached runs


def in_a_terminal(tmp_path: Path, tag: str, command: str) -> tuple[int, int]:
    """``bash -c command`` as the session leader of a fresh pseudo-terminal (a terminal window); its pid and
    the terminal's master end (closing it is closing the window: the kernel sends SIGHUP)."""
    pid, master = pty.fork()
    if pid == 0:  # the child: exec at once
        try:
            os.chdir(tmp_path)
            os.execve("/bin/bash", ["bash", "-c", command], env_for(tmp_path, tag))
        finally:
            os._exit(127)
    return pid, master


def read_until(master: int, marker: bytes, timeout: float) -> bytes:
    import select

    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.cluster
def test_a_detached_run_outlives_its_terminal_and_is_listed_attached_and_stopped(tmp_path: Path,
                                                                                 preset: Path) -> None:
    tag = uuid.uuid4().hex
    shell, master = in_a_terminal(tmp_path, tag, f"{sys.executable} -m engine.cli run {preset} --detach; sleep 60")
    run_dir = None
    try:
        said = read_until(master, b"all runs:", 120).decode("utf-8", "replace")
        assert "detached" in said and "run folder:" in said, said
        run_dir = Path(said.split("run folder:", 1)[1].split()[0])
        stepping(run_dir)
        os.close(master)  # the terminal window closes: SIGHUP to its session
        assert wait_until(lambda: os.waitpid(shell, os.WNOHANG)[0] == shell, 10), "the shell outlived its terminal"
        before = status(run_dir)["step"]
        assert wait_until(lambda: status(run_dir)["step"] > before + 20, 30), "the run stopped stepping"
        assert status(run_dir)["state"] == "running" and status(run_dir)["detached"]

        out = cli(tmp_path, tag, "ls")
        assert run_dir.name in out.stdout and "running (detached)" in out.stdout, out.stdout

        # a second front end mid-run: history, then live; Ctrl+C detaches and the run goes on
        watcher = subprocess.Popen([sys.executable, "-m", "engine.cli", "attach", run_dir.name], cwd=tmp_path,
                                   env=env_for(tmp_path, tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)
        watcher.send_signal(signal.SIGINT)
        shown, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 0, err[-3000:]
        assert "Traceback" not in shown + err and "detached from" in shown, shown + err
        assert "worker:0" in shown and "replica" in shown, shown
        assert status(run_dir)["state"] == "running"

        # attached while the run ends: it shows the end and returns
        follower = subprocess.Popen([sys.executable, "-m", "engine.cli", "attach", str(run_dir)], cwd=tmp_path,
                                    env=env_for(tmp_path, tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        time.sleep(3)
        stops: list[subprocess.CompletedProcess[str]] = []
        both = [threading.Thread(target=lambda: stops.append(cli(tmp_path, tag, "stop", run_dir.name)))
                for _ in range(2)]
        for t in both:
            t.start()
        for t in both:
            t.join()
        for out in stops:
            no_traceback(out)
            assert out.returncode == 0, out.stdout + out.stderr
            assert "stopped at step" in out.stdout or "has ended (stopped)" in out.stdout, out.stdout
        shown, err = follower.communicate(timeout=30)
        assert follower.returncode == 1 and "stopped" in shown and "Traceback" not in shown + err, shown + err
        out = cli(tmp_path, tag, "stop", run_dir.name)
        assert out.returncode == 0 and "has ended (stopped)" in out.stdout, out.stdout
        assert json.loads((run_dir / "run.json").read_text())["state"] == "stopped"
        assert not (run_dir / "control.sock").exists()
        assert wait_until(lambda: not tagged(tag, "engine."), 10), "processes outlived the stopped run"
    finally:
        if run_dir is not None:
            end(run_dir)
        try:
            os.kill(shell, signal.SIGKILL)
            os.waitpid(shell, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


@pytest.mark.cluster
def test_killing_the_detached_launcher_ends_every_task_within_seconds(tmp_path: Path, preset: Path) -> None:
    tag = uuid.uuid4().hex
    run_dir = detach(tmp_path, tag, preset)
    try:
        stepping(run_dir)
        tasks = tagged(tag, "engine.runtime.task")
        assert tasks, "no task process found"
        launcher = json.loads((run_dir / "launcher.json").read_text())
        assert launcher["detached"] and os.getsid(launcher["pid"]) == launcher["pid"], "not in a session of its own"
        os.kill(launcher["pid"], signal.SIGKILL)
        killed = time.monotonic()
        assert wait_until(lambda: not tagged(tag, "engine.runtime.task"), 10), \
            f"tasks outlived their launcher: {[p.pid for p in tagged(tag, 'engine.runtime.task')]}"
        assert time.monotonic() - killed < 10
        assert wait_until(lambda: not tagged(tag, "engine."), 10)

        rows = [json.loads(line) for line in cli(tmp_path, tag, "ls", "--json").stdout.splitlines()]
        assert [r["state"] for r in rows] == ["interrupted"]
        out = cli(tmp_path, tag, "attach", run_dir.name, timeout=30)
        no_traceback(out)
        assert out.returncode == 1 and "interrupted" in out.stdout and "replica" in out.stdout, out.stdout
        out = cli(tmp_path, tag, "stop", run_dir.name)
        assert out.returncode == 0 and "interrupted" in out.stdout, out.stdout
    finally:
        end(run_dir)
