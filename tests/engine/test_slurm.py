"""Runs through a real one-node Slurm on 127.0.0.1 (``tests/engine/slurm_cluster.py``).

salloc, srun, scancel and the controller are Slurm's own; the tasks are real TensorFlow processes.
Without Slurm the tests skip, except with ``CI=true`` (``.ci/run`` starts the cluster), where they fail.

The job over its time limit runs in the background from the session's first test on (a
``clusterdeck run`` subprocess with a 1-minute limit, ``tests/conftest.py``): Slurm ends it about a
minute later, while the other tests run, and the last test reads how it ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from engine.contract import config as config_mod
from engine.contract.config import RunConfig
from engine.control import slurm
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import IN_CI, SESSION_MARK, EventRecorder, wait_gone
from tests.conftest import slurm_preset as preset
from tests.engine import slurm_cluster

pytestmark = pytest.mark.cluster

RUN_TIMEOUT = 150.0


@pytest.fixture(scope="module")
def cluster(slurm_session: slurm_cluster.Cluster | str) -> slurm_cluster.Cluster:
    if isinstance(slurm_session, str):
        if IN_CI:
            pytest.fail(f"CI=true and {slurm_session}")
        pytest.skip(slurm_session)
    return slurm_session


class Recorder(EventRecorder):
    """Every event of a run, and waiting for one."""

    def wait_for(self, what: str, test: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s; events: {self.summary()}"
            time.sleep(0.1)

    def summary(self) -> list[str]:
        with self.lock:
            return [f"{e['kind']}:{e.get('task')}:{e.get('state', '')}:{e.get('reason', e.get('message', ''))}"[:160]
                    for e in self.events if e["kind"] != "step" and e["kind"] != "device"][-20:]


def launch(config: RunConfig, runs_root: Path) -> tuple[Run, Recorder]:
    run = Run(config, runs_root=runs_root)
    rec = Recorder()
    run.add_listener(rec)
    run.start()
    return run, rec


def job_ids(rec: Recorder) -> set[str]:
    return {str(e["job_id"]) for e in rec.events if e.get("job_id")}


def processes_of_run(run_dir: Path, jobs: set[str]) -> list[int]:
    """Tasks, supervisors, step wrappers and sruns (this node is the only one) still working for the run."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        ours = "engine.control.s" in cmd and SESSION_MARK in _environ_text(proc)
        if str(run_dir) in cmd or ours or any(f"--jobid={job}" in cmd for job in jobs):
            found.append(proc.pid)
    return found


def _environ_text(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.environ().values())
    except psutil.Error:
        return ""


def assert_nothing_left(run: Run, rec: Recorder) -> None:
    ids = job_ids(rec)
    assert ids, "the run never named its Slurm job"
    for job in ids:
        assert not slurm.queued(job), f"Slurm job {job} is still in squeue after the run ended"
    pids = {e["pid"] for e in rec.of("status") if isinstance(e.get("pid"), int)}
    assert pids, "no task process was ever seen"
    assert wait_gone(pids, 5.0) == [], "task processes outlived the run"
    left = processes_of_run(run.run_dir, ids)
    assert wait_gone(left, 5.0) == [], f"processes of the run left on the node: {left}"


# --------------------------------------------------------------------------- a job over its time limit

# --------------------------------------------------------------------------- refused or explained


def test_more_nodes_than_the_partition_has_is_refused_before_submission(cluster: slurm_cluster.Cluster,
                                                                        runs_root: Path) -> None:
    config = preset("slurm-data.yaml", nodes=2)
    # a name of its own: a run of the same preset started in the same second by another test has the same job name
    config = config_mod.replace(config, name=f"slurm-too-many-{uuid.uuid4().hex[:6]}")
    problems = slurm.check_config(config)
    assert [p.field for p in problems] == ["cluster.hosts[0].slurm.nodes"]
    assert "partition 'debug' has 1 (sinfo); expected at most 1" in problems[0].message
    run, rec = launch(config, runs_root)
    assert run.wait(30) == "failed"
    assert "slurm.nodes" in run.state.reason and "PartitionConfig" in run.state.reason
    assert not job_ids(rec), "a job was submitted although sinfo says it cannot run"
    assert not slurm_cluster.jobs_named(slurm.job_name(run.run_dir.name, ""))
    # what Slurm itself would have said, explained the same way
    explained = slurm.JobStatus("7", "PENDING", "PartitionConfig", partition="debug").explain()
    assert "Slurm job 7 is pending in partition 'debug' (PartitionConfig)" in explained
    assert "never start" in explained


def test_a_job_whose_partition_is_down_is_shown_pending_with_slurm_s_reason(cluster: slurm_cluster.Cluster,
                                                                             runs_root: Path) -> None:
    partition = f"cd-down-{uuid.uuid4().hex[:6]}"
    scontrol = ["scontrol", "create", f"PartitionName={partition}", f"Nodes={slurm_cluster.NODE}", "State=UP"]
    subprocess.run(scontrol, check=True, capture_output=True, timeout=10)
    try:
        subprocess.run(["scontrol", "update", f"PartitionName={partition}", "State=DOWN"], check=True,
                       capture_output=True, timeout=10)
        run, rec = launch(preset("slurm-data.yaml", partition=partition), runs_root)
        rec.wait_for("pending run event with reason PartitionDown",
                     lambda: rec.of("run", state="pending", reason="PartitionDown"), timeout=20)
        (pending,) = rec.of("run", state="pending", reason="PartitionDown")[:1]
        assert pending["job_id"] and pending["slurm_state"] == "PENDING"
        assert f"Slurm job {pending['job_id']} is pending in partition '{partition}' (PartitionDown)" in \
            pending["message"]
        assert run.state.state == "pending" and run.state.reason == "PartitionDown"
        assert [m for m in rec.of("info") if "PartitionDown" in str(m.get("message"))], "no message for the CLI"
        assert slurm.queued(pending["job_id"])
        assert not rec.of("status"), "no task may start while the job waits"
        run.stop()
        assert run.wait(20) == "stopped"
        assert not slurm.queued(pending["job_id"]), "Stop left the pending job in squeue"
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={partition}"], capture_output=True, timeout=10)


# --------------------------------------------------------------------------- runs


def test_data_parallel_preset_runs_through_slurm_and_a_restart_resubmits(cluster: slurm_cluster.Cluster,
                                                                         runs_root: Path) -> None:
    run = Run(preset("slurm-data.yaml", steps=30, checkpoint_every=10, restarts=1), runs_root=runs_root)
    rec = Recorder()
    killed: list[int] = []

    def kill_worker_1_once(event: dict[str, Any]) -> None:
        # worker 1 dies once it has trained a little: the whole run restarts in a new allocation
        if not killed and event["kind"] == "step" and event.get("replica") == 1 and event["step"] >= 12:
            pid = run.state.tasks["worker:1"].pid
            if pid:
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)

    run.add_listener(rec)
    run.add_listener(kill_worker_1_once)
    run.start()
    assert run.wait(RUN_TIMEOUT) == "finished", rec.summary()
    assert killed, "worker:1 was never seen training"
    submitted = [e["job_id"] for e in rec.of("info") if "submitted" in str(e.get("message"))]
    assert len(submitted) == 2 and submitted[0] != submitted[1], "the restart did not submit a new job"
    assert rec.of("run", state="restarting")
    steps = rec.of("step")
    assert {e["replica"] for e in steps} == {0, 1}, "both replicas report their steps"
    assert max(e["step"] for e in steps) >= 29
    assert {e["task"] for e in rec.of("status", state="finished")} == {"worker:0", "worker:1"}
    assert {e["host"] for e in rec.of("status", state="starting")} == {f"slurm@{slurm_cluster.NODE}"}
    assert rec.of("device"), "the supervisor's device figures come back over srun"
    running = [e for e in rec.of("info") if "running on" in str(e.get("message"))]
    assert running and running[-1]["nodes"] == [slurm_cluster.NODE]
    tf_config = json.loads(next(p.env["TF_CONFIG"] for p in run.plans if p.name == "worker:1"))
    assert tf_config["task"] == {"type": "worker", "index": 1}
    chosen = running[-1]["message"]  # the ports chosen on the node are those in TF_CONFIG
    assert all(a.startswith(f"{slurm_cluster.NODE}:") and a in chosen for a in tf_config["cluster"]["worker"])
    written = [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]
    assert written and written[-1]["kind"] == "run"  # the lifecycle, whole lines
    assert {e["replica"] for e in read_events(run.run_dir) if e["kind"] == "step"} == {0, 1}  # the samples' store
    assert_nothing_left(run, rec)


def test_a_sigterm_to_one_worker_on_a_node_fails_the_run_naming_it(cluster: slurm_cluster.Cluster,
                                                                   runs_root: Path) -> None:
    """A user's ``kill`` of one task on a node is not the run's stop: no task claims a finish."""
    run = Run(preset("slurm-data.yaml", steps=100_000, checkpoint_every=0, restarts=0), runs_root=runs_root)
    rec = Recorder()
    run.add_listener(rec)
    run.start()
    rec.wait_for("a step of worker:1", lambda: any(e.get("replica") == 1 for e in rec.of("step")), RUN_TIMEOUT)
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGTERM)
    assert run.wait(60) == "failed", rec.summary()
    assert run.state.failed_task == "worker:1" and "SIGTERM ClusterDeck did not send" in run.state.reason, \
        run.state.reason
    assert not rec.of("status", state="finished")
    assert_nothing_left(run, rec)


def test_async_preset_runs_through_slurm_and_stop_cancels_the_job(cluster: slurm_cluster.Cluster,
                                                                   runs_root: Path) -> None:
    run, rec = launch(preset("slurm-async.yaml", steps=100_000, checkpoint_every=0), runs_root)
    rec.wait_for("steps of both workers", lambda: {e.get("worker") for e in rec.of("step")} >= {0, 1},
                 timeout=RUN_TIMEOUT)
    (job,) = job_ids(rec)
    assert slurm.queued(job)
    assert {e["task"] for e in rec.of("status", state="starting")} == {"chief:0", "ps:0", "worker:0", "worker:1"}
    run.stop()
    assert run.wait(30) == "stopped"
    assert_nothing_left(run, rec)


def test_a_job_over_its_time_limit_fails_with_slurm_s_reason(
        cluster: slurm_cluster.Cluster, slurm_job_over_its_time_limit: dict[str, Any] | None) -> None:
    assert slurm_job_over_its_time_limit is not None, "the job over its time limit was not started"
    folder: Path = slurm_job_over_its_time_limit["folder"]
    deadline = slurm_job_over_its_time_limit["started"] + 200
    while not (folder / "code").exists():  # the job may be another pytest worker's child: its exit code is a file
        if time.monotonic() > deadline:
            pytest.fail("the run outlived its 1-minute Slurm time limit by minutes")
        time.sleep(0.5)
    code = int((folder / "code").read_text())
    lines = [json.loads(x) for x in (folder / "out.jsonl").read_text().splitlines() if x.startswith("{")]
    events = [e for e in lines if isinstance(e, dict) and "kind" in e]
    final = [e for e in events if e["kind"] == "run"][-1]
    assert code == 1, (folder / "err.txt").read_text()[-2000:]
    assert final["state"] == "failed"
    assert "TIMEOUT" in final["reason"] and "time limit" in final["reason"], final
    assert [e for e in events if e["kind"] == "step"], "the job ran before Slurm ended it"
    (run_dir,) = (folder / "runs").iterdir()
    assert yaml.safe_load((run_dir / "run.json").read_text())["state"] == "failed"
    jobs = {str(e["job_id"]) for e in events if e.get("job_id")}
    assert jobs and not any(slurm.queued(j) for j in jobs)
    left = [p.pid for p in psutil.process_iter() if _environ_text(p).find(slurm_job_over_its_time_limit["mark"]) >= 0]
    assert wait_gone(left, 5.0) == [], "processes of the timed-out run are still alive"
