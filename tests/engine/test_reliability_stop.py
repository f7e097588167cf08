"""Reliability, round three: a SIGTERM to one task (not from ClusterDeck) is told apart from a user's stop,
and what a task starts gets a clean signal mask. Real TensorFlow tasks and real signals."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import replace
from engine.control import lifecycle as lc
from engine.control.launcher import Run
from engine.runtime.loop import StopAgreement
from tests.conftest import PRESETS, wait_gone
from tests.engine.test_ssh import sshd  # noqa: F401 - the fixture


def _wait_for_step(run: Run, at_least: int, timeout: float = 120) -> None:
    got = threading.Event()

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "step" and int(e.get("step", 0)) >= at_least:
            got.set()

    run.add_listener(on_event)
    run.start()
    assert got.wait(timeout), run.state.summary()


def _checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))


def test_a_peers_agreed_stop_names_the_signalled_proposer(tmp_path: Path) -> None:
    path = tmp_path / "step"
    signalled, peer = StopAgreement(path, "worker:1"), StopAgreement(path, "worker:0")
    assert signalled.stop_after(True, 7, external="got a SIGTERM ClusterDeck did not send (from pid 9 (kill))") == 8
    assert peer.stop_after(False, 7) == 8 and peer.external_proposer == "worker:1"
    assert peer.external_why == "got a SIGTERM ClusterDeck did not send (from pid 9 (kill))"
    user = tmp_path / "user"
    a, b = StopAgreement(user, "worker:1"), StopAgreement(user, "worker:0")
    assert a.stop_after(True, 3) == 4 and b.stop_after(False, 3) == 4 and b.external_proposer is None


def test_the_lifecycle_blames_the_signalled_task_whoever_reports_first() -> None:
    policy = lc.Lifecycle([lc.TaskInfo("worker:0", "worker"), lc.TaskInfo("worker:1", "worker")], mode="data")
    actions = policy.feed(lc.TaskStatus("worker:0", lc.TaskPhase.FAILED, "stopped at step 9 with worker:1, which got "
                                        "a SIGTERM ClusterDeck did not send", cause_task="worker:1"), 1.0)
    assert isinstance(actions[0], lc.StopRun)
    assert actions[0].outcome.failed_task == "worker:1"
    assert "SIGTERM ClusterDeck did not send" in actions[0].outcome.reason


@pytest.mark.cluster
def test_sigterm_to_one_worker_fails_the_run_naming_it_with_honest_checkpoints(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0, restarts=0))
    run = Run(cfg, runs_root=runs_root)
    _wait_for_step(run, 5)
    pids = run.pids()
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGTERM)  # a scheduler's or a user's kill
    assert run.wait(30) == "failed", run.state.summary()
    assert run.state.failed_task == "worker:1", run.state.reason
    assert "SIGTERM ClusterDeck did not send" in run.state.reason and "from pid" in run.state.reason
    assert wait_gone(pids, 5) == []
    found = _checkpoints(run.run_dir)
    finished = [e for e in events.read_file(run.run_dir / "events.jsonl")
                if e["kind"] == "status" and e.get("state") == "finished"]
    assert finished == [], "a task claimed to finish 100,000 steps"
    # a checkpoint of the agreed step where the stop budget allowed one (on a loaded machine it may not): never
    # one named by the run's total
    assert all(step < 100_000 for step in found), found
    state = run.run_dir / "checkpoints" / "checkpoint"
    if state.exists():  # never names a checkpoint whose files are missing
        named = state.read_text().split('"')[1]
        assert (run.run_dir / "checkpoints" / f"{named}.index").exists()


@pytest.mark.cluster
def test_sigterm_to_one_worker_restarts_the_run_from_an_honest_checkpoint(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0, restarts=1))
    run = Run(cfg, runs_root=runs_root)
    restarted = threading.Event()
    run.add_listener(lambda e: restarted.set() if e["kind"] == "run" and e.get("state") == "restarting" else None)
    _wait_for_step(run, 5)
    os.kill(run.state.tasks["worker:0"].pid or 0, signal.SIGTERM)
    assert restarted.wait(30), run.state.summary()
    resumed = threading.Event()
    run.add_listener(lambda e: resumed.set() if e["kind"] == "info" and "resumed_step" in e else None)
    try:
        assert resumed.wait(120), run.state.summary()
        infos = [e for e in run.state.infos if "resumed_step" in e]
        step = infos[-1]["resumed_step"]
        assert step < 100_000 and f"ckpt-{step}" in infos[-1]["message"]
        reasons = [e.get("reason", "") for e in events.read_file(run.run_dir / "events.jsonl")
                   if e["kind"] == "run" and e.get("state") == "restarting"]
        assert reasons and reasons[0].startswith("worker:0: got a SIGTERM ClusterDeck did not send"), reasons
    finally:
        run.stop()


USER_SCRIPT = '''
import subprocess, time, keras

def build_model(config):
    t0 = time.monotonic()
    subprocess.run(["timeout", "1", "sleep", "20"])
    import os
    os.system("timeout 1 sleep 20")
    with open(os.environ["CLUSTERDECK_RUN_DIR"] + "/child-seconds.txt", "w") as f:
        f.write(str(time.monotonic() - t0))
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(10)])
'''


@pytest.mark.cluster
def test_a_users_subprocesses_start_with_sigterm_unblocked(runs_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "children.py"
    script.write_text(USER_SCRIPT)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, model=replace(cfg.model, name="script", script=str(script)),
                  training=replace(cfg.training, steps=3, checkpoint_every=0))
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    assert run.wait(120) == "finished", run.state.summary()
    seconds = float((run.run_dir / "child-seconds.txt").read_text())
    assert seconds < 6, f"timeout 1 sleep 20 (twice) took {seconds:.1f} s: SIGTERM reached them blocked"


def test_unblock_in_children_clears_a_blocked_sigterm_for_every_way_of_starting_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import os, signal, subprocess, time\n"
            "from engine.runtime.stop import unblock_in_children\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "unblock_in_children()\n"
            "t = time.monotonic(); subprocess.run(['timeout', '1', 'sleep', '20']); a = time.monotonic() - t\n"
            "t = time.monotonic(); os.system('timeout 1 sleep 20'); b = time.monotonic() - t\n"
            "t = time.monotonic(); pid = os.posix_spawnp('timeout', ['timeout', '1', 'sleep', '20'], os.environ);"
            " os.waitpid(pid, 0); c = time.monotonic() - t\n"
            "blocked = subprocess.run(['grep', 'SigBlk', '/proc/self/status'], capture_output=True, text=True).stdout\n"
            "print(a, b, c, blocked.split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    a, b, c, mask = out.stdout.split()
    assert max(float(a), float(b), float(c)) < 5, out.stdout
    assert int(mask, 16) & (1 << (signal.SIGTERM - 1)) == 0


@pytest.mark.cluster
@pytest.mark.parametrize("every", [20, 0])
def test_sigterm_to_one_dtensor_client_never_leaves_a_misnamed_checkpoint(runs_root: Path, every: int) -> None:
    cfg = config_mod.load(PRESETS / "model-2clients.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=every, restarts=0))
    run = Run(cfg, runs_root=runs_root)
    _wait_for_step(run, 45)
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGTERM)
    assert run.wait(60) == "failed", run.state.summary()
    assert run.state.failed_task == "worker:1", run.state.reason
    found = _checkpoints(run.run_dir)
    assert all(step < 100_000 for step in found), found  # none named by the run's total
    if every:
        assert found, "the periodic checkpoints are kept"
    state = run.run_dir / "checkpoints" / "checkpoint"
    if state.exists():  # never names a checkpoint whose files are missing
        named = state.read_text().split('"')[1]
        assert (run.run_dir / "checkpoints" / f"{named}.index").exists(), state.read_text()
    assert not [e for e in events.read_file(run.run_dir / "events.jsonl")
                if e["kind"] == "status" and e.get("state") == "finished"]


@pytest.mark.cluster
def test_sigterm_to_one_worker_over_ssh_fails_the_run_naming_it(sshd: Path, runs_root: Path,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from engine.contract.config import Cluster, Host, Task

    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    remote = Host(name="remote", address="127.0.0.1", ssh_host="cdtest", python=sys.executable,
                  tasks=(Task("worker", 0), Task("worker", 1)))
    cfg = config_mod.default_config()
    cfg = replace(cfg, name="ssh-partial-stop", cluster=Cluster(hosts=(remote,)),
                  training=replace(cfg.training, steps=100_000, checkpoint_every=0, restarts=0))
    run = Run(cfg, runs_root=runs_root)
    try:
        _wait_for_step(run, 5)
        os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGTERM)  # the task runs under the remote supervisor
        assert run.wait(30) == "failed", run.state.summary()
        assert run.state.failed_task == "worker:1" and "SIGTERM ClusterDeck did not send" in run.state.reason
        assert all(step < 100_000 for step in _checkpoints(run.run_dir))
    finally:
        run.stop()
