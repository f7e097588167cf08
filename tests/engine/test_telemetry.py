"""Folding the event stream: per-task and per-replica state, progress and ETA, full history."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.contract.events import make
from engine.observe.telemetry import History, RunState, Series

T0 = 1_700_000_000.0


def ev(kind: str, task: str, t: float, **fields: Any) -> dict[str, Any]:
    event = make(kind, task, **fields)
    event["t"] = T0 + t
    return event


def step(task: str, replica: int, n: int, t: float, loss: float | None = 1.0, eps: float | None = 100.0,
         **fields: Any) -> dict[str, Any]:
    return ev("step", task, t, replica=replica, step=n, loss=loss, examples_per_sec=eps, step_time=0.01, **fields)


# --------------------------------------------------------------------------- Series


def test_series_grows_past_its_capacity() -> None:
    s = Series(capacity=4)
    for i in range(1000):
        s.append(i, i * 2.0, i / 10)
    assert len(s) == 1000
    assert s.x.dtype == s.y.dtype == s.t_rel.dtype == np.float32 and s.t.dtype == np.float64
    np.testing.assert_array_equal(s.x, np.arange(1000, dtype=np.float64))
    np.testing.assert_array_equal(s.y, np.arange(1000) * 2.0)
    np.testing.assert_allclose(s.t, np.arange(1000) / 10, rtol=0, atol=2**-14)


@pytest.mark.parametrize("capacity", [0, 1, 256])
def test_series_from_any_capacity(capacity: int) -> None:
    s = Series(capacity)
    assert len(s) == 0 and s.x.size == 0
    for i in range(capacity + 1):
        s.append(float(i), -float(i), 0.0)
    assert len(s) == capacity + 1 and s.y[-1] == -float(capacity)


def test_series_views_are_only_the_filled_part() -> None:
    s = Series(capacity=8)
    s.append(1.0, 2.0, 3.0)
    assert s.x.tolist() == [1.0] and s.y.tolist() == [2.0] and s.t.tolist() == [3.0]


# --------------------------------------------------------------------------- History


def test_history_keeps_every_point_compactly() -> None:
    h = History()
    for i in range(5000):
        h.add(step("worker:0", 0, i, i * 0.01, loss=1.0 / (i + 1)))
        h.add(step("worker:1", 1, i, i * 0.01, loss=None))
    assert h.keys("replica/0/") == ["replica/0/examples_per_sec", "replica/0/loss", "replica/0/step_time"]
    loss = h.series["replica/0/loss"]
    assert len(loss) == 5000, "no downsampling"
    assert loss.x.dtype == np.float32 and loss.y.dtype == np.float32
    np.testing.assert_array_equal(loss.x, np.arange(5000, dtype=np.float64))
    np.testing.assert_array_equal(loss.y, (1.0 / (np.arange(5000) + 1)).astype(np.float32))
    assert "replica/1/loss" not in h.series, "a missing figure is not a point"
    assert h.replicas() == [0, 1]
    assert h.total_points() == 5000 * 3 + 5000 * 2
    assert h.t0 == T0


def test_history_device_points_are_by_time() -> None:
    h = History()
    before = h.version
    h.add(ev("device", "ps:0", 1.0, cpu_percent=50.0, rss_bytes=1000, gpu_util=None, tf_bytes=5, device="CPU:0"))
    h.add(ev("device", "ps:0", 2.0, cpu_percent=60, rss_bytes=True))
    assert h.version == before + 4
    assert h.keys("task/") == ["task/ps:0/cpu_percent", "task/ps:0/rss_bytes", "task/ps:0@CPU:0/tf_bytes"]
    cpu = h.series["task/ps:0/cpu_percent"]
    assert cpu.x.tolist() == [T0 + 1.0, T0 + 2.0] and cpu.y.tolist() == [50.0, 60.0]
    assert len(h.series["task/ps:0/rss_bytes"]) == 1, "a bool is not a figure"


def test_history_ignores_other_kinds() -> None:
    h = History()
    h.add(ev("info", "worker:0", 0.0, message="hi", loss=3.0))
    h.add(ev("status", "worker:0", 0.0, state="running"))
    assert h.total_points() == 0 and h.version == 0


# --------------------------------------------------------------------------- RunState


def test_run_state_folds_a_data_parallel_run() -> None:
    rs = RunState(total_steps=100, tasks=[("worker:0", "worker", "local"), ("worker:1", "worker", "local")])
    assert rs.tasks["worker:0"].state == "pending" and rs.step == 0 and rs.eta_seconds(T0) is None
    rs.apply(ev("run", "", 0.0, state="running"))
    rs.apply(ev("status", "worker:0", 0.5, state="starting", pid=101))
    rs.apply(ev("status", "worker:1", 0.5, state="starting", pid=102))
    for n in range(1, 11):
        rs.apply(step("worker:0", 0, n, 1.0 + n, loss=2.0 / n, eps=100.0))
        rs.apply(step("worker:1", 1, n, 1.0 + n, loss=3.0 / n, eps=150.0))

    assert rs.state == "running" and rs.started_at == T0
    assert rs.tasks["worker:0"].state == "running" and rs.tasks["worker:0"].pid == 101
    assert rs.tasks["worker:1"].pid == 102
    assert rs.step == 10
    r0, r1 = rs.replicas[0], rs.replicas[1]
    assert (r0.task, r0.step, r0.loss, r0.first_loss) == ("worker:0", 10, 0.2, 2.0)
    assert (r1.task, r1.step, r1.loss, r1.first_loss) == ("worker:1", 10, 0.3, 3.0)
    assert rs.throughput() == 250.0
    # first step at t=2 (step 1), step 10 at t=11: 9 steps in 9 s, 90 steps to go
    assert rs.first_step == 1 and rs.first_step_at == T0 + 2.0
    assert rs.eta_seconds(now=T0 + 11.0) == pytest.approx(90.0)
    assert rs.eta_seconds(now=T0 + 20.0) == pytest.approx(180.0)
    assert rs.history.replicas() == [0, 1] and len(rs.history.series["replica/1/loss"]) == 10

    rs.apply(ev("status", "worker:0", 12.0, state="finished", exit_code=0))
    rs.apply(ev("status", "worker:1", 12.0, state="finished", exit_code=0))
    rs.apply(ev("run", "", 12.5, state="finished"))
    summary = rs.summary()
    assert summary["state"] == "finished" and summary["duration_s"] == pytest.approx(12.5)
    assert summary["steps"] == 10 and summary["total_steps"] == 100 and summary["examples_per_sec"] == 250.0
    assert summary["replicas"]["0"] == {"task": "worker:0", "step": 10, "loss": 0.2, "first_loss": 2.0,
                                        "examples_per_sec": 100.0, "step_time": 0.01}
    assert summary["tasks"]["worker:1"] == {"state": "finished", "host": "local", "pid": 102, "reason": "",
                                            "restarts": 0}
    assert rs.events == 1 + 2 + 20 + 3


def test_eta_is_zero_past_the_end_and_none_without_a_total() -> None:
    rs = RunState(total_steps=5)
    rs.apply(step("worker:0", 0, 1, 0.0))
    assert rs.eta_seconds(T0 + 1) is None, "one report gives no pace"
    rs.apply(step("worker:0", 0, 8, 1.0))
    assert rs.eta_seconds(T0 + 1) == 0.0
    no_total = RunState()
    no_total.apply(step("worker:0", 0, 1, 0.0))
    no_total.apply(step("worker:0", 0, 3, 1.0))
    assert no_total.eta_seconds(T0 + 1) is None


def test_first_loss_is_the_first_reported_figure() -> None:
    rs = RunState()
    rs.apply(step("worker:0", 0, 1, 0.0, loss=None))
    assert rs.replicas[0].first_loss is None
    rs.apply(step("worker:0", 0, 2, 0.1, loss=4.0))
    rs.apply(step("worker:0", 0, 3, 0.2, loss=1.0))
    assert rs.replicas[0].first_loss == 4.0 and rs.replicas[0].loss == 1.0


def test_async_steps_keep_the_worker_and_the_furthest_step() -> None:
    rs = RunState(total_steps=50)
    rs.apply(step("chief:0", 0, 5, 0.0, worker=1))
    rs.apply(step("chief:0", 0, 4, 0.1, worker=0, loss=0.7))  # at-least-once scheduling: late results
    rep = rs.replicas[0]
    assert rep.step == 5 and rep.worker == 0 and rep.loss == 0.7
    rs.apply(ev("progress", "chief:0", 0.2, step=5, total=50, scheduled=12, completed=9))
    assert (rs.scheduled, rs.completed) == (12, 9)
    rs.apply(ev("progress", "chief:0", 0.3, step=6, total=50))
    assert (rs.scheduled, rs.completed) == (12, 9)


def test_device_events_update_the_task() -> None:
    rs = RunState(tasks=[("ps:0", "ps", "b")])
    rs.apply(ev("device", "ps:0", 1.0, cpu_percent=12.5, rss_bytes=2048, tf_bytes=None, gpu_util=40.0,
                gpu_mem_bytes=1 << 30))
    rs.apply(ev("device", "ps:0", 2.0, cpu_percent=20.0, rss_bytes="a lot"))
    task = rs.tasks["ps:0"]
    assert (task.cpu_percent, task.rss_bytes, task.tf_bytes, task.gpu_util, task.gpu_mem_bytes) == \
        (20.0, 2048, None, 40.0, 1 << 30)
    assert len(rs.history.series["task/ps:0/cpu_percent"]) == 2
    rs.apply(ev("device", "evaluator:0", 3.0, cpu_percent=1.0))
    assert rs.tasks["evaluator:0"].role == "evaluator"


def test_status_events_track_state_pid_log_tail_and_restarts() -> None:
    rs = RunState(tasks=[("worker:1", "worker", "local")])
    rs.apply(ev("status", "worker:1", 0.0, state="starting", pid=10))
    rs.apply(ev("status", "worker:1", 1.0, state="running"))
    rs.apply(ev("status", "worker:1", 2.0, state="failed", reason="killed by SIGKILL", exit_code=-9,
                log_tail=["Traceback", "RuntimeError: boom", 42]))
    task = rs.tasks["worker:1"]
    assert (task.state, task.reason, task.exit_code) == ("failed", "killed by SIGKILL", -9)
    assert task.log_tail == ["Traceback", "RuntimeError: boom", "42"]
    assert task.restarts == 0

    rs.apply(ev("status", "worker:1", 3.0, state="starting", pid=11))  # restarted after the failure
    assert task.restarts == 1 and task.pid == 11 and task.state == "starting"
    rs.apply(ev("status", "worker:1", 4.0, state="running"))
    rs.apply(ev("status", "worker:1", 5.0, state="restarting", reason="lost its ps"))
    rs.apply(ev("status", "worker:1", 6.0, state="starting", pid=12))  # no restarts figure: counted here
    assert task.restarts == 2
    rs.apply(ev("status", "worker:1", 7.0, state="restarting", restarts=5))
    rs.apply(ev("status", "worker:1", 8.0, state="starting", pid=13, restarts=5))
    assert task.restarts == 5, "the supervisor's own count wins"
    rs.apply(ev("status", "worker:1", 9.0, state="stopped", reason="stopped by the user", pid="x"))
    assert task.state == "stopped" and task.reason == "stopped by the user" and task.pid == 13
    assert task.log_tail == ["Traceback", "RuntimeError: boom", "42"], "kept until a new tail arrives"
    assert rs.started_at == T0


def test_status_for_an_unknown_task_adds_it() -> None:
    rs = RunState()
    rs.apply(ev("status", "evaluator:0", 0.0, state="running", host="gpu-box", role="evaluator"))
    assert rs.tasks["evaluator:0"].host == "gpu-box" and rs.tasks["evaluator:0"].state == "running"


def test_run_events_give_state_reason_and_failed_task() -> None:
    rs = RunState()
    rs.apply(ev("run", "", 1.0, state="running"))
    rs.apply(ev("run", "", 4.0, state="failed", reason="worker:1 failed", failed_task="worker:1"))
    assert (rs.state, rs.reason, rs.failed_task) == ("failed", "worker:1 failed", "worker:1")
    assert rs.summary()["duration_s"] == pytest.approx(3.0)


def test_info_events_are_kept() -> None:
    rs = RunState()
    rs.apply(ev("info", "worker:0", 0.0, message="emulating 2 GPUs", emulated_gpus=2))
    assert rs.infos[0]["emulated_gpus"] == 2


def test_eval_events_are_kept_and_plotted_by_step() -> None:
    rs = RunState()
    rs.apply(ev("eval", "evaluator:0", 1.0, step=100, loss=0.5, accuracy=0.8))
    rs.apply(ev("eval", "evaluator:0", 2.0, step=200, loss=0.25, accuracy=True))
    assert [e["step"] for e in rs.evals] == [100, 200]
    assert rs.history.series["eval/loss"].x.tolist() == [100.0, 200.0]
    assert rs.history.series["eval/loss"].y.tolist() == [0.5, 0.25]
    assert rs.history.series["eval/accuracy"].y.tolist() == [float(np.float32(0.8))], "a bool is not a figure"
    assert rs.replicas == {}, "evaluation is not training progress"


# --------------------------------------------------------------------------- History: shared axes

METRICS = ("loss", "examples_per_sec", "step_time")


def _buffers(*arrays: np.ndarray) -> list[np.ndarray]:
    """The distinct arrays that hold the data of ``arrays`` (views resolved to their base)."""
    out: list[np.ndarray] = []
    for a in arrays:
        base = a if a.base is None else a.base
        assert isinstance(base, np.ndarray)
        if not any(base is b for b in out):
            out.append(base)
    return out


def test_aligned_metrics_of_a_replica_share_one_step_and_time_axis() -> None:
    h = History()
    for i in range(1000):
        h.add(step("worker:0", 0, i, i * 0.1))
    loss, eps, st = (h.series[f"replica/0/{m}"] for m in METRICS)
    assert np.shares_memory(loss.x, eps.x) and np.shares_memory(loss.x, st.x)
    assert np.shares_memory(loss.t_rel, eps.t_rel) and np.shares_memory(loss.t_rel, st.t_rel)
    assert not np.shares_memory(loss.y, eps.y) and not np.shares_memory(loss.y, st.y)
    for s in (loss, eps, st):
        assert len(s.x) == len(s.y) == len(s.t) == len(s) == 1000
        assert s.x.dtype == s.y.dtype == s.t_rel.dtype == np.float32
        np.testing.assert_array_equal(s.x, np.arange(1000.0))
        assert s.t_base == T0
        np.testing.assert_array_equal(s.t_rel, ((T0 + np.arange(1000) * 0.1) - T0).astype(np.float32))
        np.testing.assert_allclose(s.t, T0 + np.arange(1000) * 0.1, rtol=0, atol=2**-17)


def test_a_replica_holds_five_float32_arrays_not_nine() -> None:
    h = History()
    n = 20_000
    for i in range(n):
        h.add(step("worker:0", 0, i, i * 0.1))
    series = [h.series[f"replica/0/{m}"] for m in METRICS]
    buffers = _buffers(*(a for s in series for a in (s.x, s.y, s.t_rel)))
    assert len(buffers) == 5, "one x, one t and three y"
    held = sum(b.nbytes for b in buffers)
    assert held <= 5 * 4 * (n + n // 2 + 256), held  # room to grow included
    assert held < 9 * 4 * n, "less than what a private x and t per metric would take, filled alone"


def test_replicas_reporting_the_same_steps_read_one_column_of_steps() -> None:
    h = History()
    for i in range(3000):
        for r in range(4):
            h.add(step(f"worker:{r}", r, i * 5, i * 0.1 + r * 1e-3))
    xs = [h.series[f"replica/{r}/loss"].x for r in range(4)]
    assert all(np.shares_memory(xs[0], x) for x in xs[1:]), "one column for four replicas"
    assert not np.shares_memory(h.series["replica/0/loss"].t_rel, h.series["replica/1/loss"].t_rel)
    # a replica whose steps differ from the others' (a worker of its own pace) copies its part once
    for r in (0, 1, 3):
        h.add(step(f"worker:{r}", r, 3000 * 5, 300.0))
    h.add(step("worker:2", 2, 3000 * 5 + 1, 300.0))
    for i in range(3001, 3100):
        for r in range(4):
            h.add(step(f"worker:{r}", r, i * 5 + (r == 2), i * 0.1))
    loss = [h.series[f"replica/{r}/loss"] for r in range(4)]
    assert not np.shares_memory(loss[2].x, loss[0].x) and np.shares_memory(loss[3].x, loss[0].x)
    np.testing.assert_array_equal(loss[2].x, np.r_[np.arange(3000) * 5, np.arange(3000, 3100) * 5 + 1])
    for r in (0, 1, 3):
        np.testing.assert_array_equal(loss[r].x, np.arange(3100) * 5)
    assert all(len(s) == 3100 for s in loss)


def test_a_replica_starting_late_or_behind_reads_the_steps_it_reports() -> None:
    h = History()
    for i in range(100):
        h.add(step("worker:0", 0, i, float(i)))
    for i in range(50, 150):  # joins at step 50
        h.add(step("worker:1", 1, i, float(i)))
        h.add(step("worker:0", 0, i + 50, float(i)))
    for i in range(60):  # a third that starts from 0 and stays behind the first
        h.add(step("worker:2", 2, i, float(i)))
    assert h.series["replica/1/loss"].x.tolist() == [float(i) for i in range(50, 150)]
    assert h.series["replica/0/loss"].x.tolist() == [float(i) for i in range(200)]
    assert h.series["replica/2/loss"].x.tolist() == [float(i) for i in range(60)]
    assert np.shares_memory(h.series["replica/2/loss"].x, h.series["replica/0/loss"].x)


def test_steps_past_float32s_exact_integers_widen_the_column() -> None:
    h = History()
    big = 2**24 - 2
    for i in range(4):
        h.add(step("worker:0", 0, big + i, float(i)))  # 2**24 + 1 has no float32
        h.add(step("worker:1", 1, big + i, float(i)))
    x0, x1 = h.series["replica/0/loss"].x, h.series["replica/1/loss"].x
    assert x0.dtype == np.float64 and np.shares_memory(x0, x1)
    assert x0.tolist() == x1.tolist() == [float(big + i) for i in range(4)]
    s = Series()
    s.append(1.0, 1.0, 0.0)
    s.append(2.5, 1.0, 0.0)  # not an integer: float32 would hold it, but steps are widened at once
    s.append(16_777_217.0, 1.0, 0.0)
    assert s.x.tolist() == [1.0, 2.5, 16_777_217.0]


def test_float32_losses_round_trip_exactly_and_other_values_within_float32_rounding() -> None:
    rng = np.random.default_rng(7)
    losses = rng.lognormal(size=2000).astype(np.float32)  # what a float32 tensor's loss reads as
    rates = rng.uniform(10, 1e6, size=2000)  # float64 figures
    h = History()
    for i in range(2000):
        h.add(step("worker:0", 0, i, i * 0.1, loss=float(losses[i]), eps=float(rates[i])))
    assert h.series["replica/0/loss"].y.tolist() == losses.astype(np.float64).tolist(), "bit for bit"
    eps = h.series["replica/0/examples_per_sec"].y.astype(np.float64)
    assert np.all(np.abs(eps - rates) <= rates * 2.0**-24)
    np.testing.assert_array_equal(eps, rates.astype(np.float32))


def test_values_beyond_float32_widen_their_series_only() -> None:
    h = History()
    for i in range(300):
        h.add(step("worker:0", 0, i, float(i), loss=1e300 if i == 200 else float(i)))
    loss, eps = h.series["replica/0/loss"], h.series["replica/0/examples_per_sec"]
    assert loss.y.dtype == np.float64 and eps.y.dtype == np.float32
    assert loss.y[200] == 1e300 and loss.y[:200].tolist() == [float(i) for i in range(200)]
    h.add(step("worker:0", 0, 300, 300.0, loss=float("inf"), eps=float("nan")))
    assert np.isinf(loss.y[-1]) and np.isnan(eps.y[-1]) and eps.y.dtype == np.float32, "inf and nan fit float32"


def test_wall_times_keep_within_a_millisecond_and_widen_after_hours() -> None:
    h = History()
    times = np.cumsum(np.random.default_rng(3).uniform(0.05, 0.15, size=5000))
    times[-10:] += 2.0**15  # nine hours later
    for i, t in enumerate(times):
        h.add(step("worker:0", 0, i, float(t)))
        h.add(ev("device", "worker:0", float(t) + 1e-4, cpu_percent=50.0))
    loss, cpu = h.series["replica/0/loss"], h.series["task/worker:0/cpu_percent"]
    assert loss.t_rel.dtype == cpu.t_rel.dtype == np.float64, "past the span: float64 from then on"
    assert loss.t_base == cpu.t_base == cpu.x_base == T0 + times[0] and loss.x_base == 0.0
    np.testing.assert_allclose(loss.t, T0 + times, rtol=0, atol=2**-10)
    np.testing.assert_allclose(cpu.x, T0 + times + 1e-4, rtol=0, atol=2**-10)
    np.testing.assert_array_equal(loss.t[-10:], T0 + times[-10:]), "times after the widening are exact"
    short = History()
    for i, t in enumerate(times[:-10]):
        short.add(step("worker:0", 0, i, float(t)))
    assert short.series["replica/0/loss"].t_rel.dtype == np.float32
    np.testing.assert_allclose(short.series["replica/0/loss"].t, T0 + times[:-10], rtol=0, atol=2**-10)


def test_task_metrics_share_their_time_axis() -> None:
    h = History()
    for i in range(300):
        h.add(ev("device", "worker:0", float(i), cpu_percent=50.0 + i, rss_bytes=1000 + i, gpu_util=None))
    cpu, rss = h.series["task/worker:0/cpu_percent"], h.series["task/worker:0/rss_bytes"]
    assert np.shares_memory(cpu.x_rel, rss.x_rel) and np.shares_memory(cpu.t_rel, cpu.x_rel), "by time: t is x"
    np.testing.assert_array_equal(cpu.t, T0 + np.arange(300.0))
    np.testing.assert_array_equal(cpu.x, cpu.t)
    np.testing.assert_array_equal(rss.y, 1000.0 + np.arange(300))


def test_a_metric_missing_from_a_step_goes_its_own_way() -> None:
    h = History()
    for i in range(10):
        h.add(step("worker:0", 0, i, i * 0.1))
    h.add(step("worker:0", 0, 10, 1.0, loss=None))  # no loss at step 10
    for i in range(11, 600):
        h.add(step("worker:0", 0, i, i * 0.1))
    loss, eps, st = (h.series[f"replica/0/{m}"] for m in METRICS)
    assert not np.shares_memory(loss.t_rel, eps.t_rel)
    assert np.shares_memory(eps.t_rel, st.t_rel), "the other two still share"
    expected = [float(i) for i in range(600) if i != 10]
    assert loss.x.tolist() == expected and len(loss.t) == len(loss.y) == len(loss) == 599
    assert eps.x.tolist() == [float(i) for i in range(600)] and len(st) == 600
    assert h.version == 600 * 3 - 1 and h.total_points() == 600 * 3 - 1


def test_a_metric_appearing_late_shares_from_where_it_starts() -> None:
    h = History()
    for i in range(5):
        h.add(step("worker:0", 0, i, float(i), loss=None))
    for i in range(5, 400):
        h.add(step("worker:0", 0, i, float(i)))
    loss, eps = h.series["replica/0/loss"], h.series["replica/0/examples_per_sec"]
    assert np.shares_memory(loss.x, eps.x)
    assert loss.x.tolist() == [float(i) for i in range(5, 400)] and len(eps) == 400
    np.testing.assert_array_equal(loss.t, eps.t[5:])


def test_views_taken_earlier_never_change() -> None:
    h = History()
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[float], list[float], list[float]]] = []
    for i in range(2000):
        h.add(step("worker:0", 0, i % 700, i * 0.1, loss=None if i % 997 == 5 else float(i)))
        if i % 50 == 0:
            s = h.series["replica/0/loss"] if "replica/0/loss" in h.series else h.series["replica/0/step_time"]
            seen.append((s.x, s.y, s.t_rel, s.x.tolist(), s.y.tolist(), s.t_rel.tolist()))
    for x, y, t, xs, ys, ts in seen:
        assert x.tolist() == xs and y.tolist() == ys and t.tolist() == ts


def test_series_shared_detaches_on_a_direct_append() -> None:
    h = History()
    for i in range(3):
        h.add(step("worker:0", 0, i, float(i)))
    loss = h.series["replica/0/loss"]
    loss.append(99.0, 9.0, T0 + 99.5)
    h.add(step("worker:0", 0, 3, 3.0))
    assert loss.x.tolist() == [0.0, 1.0, 2.0, 99.0, 3.0]
    assert loss.t_rel.tolist() == [0.0, 1.0, 2.0, 99.5, 3.0] and loss.y.tolist() == [1.0, 1.0, 1.0, 9.0, 1.0]
    assert h.series["replica/0/step_time"].x.tolist() == [0.0, 1.0, 2.0, 3.0]


def _f32(v: float) -> float:
    """A figure as the history keeps it: rounded to float32 when it fits, else as is."""
    return float(np.float32(v)) if abs(v) <= np.finfo(np.float32).max else float(v)


# Figures as a step event may carry them: numbers, missing, None, or not numbers at all.
figure = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-5, 5),
                   st.none(), st.just(True), st.just("x"), st.just(...))
step_event = st.tuples(st.integers(0, 2), st.integers(-3, 40), figure, figure, figure)
device_event = st.tuples(st.sampled_from(["ps:0", "worker:1"]), figure, figure, figure)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(step_event, device_event), max_size=400), st.integers(1, 60))
def test_history_matches_a_naive_model(events: list[tuple[Any, ...]], check_every: int) -> None:
    """Random interleavings of replicas, steps that repeat or go back and metrics that come and go."""
    h = History()
    model: dict[str, list[tuple[float, float, float]]] = {}
    for i, e in enumerate(events):
        t = i * 0.5
        if isinstance(e[0], int):
            rid, n, *values = e
            fields = {m: v for m, v in zip(METRICS, values, strict=True) if v is not ...}
            event = {"v": 1, "kind": "step", "task": f"worker:{rid}", "t": T0 + t, "replica": rid, "step": n,
                     **fields}
            for m, v in fields.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    model.setdefault(f"replica/{rid}/{m}", []).append((float(n), _f32(v), T0 + t))
        else:
            task, cpu, rss, gpu = e
            fields = {m: v for m, v in (("cpu_percent", cpu), ("rss_bytes", rss), ("gpu_util", gpu)) if v is not ...}
            event = {"v": 1, "kind": "device", "task": task, "t": T0 + t, **fields}
            for m, v in fields.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    model.setdefault(f"task/{task}/{m}", []).append((T0 + t, _f32(v), T0 + t))
        h.add(event)
        if i % check_every == 0 or i == len(events) - 1:
            assert sorted(h.series) == sorted(model)
            for key, points in model.items():
                s = h.series[key]
                assert len(s) == len(s.x) == len(s.y) == len(s.t) == len(points)
                assert s.t.dtype == np.float64 and s.t_base == T0
                assert list(zip(s.x.tolist(), s.y.tolist(), strict=True)) == [p[:2] for p in points], key
                # times: seconds from the history's first event, rounded to float32 (all within 200 s here)
                assert s.t_rel.tolist() == [float(np.float32(p[2] - T0)) for p in points], key
    assert h.version == h.total_points() == sum(len(p) for p in model.values())
    assert h.replicas() == sorted({int(k.split("/")[1]) for k in model if k.startswith("replica/")})


def test_an_async_summary_names_the_worker_behind_each_replica() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from engine.cli.main import _print_summary

    rs = RunState(total_steps=2)
    rs.apply(ev("run", "", 0.0, state="running"))
    for worker in (0, 1):  # the async chief reports for every worker
        rs.apply(step("chief:0", worker, 2, 1.0, loss=0.5, worker=worker))
    rs.apply(ev("run", "", 2.0, state="finished"))
    assert rs.summary()["replicas"]["1"]["worker"] == 1
    console = Console(record=True, width=200)
    _print_summary(console, SimpleNamespace(state=rs, run_dir="/runs/x"))
    text = console.export_text()
    assert "replica 1 (worker:1, reported by chief:0): final loss" in text
    assert "replica 0 (worker:0, reported by chief:0)" in text


def test_the_live_views_notes_merge_a_message_said_by_every_task_and_show_brackets_as_written() -> None:
    from rich.console import Console

    from engine.cli.main import _Notes

    notes = _Notes()
    notes.info("supervisor@localhost", "2 tasks share 2 core(s) on this host")
    for task in ("worker:0", "worker:1"):
        notes.info(task, "MultiWorkerMirroredStrategy: 2 replicas in sync, 1 on this task")
        notes.info(task, "16 steps per function (training.steps_per_execution)")
    notes.failed("worker:1", "ValueError: shape [784] [/] is not [bold]")
    console = Console(record=True, width=200)
    for line in notes.last(4):
        console.print(line)
    text = console.export_text()
    assert text.splitlines() == [
        "supervisor@localhost: 2 tasks share 2 core(s) on this host",
        "worker:0, worker:1: MultiWorkerMirroredStrategy: 2 replicas in sync, 1 on this task",
        "worker:0, worker:1: 16 steps per function (training.steps_per_execution)",
        "worker:1 failed: ValueError: shape [784] [/] is not [bold]",
    ]


def test_a_failed_runs_summary_shows_its_reason_and_folder_as_written() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from engine.cli.main import _print_summary

    rs = RunState(total_steps=2)
    rs.apply(ev("run", "", 0.0, state="running"))
    rs.apply(ev("run", "", 1.0, state="failed", failed_task="worker:1",
                reason="ValueError: expected shape [784], got [28, 28] [/]"))
    console = Console(record=True, width=200)
    _print_summary(console, SimpleNamespace(state=rs, run_dir="/runs/[1]"))
    text = console.export_text()
    assert "failed task: worker:1 - ValueError: expected shape [784], got [28, 28] [/]" in text
    assert "run folder: /runs/[1]" in text
