"""Why is it slow: each step's breakdown folded for the views (data, async and model mode), the live view's
breakdown column on 80 columns, profiles read back without TensorFlow, and real runs: a model-mode run's
breakdown, a slowed model-mode pipeline named input-bound, a 2-worker profile in TensorBoard's layout with a
summary per task."""

from __future__ import annotations

import json
import re
import statistics
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from engine.cli import doctor as doctor_cli
from engine.cli.live_view import LiveView, bar_cells, breakdown_text
from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from engine.control import profiling
from engine.observe.telemetry import Breakdowns, RunState, breakdown_of
from engine.runtime import diagnostics
from tests import kit
from tests.conftest import PRESETS


def test_each_modes_step_splits_into_its_parts() -> None:
    data = breakdown_of(kit.step(0, 5, t=7.0, step_time=0.05, sync_wait=0.02, own_time=0.03, input_wait=0.01))
    assert data is not None and (data.t, data.step, data.step_time) == (7.0, 5, 0.05)
    assert (data.collective, data.input, data.dispatch) == (0.02, 0.01, None)
    assert data.compute == pytest.approx(0.02) and data.measured() == ("compute", "collective", "input")
    assert sum(data.shares().values()) == pytest.approx(1.0)
    # async: the worker's function ran own_time (its input wait inside), then waited for the chief
    spread = breakdown_of(kit.step(1, 9, step_time=0.2, own_time=0.05, input_wait=0.02, dispatch_wait=0.15))
    assert spread is not None and (spread.compute, spread.input, spread.dispatch) == pytest.approx((0.03, 0.02, 0.15))
    assert spread.collective is None and spread.total == pytest.approx(0.2)
    # model: the input wait alone; compute holds the rest (DTensor's collectives inside)
    mesh = breakdown_of(kit.step(0, 3, step_time=0.01, input_wait=0.004))
    assert mesh is not None and mesh.measured() == ("compute", "input") and mesh.compute == pytest.approx(0.006)
    # a wait longer than the step is the step; no step time, no breakdown
    capped = breakdown_of(kit.step(0, 1, step_time=0.01, input_wait=0.5))
    assert capped is not None and capped.input == 0.01 and capped.compute == 0.0
    assert breakdown_of(kit.step(0, 1, step_time=None, input_wait=0.5)) is None
    assert breakdown_of(kit.step(0, 1, step_time=0.01)).measured() == ("compute",)  # type: ignore[union-attr]


def test_the_run_state_keeps_each_replicas_latest_and_recent_breakdowns() -> None:
    state = RunState(total_steps=100)
    for i in range(1, 6):
        for rid in (0, 1):
            state.apply(kit.step(rid, i, t=float(i), step_time=0.04, sync_wait=0.01 * (rid + 1), own_time=0.03,
                                 input_wait=0.005))
    latest = state.breakdowns.latest()
    assert list(latest) == [0, 1] and latest[1].collective == 0.02 and latest[1].step == 5
    assert [b.step for b in state.breakdowns.recent(0)] == [1, 2, 3, 4, 5]
    assert [b.step for b in state.breakdowns.recent(0, every=2)] == [1, 3, 5]  # the newest always kept
    assert [b.step for b in state.breakdowns.recent(1, every=3)] == [2, 5]
    assert state.breakdowns.first_t() == 1.0 and state.breakdowns.kept() == 10
    assert state.breakdowns.mean()["collective"] == pytest.approx(0.015)
    assert state.breakdowns.measured() == ("compute", "collective", "input")
    # a launcher's state without curves keeps the latest only
    lean = RunState(keep_history=False)
    lean.apply(kit.step(0, 1, step_time=0.01))
    lean.apply(kit.step(0, 2, step_time=0.02))
    assert lean.breakdowns.recent(0) == [] and lean.breakdowns.latest()[0].step_time == 0.02
    assert Breakdowns(keep=3).keep == 3


def test_the_live_view_draws_a_breakdown_bar_per_replica_within_80_columns() -> None:
    assert bar_cells({"compute": 0.5, "collective": 0.3, "input": 0.2}, 8) == [("compute", 4), ("collective", 2),
                                                                               ("input", 2)]
    assert sum(n for _, n in bar_cells({"compute": 0.34, "input": 0.33, "dispatch": 0.33}, 8)) == 8
    assert breakdown_text(None) == "-"

    class Source:
        config = type("C", (), {"name": "breakdown"})()
        state = RunState(total_steps=100, tasks=[("worker:0", "worker", "local"), ("worker:1", "worker", "local")])
        done, run_dir = True, "/tmp/run"

        def wait(self, timeout: float | None = None) -> str:
            return ""

        def add_listener(self, listener: Any) -> None:
            self.listener = listener

    source = Source()
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    view = LiveView(source, console)
    for i in range(1, 60):
        for rid, (sync, waited) in enumerate(((0.03, 0.001), (0.002, 0.03))):
            event = kit.step(rid, i, t=float(i) / 4, step_time=0.05, sync_wait=sync, own_time=0.05 - sync,
                             input_wait=waited, metrics={"accuracy": 0.5})
            source.state.apply(event)
            view.on_event(event)
    console.print(view.render())
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    rows = {line.split()[1]: line for line in lines if line.split()[:1] in (["0"], ["1"])}
    assert rows["worker:0"].endswith("▓60%") and "▓▓▓▓▓" in rows["worker:0"]
    assert rows["worker:1"].endswith("▒60%") and re.search(r" 2\.\d\dx ", rows["worker:1"]), rows  # flagged
    assert any(line.startswith("step: █ compute  ▓ collective wait  ▒ input wait") for line in lines), lines
    said = " ".join(" ".join(lines).split())  # the note wraps at 80 columns
    assert "(worker:1) is straggling" in said and "waiting for input 60 % of its step" in said, lines


def test_control_and_runtime_agree_on_the_profile_files() -> None:
    assert profiling.SUMMARY_SUFFIX == diagnostics.SUMMARY_SUFFIX
    assert (profiling.MIN_MS, profiling.MAX_MS) == (diagnostics.MIN_MS, diagnostics.MAX_MS)
    requests = diagnostics.ProfileRequests(Path("/run"), "worker:1")
    folder = RunFolder(Path("/run"))
    assert requests.done_file("r") == profiling.done_file(folder, "r", "worker:1")
    assert requests.request_file == folder.path / profiling.PROFILE_DIR / profiling.REQUEST_FILE
    assert [diagnostics.category_of(t) for t in ("CollectiveReduceV2", "_Recv", "Dataset", "_MklMatMul")] == \
        ["collective", "collective", "input", "compute"]


def test_a_capture_is_read_back_without_tensorflow(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    with pytest.raises(profiling.ProfileError, match="expected a folder holding run.json"):
        profiling.capture(tmp_path, 100)
    (tmp_path / "run.json").write_text(json.dumps({"tasks": {"worker:0": {"pid": 1, "state": "finished"}}}))
    with pytest.raises(profiling.ProfileError, match="received: ms=5"):
        profiling.capture(tmp_path, 5)
    with pytest.raises(profiling.ProfileError, match="no live task"):
        profiling.capture(tmp_path, 100)
    rid = profiling.request_profile(folder, 1500)
    request = json.loads((tmp_path / "profile" / "request.json").read_text())
    assert request["id"] == rid and request["ms"] == 1500
    profiling.capture_dir(folder, rid).mkdir(parents=True, exist_ok=True)
    profiling.summary_file(folder, rid, "worker:0").write_text(json.dumps(
        {"top_ops": [{"type": "Dataset", "op": "Iterator::Root", "category": "input", "self_us": 10.0, "count": 2,
                      "share": 0.5}, "not an op"], "breakdown": {"compute": 0.5, "input": 0.5, "bogus": 1},
         "busy_us": 20.0}))
    profiling.done_file(folder, rid, "worker:0").write_text(json.dumps({"xplane": "tensorboard/x.pb", "ms": 1500}))
    profiling.done_file(folder, rid, "worker:1").write_text("[]")
    got = profiling.read_capture(tmp_path, rid)
    assert got.ms == 1500 and list(got.tasks) == ["worker:0", "worker:1"]
    w0 = got.tasks["worker:0"]
    assert w0.ok and w0.xplane == tmp_path / "tensorboard/x.pb" and w0.breakdown == {"compute": 0.5, "input": 0.5}
    assert [op.op for op in w0.top_ops] == ["Iterator::Root"] and w0.busy_us == 20.0
    assert got.tasks["worker:1"].error == "a malformed done file"
    assert profiling.task_profile(folder, rid, "ps:0", None).missing
    assert profiling.captures(tmp_path) == [rid]
    assert got.trace_dir == tmp_path / "tensorboard" / "plugins" / "profile" / rid


SLOW_MESH_INPUT = """
    import time

    import numpy as np
    import tensorflow as tf

    def make_dataset(input_context, config):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2048, 16)).astype("float32")
        y = (x[:, 0] > 0).astype("int32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(config.training.global_batch_size)
        if DELAY:  # a slow pipeline: DELAY s per batch
            ds = ds.map(lambda a, b: (tf.py_function(lambda t: (time.sleep(DELAY), t)[1], [a], tf.float32), b))
            ds = ds.map(lambda a, b: (tf.ensure_shape(a, [None, 16]), b))
        return ds
"""


def mesh_config(tmp_path: Path, delay: float, steps: int = 80) -> config_mod.RunConfig:
    """One worker, a batch 2 x model 2 mesh, a script's pipeline that sleeps ``delay`` s per batch."""
    script = tmp_path / f"mesh_input_{int(delay * 1000)}.py"
    script.write_text(textwrap.dedent(SLOW_MESH_INPUT).lstrip().replace("DELAY", repr(delay)), encoding="utf-8")
    cfg = config_mod.load(PRESETS / "model-2x2.yaml")
    return replace(cfg, data=replace(cfg.data, source="script", path=str(script), shape=(16,), classes=2, size=2048),
                   model=replace(cfg.model, hidden=(32,)),
                   training=replace(cfg.training, global_batch_size=64, steps=steps, checkpoint_every=0,
                                    metrics_hz=1e6))


def input_shares(steps: list[dict[str, Any]]) -> list[float]:
    made = [breakdown_of(e) for e in steps if e["step"] > 10]
    return [b.shares()["input"] for b in made if b is not None]


@pytest.mark.cluster
def test_a_model_mode_step_reports_its_input_wait_and_a_slowed_pipeline_is_input_bound(
        tmp_path: Path, runs_root: Path) -> None:
    fast = [e for e in kit.run_to_end(mesh_config(tmp_path, 0.0), runs_root) if e["kind"] == "step"]
    assert {e["replica"] for e in fast} == {0, 1}
    assert all("input_wait" in e and 0 <= e["input_wait"] <= e["step_time"] for e in fast)
    assert not any("sync_wait" in e or "own_time" in e for e in fast)  # the mesh's collectives are inside compute
    slow = [e for e in kit.run_to_end(mesh_config(tmp_path, 0.03), runs_root) if e["kind"] == "step"]
    assert statistics.median(e["input_wait"] for e in slow if e["step"] > 10) > 0.02
    fast_share, slow_share = statistics.median(input_shares(fast)), statistics.median(input_shares(slow))
    assert slow_share > 0.5 and slow_share > 2 * fast_share, (fast_share, slow_share)


@pytest.mark.cluster
def test_a_two_worker_profile_writes_a_trace_and_a_summary_per_task(runs_root: Path, capsys: Any) -> None:
    """Three captures in a row of one 2-worker run, none retried: TensorFlow 2.21's trace collection used to kill a
    task of such a run about one capture in ten (``tf_compat.keep_trace_events_in_place``), and the run goes on."""
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))
    run = kit.start_stepping(cfg, runs_root)
    try:
        deadline = time.monotonic() + 10  # run.json names the tasks' pids within a flush or two
        while len(profiling.live_tasks(run.run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(3):
            code = doctor_cli.main(["profile", str(run.run_dir), "--ms", "1000"])
            out = capsys.readouterr().out
            assert code == 0, (out, run.state.summary())
        assert not run.done, run.state.summary()
    finally:
        run.stop(wait=False)
        run.wait(60)
    rid = profiling.captures(run.run_dir)[-1]
    capture = profiling.read_capture(run.run_dir, rid)
    assert sorted(capture.tasks) == ["worker:0", "worker:1"]
    assert sorted(p.name for p in capture.trace_dir.glob("*.xplane.pb")) == ["worker-0.xplane.pb", "worker-1.xplane.pb"]
    for task, got in capture.tasks.items():
        assert got.ok and got.xplane is not None and got.xplane.stat().st_size > 0, got
        assert got.top_ops and got.top_types and got.busy_us, got
        assert sum(got.breakdown.values()) == pytest.approx(1.0, abs=0.01)
        assert got.breakdown["collective"] > 0, got.breakdown  # the all-reduce ran in the capture
        assert any(op.category == "collective" for op in got.top_types), got.top_types
        assert f"{task}: tensorboard/plugins/profile/{rid}/" in out
    assert out.count("op time: compute") == 2 and "tensorboard --logdir" in out
    folder = RunFolder(run.run_dir)
    for task in ("worker:0", "worker:1"):  # the trace collection was guarded in each task
        done = json.loads(profiling.done_file(folder, rid, task).read_text(encoding="utf-8"))
        assert done["trace_collection"].startswith("TraceMeRecorder's growing vector relocates"), done
    print(out)
