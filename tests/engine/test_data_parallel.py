"""Real data-parallel runs: TensorFlow task processes on the CPU, started by the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, RunConfig, Task, replace
from engine.contract.run_folder import RunFolder
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import PRESETS, ROOT, alive, wait_gone

pytestmark = pytest.mark.cluster


def tensor_value(proto: object) -> float:
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(proto))


def small(cfg: RunConfig, steps: int, **training: object) -> RunConfig:
    return replace(cfg, training=replace(cfg.training, steps=steps, epochs=None, **training))


def one_worker(gpus: int) -> Cluster:
    return Cluster(hosts=(Host(name="local", gpus=gpus, tasks=(Task("worker", 0),)),))


def test_two_workers_complete_with_events_from_both_replicas(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-2workers.yaml"), 60, checkpoint_every=25)
    run = Run(cfg, runs_root=runs_root)
    seen: list[dict] = []
    run.add_listener(seen.append)
    run_dir = run.start()
    assert run.wait(120) == "finished", run.state.summary()

    steps = [e for e in seen if e["kind"] == "step"]
    by_replica = {r: [e for e in steps if e["replica"] == r] for r in (0, 1)}
    assert by_replica[0] and by_replica[1], "both replicas must report"
    assert {e["task"] for e in by_replica[0]} == {"worker:0"}
    assert {e["task"] for e in by_replica[1]} == {"worker:1"}
    for r in (0, 1):
        last = by_replica[r][-1]
        assert last["step"] == 60
        assert last["examples_per_sec"] > 0 and last["step_time"] > 0
        # each replica reports its own loss: the two differ (different shards of data)
    assert by_replica[0][-1]["loss"] != by_replica[1][-1]["loss"]
    infos = [e for e in seen if e["kind"] == "info" and e.get("strategy")]
    assert {e["strategy"] for e in infos} == {"MultiWorkerMirroredStrategy"}

    # everything streamed is also on disk: the lifecycle in events.jsonl and each task's file, the samples in the
    # run's tiered store (float32 columns), once (the tasks' own files do not copy them)
    on_disk = sorted((e for e in read_events(run_dir) if e["kind"] == "step"), key=lambda e: (e["step"], e["replica"]))
    live = sorted(steps, key=lambda e: (e["step"], e["replica"]))
    assert [(e["replica"], e["step"]) for e in on_disk] == [(e["replica"], e["step"]) for e in live]
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(on_disk, live, strict=True))
    for name in ("worker-0", "worker-1"):
        own = events.read_file(run_dir / "tasks" / name / "events.jsonl")
        assert any(e["kind"] == "status" for e in own) and not any(e["kind"] == "step" for e in own)
        assert (run_dir / "tasks" / name / "log.txt").exists()
    assert (run_dir / "config.yaml").exists() and config_mod.load(run_dir / "config.yaml").name == cfg.name
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    assert any(p.name.startswith("ckpt-60") for p in (run_dir / "checkpoints").iterdir())
    # the same scalars as TensorBoard summaries, read back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for r in (0, 1):  # a TensorBoard run per replica, plain tags (one chart overlays the replicas)
        acc = EventAccumulator(str(run_dir / "tensorboard" / f"replica_{r}"), size_guidance={"tensors": 0})
        acc.Reload()
        points = {int(ev.step): float(tensor_value(ev.tensor_proto)) for ev in acc.Tensors("loss")}
        streamed = {e["step"]: e["loss"] for e in by_replica[r]}
        # at most two points a second per replica in TensorBoard, the run's last one included
        assert points and points.keys() <= streamed.keys() and max(points) == 60
        assert all(abs(points[k] - streamed[k]) < 1e-5 for k in points)
    # device use was sampled by the supervisor
    assert any(e["kind"] == "device" and "cpu_percent" in e for e in seen)
    assert not alive(run.pids())


def _loss_trajectory(cfg: RunConfig, runs_root: Path) -> list[float]:
    run = Run(cfg, runs_root=runs_root)
    seen: list[dict] = []
    run.add_listener(seen.append)
    run.start()
    assert run.wait(120) == "finished", run.state.summary()
    per_step: dict[int, list[float]] = {}
    for e in seen:
        if e["kind"] == "step":
            per_step.setdefault(e["step"], []).append(e["loss"])
    # every replica holds an equal slice of the global batch: the global loss is their mean
    return [sum(v) / len(v) for _, v in sorted(per_step.items())]


def test_mirrored_two_devices_follow_one_device_trajectory(runs_root: Path) -> None:
    base = small(config_mod.default_config(), 20, metrics_hz=1e6, global_batch_size=64, learning_rate=0.1)
    one = _loss_trajectory(replace(base, name="one-device", cluster=one_worker(0)), runs_root)
    two = _loss_trajectory(replace(base, name="two-devices", cluster=one_worker(2)), runs_root)
    assert len(one) == len(two) == 20
    assert one[-1] < one[0], "the loss must fall, or the comparison proves nothing"
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        assert abs(a - b) <= 1e-4, f"step {step}: 1 device {a:.6f} vs 2 devices {b:.6f}"


def _final_weights(run_dir: Path, step: int) -> dict[str, object]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(RunFolder(run_dir).checkpoints / f"ckpt-{step}"))
    # the model's variables (as the optimizer tracks them) and the optimizer's step count
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "_trainable_variables/" in name or "_iterations/" in name}


def test_grouped_steps_train_as_single_steps_and_report_per_group(runs_root: Path) -> None:
    """Two workers, 40 steps, a checkpoint at 20: with 8 steps per function the groups end at the
    warm-up's end (8), every 8 steps and the checkpoint, and the weights come out as with single steps."""
    import numpy as np

    base = small(config_mod.load(PRESETS / "data-2workers.yaml"), 40, checkpoint_every=20, metrics_hz=1e6)
    weights, reported = {}, {}
    for k in (1, 8):
        cfg = replace(base, name=f"groups-{k}", training=replace(base.training, steps_per_execution=k))
        run = Run(cfg, runs_root=runs_root)
        seen: list[dict] = []
        run.add_listener(seen.append)
        run.start()
        assert run.wait(120) == "finished", run.state.summary()
        reported[k] = [e["step"] for e in seen if e["kind"] == "step" and e["replica"] == 0]
        assert (RunFolder(run.run_dir).checkpoints / "ckpt-20.index").exists()
        weights[k] = _final_weights(run.run_dir, 40)
    assert reported[1] == list(range(1, 41))
    assert reported[8] == [8, 16, 20, 28, 36, 40]
    assert len(weights[1]) == 5 and weights[1].keys() == weights[8].keys()  # 2 kernels, 2 biases, iterations
    for name, value in weights[1].items():
        assert np.allclose(value, weights[8][name], atol=1e-5), name


def test_stop_mid_run_leaves_no_process_within_3s(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-2workers.yaml"), 100_000)
    run = Run(cfg, runs_root=runs_root)
    got_step = threading.Event()
    run.add_listener(lambda e: got_step.set() if e["kind"] == "step" else None)
    run.start()
    assert got_step.wait(90), "no step within 90 s"
    pids = run.pids()
    assert len(pids) == 3  # one supervisor, two tasks
    t0 = time.monotonic()
    run.stop()
    elapsed = time.monotonic() - t0
    assert wait_gone(pids, max(0.0, 3.0 - elapsed)) == []
    assert time.monotonic() - t0 <= 3.0 + 0.2
    assert run.wait(5) == "stopped"
    states = {t.state for t in run.state.tasks.values()}
    assert states == {"stopped"}


def test_killed_worker_fails_the_run_naming_it(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-2workers.yaml"), 100_000)
    run = Run(cfg, runs_root=runs_root)
    got_step = threading.Event()
    run.add_listener(lambda e: got_step.set() if e["kind"] == "step" else None)
    run.start()
    assert got_step.wait(90)
    victim = run.state.tasks["worker:1"].pid
    assert victim
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "worker:1"
    assert "SIGKILL" in run.state.reason
    assert not wait_gone(run.pids(), 3)
    on_disk = read_events(run.run_dir)
    assert any(e["kind"] == "step" for e in on_disk)
    lifecycle = events.read_file(run.run_dir / "events.jsonl")
    assert lifecycle[-1]["kind"] == "run" and lifecycle[-1]["state"] == "failed"


def test_restart_resumes_from_checkpoint(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-1worker-2gpus.yaml"), 400, checkpoint_every=20, restarts=1)
    run = Run(cfg, runs_root=runs_root)
    seen: list[dict] = []
    killed = threading.Event()

    def on_event(e: dict) -> None:
        seen.append(e)
        if e["kind"] == "step" and e["step"] >= 60 and not killed.is_set():
            killed.set()
            os.kill(run.state.tasks["worker:0"].pid or 0, signal.SIGKILL)

    run.add_listener(on_event)
    run.start()
    assert run.wait(180) == "finished", run.state.summary()
    assert killed.is_set()
    assert any(e["kind"] == "run" and e["state"] == "restarting" for e in seen)
    restored = [e for e in seen if e["kind"] == "info" and "resumed from checkpoint" in e.get("message", "")]
    assert restored, "the second generation must restore the checkpoint"
    restart_at = next(i for i, e in enumerate(seen) if e["kind"] == "run" and e["state"] == "restarting")
    after = [e["step"] for e in seen[restart_at:] if e["kind"] == "step"]
    assert after and 20 <= min(after) <= 81  # carried on from a checkpoint, not from step 1
    assert max(after) == 400


def _cli(*args: str, cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_json_mode_streams_events_and_summary(tmp_path: Path) -> None:
    out = _cli("run", str(PRESETS / "data-1worker-2gpus.yaml"), "--steps", "30", "--json", "--out",
               str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    assert any(e["kind"] == "step" and e["replica"] == 1 for e in lines)
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["state"] == "finished" and summary["steps"] == 30
    assert set(summary["replicas"]) == {"0", "1"}
    assert Path(summary["run_dir"]).is_dir()


def test_cli_pretty_failure_names_the_task_and_exits_non_zero(tmp_path: Path) -> None:
    preset = tmp_path / "broken.yaml"
    cfg = small(config_mod.default_config(), 30)
    config_mod.save(cfg, preset)
    # a test-only hook makes worker:1 raise once it starts
    env_out = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(preset), "--out", str(tmp_path / "runs")],
                             cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERDECK_TEST_FAIL="worker:1"),
                             capture_output=True, text=True, timeout=150)
    assert env_out.returncode == 1, env_out.stdout[-2000:] + env_out.stderr[-2000:]
    assert "failed task: worker:1" in env_out.stdout
    assert "test failure requested" in env_out.stdout


def test_cli_rejects_a_bad_preset_with_the_field_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  hosts:\n  - name: a\n    gpus: -2\n", encoding="utf-8")
    out = _cli("run", str(bad), cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert "cluster.hosts[0].gpus: expected an integer >= 0, got -2" in out.stderr
    assert "Traceback" not in out.stderr


def test_launcher_killed_tasks_exit_by_themselves(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(PRESETS / "data-2workers.yaml"),
                             "--steps", "100000", "--json", "--out", str(tmp_path / "runs")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids: set[int] = set()
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        e = json.loads(line)
        if e["kind"] == "status" and e.get("pid"):
            pids.add(e["pid"])
        if e["kind"] == "step" or time.monotonic() > deadline:
            break
    assert len(pids) == 2
    proc.kill()
    proc.wait()
    assert wait_gone(pids, 5.0) == [], "tasks outlived their launcher by more than 5 s"
    run_dir = next((tmp_path / "runs").iterdir())
    # the samples' store of the killed launcher reads back (whole records only; it writes every 0.5 s, so a
    # launcher killed at its first step may have written none); events.jsonl holds whole lines only
    folder = RunFolder(run_dir)
    read_events(run_dir)
    stats = events.ReadStats()
    events.read_file(folder.events, stats)
    assert stats.bad == 0 and stats.good > 0
    assert config_mod.load(run_dir / "config.yaml")


def test_evaluator_side_car_evaluates_checkpoints_until_the_final_one(runs_root: Path) -> None:
    cfg = small(config_mod.load(PRESETS / "data-1worker-2gpus.yaml"), 150, checkpoint_every=50)
    host = cfg.cluster.hosts[0]
    cfg = replace(cfg, cluster=Cluster(hosts=(replace(host, tasks=(*host.tasks, Task("evaluator", 0))),)))
    run = Run(cfg, runs_root=runs_root)
    run.start()
    assert run.wait(150) == "finished", run.state.summary()
    evals = run.state.evals
    assert evals and evals[-1]["step"] == 150
    assert all(e["task"] == "evaluator:0" for e in evals)
    assert 0.0 <= evals[-1]["accuracy"] <= 1.0
    # held-out data from the same teacher: the trained model beats chance (10 classes)
    assert evals[-1]["accuracy"] > 0.2
    assert run.state.tasks["evaluator:0"].state == "finished"
