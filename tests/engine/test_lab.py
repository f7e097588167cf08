"""Runs across a lab of hosts (network namespaces on a bridge, each with its own sshd: tests/engine/lab.py,
docs/lab.md) and what the faults of a real network do to them: a host cut off, a remote supervisor killed, an sshd
gone, a slower host. Real TensorFlow tasks, real ssh, real links; small models and step counts."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Cluster, ConfigError, Host, RunConfig, replace
from engine.control.launcher import Run
from engine.observe.stragglers import StragglerDetector
from tests.conftest import PRESETS, EventRecorder, run_story, wait_gone
from tests.engine.lab import Lab, address, lab_fixture, lab_session_fixture, wait_until  # noqa: F401 - fixtures

pytestmark = pytest.mark.cluster

#: TensorFlow's start-up lines: never the message of a failure.
TF_NOISE = ("absl", "I0000", "W0000", "oneDNN", "cpu_feature_guard")


def lab_config(mode: str, hosts: tuple[Host, ...], steps: int, **training: Any) -> RunConfig:
    preset = config_mod.load(PRESETS / ("async-1ps.yaml" if mode == "async" else "data-2workers.yaml"))
    return replace(preset, name=f"lab-{mode}", cluster=Cluster(hosts=hosts),
                   model=replace(preset.model, hidden=(64,)),
                   training=replace(preset.training, steps=steps, checkpoint_every=0, restarts=0, **training))


def launch(config: RunConfig, runs_root: Path, **kw: Any) -> tuple[Run, EventRecorder]:
    run = Run(config, runs_root=runs_root, **kw)
    rec = EventRecorder()
    run.add_listener(rec)
    run.start()
    return run, rec


def stepped(rec: EventRecorder, since: int = 0, **match: Any) -> bool:
    """A step event (of ``match``) among the events recorded after the first ``since``."""
    return any(e["kind"] == "step" and all(e.get(k) == v for k, v in match.items())
               for e in rec.snapshot()[since:])


def remote_left(lab: Lab, n: int) -> list[int]:
    """Pids of ClusterDeck's processes still on host ``labN`` (supervisors, templates, tasks)."""
    return [p.pid for p in lab.processes(n, "engine.")]


def test_a_data_run_across_two_hosts_names_the_slowed_host_as_its_straggler_and_stops(lab: Lab, runs_root: Path) -> None:
    # a model whose step is mostly compute (not the all-reduce), reported every 4 steps; the run trains until the
    # detector (1.5 s of a sustained excess) has flagged a replica after lab2 was slowed, however loaded this machine
    config = lab_config("data", (lab.host(1, ("worker", 0)), lab.host(2, ("worker", 1))), steps=100_000,
                        metrics_hz=20, steps_per_execution=4)
    config = replace(config, model=replace(config.model, hidden=(512,)))
    detector = StragglerDetector(margin=0.5, window_s=1.5)
    changes: list[Any] = []
    slowed_at: list[float] = []
    first_step = threading.Event()
    flagged = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        new = detector.update(event)
        changes.extend(new)
        if slowed_at and any(c.flagged and c.since >= slowed_at[0] for c in new):
            flagged.set()
        if event["kind"] == "step":
            first_step.set()

    run = Run(config, runs_root=runs_root)
    run.add_listener(on_event)
    run.start()
    try:
        assert first_step.wait(90), run.state.summary()
        slowed_at.append(time.time())  # the detector's clock: the events' own time
        lab.slow(2, 10)  # lab2 becomes a slower machine: a tenth of a core for all it runs
        assert flagged.wait(60), (changes, run_story(run.run_dir))
        assert run.state.state == "running", run_story(run.run_dir)
    finally:
        run.stop()
    assert run.wait(30) == "stopped", run_story(run.run_dir)
    # the tasks ran where the config put them, talking over the lab's addresses
    assert {name: t.host for name, t in run.state.tasks.items()} == {"worker:0": "lab1", "worker:1": "lab2"}
    assert set(run.state.replicas) == {0, 1}
    tf_config = (run.run_dir / "config.yaml").read_text()
    assert address(1) in tf_config and address(2) in tf_config
    # the first replica flagged once lab2 is slowed is lab2's (a busy machine may flag the other later, briefly)
    after = [c for c in changes if c.flagged and c.since >= slowed_at[0]]
    assert after and after[0].replica == 1, changes
    assert after[0].task == "worker:1" and "slower or busier host" in after[0].cause, after[0]


def test_an_async_run_loses_a_cut_worker_host_and_a_killed_supervisor_without_restarting(
        lab: Lab, runs_root: Path) -> None:
    hosts = (lab.host(1, ("chief", 0), ("ps", 0)), lab.host(2, ("worker", 0)), lab.host(3, ("worker", 1)))
    # the chief schedules ~100 steps/s: cores are left for a worker started again
    run, rec = launch(lab_config("async", hosts, steps=100_000, metrics_hz=4.0), runs_root,
                      task_env={"CLUSTERDECK_TEST_STEP_DELAY": "chief:0=0.01"})
    try:
        assert wait_until(lambda: stepped(rec, worker=1) and stepped(rec, worker=0), 90), run_story(run.run_dir)

        # 1. lab3 (worker:1 alone) cut off: named within seconds, the run is not failed nor restarted
        lab.cut(3)
        cut_at = time.monotonic()
        assert wait_until(lambda: rec.of("info", host="lab3", host_unreachable=True), 15), run_story(run.run_dir)
        (notice,) = rec.of("info", host="lab3", host_unreachable=True)
        assert time.monotonic() - cut_at < 12
        assert "host lab3 does not answer" in notice["message"] and address(3) in notice["message"]
        assert "worker:1" in notice["message"] and notice["lost_tasks"] == ["worker:1"]
        lab.heal(3)
        mark = len(rec.snapshot())
        # 2. the link back: the same worker trains on (TCP kept the connections), nothing was restarted
        assert wait_until(lambda: rec.of("info", host="lab3", host_unreachable=False), 15), run_story(run.run_dir)
        assert wait_until(lambda: stepped(rec, mark, worker=1), 30), run_story(run.run_dir)
        assert run.state.state == "running" and not rec.of("status", task="worker:1", state="failed")

        # 3. lab3's supervisor killed: its worker is lost, the host's supervisor started again, the worker back
        (supervisor,) = lab.processes(3, "engine.control.supervisor")
        old_worker = run.state.tasks["worker:1"].pid
        mark = len(rec.snapshot())
        supervisor.send_signal(signal.SIGKILL)
        def back() -> int | None:  # where the relaunched worker:1 said it runs
            return next((mark + i for i, e in enumerate(rec.snapshot()[mark:]) if e["kind"] == "status"
                         and e["task"] == "worker:1" and e["state"] == "running"), None)

        assert wait_until(lambda: back() is not None, 60), run_story(run.run_dir)
        assert wait_until(lambda: stepped(rec, back() or 0, worker=1), 60), run_story(run.run_dir)
        lost = [e for e in rec.snapshot()[mark:] if e["kind"] == "status" and e["task"] == "worker:1"
                and e["state"] == "failed"]
        assert lost and lost[0]["will_restart"] is True and "lost with host lab3" in lost[0]["reason"]
        assert "the supervisor on lab3" in lost[0]["reason"] and "ssh to" not in lost[0]["reason"]
        assert not any(noise in lost[0]["reason"] for noise in TF_NOISE), lost[0]["reason"]
        assert run.state.tasks["worker:1"].pid != old_worker
        assert rec.of("info", host="lab3", relaunch=1)
        pids = rec.pids()
    finally:
        run.stop()
    assert run.wait(30) == "stopped", run_story(run.run_dir)
    # never a whole-run restart, the chief and the other worker trained throughout
    assert not rec.of("run", state="restarting")
    assert [e["pid"] for e in rec.of("status", task="chief:0", state="starting")] == [run.state.tasks["chief:0"].pid]
    assert wait_gone(pids, 10) == []


def test_a_cut_host_fails_a_data_run_within_seconds_naming_the_host(lab: Lab, runs_root: Path) -> None:
    config = lab_config("data", (lab.host(1, ("worker", 0)), lab.host(2, ("worker", 1))), steps=100_000)
    run, rec = launch(config, runs_root)
    try:
        assert wait_until(lambda: stepped(rec, task="worker:1"), 90), run_story(run.run_dir)
        lab.cut(2)
        cut_at = time.monotonic()
        assert run.wait(30) == "failed", run_story(run.run_dir)
        took = time.monotonic() - cut_at
    finally:
        run.stop()
    reason = run.state.reason
    assert run.state.failed_task == "supervisor@lab2", (run.state.failed_task, reason)
    assert reason.startswith("host lab2 does not answer") and address(2) in reason and "worker:1" in reason, reason
    assert "heartbeat" not in reason, reason  # the network is named, not what TensorFlow made of it
    assert took < 15, f"the run took {took:.1f} s to fail after the cut"
    # once the link is back, the cut-off supervisor hears that its launcher is gone and ends its tasks
    lab.heal(2)
    assert wait_until(lambda: not remote_left(lab, 2), 25), remote_left(lab, 2)


def test_a_killed_remote_supervisor_is_blamed_with_its_cause_not_ssh_or_tensorflow(lab: Lab, runs_root: Path) -> None:
    config = lab_config("data", (lab.host(1, ("worker", 0)), lab.host(3, ("worker", 1))), steps=100_000)
    run, rec = launch(config, runs_root)
    try:
        assert wait_until(lambda: stepped(rec, task="worker:1"), 90), run_story(run.run_dir)
        (supervisor,) = lab.processes(3, "engine.control.supervisor")
        supervisor.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert run.wait(20) == "failed", run_story(run.run_dir)
        took = time.monotonic() - killed_at
    finally:
        run.stop()
    reason = run.state.reason
    assert run.state.failed_task == "supervisor@lab3", (run.state.failed_task, reason)
    assert reason.startswith("the supervisor on lab3 (over ssh) ended abruptly"), reason
    assert "killed by a signal" in reason and "ssh to lab3 failed" not in reason, reason
    assert not any(noise in reason for noise in TF_NOISE) and "heartbeat" not in reason, reason
    assert took < 12, f"the run took {took:.1f} s to fail"
    assert wait_until(lambda: not remote_left(lab, 3), 10), remote_left(lab, 3)


def test_a_host_whose_sshd_is_gone_is_named_before_launch(lab: Lab, runs_root: Path) -> None:
    lab.stop_sshd(3)
    config = lab_config("data", (lab.host(1, ("worker", 0)), lab.host(3, ("worker", 1))), steps=100)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        Run(config, runs_root=runs_root).start()
    assert time.monotonic() - t0 < 8
    (problem,) = refused.value.problems
    assert problem.field == "cluster"
    assert problem.message.startswith("host 'lab3' (lab3, ssh port 22): ssh cannot log in"), problem.message
    assert "Connection refused" in problem.message, problem.message
    assert not runs_root.exists() or not any(runs_root.iterdir())  # nothing was started, no run folder
    assert not remote_left(lab, 1) and not remote_left(lab, 3)
    assert os.environ.get("CLUSTERDECK_SSH_CONFIG")  # the lab's own ssh config named the host
