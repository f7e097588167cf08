"""The tiered series store on a real folder: every point kept raw, the tiers' summaries exact, views
that pick the level they need, retention by whole files, and whole records only after a SIGKILL."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract.series_store import Retention, SeriesFollower, SeriesStore, SeriesWriter, read_batches
from tests import kit

T0 = 1_700_000_000.0


def step(r: int, n: int, t: float, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"loss": 1.0 / (1 + n) + r, "examples_per_sec": 100.0 + n % 7, "step_time": 0.01}
    return kit.step(r, n, t=t, **{**fields, **extra})


def fill(writer: SeriesWriter, seconds: float, hz: float = 20, replicas: int = 2, flush_every: int = 50) -> int:
    count = 0
    for tick in range(int(seconds * hz)):
        t = T0 + tick / hz
        for r in range(replicas):
            writer.add(step(r, tick, t, metrics={"accuracy": (tick % 10) / 10}))
            count += 1
        if tick % 5 == 0:
            writer.add({"v": 1, "kind": "device", "task": "worker:0", "t": t, "cpu_percent": float(tick % 100),
                        "rss_bytes": 1e9, "pid": 4, "device": "CPU:0", "tf_bytes": 123.0})
            count += 1
        if tick % flush_every == 0:
            writer.flush()
    return count


def test_every_raw_point_is_kept_and_the_tiers_summarise_it_exactly(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    fill(writer, 120)
    writer.close()
    store = SeriesStore(tmp_path)
    raw = store.read_level("step", "raw")
    assert len(raw) == 2 * 120 * 20
    assert raw.cols == ["examples_per_sec", "loss", "metrics.accuracy", "step_time", ]
    r0 = raw.take(raw.owner == 0)
    np.testing.assert_array_equal(r0.x_first, np.arange(2400))
    np.testing.assert_array_equal(r0.last["loss"], np.float32(1.0 / (1 + np.arange(2400))))
    for level, width in (("1s", 1.0), ("5s", 5.0), ("30s", 30.0)):
        tier = store.read_level("step", level)
        assert int(tier.n.sum()) == len(raw), level
        t0 = tier.take(tier.owner == 0)
        buckets = np.floor(r0.t_first / width)
        for i in (0, len(t0) // 2, len(t0) - 1):
            inside = buckets == math.floor(t0.t_first[i] / width)
            values = r0.last["loss"][inside]
            assert t0.min["loss"][i] == values.min() and t0.max["loss"][i] == values.max()
            assert t0.last["loss"][i] == values[-1] and t0.count["loss"][i] == inside.sum()
            assert t0.mean("loss")[i] == pytest.approx(values.astype(np.float64).mean(), rel=1e-6)
            assert (t0.x_first[i], t0.x_last[i]) == (r0.x_first[inside][0], r0.x_first[inside][-1])
    keys = {o.key for o in store.owners()}
    assert keys == {"replica/0", "replica/1", "task/worker:0", "task/worker:0@CPU:0"}


def test_a_view_takes_the_coarsest_level_with_enough_points_and_the_newest_rows_from_finer_ones(
        tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    fill(writer, 300)
    writer.flush()  # open buckets stay open: the newest rows exist only raw or in finer tiers
    store = SeriesStore(tmp_path)
    for max_points, width in ((20, 10.0), (200, 1.0), (100_000, 0.0)):
        view = store.view("step", max_points)
        assert view.width == width
        assert int(view.n.sum()) == 2 * 300 * 20, max_points  # every event stood for exactly once
        r0 = view.take(view.owner == 0)
        assert np.all(np.diff(r0.t_first) > 0)
    coarse = store.view("step", 20)
    assert len(coarse) < 2 * 300 * 20 / 100


def test_retention_drops_whole_old_raw_files_and_the_tiers_keep_the_envelope(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path, Retention(raw_s=60.0, raw_file_s=20.0))
    fill(writer, 300)
    writer.close()
    store = SeriesStore(tmp_path)
    raw = store.read_level("step", "raw")
    assert 0 < raw.t_first.max() - raw.t_first.min() <= 60.0 + 20.0 + 1
    view = store.view("step", 100_000)  # finer than any tier: raw where kept, 1 s buckets before it
    assert int(view.n.sum()) == 2 * 300 * 20
    assert float(view.take(view.owner == 0).max["loss"].max()) == pytest.approx(1.0)


def test_a_new_metric_midway_starts_a_new_file_and_every_level_reads_it(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    for n in range(100):
        extra = {"metrics": {"auc": 0.5}} if n >= 50 else {}
        writer.add(step(0, n, T0 + n / 10, **extra))
        if n % 10 == 9:
            writer.flush()
    writer.close()
    store = SeriesStore(tmp_path)
    raw = store.read_level("step", "raw")
    assert int(raw.count["metrics.auc"].sum()) == 50
    tier = store.read_level("step", "1s")
    assert int(tier.count["metrics.auc"].sum()) == 50 and int(tier.count["loss"].sum()) == 100


def test_nulls_nan_and_bools_are_no_samples(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    writer.add(step(0, 0, T0, loss=None))
    writer.add(step(0, 1, T0 + 0.1, loss=float("nan")))
    writer.add(step(0, 2, T0 + 0.2, flag=True, note="x"))
    writer.close()
    raw = SeriesStore(tmp_path).read_level("step", "raw")
    assert raw.count["loss"].tolist() == [0, 0, 1]
    assert "note" not in raw.cols and "flag" not in raw.cols


def test_a_replica_whose_first_loss_is_nan_is_kept_with_its_finite_first_values(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    writer.add(step(3, 0, T0, loss=float("nan"), metrics={"auc": float("inf"), "acc": 0.5}))
    writer.add(step(3, 1, T0 + 0.1, loss=2.0))
    writer.close()
    store = SeriesStore(tmp_path)
    (owner,) = store.owners()
    assert owner.replica == 3 and "loss" not in owner.first and "metrics.auc" not in owner.first
    assert owner.first["metrics.acc"] == 0.5
    assert store.read_level("step", "raw").count["loss"].tolist() == [0, 1]


def test_a_follower_reads_only_new_rows(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path)
    follower = SeriesFollower(tmp_path)
    writer.add(step(0, 0, T0))
    writer.flush()
    assert len(follower.read_new()["step"]) == 1
    assert follower.read_new() == {}
    writer.add(step(0, 1, T0 + 1))
    writer.add(step(0, 2, T0 + 2))
    writer.flush()
    assert follower.read_new()["step"].x_first.tolist() == [1, 2]
    writer.close()


WRITER = textwrap.dedent("""
    import sys, time
    from engine.contract.series_store import SeriesWriter
    writer = SeriesWriter(sys.argv[1])
    n = 0
    t0 = 1_700_000_000.0
    while True:
        for r in range(64):
            writer.add({"v": 1, "kind": "step", "task": "w", "t": t0 + n * 0.05, "replica": r, "step": n,
                        "loss": float(n), "metrics": {"accuracy": 0.5}})
        n += 1
        if n % 5 == 0:
            writer.flush()
        if n == 200:
            print("ready", flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 0.013, 0.037])
def test_a_writer_killed_mid_write_leaves_whole_records_only(tmp_path: Path, delay: float) -> None:
    root = tmp_path / "series"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = SeriesStore(root)
    raw = store.read_level("step", "raw")
    assert len(raw) >= 200 * 64 and len(raw) % (5 * 64) == 0  # whole batches, nothing half
    steps = raw.take(raw.owner == 0).x_first
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    assert np.array_equal(raw.take(raw.owner == 0).last["loss"], steps.astype(np.float32))
    for path in sorted((root / "1s").glob("*.arrows")):
        for batch in read_batches(path):
            batch.validate(full=True)
    view = store.view("step", 100)
    assert int(view.n.sum()) == len(raw)  # the tiers' lost open buckets come from raw
    # a writer started after the kill starts new files: the torn tail is never followed by data
    writer = SeriesWriter(root)
    writer.add({"v": 1, "kind": "step", "task": "w", "t": 1_800_000_000.0, "replica": 0, "step": 10**6,
                "loss": 1.0})
    writer.close()
    assert len(SeriesStore(root).read_level("step", "raw")) == len(raw) + 1


def test_a_recent_follower_starts_at_the_newest_raw_file(tmp_path: Path) -> None:
    writer = SeriesWriter(tmp_path, Retention(raw_file_s=10.0))
    for n in range(60):
        writer.add(step(0, n, T0 + n))
        writer.flush()
    writer.close()
    rows = SeriesFollower(tmp_path, recent=True).read_new()["step"]
    assert 0 < len(rows) <= 12 and rows.x_first[-1] == 59
    assert SeriesFollower(tmp_path, at_end=True).read_new() == {}
