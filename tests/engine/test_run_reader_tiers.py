"""Opening a run folder whose samples are in tiers: the history from the tiers it needs (every event
stood for once, envelopes for summarised parts), the run's state rebuilt, new samples followed, and a
folder written before the tiers (every step in events.jsonl) opened as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract import events
from engine.contract.config import default_config
from engine.contract.run_folder import RunFolder
from engine.control.run_record import RunRecord
from engine.observe.run_reader import read_run_folder
from engine.observe.telemetry import RunState
from tests import kit

T0 = 1_700_000_000.0


def step(r: int, n: int, t: float) -> dict[str, Any]:
    return kit.step(r, n, t=t, loss=2.0 / (1 + n), examples_per_sec=50.0 + r, step_time=0.02, worker=r,
                    metrics={"accuracy": min(1.0, n / 1000)})


def lifecycle(seconds: float) -> list[dict[str, Any]]:
    return [
        {"v": 1, "kind": "run", "task": "", "t": T0 - 1, "state": "running"},
        *({"v": 1, "kind": "status", "task": f"worker:{r}", "t": T0 - 1, "state": "running", "pid": 10 + r}
          for r in range(2)),
        {"v": 1, "kind": "eval", "task": "worker:0", "t": T0 + 5, "step": 100, "loss": 0.3},
        {"v": 1, "kind": "run", "task": "", "t": T0 + seconds, "state": "finished"},
    ]


def record_run(folder: RunFolder, seconds: float, *, series: bool = True) -> list[dict[str, Any]]:
    record = RunRecord(folder, describe=lambda: {"state": "running"}, on_failure=lambda _: None, series=series)
    sent: list[dict[str, Any]] = []
    life = lifecycle(seconds)
    for e in life[:3]:
        record.write_event(e)
    for tick in range(int(seconds * 20)):
        t = T0 + tick / 20
        for r in range(2):
            e = step(r, tick, t)
            record.write_event(e)
            sent.append(e)
        if tick % 10 == 0:
            e = {"v": 1, "kind": "device", "task": "worker:0", "t": t, "cpu_percent": float(tick % 50),
                 "rss_bytes": 1_000_000 + tick, "pid": 10}
            record.write_event(e)
            sent.append(e)
        if tick == 100:
            record.write_event(life[3])
        dry = tick % 7 == 0
        record.catch_up(lambda dry=dry: dry)  # type: ignore[misc]
    record.write_event(life[4])
    record.close()
    return sent


@pytest.fixture
def folder(tmp_path: Path) -> RunFolder:
    folder = RunFolder.create(tmp_path, "r")
    folder.write_config(default_config())
    return folder


def f32(value: Any) -> Any:
    """Figures as the tiers keep them: float32, like the history's values."""
    if isinstance(value, dict):
        return {k: f32(v) for k, v in value.items()}
    return float(np.float32(value)) if isinstance(value, float) else value


def folded(sent: list[dict[str, Any]]) -> RunState:
    state = RunState()
    for e in sorted(lifecycle(len(sent) / 2 / 20) + sent, key=lambda e: e["t"]):
        state.apply(e)
    return state


def test_samples_go_to_the_tiers_and_lifecycle_to_events_jsonl(folder: RunFolder) -> None:
    record_run(folder, 30)
    kinds = {events.decode(line)["kind"] for line in folder.events.read_bytes().splitlines()}  # type: ignore[index]
    assert kinds == {"run", "status", "eval"}
    assert (folder.path / "series" / "raw").is_dir()


def test_a_short_run_reopens_with_every_point(folder: RunFolder) -> None:
    sent = record_run(folder, 30)
    _, state, _ = read_run_folder(folder.path, max_points_per_series=10_000)
    expected = folded(sent)
    assert state.state == "finished"
    assert sorted(state.history.keys()) == sorted(expected.history.keys())
    for key in expected.history.keys():
        got, want = state.history.series[key], expected.history.series[key]
        np.testing.assert_array_equal(got.x, want.x)
        np.testing.assert_array_equal(got.y, want.y)
        np.testing.assert_allclose(got.t, want.t, atol=2e-3)
    assert state.history.envelopes == {}
    assert f32(state.summary()["replicas"]) == f32(expected.summary()["replicas"])
    for name, task in expected.tasks.items():
        assert (state.tasks[name].state, state.tasks[name].pid) == (task.state, task.pid)
    assert state.tasks["worker:0"].cpu_percent == expected.tasks["worker:0"].cpu_percent


def test_a_long_run_reopens_from_a_coarse_tier_with_its_envelope(folder: RunFolder) -> None:
    sent = record_run(folder, 600)
    _, state, _ = read_run_folder(folder.path, max_points_per_series=50)
    loss = state.history.series["replica/0/loss"]
    assert 50 <= len(loss) < 200  # 10 s buckets over 600 s, and the newest rows finer
    envelope = state.history.envelopes["replica/0/loss"]
    ys = np.array([e["loss"] for e in sent if e.get("replica") == 0], np.float32)
    assert envelope.hi.max() == ys.max() and envelope.lo.min() == ys.min()
    assert state.replicas[0].step == 600 * 20 - 1 and state.replicas[0].first_loss == pytest.approx(2.0)
    assert state.replicas[1].metrics["accuracy"] == pytest.approx(1.0)
    assert state.events >= len(sent)


def test_a_reopened_running_run_follows_new_samples(folder: RunFolder) -> None:
    record = RunRecord(folder, describe=lambda: {"state": "running"}, on_failure=lambda _: None)
    for n in range(10):
        record.write_event(step(0, n, T0 + n))
    record.flush()
    _, state, reader = read_run_folder(folder.path)
    assert state.replicas[0].step == 9
    for n in range(10, 15):
        record.write_event(step(0, n, T0 + n))
    record.flush()
    for e in reader.read_new():
        state.apply(e)
    assert state.replicas[0].step == 14
    assert state.history.series["replica/0/loss"].x.tolist() == list(range(15))
    assert state.history.series["replica/0/accuracy"].y[-1] == pytest.approx(0.014)
    record.close()


def test_a_folder_written_before_the_tiers_still_opens(folder: RunFolder) -> None:
    sent = record_run(folder, 20, series=False)
    assert not (folder.path / "series").exists()
    _, state, _ = read_run_folder(folder.path)
    expected = folded(sent)
    assert state.history.total_points() == expected.history.total_points()
    assert state.summary()["replicas"] == expected.summary()["replicas"]


def test_read_events_gives_every_event_of_a_folder_in_time_order(folder: RunFolder) -> None:
    sent = record_run(folder, 10)
    from engine.observe.run_reader import read_events

    got = read_events(folder.path)
    steps = [e for e in got if e["kind"] == "step"]
    assert len(steps) == len([e for e in sent if e["kind"] == "step"])
    assert [e["step"] for e in steps if e["replica"] == 0] == list(range(200))
    assert {e["kind"] for e in got} == {"run", "status", "eval", "step", "device"}
    assert [e["t"] for e in got] == sorted(e["t"] for e in got)
