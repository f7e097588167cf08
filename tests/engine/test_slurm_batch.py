"""Slurm batch runs (``clusterdeck sbatch``) through the real one-node Slurm on 127.0.0.1.

sbatch, scontrol, scancel and the controller are Slurm's own; the launcher runs inside the batch job and the
tasks are real TensorFlow processes. Without Slurm the tests skip, except with ``CI=true``, where they fail.

A requeued job waits in the queue for its credentials' lifetime (about two minutes, Slurm's ``BeginTime``) before
it may start again; the requeue test makes it eligible a few seconds later (``scontrol update StartTime=now``) as an
impatient administrator would, which changes nothing of what the run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.cli import batch as batch_cli
from engine.cli.attach import FollowedRun
from engine.cli.runs_list import run_row
from engine.contract import config as config_mod
from engine.contract import events as events_mod
from engine.contract.config import ConfigError, RunConfig
from engine.contract.run_folder import LIVE_STATES, RunFolder
from engine.control import slurm, slurm_batch
from engine.observe.run_reader import read_events
from tests.conftest import IN_CI, ROOT, wait_gone
from tests.conftest import slurm_preset as preset
from tests.engine import slurm_cluster

pytestmark = pytest.mark.cluster

RUN_TIMEOUT = 240.0  # TensorFlow starts slowly on two cores shared with other tests


@pytest.fixture(scope="module")
def cluster(slurm_session: slurm_cluster.Cluster | str) -> slurm_cluster.Cluster:
    if isinstance(slurm_session, str):
        if IN_CI:
            pytest.fail(f"CI=true and {slurm_session}")
        pytest.skip(slurm_session)
    return slurm_session


def small(**training: Any) -> RunConfig:
    """The data-parallel Slurm preset with a small model, two workers on the one node."""
    config = preset("slurm-data.yaml", **training)
    return config_mod.replace(config, name=f"batch-{uuid.uuid4().hex[:6]}",
                              model=config_mod.replace(config.model, hidden=(32,)))


def wait_until(what: str, test: Any, timeout: float, folder: RunFolder | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = test()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s" + (f"\n{story(folder)}" if folder is not None else ""))
        time.sleep(0.25)


def story(folder: RunFolder) -> str:
    """What the run folder tells, for a failed assertion: run events, the executions, the launcher's log tail."""
    lines = [f"{e['kind']} {e['task']} {e.get('state', '')} {e.get('reason', '') or e.get('message', '')}"[:220]
             for e in events_mod.read_file(folder.events) if e["kind"] in ("run", "info", "status")]
    try:
        log = [x for x in folder.launcher_log.read_text(errors="replace").splitlines() if "clusterdeck" in x]
    except OSError:
        log = []
    return "\n".join(lines[-30:] + [json.dumps(e) for e in slurm_batch.executions(folder)] + log[-10:])


def state_of(folder: RunFolder) -> str:
    return str(folder.read_meta().get("state", ""))


def job_of(folder: RunFolder) -> str:
    record = slurm_batch.read_batch(folder)
    assert record is not None and record.get("job_id"), f"no job id in {folder.path}"
    return str(record["job_id"])


def run_events(folder: RunFolder, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in events_mod.read_file(folder.events)
            if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def processes_of(folder: RunFolder, job: str) -> list[int]:
    """Launcher, supervisors, tasks and sruns still working for the run (this node is the only one)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if str(folder.path) in cmd or f"--jobid={job}" in cmd:
            found.append(proc.pid)
    return found


def assert_nothing_left(folder: RunFolder) -> None:
    job = job_of(folder)
    deadline = time.monotonic() + 20
    while slurm.queued(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not slurm.queued(job), f"Slurm job {job} is still in squeue after the run ended"
    left = processes_of(folder, job)
    assert wait_gone(left, 10.0) == [], f"processes of the run are left: {left}"


def usr1(job: str) -> None:
    """The time-limit warning, now: what ``--signal=B:USR1@S`` sends S seconds before the limit."""
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, capture_output=True, timeout=10)


def step_of(folder: RunFolder) -> int:
    step = folder.read_meta().get("step")
    return step if isinstance(step, int) else 0


# --------------------------------------------------------------------------- refused


def test_bad_input_is_refused_before_anything_is_submitted(cluster: slurm_cluster.Cluster, runs_root: Path,
                                                           tmp_path: Path) -> None:
    def cli(preset_path: Path | str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "engine.cli.batch", str(preset_path), "--out", str(runs_root),
                               *extra], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)

    # a preset without a Slurm group
    out = cli("data-2workers")
    assert out.returncode == 2, out.stderr
    assert "cluster.hosts: a batch job runs a Slurm group (a host of kind: slurm), but this preset has none" in \
        out.stderr and "Traceback" not in out.stderr
    # two Slurm groups
    config = small()
    group = config.cluster.hosts[0]
    two = config_mod.replace(config, cluster=config_mod.replace(config.cluster, hosts=(
        group, config_mod.replace(group, name="second", tasks=()))))
    with pytest.raises(ConfigError) as refused:
        slurm_batch.submit(two, runs_root)
    assert "holds one Slurm group, but this preset has 2 ('slurm', 'second')" in str(refused.value)
    # a Slurm group beside a machine
    local = config_mod.Host(name="box", tasks=(config_mod.Task(role="evaluator", index=0),))
    mixed = config_mod.replace(config, cluster=config_mod.replace(config.cluster, hosts=(group, local)))
    assert [p.field for p in slurm_batch.batch_problems(mixed)] == ["cluster.hosts[1]"]
    # no Slurm here (its commands not on the PATH)
    path = tmp_path / "preset.yaml"
    config_mod.save(config, path)
    bare = tmp_path / "bin"
    bare.mkdir()
    out = cli(path, env={**os.environ, "PATH": str(bare)})
    assert out.returncode == 2, out.stderr
    assert "Slurm's commands are not installed here" in out.stderr and "submit host" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # a warning time Slurm cannot take
    out = cli(path, "--signal-before", "1", "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout.splitlines()[0])["field"] == "--signal-before"
    # nothing was made or queued
    assert not runs_root.exists() or not any(runs_root.iterdir())
    assert not slurm_cluster.jobs_named(config.name)


def test_sacct_lines_read_as_the_job_s_last_execution(cluster: slurm_cluster.Cluster) -> None:
    text = "41|REQUEUED|0:15|debug\n41|CANCELLED by 1000|0:0|debug\n410|COMPLETED|0:0|debug\n"
    status = slurm.parse_sacct(text, "41")
    assert status is not None and (status.state, status.partition) == ("CANCELLED", "debug")
    assert status.explain() == "Slurm job 41 was cancelled (CANCELLED)"
    assert slurm.parse_sacct(text, "7") is None
    # this cluster keeps no accounting: a job the controller does not know is said so, never a traceback
    status, why = slurm.final_status("999999")
    assert status is None
    assert "the controller no longer knows Slurm job 999999" in why and "sacct" in why


# --------------------------------------------------------------------------- queued


def test_a_queued_batch_run_reads_pending_with_slurm_s_reason_and_is_stopped_from_the_queue(
        cluster: slurm_cluster.Cluster, runs_root: Path) -> None:
    partition = f"cd-down-{uuid.uuid4().hex[:6]}"
    subprocess.run(["scontrol", "create", f"PartitionName={partition}", f"Nodes={slurm_cluster.NODE}", "State=UP"],
                   check=True, capture_output=True, timeout=10)
    try:
        subprocess.run(["scontrol", "update", f"PartitionName={partition}", "State=DOWN"], check=True,
                       capture_output=True, timeout=10)
        config = preset("slurm-data.yaml", partition=partition)
        done = slurm_batch.submit(config, runs_root, deep=False)
        folder = done.folder
        assert done.job_id and slurm.queued(done.job_id)
        script = (folder.path / slurm_batch.BATCH_SCRIPT).read_text()
        assert f"-m engine.control.slurm_batch_launcher {folder.path}" in script and script.count("exec ") == 1
        cmd = done.command
        assert cmd[:2] == ("sbatch", "--parsable") and "--requeue" in cmd and f"--partition={partition}" in cmd
        assert f"--signal=B:USR1@{slurm_batch.DEFAULT_WARNING_S}" in cmd
        assert f"--output={folder.launcher_log}" in cmd and f"--job-name={slurm.job_name(folder.path.name, 'slurm')}" \
            in cmd
        # the folder reads Queued at once: run.json pending, a run event with the job id
        assert state_of(folder) == "pending" and run_row(folder).state == "pending"
        (pending,) = run_events(folder, "run", state="pending")
        assert pending["job_id"] == done.job_id and f"Slurm job {done.job_id} is pending" in pending["message"]
        # and with Slurm's own reason once the scheduler has looked at it
        state = wait_until("the reason PartitionDown",
                           lambda: (s := slurm_batch.batch_state(folder)) is not None and "PartitionDown" in s.reason
                           and s, 30)
        assert state.state == "pending" and state.slurm_state == "PENDING" and state.job_id == done.job_id
        follower = FollowedRun(folder)  # attach while queued: it waits, it does not end
        follower.poll()
        assert not follower.done and follower.state.state == "pending"
        said = slurm_batch.stop_run(folder, by="the test")
        assert said == f"stopped by the test while queued: Slurm job {done.job_id} cancelled"
        assert follower.wait(10) == "stopped"
        assert state_of(folder) == "stopped" and run_row(folder).state == "stopped"
        assert not slurm.queued(done.job_id)
        after = slurm_batch.batch_state(folder)
        assert after is not None and after.state == "stopped"
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={partition}"], capture_output=True, timeout=10)


# --------------------------------------------------------------------------- runs


def test_a_batch_run_outlives_the_shell_that_submitted_it(cluster: slurm_cluster.Cluster, runs_root: Path,
                                                          tmp_path: Path) -> None:
    config = small(steps=48, checkpoint_every=0)
    path = tmp_path / "preset.yaml"
    config_mod.save(config, path)
    # a login shell submits and logs out: its session ends, nothing of it is left
    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} -m engine.cli.batch {path} --out {runs_root} --json; "
                              "exit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             start_new_session=True)
    t0 = time.monotonic()
    out, err = shell.communicate(timeout=120)
    took = time.monotonic() - t0
    assert shell.returncode == 0, err
    said = json.loads(out.splitlines()[-1])
    assert said["kind"] == "submitted" and said["job_id"]
    left = [p.pid for p in psutil.process_iter() if _session(p) == shell.pid]
    assert wait_gone(left, 5.0) == [], "the submitting shell's session left processes"
    folder = RunFolder(said["run_dir"])
    job = said["job_id"]
    print(f"submitted in {took:.1f} s")
    # attached from the login node from the start: it follows through the queue into the run
    follower = FollowedRun(folder)
    assert follower.state.state in ("pending", "starting", "running")
    assert follower.wait(RUN_TIMEOUT) == "finished", story(folder)
    wait_until("run.json finished", lambda: state_of(folder) == "finished", 10, folder)  # written after the event
    assert run_row(folder).state == "finished"
    assert follower.state.step == 48
    infos = [str(e.get("message")) for e in run_events(folder, "info")]
    assert any(f"the run adopts Slurm job {job}" in m for m in infos), infos
    submitted = [m for m in infos if "submitted" in m]
    assert submitted == [f"Slurm job {job} submitted for 'slurm' as a batch job: its launcher runs inside it, on "
                         "the job's first node"], "a second job was submitted (salloc inside the batch job?)"
    assert {e["task"] for e in run_events(folder, "status", state="finished")} == {"worker:0", "worker:1"}
    assert_nothing_left(folder)
    assert [e["kind"] for e in slurm_batch.executions(folder)] == ["start", "end"]
    status, _ = slurm.final_status(job)
    assert status is not None and status.state == "COMPLETED", status
    state = slurm_batch.batch_state(folder)
    assert state is not None and state.state == "finished"


def _session(proc: psutil.Process) -> int:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return -1


def test_the_time_limit_warning_checkpoints_requeues_and_the_run_resumes_its_steps(
        cluster: slurm_cluster.Cluster, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning: stopped at a final checkpoint, requeued, resumed from it. Then Slurm requeues the job itself
    (``scontrol requeue``, as it does to a preempted job where the cluster requeues them): resumed again."""
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "worker:0=0.05")  # sbatch hands the job this environment
    config = small(steps=240, checkpoint_every=40, restarts=2, steps_per_execution=4)
    done = slurm_batch.submit(config, runs_root, deep=False)
    folder, job = done.folder, done.job_id
    wait_until("steps of the first execution", lambda: state_of(folder) == "running" and step_of(folder) >= 20,
               RUN_TIMEOUT, folder)
    usr1(job)
    seen: list[str] = []  # what a reader (ls, attach) makes of the run while it is stopped and requeued

    def requeued() -> bool:
        now = slurm_batch.batch_state(folder)
        seen.append(now.state if now is not None else "")
        return state_of(folder) == "pending" and (s := slurm.job_status(job)) is not None and s.pending

    wait_until("the requeued job", requeued, 60, folder)
    assert set(seen) <= set(LIVE_STATES), f"read as ended meanwhile: {seen}"
    assert "starting" not in seen[seen.index("stopping") if "stopping" in seen else 0:], seen  # not yet back
    saved = [e for e in run_events(folder, "info") if isinstance(e.get("stopped_step"), int)][0]
    first_end = saved["stopped_step"]
    assert 0 < first_end < 240 and saved["checkpoint"].endswith(f"ckpt-{first_end}")
    requeued = run_events(folder, "run", state="pending")[-1]
    assert requeued["job_id"] == job and f"checkpoint at step {first_end} written" in requeued["message"]
    assert "requeued (restart 1 of 2)" in requeued["message"]
    assert not folder.launcher_json.exists() and run_row(folder).state == "pending"
    eligible_now(job)
    wait_until("steps of the second execution", lambda: len(resumes(folder)) >= 1 and state_of(folder) == "running"
               and step_of(folder) >= first_end + 24, RUN_TIMEOUT, folder)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=10)
    wait_until("the job queued again by Slurm",
               lambda: (s := slurm_batch.batch_state(folder)) is not None and s.state == "pending", 60, folder)
    eligible_now(job)
    wait_until("the end of the third execution", lambda: state_of(folder) in ("finished", "failed", "stopped")
               and len(resumes(folder)) >= 2, RUN_TIMEOUT, folder)
    assert state_of(folder) == "finished", story(folder)
    assert_nothing_left(folder)
    steps = sorted((e["t"], e["step"]) for e in read_events(folder.path) if e["kind"] == "step")
    assert max(s for _, s in steps) == 240
    rounds = resumes(folder)
    assert rounds[0]["resumed_step"] == first_end, rounds
    for resumed in (rounds[0], rounds[-1]):  # each execution's steps carry on from the checkpoint it resumed
        after = [s for t, s in steps if t > resumed["t"]]
        assert after and min(after) > resumed["resumed_step"], f"an execution started its steps over: {resumed}"
    assert rounds[-1]["resumed_step"] >= first_end
    lines = slurm_batch.executions(folder)
    assert [e["kind"] for e in lines if e["kind"] in ("start", "end")] == ["start", "end"] * 3, lines
    assert [e.get("slurm_restart_count") for e in lines if e["kind"] == "start"] == ["", "1", "2"]
    assert slurm_batch.restarts_used(lines) == 2


def resumes(folder: RunFolder) -> list[dict[str, Any]]:
    """The primary's "resumed from checkpoint" of each execution after the first."""
    return [e for e in run_events(folder, "info") if "resumed_step" in e and e["task"] == "worker:0"]


def eligible_now(job: str) -> None:
    """A requeued job may start at once, not after Slurm's two minutes (see the module's docstring). Not in the
    second its node revoked the job's credential, though: slurmd refuses a credential made within the second of a
    revocation (whole seconds), and Slurm fails the job ("Job credential revoked")."""
    wait_until("the job pending again", lambda: (s := slurm.job_status(job)) is not None and s.pending, 30)
    time.sleep(2.5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True,
                   timeout=10)


def test_a_whole_run_restart_stays_inside_the_batch_job_and_counts_against_the_restarts(
        cluster: slurm_cluster.Cluster, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "worker:0=0.05")
    config = small(steps=120, checkpoint_every=20, restarts=1, steps_per_execution=4)
    done = slurm_batch.submit(config, runs_root, deep=False)
    folder, job = done.folder, done.job_id
    wait_until("steps past the first checkpoint", lambda: state_of(folder) == "running" and step_of(folder) >= 30,
               RUN_TIMEOUT, folder)
    pid = folder.read_meta()["tasks"]["worker:1"]["pid"]
    os.kill(pid, 9)  # the run restarts from its checkpoint, in the same job: no salloc, no new job
    wait_until("the end", lambda: state_of(folder) in ("finished", "failed", "stopped"), RUN_TIMEOUT, folder)
    assert state_of(folder) == "finished", story(folder)
    assert run_events(folder, "run", state="restarting"), "the run did not restart"
    assert len([e for e in run_events(folder, "info") if "submitted" in str(e.get("message"))]) == 1
    assert_nothing_left(folder)
    lines = slurm_batch.executions(folder)
    assert [e["kind"] for e in lines] == ["start", "run_restart", "end"], lines
    assert slurm_batch.restarts_used(lines) == 1  # a requeue now would find no restart left
    # each generation was placed with ports chosen then: none the last one may still hold
    placed = [e["message"] for e in run_events(folder, "info") if " running on " in str(e.get("message"))]
    assert len(placed) == 2 and placed[0] != placed[1], placed
    status, _ = slurm.final_status(job)
    assert status is not None and status.state == "COMPLETED"


def test_the_warning_with_no_restart_left_stops_the_run_at_its_checkpoint(
        cluster: slurm_cluster.Cluster, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "worker:0=0.05")
    config = small(steps=100_000, checkpoint_every=0, restarts=0, steps_per_execution=4)
    done = slurm_batch.submit(config, runs_root, deep=False)
    folder, job = done.folder, done.job_id
    wait_until("steps", lambda: state_of(folder) == "running" and step_of(folder) >= 8, RUN_TIMEOUT, folder)
    usr1(job)
    # the launcher's run ends stopped, then the batch side says why with the step of the checkpoint
    final = wait_until("the run's end", lambda: run_events(folder, "run", state="stopped", job_id=job), 90, folder)[-1]
    (saved,) = [e for e in run_events(folder, "info") if isinstance(e.get("stopped_step"), int)]
    step = saved["stopped_step"]
    assert final["reason"] == (f"Slurm time limit reached: checkpoint at step {step} written; no restarts left "
                               "(training.restarts: 0)")
    assert (folder.checkpoints / f"ckpt-{step}.index").exists()
    wait_until("the run.json end", lambda: state_of(folder) == "stopped", 20, folder)
    assert folder.read_meta()["summary"]["reason"] == final["reason"]
    assert not run_events(folder, "run", state="pending", slurm_state="REQUEUED"), "requeued with no restart left"
    assert_nothing_left(folder)
    status, _ = slurm.final_status(job)
    assert status is not None and status.state == "COMPLETED"
    state = slurm_batch.batch_state(folder)
    assert state is not None and state.state == "stopped"


def test_the_cli_registers_sbatch_on_a_parser(cluster: slurm_cluster.Cluster) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="clusterdeck")
    batch_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sbatch", "slurm-data", "--steps", "5", "--signal-before", "300"])
    assert (args.preset, args.steps, args.signal_before, args.func) == ("slurm-data", 5, 300, batch_cli.cmd_sbatch)
