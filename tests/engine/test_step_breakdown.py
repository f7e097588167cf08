"""Why a replica is slow: each step event's breakdown (waiting for input, for the all-reduce, computing) and
the straggler's cause named from it, on real runs."""

from __future__ import annotations

import math
import os
import statistics
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.contract.config import Cluster, Data, Host, Model, RunConfig, Task, Training
from engine.observe.stragglers import StragglerDetector, cause_of
from tests import kit

SLOW_INPUT = """
    import time

    import numpy as np
    import tensorflow as tf

    def make_dataset(input_context, config):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2048, 16)).astype("float32")
        y = (x[:, 0] > 0).astype("int32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        ds = ds.batch(input_context.get_per_replica_batch_size(config.training.global_batch_size))
        if input_context.input_pipeline_id == 1:  # this worker's pipeline is slow: 40 ms a batch
            ds = ds.map(lambda a, b: (tf.py_function(lambda t: (time.sleep(0.04), t)[1], [a], tf.float32), b))
            ds = ds.map(lambda a, b: (tf.ensure_shape(a, [None, 16]), b))
        return ds
"""


def two_workers(data: Data, steps: int = 60) -> RunConfig:
    return RunConfig(name="breakdown", cluster=Cluster(hosts=(Host(name="local", tasks=(Task("worker", 0),
                                                                                        Task("worker", 1))),)),
                     data=data, model=Model(name="mlp", hidden=(32,)),
                     training=Training(global_batch_size=64, steps=steps, metrics_hz=1e6))


def run(cfg: RunConfig, runs_root: Path) -> list[dict[str, Any]]:
    return [e for e in kit.run_to_end(cfg, runs_root) if e["kind"] == "step"]


def flagged_causes(steps: list[dict[str, Any]]) -> dict[str, str]:
    detector = StragglerDetector(window_s=0.5, smooth_s=0.5)
    causes: dict[str, str] = {}
    for event in steps:
        for change in detector.update(event):
            if change.flagged:
                causes[change.task] = change.cause
    return causes


def test_the_cause_reads_the_breakdown() -> None:
    assert cause_of(0.41, 1.3) == "waiting for input 41 % of its step: its data pipeline is the bottleneck"
    assert cause_of(0.05, 1.6) == "compute 1.6× the others: a slower or busier host"
    assert cause_of(math.nan, 1.6).startswith("compute 1.6×")
    # a host short of CPU waits for its batch too, but its compute makes most of its excess: the host, not the pipeline
    assert cause_of(0.3, 4.0, input_of_excess=0.4) == "compute 4.0× the others: a slower or busier host"
    # the wait is its excess, even where the others' own time is next to nothing (they wait for it in the all-reduce)
    assert cause_of(0.83, 40403.1, input_of_excess=0.97).startswith("waiting for input 83 %")
    assert cause_of(0.3, 1.7, input_of_excess=0.5).startswith("waiting for input 30 %")
    # the detector keeps each replica's latest share and names it when it flags the replica
    detector = StragglerDetector(window_s=0.0, smooth_s=0.0)
    changes = []
    for i in range(1, 6):
        for replica, (step_time, waited) in enumerate(((0.010, 0.001), (0.012, 0.001), (0.040, 0.030))):
            changes += detector.update(kit.step(replica, i, t=float(i), step_time=step_time, input_wait=waited))
    flagged = [c for c in changes if c.flagged]
    assert [c.replica for c in flagged] == [2] and flagged[0].cause.startswith("waiting for input 75 %")


@pytest.mark.cluster
def test_a_slow_input_pipeline_is_named_input_bound(tmp_path: Path, runs_root: Path) -> None:
    script = tmp_path / "slow_input.py"
    script.write_text(textwrap.dedent(SLOW_INPUT).lstrip(), encoding="utf-8")
    steps = run(two_workers(Data(source="script", path=str(script), shape=(16,), classes=2, size=2048)), runs_root)
    late = [e for e in steps if e["step"] > 10]
    slow = [e["input_wait"] for e in late if e["task"] == "worker:1"]
    fast = [e["input_wait"] for e in late if e["task"] == "worker:0"]
    # a step now and then finds its batch ready (prefetched while the other worker's all-reduce waited)
    assert slow and fast and statistics.median(slow) > 0.02 > statistics.median(fast), (slow, fast)
    # worker:0 waits for worker:1 in the all-reduce, so only worker:1's own share is slow
    causes = flagged_causes(steps)
    assert "worker:1" in causes and causes["worker:1"].startswith("waiting for input"), causes
    assert "worker:0" not in causes


@pytest.mark.cluster
def test_a_slow_worker_is_named_compute_bound(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "worker:1=0.03")  # a busier host: 30 ms more per step
    steps = run(two_workers(Data(shape=(16,), classes=2, size=2048)), runs_root)
    causes = flagged_causes(steps)
    assert "worker:1" in causes and causes["worker:1"].startswith("compute"), causes
    assert statistics.median(e["input_wait"] for e in steps if e["task"] == "worker:1" and e["step"] > 10) < 0.02
    assert os.environ["CLUSTERDECK_TEST_STEP_DELAY"]


SAMPLING_SCRIPT = """
import json, sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from engine.contract import config as config_mod
from engine.contract.presets import resolve_preset
from engine.runtime import data_parallel
from engine.runtime.context import TaskContext
from engine.runtime.emitter import Emitter

out = {}
for name, steps in (("short", 160), ("long", data_parallel.SAMPLE_FROM_STEPS)):
    cfg = config_mod.load(resolve_preset("data-1worker-2gpus"))
    cfg = replace(cfg, training=replace(cfg.training, steps=steps, epochs=None, steps_per_execution=16))
    root = Path(sys.argv[2]) / name
    root.mkdir()
    ctx = TaskContext(config=cfg, task="worker:0", role="worker", index=0, run_dir=root,
                      emitter=Emitter("worker:0", None), devices=2, gpus_assigned=False)
    adapter = data_parallel.MirroredAdapter(ctx, telemetry=False)
    adapter.restore()
    measured = []
    for step in range(1, 161):
        before = adapter.breakdown_result
        adapter.run_step(step, last=step % 16 == 0)
        if step % 16 == 0:
            measured.append(adapter.breakdown_result is not before)
    out[name] = {"forms": sorted(adapter._functions), "measured": measured}
print(json.dumps(out))
"""


def test_a_run_shorter_than_the_sampling_threshold_measures_every_group_with_one_traced_form(tmp_path: Path) -> None:
    """A short run's breakdown is in every group and its step function traced once (a second trace, measured and
    not, costs a worker about a CPU-second); a long run samples one group in BREAKDOWN_GROUPS, both forms traced."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, "-c", SAMPLING_SCRIPT, str(ROOT), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["short"] == {"forms": [True], "measured": [True] * 10}
    assert got["long"]["forms"] == [False, True]
    assert got["long"]["measured"] == [True, False, False, True, False, False, False, True, False, False]
