"""Asynchronous parameter-server training on real local clusters: chief + workers + ps processes.

Each test starts real TensorFlow processes (3-9 s each to start on a small machine), so the
runs are short and each test checks several things of one run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import parent_death
from engine.contract.config import RunConfig
from engine.contract.run_folder import RunFolder
from engine.control.launcher import Run
from tests.conftest import PRESETS, EventRecorder, wait_gone

pytestmark = pytest.mark.cluster

RUN_TIMEOUT = 150.0


def preset(steps: int, **training: Any) -> RunConfig:
    config = config_mod.load(PRESETS / "async-1ps.yaml")
    return config_mod.replace(config, training=config_mod.replace(config.training, steps=steps, **training))


Recorder = EventRecorder


def launch(config: RunConfig, runs_root: Path, *listeners: Any) -> tuple[Run, Recorder]:
    run = Run(config, runs_root=runs_root)
    rec = Recorder()
    run.add_listener(rec)
    for listener in listeners:
        run.add_listener(listener)
    run.start()
    return run, rec


def assert_nothing_left(pids: set[int]) -> None:
    assert pids, "no task process was ever seen"
    assert wait_gone(pids, 5.0) == [], "ps/worker/chief processes outlived the run"


def workers_seen(steps: list[dict[str, Any]]) -> set[int]:
    return {e["worker"] for e in steps}


def test_chief_two_workers_one_ps_complete(runs_root: Path) -> None:
    config = preset(steps=200, checkpoint_every=0, restarts=0, metrics_hz=10.0)
    run, rec = launch(config, runs_root)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason

    steps = rec.of("step")
    assert workers_seen(steps) == {0, 1}, "both workers must report steps"
    assert all(e["replica"] == e["worker"] and e["task"] == "chief:0" for e in steps)
    assert set(run.state.replicas) == {0, 1}
    for rep in run.state.replicas.values():
        assert rep.examples_per_sec and rep.examples_per_sec > 0
        assert rep.step_time and rep.step_time > 0
        assert rep.loss is not None and rep.first_loss is not None and rep.loss < rep.first_loss
    # every step is accounted for once, but reported at most metrics_hz times per worker per second
    assert sum(e["steps"] for e in steps) == 200
    for worker in (0, 1):
        mine = [e for e in steps if e["worker"] == worker]
        assert len(mine) <= (mine[-1]["t"] - mine[0]["t"]) * 10.0 + 2
        assert [e["step"] for e in mine] == sorted(e["step"] for e in mine)
    assert len(steps) < 100

    progress = rec.of("progress")
    assert progress and all(0 <= e["completed"] <= e["scheduled"] <= 200 for e in progress)
    assert progress[-1]["completed"] == progress[-1]["scheduled"] == 200 and progress[-1]["total"] == 200
    assert any(e["scheduled"] > e["completed"] for e in progress), "steps must be in flight while fetching"
    # every group scheduled as the one concrete function (tf_compat.scheduled_concrete_function), no fallback
    assert not [e for e in rec.of("info") if "looks its function up" in e.get("message", "")]

    # the chief's steady-state throughput counts one worker batch (64 examples) per step, as its progress does
    (done,) = [e for e in rec.of("status", state="finished") if e["task"] == "chief:0"]
    warm = [e for e in progress if e["completed"] >= 40]
    paced = (warm[-1]["completed"] - warm[0]["completed"]) * 64 / (warm[-1]["t"] - warm[0]["t"])
    assert 0.7 < done["window_examples_per_sec"] / paced < 1.4, (done["window_examples_per_sec"], paced)

    (placement,) = rec.of("placement")
    assert placement["variables"] and {v["task"] for v in placement["variables"]} == {"ps:0"}
    assert {e["task"] for e in rec.of("status", state="running")} == {"chief:0", "worker:0", "worker:1", "ps:0"}
    assert "chief:0" in [e["task"] for e in rec.of("status", state="finished")]
    # the launcher ended the servers (they never leave server.join() by themselves); none failed
    assert not rec.of("status", state="failed")
    assert all(run.state.tasks[t].state in ("finished", "stopped") for t in ("worker:0", "worker:1", "ps:0"))
    assert_nothing_left(rec.pids())


def test_steps_run_in_groups_cut_at_warm_up_and_checkpoints(runs_root: Path) -> None:
    # 16 steps per scheduled function; a group ends early where the loop needs every step so far done:
    # the end of the warm-up (step 20 of 100), each checkpoint (30, 60, 90) and the last step. Groups:
    # 1-16, 17-20, 21-30, 31-46, 47-60, 61-76, 77-90, 91-100; every one a sample (metrics_hz 1e6)
    config = preset(steps=100, checkpoint_every=30, restarts=0, metrics_hz=1e6, steps_per_execution=16)
    run, rec = launch(config, runs_root)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason
    steps = rec.of("step")
    assert sum(e["steps"] for e in steps) == 100, "every step counted once"
    assert sum(e["sampled"] for e in steps) == 8, "one scheduled function per group"
    assert {e["step"] for e in steps} <= {16, 20, 30, 46, 60, 76, 90, 100}
    assert max(e["step"] for e in steps) == 100
    progress = rec.of("progress")
    assert progress[-1]["completed"] == progress[-1]["scheduled"] == 100
    ckpts = sorted(p.name for p in (run.run_dir / "checkpoints").glob("ckpt-*.index"))
    assert ckpts == ["ckpt-100.index", "ckpt-90.index"]
    (ran,) = [e for e in rec.of("info") if "steps_run" in e]
    assert ran["steps_run"] == 100
    # TensorFlow's coordinator timers: the 8 groups and each worker's dataset ran; every group was a sample,
    # copied by the chief as it read it, so the workers' threads copied nothing (a copy there, a round trip,
    # took ~3-4 ms each: 8 of them ~30 ms)
    assert ran["coordinator_functions"] >= 8, ran
    assert 0 < ran["coordinator_run_s"] and ran["coordinator_copy_s"] < 0.005, ran
    assert "copies to the chief" in ran["message"], ran
    assert_nothing_left(rec.pids())


def test_a_stop_mid_group_saves_the_steps_it_ran_and_a_restart_resumes_there(runs_root: Path) -> None:
    import threading

    # groups of 16 (the preset's): a stop comes between two steps of a group; the chief schedules what the
    # loop counts as done, waits for every group in flight and saves exactly that step
    config = preset(steps=100_000, checkpoint_every=0, restarts=0)
    assert config.training.steps_per_execution == 16
    run, rec = launch(config, runs_root)
    going = threading.Event()
    run.add_listener(lambda e: going.set() if e["kind"] == "step" and e["step"] >= 200 else None)
    assert going.wait(RUN_TIMEOUT), "no step 200"
    pids = rec.pids()
    run.stop()
    assert run.wait(30) == "stopped"
    (stopped,) = [e for e in rec.of("info") if e["task"] == "chief:0" and "stopped_step" in e]
    step = stopped["stopped_step"]
    assert step >= 200 and "final checkpoint ckpt-" in stopped["message"]
    assert (run.run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    progress = [e for e in rec.of("progress") if e["task"] == "chief:0"]
    assert progress[-1]["completed"] == progress[-1]["scheduled"] == step
    assert_nothing_left(pids)

    # the same run folder started again resumes at that step, in groups again
    again = config_mod.replace(config, training=config_mod.replace(config.training, steps=step + 40))
    run2 = Run(again, runs_root=runs_root, run_dir=run.run_dir)
    rec2 = Recorder()
    run2.add_listener(rec2)
    run2.start()
    assert run2.wait(RUN_TIMEOUT) == "finished", run2.state.reason
    resumed = [e for e in rec2.of("info") if e["task"] == "chief:0" and "resumed_step" in e]
    assert resumed and resumed[0]["resumed_step"] == step
    assert sum(e["steps"] for e in rec2.of("step")) == 40
    assert (run.run_dir / "checkpoints" / f"ckpt-{step + 40}.index").exists()
    assert_nothing_left(rec2.pids())


def test_killed_worker_is_restarted_and_rejoins(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    killed: dict[str, int] = {}
    # the chief schedules at most ~100 steps/s, so that the cores stay free for the fresh worker process; the
    # run is long and is stopped once the restarted worker has trained again
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "chief:0=0.01")

    def kill_worker_1(event: dict[str, Any]) -> None:
        # worker 1 dies as soon as it has been seen training; its restart (a fresh TF process next to
        # a busy cluster) takes 10-20 s on 2 cores
        if not killed and event["kind"] == "step" and event.get("worker") == 1:
            pid = run.state.tasks["worker:1"].pid
            assert pid is not None
            killed["pid"] = pid
            os.kill(pid, signal.SIGKILL)

    def after_rejoin(order: list[dict[str, Any]]) -> tuple[int, int, list[dict[str, Any]]] | None:
        failed = next((i for i, e in enumerate(order) if e["kind"] == "status" and e["task"] == "worker:1"
                       and e["state"] == "failed"), None)
        if failed is None:
            return None
        rejoined = next((i for i, e in enumerate(order) if i > failed and e["kind"] == "status"
                         and e["task"] == "worker:1" and e["state"] == "running"), None)
        if rejoined is None:
            return None
        return failed, rejoined, [e for e in order[rejoined:] if e["kind"] == "step"]

    run, rec = launch(preset(steps=100_000, checkpoint_every=0, restarts=0), runs_root, kill_worker_1)
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        seen = after_rejoin(rec.snapshot())
        if seen and workers_seen(seen[2]) >= {0, 1}:
            break
        assert run.state.state in ("starting", "running"), run.state.reason
        assert time.monotonic() < deadline, "the restarted worker never ran a step again"
        time.sleep(0.2)
    pids = rec.pids() | {killed["pid"]}
    run.stop()
    assert run.wait(30) == "stopped", run.state.reason

    order = rec.snapshot()
    failed, rejoined, _ = seen
    assert order[failed]["will_restart"] is True
    assert order[rejoined]["pid"] != killed["pid"]
    assert run.state.tasks["worker:1"].restarts == 1
    # the chief trained on through the loss and the restart, and saved where the stop found it
    (stopped,) = [e for e in rec.of("info") if e["task"] == "chief:0" and "stopped_step" in e]
    assert "final checkpoint ckpt-" in stopped["message"]
    assert_nothing_left(pids)
    if parent_death.available():  # the restart, as the first start, forked from the host's warm-start template
        log = RunFolder(run.run_dir).task_log("worker:1").read_text()
        assert log.count("starting worker:1 (forked, warm)") == 2, log[-2000:]


def test_killed_ps_restarts_the_run_from_its_checkpoint(runs_root: Path) -> None:
    killed: dict[str, int] = {}

    def kill_ps(event: dict[str, Any]) -> None:
        # after the checkpoint at step 50 was written
        if not killed and event["kind"] == "step" and event["step"] >= 70:
            pid = run.state.tasks["ps:0"].pid
            assert pid is not None
            killed["pid"] = pid
            os.kill(pid, signal.SIGKILL)

    run, rec = launch(preset(steps=150, checkpoint_every=50, restarts=1), runs_root, kill_ps)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason
    assert killed and run.restarts_used == 1

    with rec.lock:
        order = list(rec.events)
    restart = next(i for i, e in enumerate(order) if e["kind"] == "run" and e["state"] == "restarting")
    assert "ps:0" in order[restart]["reason"] or "chief:0" in order[restart]["reason"]
    restored = [e for e in order[restart:] if e["kind"] == "info" and "checkpoint" in e]
    assert restored and restored[0]["step"] >= 50
    resumed = [e for e in order[restart:] if e["kind"] == "status" and e["task"] == "chief:0"
               and e["state"] == "running"]
    assert resumed and resumed[0]["step"] == restored[0]["step"]
    progress = [e for e in order[restart:] if e["kind"] == "progress"]
    assert progress[0]["completed"] == restored[0]["step"] and progress[-1]["completed"] == 150
    first_after = next(e for e in order[restart:] if e["kind"] == "step")
    assert first_after["step"] > restored[0]["step"] > 0, "the step count must carry on from the checkpoint"
    ckpts = sorted(p.name for p in (run.run_dir / "checkpoints").glob("ckpt-*.index"))
    assert "ckpt-150.index" in ckpts
    assert_nothing_left(rec.pids() | {killed["pid"]})


def test_killed_chief_fails_the_run_and_leaves_nothing(runs_root: Path) -> None:
    killed: dict[str, int] = {}

    def kill_chief(event: dict[str, Any]) -> None:
        if not killed and event["kind"] == "step":
            pid = run.state.tasks["chief:0"].pid
            assert pid is not None
            killed["pid"] = pid
            os.kill(pid, signal.SIGKILL)

    run, rec = launch(preset(steps=2000, checkpoint_every=0, restarts=0), runs_root, kill_chief)
    assert run.wait(RUN_TIMEOUT) == "failed"
    assert killed and run.state.failed_task == "chief:0"
    assert "SIGKILL" in run.state.reason
    assert_nothing_left(rec.pids() | {killed["pid"]})


# --------------------------------------------------------------------------- the sharded embedding


def test_sharded_embedding_is_split_over_two_ps_and_learns(runs_root: Path) -> None:
    config = config_mod.load(PRESETS / "async-embedding-2ps.yaml")
    config = config_mod.replace(config, training=config_mod.replace(config.training, steps=300))
    run, rec = launch(config, runs_root)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason

    (placement,) = rec.of("placement")
    table = [v for v in placement["variables"] if v["name"] == "embedding_table"]
    assert [v["shard"] for v in table] == [0, 1] and all(v["shards"] == 2 for v in table)
    assert {v["task"] for v in table} == {"ps:0", "ps:1"}, "the table must be split across both ps tasks"
    assert sum(v["shape"][0] for v in table) == 8192 and all(v["shape"][1] == 64 for v in table)
    assert {v["device"].split("/device:")[0] for v in table} == {"/job:ps/replica:0/task:0",
                                                                 "/job:ps/replica:0/task:1"}
    head = [v for v in placement["variables"] if v["name"] != "embedding_table"]
    assert head and all(v["shards"] == 1 for v in head), "Keras variables must stay whole"

    steps = rec.of("step")
    assert workers_seen(steps) == {0, 1}
    early = sum(e["loss"] for e in steps[:4]) / 4
    late = sum(e["loss"] for e in steps[-4:]) / 4
    assert late < 0.7 * early, f"the loss did not fall: {early:.3f} -> {late:.3f}"
    assert_nothing_left(rec.pids())


# --------------------------------------------------------------------------- the user's model and data

#: "learned": the mean loss of the last fifth of the step reports (at most 20) is below this fraction of the first's
LEARNED_RATIO = 0.6


def assert_learned(steps: list[dict[str, Any]], reports: int = 5) -> tuple[float, float]:
    """The mean loss of the last fifth of ``steps``'s reports fell enough from that of the first fifth."""
    losses = [e["loss"] for e in steps]
    assert len(losses) >= reports, f"only {len(losses)} step reports"
    n = max(1, min(20, len(losses) // 5))
    first, last = sum(losses[:n]) / n, sum(losses[-n:]) / n
    assert last < LEARNED_RATIO * first, f"the loss did not fall enough: {first:.3f} -> {last:.3f}"
    return first, last


def test_user_script_model_and_data_train_asynchronously(runs_root: Path) -> None:
    config = config_mod.load(PRESETS / "async-user-script.yaml")
    config = config_mod.replace(config, training=config_mod.replace(config.training, steps=200, metrics_hz=1e6,
                                                                    checkpoint_every=100))
    run, rec = launch(config, runs_root)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason
    steps = rec.of("step")
    assert workers_seen(steps) == {0, 1}, "both workers read their shard of the script's data"
    assert sum(e["steps"] for e in steps) == 200
    # 16 steps per scheduled function, as the preset ships: at most one sample per group (14 groups: cut
    # at the warm-up's step 40 and the checkpoint at 100)
    (info,) = [e for e in rec.of("info") if e.get("strategy") == "ParameterServerStrategy"]
    assert info["steps_per_execution"] == 16
    assert sum(e["sampled"] for e in steps) <= 14
    assert_learned(steps)
    # the script's model trains on the ps: Adam's slots are placed there with the weights
    (placement,) = rec.of("placement")
    names = [v["name"] for v in placement["variables"]]
    assert any("adam" in n.lower() or "momentum" in n.lower() for n in names), names
    assert {v["task"] for v in placement["variables"]} == {"ps:0"}
    assert (run.run_dir / "checkpoints" / "ckpt-200.index").exists()
    assert_nothing_left(rec.pids())


def test_npz_file_trains_asynchronously_each_worker_on_its_shard(tmp_path: Path, runs_root: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2048, 20)).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((20, 4)), axis=1).astype(np.int64)
    np.savez(tmp_path / "task.npz", x=x, y=y)
    config = preset(steps=200, checkpoint_every=0, restarts=0, metrics_hz=1e6, optimizer="rmsprop",
                    learning_rate=0.003, global_batch_size=64)
    config = config_mod.replace(
        config, data=config_mod.replace(config.data, source="npz", path=str(tmp_path / "task.npz"), shape=(20,),
                                        classes=4, size=2048),
        model=config_mod.replace(config.model, hidden=(32,)))
    run, rec = launch(config, runs_root)
    assert run.wait(RUN_TIMEOUT) == "finished", run.state.reason
    steps = rec.of("step")
    assert workers_seen(steps) == {0, 1}
    assert_learned(steps)
    # the examples went to the workers as files in the run folder, removed at the end
    assert not (run.run_dir / "scratch" / "examples").exists()
    assert_nothing_left(rec.pids())
