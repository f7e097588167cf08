"""The Keras callback: an existing ``model.fit`` streams per-replica metrics into a run folder the app reopens."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.observe.telemetry import RunState
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "keras_fit_callback.py"


def test_example_fit_on_two_replicas_writes_a_run_folder_the_app_reopens(tmp_path: Path) -> None:
    run_dir = tmp_path / "fit-run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--run-dir", str(run_dir), "--steps", "20"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(run_dir)

    # what a launched run has: config.yaml, run.json, the run's events.jsonl and the task's own
    config = config_mod.load(run_dir / "config.yaml", check=False)
    assert [t.name for _, t in config.cluster.tasks()] == ["worker:0"] and config.num_replicas() == 2
    assert config.training.steps == 20
    meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert meta["state"] == "finished" and meta["summary"]["steps"] == 20
    stats = events.ReadStats()
    stream = events.read_file(run_dir / "events.jsonl", stats)
    assert stats.bad == 0 and stream
    own = events.read_file(run_dir / "tasks" / "worker-0" / "events.jsonl")
    assert [e for e in stream if e["kind"] == "step"] == [e for e in own if e["kind"] == "step"]
    assert [e["state"] for e in stream if e["kind"] == "run"] == ["running", "finished"]

    # folded as the app folds a reopened run
    state = RunState(total_steps=config.total_steps())
    for e in stream:
        state.apply(e)
    assert state.state == "finished" and state.step == 20
    assert sorted(state.replicas) == [0, 1]

    steps = [e for e in stream if e["kind"] == "step"]
    by_step: dict[int, dict[int, dict]] = {}
    for e in steps:
        by_step.setdefault(e["step"], {})[e["replica"]] = e
    assert {1, 11, 20} <= set(by_step), "first batch of each epoch and the last step are always reported"
    for step in (1, 11):
        # each replica's own loss; at an epoch's first batch their mean is the loss Keras logs
        first = by_step[step]
        assert set(first) == {0, 1}
        assert first[0]["loss"] != first[1]["loss"]
        mean = (first[0]["loss"] + first[1]["loss"]) / 2
        assert math.isclose(mean, first[0]["epoch_loss"], rel_tol=1e-5), (step, first)
    for e in steps:
        assert e["examples_per_sec"] > 0 and e["step_time"] > 0
    losses = [(by_step[s][0]["loss"] + by_step[s][1]["loss"]) / 2 for s in sorted(by_step)]
    assert losses[-1] < losses[0], "the model learns"
    info = [e for e in stream if e["kind"] == "info" and e.get("strategy")]
    assert info and info[0]["strategy"] == "MirroredStrategy" and info[0]["replica_ids"] == [0, 1]


def test_callback_without_a_strategy_reports_one_replica(tmp_path: Path) -> None:
    import keras

    from engine.runtime.keras_callback import ClusterDeckCallback

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = ClusterDeckCallback(run_dir=tmp_path / "run", metrics_hz=1e6)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, callbacks=[callback], verbose=0)
    steps = [e for e in events.read_file(tmp_path / "run" / "events.jsonl") if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 9)) and {e["replica"] for e in steps} == {0}
    # one replica: its loss is the batch loss, and the epoch's mean is what Keras reports
    assert math.isclose(steps[0]["loss"], steps[0]["epoch_loss"], rel_tol=1e-6)
    assert math.isclose(np.mean([e["loss"] for e in steps[:4]]), history.history["loss"][0], rel_tol=1e-5)
    assert all(math.isclose(e["examples_per_sec"] * e["step_time"], 16, rel_tol=1e-6) for e in steps)
    # the model's own loss path is wrapped once, however often the callback is attached
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[ClusterDeckCallback(run_dir=tmp_path / "again")], verbose=0)
    assert len([e for e in events.read_file(tmp_path / "again" / "events.jsonl") if e["kind"] == "step"]) >= 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"metrics_hz": 0}, "metrics_hz: expected a number > 0, got 0"),
    ({"task": "boss"}, "task: expected 'role:index'"),
    ({"task": "worker:x"}, "task: expected 'role:index'"),
])
def test_callback_arguments_are_checked(kwargs: dict, message: str) -> None:
    from engine.runtime.keras_callback import ClusterDeckCallback

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ClusterDeckCallback(**kwargs)


def test_callback_in_a_custom_loop_records_the_loops_loss_or_refuses(tmp_path: Path) -> None:
    import keras

    from engine.runtime.keras_callback import ClusterDeckCallback

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    callback = ClusterDeckCallback(run_dir=tmp_path / "run", metrics_hz=1e6)
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_train_batch_end(0, logs={"loss": 0.75, "size": 16})  # no fit ran: the loop's own loss
    with pytest.raises(ValueError, match="no loss to record at batch 2: outside model.fit"):
        callback.on_train_batch_end(1, logs={})
    steps = [e for e in events.read_file(tmp_path / "run" / "events.jsonl") if e["kind"] == "step"]
    assert [(e["replica"], e["loss"]) for e in steps] == [(0, 0.75)] and steps[0]["examples_per_sec"] > 0
