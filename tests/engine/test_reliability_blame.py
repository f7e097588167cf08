"""Reliability, round three: blame and messages. A stopped supervisor is blamed, not a task; a killed ssh
client here and a killed supervisor there are named apart; TensorFlow's start-up noise is never the message;
progress is judged by steps at any report rate."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task, replace
from engine.control import lifecycle as lc
from engine.control.launcher import Run
from engine.control.transports import BaseTransport, SshTransport, SupervisorLaunch, log_tail
from tests.conftest import PRESETS, wait_gone
from tests.engine.test_faults import BOTH, fake_run, start_and_wait_for_steps
from tests.engine.test_ssh import sshd  # noqa: F401 - the fixture

TF_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1733361 1234 cpu_feature_guard.cc:210] This TensorFlow binary is optimized to use available CPU",
    "2026-12-05 00:49:08.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.",
]


def test_a_supervisors_failure_never_quotes_tensorflows_start_up_noise(tmp_path: Path) -> None:
    log = tmp_path / "supervisor.log"
    log.write_text("\n".join(["Traceback (most recent call last):", "OSError: [Errno 28] No space left on device",
                              *TF_NOISE]) + "\n")
    tail = log_tail(log)
    assert tail[-1] == "OSError: [Errno 28] No space left on device"
    assert not any("absl" in line or "oneDNN" in line or "cpu_feature_guard" in line for line in tail)
    launch = SupervisorLaunch(group="g", host=None, command=["python3"], env={}, log=log)
    assert "No space left" in BaseTransport().failure(launch, 1, tail)


def test_ssh_failures_name_the_client_here_or_the_supervisor_there(tmp_path: Path) -> None:
    host = Host(name="remote", address="10.0.0.7", ssh_host="gpubox", tasks=(Task("worker", 0),))
    launch = SupervisorLaunch(group="remote", host=host, command=["python3"], env={}, log=tmp_path / "x.log")
    ssh = SshTransport()
    assert ssh.failure(launch, -9, []).startswith("the ssh client on this machine (to gpubox) was killed by SIGKILL")
    assert ssh.failure(launch, 255, ["ssh: connect to host gpubox port 22: Connection refused"]).startswith(
        "ssh to gpubox failed")
    killed = ssh.failure(launch, 255, [])
    assert killed.startswith("the supervisor on gpubox (over ssh) ended abruptly") and "killed" in killed


def test_a_silent_supervisor_is_blamed_not_its_task() -> None:
    policy = lc.Lifecycle([lc.TaskInfo("worker:0", "worker", "local"), lc.TaskInfo("worker:1", "worker", "local")],
                          mode="data", progress_timeout_s=5.0, report_interval_s=0.05)
    policy.started()
    for t in range(1, 11):  # steps and samples every 0.5 s, then nothing at all from the host
        now = t * 0.5
        policy.feed(lc.StepProgress("worker:0", t), now)
        policy.feed(lc.StepProgress("worker:1", t), now)
        policy.feed(lc.CpuSample("worker:0", 50.0), now)
    assert policy.feed(lc.Tick(), 11.0) == []  # hung for the timeout, but its supervisor is quiet too: wait
    (action,) = policy.feed(lc.Tick(), 15.5)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "supervisor@local"
    assert "sent nothing for" in action.outcome.reason and "SIGSTOP" in action.outcome.reason


def test_a_slow_report_rate_is_no_hang_and_progress_events_count_steps() -> None:
    policy = lc.Lifecycle([lc.TaskInfo("worker:0", "worker")], mode="data", progress_timeout_s=60.0,
                          report_interval_s=100.0)  # metrics_hz 0.01
    policy.started()
    policy.feed(lc.StepProgress("worker:0", 1), 0.0)
    assert policy.feed(lc.Tick(), 200.0) == []  # between two reports 100 s apart: healthy
    (action,) = policy.feed(lc.Tick(), 261.0)
    assert isinstance(action, lc.StopRun) and "training.metrics_hz 0.01" in action.outcome.reason
    policy = lc.Lifecycle([lc.TaskInfo("chief:0", "chief"), lc.TaskInfo("worker:0", "worker")], mode="async",
                          progress_timeout_s=10.0)
    policy.started()
    for name in ("chief:0", "worker:0"):
        policy.feed(lc.TaskStatus(name, lc.TaskPhase.RUNNING), 0.0)
    progress = lc.from_event({"kind": "progress", "task": "chief:0", "step": 5, "total": 9})
    assert progress == lc.StepProgress("chief:0", 5, None, 0, moved_on=True)
    policy.feed(progress, 0.0)
    policy.feed(lc.StepProgress("chief:0", 5, worker=0), 0.0)
    for t in range(1, 12):  # the same step again and again is no progress
        policy.feed(lc.StepProgress("chief:0", 5, None, 0, moved_on=True), float(t))
    (action,) = policy.feed(lc.Tick(), 11.0)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "chief:0"


def test_a_stopped_supervisor_fails_the_run_blaming_it(runs_root: Path) -> None:
    run = fake_run(runs_root, progress_timeout_s=3.0, worker_0="forever", worker_1="forever")
    sampled = threading.Event()
    run.add_listener(lambda e: sampled.set() if e["kind"] == "device" else None)
    start_and_wait_for_steps(run, 30, BOTH)
    assert sampled.wait(10)  # its supervisor samples its tasks (what its silence is judged by)
    supervisor = run.core.supervisors[0].proc.pid  # the local supervisor (its process, not a task)
    pids = run.pids()
    os.kill(supervisor, signal.SIGSTOP)
    try:
        assert run.wait(40) == "failed", run.state.summary()
    finally:
        try:
            os.kill(supervisor, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert run.state.failed_task.startswith("supervisor@"), (run.state.failed_task, run.state.reason)
    assert "sent nothing" in run.state.reason
    assert wait_gone(pids, 10) == []


@pytest.mark.cluster
def test_a_healthy_run_reporting_every_20_s_is_not_called_hung(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=600, metrics_hz=0.05, progress_timeout_s=4.0,
                                        checkpoint_every=0))
    run = Run(cfg, runs_root=runs_root)
    run.start()
    assert run.wait(240) == "finished", run.state.summary()


def _ssh_run(sshd_config: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, threading.Event]:
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd_config))
    remote = Host(name="remote", address="127.0.0.1", ssh_host="cdtest", python=sys.executable,
                  tasks=(Task("worker", 0), Task("worker", 1)))
    cfg = config_mod.default_config()
    cfg = replace(cfg, name="ssh-blame", cluster=Cluster(hosts=(remote,)),
                  training=replace(cfg.training, steps=100_000, restarts=0, checkpoint_every=0))
    run = Run(cfg, runs_root=runs_root)
    stepped = threading.Event()
    run.add_listener(lambda e: stepped.set() if e["kind"] == "step" else None)
    run.start()
    return run, stepped


def _remote_supervisor() -> int:
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] == ["-m", "engine.control.supervisor"] and proc.info["ppid"] != os.getpid():
            if any(p.name() == "sshd" for p in proc.parents()):
                return proc.pid
    raise AssertionError("no supervisor under sshd")


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["client", "remote"])
def test_a_killed_ssh_client_and_a_killed_remote_supervisor_are_named_apart(
        sshd: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:  # noqa: F811
    run, stepped = _ssh_run(sshd, runs_root, monkeypatch)
    try:
        assert stepped.wait(120), run.state.summary()
        victim = run.core.supervisors[0].proc.pid if where == "client" else _remote_supervisor()
        os.kill(victim, signal.SIGKILL)
        assert run.wait(30) == "failed", run.state.summary()
        reason: Any = run.state.reason
        assert run.state.failed_task.startswith("supervisor@")
        if where == "client":
            assert "the ssh client on this machine" in reason and "SIGKILL" in reason, reason
        else:
            assert "ssh to cdtest failed" not in reason and "the supervisor on cdtest" in reason, reason
    finally:
        run.stop()
    time.sleep(0.5)


def test_an_async_worker_killed_past_the_restart_limit_says_the_limit_was_reached(runs_root: Path) -> None:
    run = fake_run(runs_root, mode="async", chief_0="forever", worker_0="idle", worker_1="idle")
    starts: list[int] = []
    started = threading.Event()

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "status" and e["task"] == "worker:1" and e.get("state") == "starting":
            starts.append(int(e["pid"]))
            started.set()

    run.add_listener(on_event)
    run.start()
    try:
        for _ in range(11):
            assert started.wait(30), run.state.summary()
            started.clear()
            os.kill(starts[-1], signal.SIGKILL)
            if run.wait(0.01) == "failed":
                break
        assert run.wait(30) == "failed", run.state.summary()
        assert run.state.failed_task == "worker:1"
        assert "killed by SIGKILL" in run.state.reason and "max_task_restarts 10" in run.state.reason, \
            run.state.reason
        assert len(starts) == 11  # the first start and 10 restarts
    finally:
        run.stop()
