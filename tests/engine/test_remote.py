"""Remote attach, ls and stop over the user's own OpenSSH, against a real sshd on 127.0.0.1.

The runs here are simulated (no TensorFlow): a run folder written through the launcher's own ``RunRecord``, its
launcher this test process (``launcher.json``), events appended live from a thread as the launcher appends them.
``test_remote_run.py`` does the same with real detached runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from engine.contract.config import default_config, replace
from engine.contract.run_folder import RunFolder, process_token
from engine.contract.series_store import Block
from engine.control import control_socket
from engine.control.remote import RemoteError, RemoteRun, RunSummary, remote_list, remote_stop
from engine.control.remote_protocol import (
    MISSING_MARK,
    BlobAssembler,
    RemoteTarget,
    TargetError,
    blob,
    decode_block,
    encode_block,
    looks_remote,
    remote_shell,
)
from engine.control.run_record import RunRecord
from engine.observe.run_reader import read_events, read_run_folder
from tests.conftest import ROOT
from tests.engine.test_ssh import sshd  # noqa: F401 - the real sshd on 127.0.0.1 (fixture)

REMOTE = f"{sys.executable} -m engine.cli"  # how ClusterDeck starts "there" (this checkout)


# --------------------------------------------------------------------------- a simulated run


class SimulatedRun:
    """A run folder whose launcher is this process: ``history_s`` of history of ``replicas`` replicas ending now,
    then (``live``) steps at ``hz`` from a thread until :meth:`end` or :meth:`die`."""

    def __init__(self, root: Path, *, history_s: float = 30.0, replicas: int = 2, hz: float = 20.0,
                 live: bool = True) -> None:
        cfg = default_config()
        self.folder = RunFolder.create(root, "sim")
        self.folder.write_config(replace(cfg, name="sim", training=replace(cfg.training, steps=10**9)))
        self.record = RunRecord(self.folder, describe=lambda: {"state": "running", "name": "sim", "mode": "data",
                                                               "step": self.tick}, on_failure=print)
        self.replicas, self.hz, self.tick = replicas, hz, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        t0 = time.time() - history_s
        self.record.write_event({"v": 1, "kind": "run", "task": "launcher", "t": t0 - 1, "state": "running"})
        for r in range(replicas):
            self.record.write_event({"v": 1, "kind": "status", "task": f"worker:{r}", "t": t0 - 0.5,
                                     "state": "running"})
        ticks = int(history_s * hz)
        for self.tick in range(ticks):
            self._write(t0 + self.tick / hz)
        self.record.flush()
        self.record.write_meta("running")
        self.folder.launcher_json.write_text(json.dumps(
            {"pid": os.getpid(), "token": process_token(os.getpid()), "host": socket.gethostname(),
             "socket": str(self.folder.control_socket), "detached": True, "started": ""}), encoding="utf-8")
        self._thread = threading.Thread(target=self._live, daemon=True)
        if live:
            self._thread.start()

    def _write(self, t: float) -> None:
        for r in range(self.replicas):
            self.record.write_event({"v": 1, "kind": "step", "task": f"worker:{r}", "t": t, "replica": r,
                                     "step": self.tick, "loss": 1.0 / (1 + self.tick), "step_time": 0.05})
        if self.tick % 10 == 0:
            for r in range(self.replicas):
                self.record.write_event({"v": 1, "kind": "device", "task": f"worker:{r}", "t": t,
                                         "cpu_percent": 50.0, "rss_bytes": 1e9})

    def _live(self) -> None:
        while not self._stop.wait(1.0 / self.hz):
            with self._lock:
                self.tick += 1
                self._write(time.time())
                self.record.catch_up(lambda: True)

    def end(self, state: str = "stopped") -> None:
        """The run ends as its launcher records an end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            self.record.write_event({"v": 1, "kind": "run", "task": "launcher", "t": time.time(), "state": state})
            self.record.write_meta(state)
            self.record.close()

    def die(self) -> None:
        """The launcher dies without a word: ``launcher.json`` names a process that is gone."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            self.record.close()
        proc = subprocess.Popen(["sleep", "30"])
        token = process_token(proc.pid)
        proc.kill()
        proc.wait()
        self.folder.launcher_json.write_text(json.dumps(
            {"pid": proc.pid, "token": token, "host": socket.gethostname(), "socket": "", "detached": True,
             "started": ""}), encoding="utf-8")


@pytest.fixture
def ssh_env(sshd: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    monkeypatch.setenv("CLUSTERDECK_REMOTE_COMMAND", REMOTE)
    return sshd


def followers(path: Path | str) -> list[psutil.Process]:
    """``clusterdeck follow`` processes of ``path`` still running on this machine (the remote side here)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "follow" in cmd and any(str(path) in word for word in cmd) and "engine.cli" in " ".join(cmd):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.Error:
                continue
    return found


def wait_until(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    return check()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    return out


# --------------------------------------------------------------------------- no ssh: names and the wire


def test_targets_are_read_as_scp_and_ssh_urls_and_bad_ones_are_named() -> None:
    assert RemoteTarget.parse("ana@gpubox:/data/runs/x", need_path=True) == \
        RemoteTarget(host="gpubox", user="ana", path="/data/runs/x")
    assert RemoteTarget.parse("gpubox:x", need_path=True) == RemoteTarget(host="gpubox", path="x")
    assert RemoteTarget.parse("ssh://ana@10.0.0.5:2222/runs/x", need_path=True) == \
        RemoteTarget(host="10.0.0.5", user="ana", port=2222, path="/runs/x")
    assert RemoteTarget.parse("ana@gpubox", need_path=False).path == ""
    assert str(RemoteTarget.parse("ana@gpubox:/r", need_path=True)) == "ana@gpubox:/r"
    for bad, said in (("ana@gpubox", "no run named after the host"), ("-oProxyCommand=x:/r", "not a host name"),
                      ("ssh://h:99999/r", "not a number from 1 to 65535"), ("a b@h:/r", "not a user name"),
                      (":/r", "no host named")):
        with pytest.raises(TargetError, match=said):
            RemoteTarget.parse(bad, need_path=True)
    assert looks_remote("ana@gpubox:/x") and looks_remote("gpubox:run") and looks_remote("ssh://h/x")
    assert not looks_remote("some-run") and not looks_remote("./a:b") and not looks_remote("/tmp/a:b")
    with pytest.raises(RemoteError, match="not a host name"):
        RemoteRun("-evil:/x")


def test_the_curves_view_and_blobs_cross_the_wire_unchanged() -> None:
    rng = np.random.default_rng(0)
    n = 5000
    block = Block(np.repeat(np.arange(4, dtype=np.uint32), n // 4), np.arange(n, dtype=np.float64),
                  np.arange(n, dtype=np.float64) + 0.5, np.arange(n, dtype=np.float64), np.arange(n, dtype=np.float64),
                  np.ones(n, np.uint32), ["loss", "metrics.accuracy"], 1.0)
    for c in block.cols:
        v = rng.random(n).astype(np.float32)
        block.min[c], block.max[c], block.last[c], block.sum[c] = v, v, v, v.astype(np.float64)
        block.count[c] = np.ones(n, np.uint32)
    back = decode_block(encode_block(block))
    assert back.cols == block.cols and back.width == 1.0
    for name in ("owner", "t_first", "t_last", "x_first", "x_last", "n"):
        np.testing.assert_array_equal(getattr(back, name), getattr(block, name))
    for c in block.cols:
        for stat in ("min", "max", "last", "sum", "count"):
            np.testing.assert_array_equal(getattr(back, stat)[c], getattr(block, stat)[c])
    data = os.urandom(200_000)
    lines = list(blob("series:step", data, group="step"))
    assert len(lines) > 1 and all(len(json.dumps(e)) < 60_000 for e in lines)
    assembler = BlobAssembler()
    got = [assembler.add(e) for e in lines]
    assert got[:-1] == [None] * (len(lines) - 1) and got[-1] == ("series:step", data, {"group": "step"})
    with pytest.raises(ValueError, match="out of order"):
        BlobAssembler().add(lines[1])


def test_a_machine_without_clusterdeck_is_told_by_the_remote_shell(tmp_path: Path) -> None:
    """The remote command line, run by a shell whose PATH has no clusterdeck: the mark the front end reads."""
    out = subprocess.run(["sh", "-c", remote_shell(None, ["--protocol", "1", "--", "/r"])], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=10)
    assert out.returncode == 127 and MISSING_MARK in out.stderr


# --------------------------------------------------------------------------- over the real sshd


@pytest.mark.cluster
def test_history_over_ssh_is_what_the_folder_holds_locally(ssh_env: Path, tmp_path: Path) -> None:
    sim = SimulatedRun(tmp_path / "runs", history_s=120, live=False)
    sim.end("finished")
    config, local, _ = read_run_folder(sim.folder.path)
    with RemoteRun(f"cdtest:{sim.folder.path}") as run:
        assert run.config == config and run.run_dir == f"cdtest:{sim.folder.path}"
        assert run.state.state == "finished" == local.state
        assert sorted(run.state.history.series) == sorted(local.history.series)
        for key, series in local.history.series.items():
            assert len(run.state.history.series[key]) == len(series), key
        assert {r: v.step for r, v in run.state.replicas.items()} == {r: v.step for r, v in local.replicas.items()}
        assert list(run.events(timeout=10)) == [] and run.done  # an ended run: the history, then the end
    assert wait_until(lambda: not followers(sim.folder.path), 5)


@pytest.mark.cluster
def test_live_steps_over_ssh_survive_a_dropped_connection_none_lost_none_twice(ssh_env: Path, tmp_path: Path) -> None:
    sim = SimulatedRun(tmp_path / "runs", history_s=10)
    run = RemoteRun(f"cdtest:{sim.folder.path}", reconnect_s=30).open()
    received: list[dict[str, Any]] = []
    notes: list[str] = []
    run.add_listener(lambda e: received.append(e) if e["kind"] == "step" else
                     notes.append(e["message"]) if e.get("task") == "remote" else None)
    try:
        attached_at = time.time()
        deadline = time.monotonic() + 20
        while sum(e["t"] > attached_at for e in received) < 40 and time.monotonic() < deadline:
            run.wait(0.1)
        assert sum(e["t"] > attached_at for e in received) >= 40, "no live steps over ssh"
        first_ssh = run.ssh_pid
        os.kill(first_ssh, signal.SIGKILL)  # the connection drops (the network, a laptop lid)
        deadline = time.monotonic() + 30
        while run.reconnects < 1 and time.monotonic() < deadline:
            run.wait(0.1)
        assert run.reconnects == 1 and run.ssh_pid != first_ssh, notes
        time.sleep(1.5)  # live again on the new connection
        run.wait(0.5)
        sim.end("stopped")
        assert run.wait(30) == "stopped" and run.done
    finally:
        run.close()
    assert any("lost" in n for n in notes) and any("reconnected" in n for n in notes), notes
    live = [(e["replica"], e["t"]) for e in received if e["t"] > attached_at]
    assert len(live) == len(set(live)), "a step was folded twice"
    on_disk = [(e["replica"], e["t"]) for e in read_events(sim.folder.path)
               if e["kind"] == "step" and e["t"] > attached_at]
    assert sorted(live) == sorted(on_disk), f"{len(set(on_disk) - set(live))} steps lost over the drop"
    assert wait_until(lambda: not followers(sim.folder.path), 5), "a follower outlived its connection"


@pytest.mark.cluster
def test_bad_runs_over_ssh_get_one_line_naming_the_host_and_never_hang(ssh_env: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "not-a-run").mkdir(parents=True)
    started = time.monotonic()
    for target, said in ((f"cdtest:{runs / 'not-a-run'}", "not a run folder"),
                         (f"cdtest:{tmp_path / 'missing'}", "no such folder"),
                         ("root@cdtest:nosuchrun", "nosuchrun")):
        with pytest.raises(RemoteError, match=said) as exc:
            RemoteRun(target).open()
        assert str(exc.value).startswith(("cdtest: ", "root@cdtest: ")) and "\n" not in str(exc.value)
    out = cli("attach", f"cdtest:{runs / 'not-a-run'}")
    assert out.returncode == 2 and out.stderr.startswith("clusterdeck: cdtest: ") and "not a run folder" in out.stderr

    # another user's run: its launcher refuses this uid on the control socket (SO_PEERCRED)
    theirs = SimulatedRun(runs, history_s=2, live=False)
    server = control_socket.ControlServer(theirs.folder.control_socket, lambda m: {"ok": True},
                                          owner_uid=os.getuid() + 4242).start()
    try:
        with pytest.raises(RemoteError, match=f"belongs to uid {os.getuid() + 4242}"):
            RemoteRun(f"cdtest:{theirs.folder.path}").open()
        with pytest.raises(RemoteError, match="belongs to uid"):
            remote_stop(f"cdtest:{theirs.folder.path}")
        out = cli("stop", f"cdtest:{theirs.folder.path}")
        assert out.returncode == 1 and "only the run's owner" in out.stderr, out.stderr
    finally:
        server.close()
        theirs.end()

    # no clusterdeck there, an older one without the follower, another protocol
    fake_old = tmp_path / "old-clusterdeck"
    fake_old.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'clusterdeck 0.0.9'; exit 0; fi\n"
                        "echo \"clusterdeck: error: argument command: invalid choice: 'follow'\" >&2\nexit 2\n")
    fake_new = tmp_path / "new-clusterdeck"
    fake_new.write_text("#!/bin/sh\necho '{\"v\":1,\"kind\":\"info\",\"task\":\"follower\",\"t\":1,"
                        "\"message\":\"hello\",\"follow\":\"hello\",\"protocol\":99,\"version\":\"9.0\"}'\n"
                        "cat >/dev/null\n")  # then waits for its stdin to close, as a follower does
    for f in (fake_old, fake_new):
        f.chmod(0o755)
    for command, said in (("/nonexistent/clusterdeck", "/nonexistent/clusterdeck was not found there"),
                          (f"sh -c 'echo \"{MISSING_MARK}\" >&2; exit 127' --", "ClusterDeck is not installed there"),
                          (str(fake_old), "older than remote attach (it has no 'follow' command; version there: 0.0.9"),
                          (str(fake_new), "ClusterDeck 9.0 there speaks follower protocol 99")):
        with pytest.raises(RemoteError, match=said.replace("(", r"\(").replace(")", r"\)")) as exc:
            RemoteRun(f"cdtest:{runs}", remote_command=command).open()
        assert str(exc.value).startswith("cdtest: ")
    with pytest.raises(RemoteError, match="cdtest: no answer within 3 s"):  # logged in, but nothing answers
        RemoteRun(f"cdtest:{runs}", remote_command="cat >/dev/null; true", hello_timeout=3).open()
    out = cli("ls", "cdtest", "--remote-clusterdeck", str(fake_new))
    assert out.returncode == 2 and "speaks follower protocol 99" in out.stderr
    out = cli("attach", "nohost.invalid:/x")
    assert out.returncode == 2 and "nohost.invalid: ssh failed" in out.stderr
    assert time.monotonic() - started < 90


@pytest.mark.cluster
def test_a_run_whose_launcher_died_reads_interrupted_with_its_history(ssh_env: Path, tmp_path: Path) -> None:
    sim = SimulatedRun(tmp_path / "runs", history_s=20, live=False)
    sim.die()
    run = RemoteRun(f"cdtest:{sim.folder.path}").open()
    try:
        assert run.state.state == "interrupted" and run.state.history.total_points() > 0
        assert run.wait(10) == "interrupted" and run.done
    finally:
        run.close()
    out = cli("attach", f"cdtest:{sim.folder.path}")
    assert out.returncode == 1 and "interrupted" in out.stdout and "history" in out.stdout, out.stdout
    out = cli("stop", f"cdtest:{sim.folder.path}")
    assert out.returncode == 0 and "has ended: interrupted" in out.stdout, out.stdout + out.stderr
    rows = [json.loads(line) for line in cli("ls", f"cdtest:{sim.folder.path.parent}", "--json").stdout.splitlines()]
    assert [(r["run"], r["state"], r["host"] if "host" in r else "cdtest") for r in rows] == \
        [(sim.folder.path.name, "interrupted", "cdtest")]


@pytest.mark.cluster
def test_attaching_while_the_run_ends_ends_with_it(ssh_env: Path, tmp_path: Path) -> None:
    for delay in (0.0, 0.3, 0.8):  # the end before, during and after the history
        sim = SimulatedRun(tmp_path / f"runs{delay}", history_s=5)
        timer = threading.Timer(delay, sim.end)
        started = time.monotonic()
        timer.start()
        try:
            run = RemoteRun(f"cdtest:{sim.folder.path}").open()
            try:
                assert run.wait(20) == "stopped" and run.done
            finally:
                run.close()
        finally:
            timer.join()
        assert time.monotonic() - started < 25
        path = sim.folder.path
        assert wait_until(lambda path=path: not followers(path), 5)


@pytest.mark.cluster
def test_ls_over_ssh_lists_what_ls_lists_there(ssh_env: Path, tmp_path: Path) -> None:
    sim = SimulatedRun(tmp_path / "runs", history_s=3, live=False)
    try:
        here = [json.loads(line) for line in cli("ls", "--out", str(tmp_path / "runs"), "--json").stdout.splitlines()]
        there = remote_list(f"root@cdtest:{tmp_path / 'runs'}")
        assert [RunSummary(**{**r, "host": "root@cdtest"}) for r in here] == \
            [replace_duration(s, r["duration_s"]) for s, r in zip(there, here, strict=True)]
        out = cli("ls", f"cdtest:{tmp_path / 'runs'}")
        assert sim.folder.path.name in out.stdout and "running (detached)" in out.stdout, out.stdout
        assert remote_list(f"cdtest:{tmp_path / 'none'}") == []
    finally:
        sim.end()


def replace_duration(summary: RunSummary, duration: float | None) -> RunSummary:
    """A live run's duration grows between two listings: compared apart."""
    import dataclasses

    assert (summary.duration_s is None) == (duration is None)
    return dataclasses.replace(summary, duration_s=duration)


def test_a_follower_cut_off_from_its_front_end_ends_itself_and_pings_keep_it(tmp_path: Path) -> None:
    """A network partition: sshd has not noticed, the follower's stdin neither closes nor speaks. It ends itself
    once silent for CLUSTERDECK_FOLLOW_SILENCE_S (45 s by default; the front end pings every 10 s)."""
    sim = SimulatedRun(tmp_path / "runs", history_s=2)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "follow", "--protocol", "1", "--",
                                 str(sim.folder.path)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERDECK_FOLLOW_SILENCE_S="2"))
        assert proc.stdin is not None
        until = time.monotonic() + 5
        while time.monotonic() < until:  # pinged: it stays
            proc.stdin.write(b'{"v": 1, "command": "ping", "id": 0}\n')
            proc.stdin.flush()
            time.sleep(0.5)
        assert proc.poll() is None, "a pinged follower ended"
        silent = time.monotonic()
        assert proc.wait(10) == 0  # silence: it ends, its stdin still open
        assert 1.5 < time.monotonic() - silent < 6
        proc.stdin.close()
    finally:
        sim.end()
