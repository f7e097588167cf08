"""The plots' series model without a window: decimation keeps every peak, smoothing of known
inputs, envelopes of blocks, the x-axis modes and what a frame hands the drawing."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.observe.telemetry import RunState
from gui.series_model import (
    CHECKPOINT,
    PLOTS,
    STEP_LABEL,
    SUMMARY_BLOCK,
    WALL_TIME_LABEL,
    Grown,
    PlotSpec,
    Reset,
    SeriesModel,
    Summary,
    ema,
    ema_from,
    follow_x,
    follow_y,
    natural_key,
    nice_ceiling,
    robust_top,
    series_xy,
    to_screen,
    total,
    x_label,
)

LOSS = PLOTS[0]
ROOT = Path(__file__).resolve().parents[2]
RAW = PlotSpec("raw", "Raw", "replica", ("loss",), smooth=False)


def model_with(y: np.ndarray, spec: PlotSpec = RAW, weight: float = 0.0, x: np.ndarray | None = None,
               view: tuple[tuple[float, float] | None, int] = (None, 500)) -> SeriesModel:
    model = SeriesModel(spec)
    model.put("a", np.arange(float(len(y))) if x is None else x, y, weight, view)
    return model


def test_the_module_imports_no_qt() -> None:
    # loaded from its file, outside the gui package (whose __init__ guards Qt's singletons)
    code = ("import importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('series_model', 'gui/series_model.py'); "
            "module = sys.modules['series_model'] = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(module); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- decimation


def test_decimation_keeps_every_peak_and_draws_about_two_points_per_pixel() -> None:
    rng = np.random.default_rng(0)
    n = 200_000
    y = rng.normal(size=n).astype(np.float32)
    spikes = rng.choice(n, size=7, replace=False)
    y[spikes[:4]] = 50.0 + np.arange(4)  # single-point peaks, up and down
    y[spikes[4:]] = -50.0 - np.arange(3)
    model = model_with(y)
    x, yd = model.display("a", (None, 500))
    assert len(x) <= 2 * 500 + 2 * SUMMARY_BLOCK * 16, len(x)
    assert yd.max() == pytest.approx(53.0) and yd.min() == pytest.approx(-52.0)
    for i in spikes:  # each spike is the min or max of the block drawn where it is
        j = int(np.searchsorted(x, i, side="right")) - 1
        assert y[i] in (yd[j], yd[max(0, j - 1)], yd[min(len(yd) - 1, j + 1)]), i
    assert np.all(np.diff(x) >= 0), "x stays sorted"


def test_few_points_in_view_are_drawn_exactly() -> None:
    y = np.sin(np.arange(10_000) / 50.0)
    model = model_with(y)
    x, yd = model.display("a", ((1000.0, 1300.0), 800))
    assert x[0] == 999.0 and x[-1] == 1301.0, "one point either side of the view"
    assert np.array_equal(yd, y[999:1302])


def test_a_zoomed_in_smoothed_curve_draws_every_point_smoothed() -> None:
    y = np.random.default_rng(3).normal(size=20_000)
    model = model_with(y, LOSS, weight=0.9)
    x, yd = model.display("a", ((5000.0, 5400.0), 1000))
    i0 = int(x[0])
    assert np.allclose(yd, ema(y, 0.9)[i0: i0 + len(x)], rtol=0, atol=1e-9)


def test_the_display_is_kept_for_an_unchanged_view() -> None:
    model = model_with(np.arange(5000.0))
    first = model.display("a", (None, 300))
    assert model.display("a", (None, 300)) is first
    assert model.display("a", (None, 400)) is not first
    assert model.display("missing", (None, 300))[0].size == 0


# ---------------------------------------------------------------------------- smoothing


def test_smoothing_of_known_inputs() -> None:
    assert np.allclose(ema(np.array([0.0, 1.0, 1.0, 1.0]), 0.5), [0.0, 0.5, 0.75, 0.875])
    assert np.allclose(ema(np.full(100, 3.0), 0.99), 3.0), "a constant stays itself"
    assert np.allclose(ema(np.array([2.0, 4.0, 8.0]), 0.0), [2.0, 4.0, 8.0]), "weight 0: the points"
    assert np.allclose(ema_from(np.array([1.0, 1.0]), 0.5, 0.0), [0.5, 0.75]), "continued from a state"


@pytest.mark.parametrize("weight", [0.3, 0.9, 0.999])
def test_the_vectorised_smoothing_is_the_loop(weight: float) -> None:
    y = np.random.default_rng(2).normal(size=3001) * 100
    assert np.allclose(ema_from(y, weight, 5.0), ema(np.r_[5.0, y], weight)[1:], rtol=1e-12, atol=1e-9)
    y[1500] = np.nan  # a gap at that point only: the smoothing goes on from the state before it
    y[2000] = np.inf
    got = ema_from(y, weight, 5.0)
    assert np.isnan(got[1500]) and np.isnan(got[2000])
    assert np.isfinite(np.delete(got, [1500, 2000])).all()
    assert got[1501] == pytest.approx(weight * got[1499] + (1 - weight) * y[1501])
    assert np.allclose(got, ema(np.r_[5.0, y], weight)[1:], rtol=1e-12, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.95])
def test_a_summary_extended_frame_by_frame_equals_one_made_at_once(weight: float) -> None:
    y = np.random.default_rng(1).normal(size=5000)
    grown, once = Summary(weight), Summary(weight)
    for k in (1, 2, 50, 51, 300, 500, 1023, 1024, 1025, 2100, 5000):
        grown.extend(y[:k])
    once.extend(y)
    expected = ema(y, weight) if weight else y
    for s in (grown, once):
        assert np.allclose(s.values(y, 0, 5000), expected, rtol=0, atol=1e-12)
        assert np.allclose(s.values(y, 1023, 3001), expected[1023:3001], rtol=0, atol=1e-12)
    assert len(grown.marks) >= 5000 // CHECKPOINT


# ---------------------------------------------------------------------------- envelopes


def test_the_envelope_is_each_blocks_min_and_max() -> None:
    y = np.random.default_rng(5).normal(size=10 * SUMMARY_BLOCK + 7)
    s = Summary(0.0)
    s.extend(y)
    blocks = y[: 10 * SUMMARY_BLOCK].reshape(-1, SUMMARY_BLOCK)
    assert s.blocks == 10
    assert np.allclose(s.lo[:10], blocks.min(axis=1), atol=1e-6)
    assert np.allclose(s.hi[:10], blocks.max(axis=1), atol=1e-6)
    assert (s.plo, s.phi) == (pytest.approx(y[-7:].min()), pytest.approx(y[-7:].max())), "the partial block"
    lo, hi = s.peaks(2 * SUMMARY_BLOCK, 1, 4)  # blocks of 64 points: 1, 2, 3
    wide = y[64: 256].reshape(3, 64)
    assert np.allclose(lo, wide.min(axis=1), atol=1e-6) and np.allclose(hi, wide.max(axis=1), atol=1e-6)
    assert s.bounds() == (pytest.approx(y.min(), abs=1e-6), pytest.approx(y.max(), abs=1e-6))


def test_points_that_are_not_finite_are_gaps_left_out_of_the_envelope_and_counted() -> None:
    y = np.arange(4.0 * SUMMARY_BLOCK)
    y[40], y[41], y[63] = np.nan, np.inf, -np.inf
    y[2 * SUMMARY_BLOCK: 3 * SUMMARY_BLOCK] = np.inf  # a block of nothing finite: a gap
    for weight in (0.0, 0.6):
        s = Summary(weight)
        s.extend(y[:50])
        s.extend(y)
        assert s.bad == [1, 1 + SUMMARY_BLOCK, 1] and s.non_finite == SUMMARY_BLOCK + 3
        assert np.isfinite(s.lo[1]) and np.isfinite(s.hi[1]) and s.lo[0] == 0.0
        assert math.isnan(s.lo[2]) and math.isnan(s.hi[2])
        drawn = s.values(y, 0, len(y))
        assert np.isnan(drawn[[40, 41, 63]]).all() and np.isfinite(drawn[3 * SUMMARY_BLOCK:]).all()
        assert s.bounds()[1] <= 4.0 * SUMMARY_BLOCK - 1 and np.isfinite(s.bounds()).all()
        s.rewind(y, 45)
        assert s.bad == [0, 0, 0] and s.n == SUMMARY_BLOCK
    plain = Summary(0.0)
    plain.extend(y)
    assert plain.lo[1] == SUMMARY_BLOCK and plain.hi[1] == 62.0 and plain.bounds() == (0.0, 4.0 * SUMMARY_BLOCK - 1)


def test_a_rewound_summary_is_made_again_from_the_changed_point() -> None:
    y = np.random.default_rng(6).normal(size=3000)
    s = Summary(0.8)
    s.extend(y[:2000])
    y2 = y.copy()
    y2[1500:] += 1.0
    s.rewind(y2, 1500)
    s.extend(y2)
    assert s.n == 3000 and np.allclose(s.values(y2, 0, 3000), ema(y2, 0.8), atol=1e-12)


# ---------------------------------------------------------------------------- x-axis modes


def state_with_series() -> RunState:
    state = RunState()
    t = 1000.0 + np.arange(5.0) * 2  # a point every 2 s from t = 1000
    state.history.load("replica/0/loss", np.arange(10.0, 15.0), np.ones(5), t)
    state.history.load("task/worker:0/cpu_percent", t, np.full(5, 50.0), t)
    return state


def test_a_replica_plot_is_by_step_or_by_wall_time_since_the_run_started() -> None:
    state = state_with_series()
    x, y, offset = series_xy(state, "replica/0/loss", by_time=False)
    assert np.array_equal(x, np.arange(10.0, 15.0)) and offset == 0.0
    state.started_at = 996.0  # the run started 4 s before its first figure
    x, y, offset = series_xy(state, "replica/0/loss", by_time=True)
    assert np.allclose(x - offset, [4.0, 6.0, 8.0, 10.0, 12.0])


def test_a_task_plot_is_always_by_wall_time_since_the_first_figure_when_the_start_is_unknown() -> None:
    state = state_with_series()
    x, _, offset = series_xy(state, "task/worker:0/cpu_percent", by_time=False)
    assert np.allclose(x - offset, [0.0, 2.0, 4.0, 6.0, 8.0])
    assert x_label("task", False) == WALL_TIME_LABEL and x_label("replica", False) == STEP_LABEL
    assert x_label("replica", True) == WALL_TIME_LABEL


def test_log_axes_leave_out_points_at_or_below_zero() -> None:
    x, y = to_screen(np.array([1.0, 10.0, 100.0]), np.array([0.0, 1.0, 1000.0]), (True, True))
    assert np.allclose(x, [0, 1, 2]) and np.isnan(y[0]) and np.allclose(y[1:], [0, 3])
    same = np.array([1.0, -1.0])
    assert to_screen(same, same, (False, False))[1] is same


# ---------------------------------------------------------------------------- what a frame draws


def test_a_curve_grows_by_its_new_segments_from_its_last_point() -> None:
    spec = PlotSpec("t", "T", "replica", ("step_time",), scale=1000.0)
    model = SeriesModel(spec)
    x, y = np.arange(100.0), np.linspace(0.0, 1.0, 100)
    first = model.put("a", x[:60], y[:60], 0.0, (None, 400), x_offset=5.0)
    assert isinstance(first, Reset) and first.bounds == pytest.approx([-5.0, 54.0, 0.0, y[59] * 1000])
    assert model.put("a", x[:60], y[:60], 0.0, (None, 400), x_offset=5.0) is None, "nothing new"
    grown = model.put("a", x, y, 0.0, (None, 400), x_offset=5.0)
    assert isinstance(grown, Grown)
    assert np.allclose(grown.x, x[59:] - 5.0) and np.allclose(grown.y, y[59:] * 1000), "from the joint, scaled"
    assert isinstance(model.put("a", x, y, 0.5, (None, 400), x_offset=5.0), Reset), "new smoothing: all again"
    assert isinstance(model.put("a", x, y, 0.5, (None, 300), x_offset=5.0), Reset), "new width: all again"
    raw_x, raw_y = model.raw["a"]
    assert model.points("a") == 100 and np.allclose(raw_x, x - 5.0) and np.allclose(raw_y, y * 1000)


def test_the_first_step_is_not_drawn_where_it_includes_tracing() -> None:
    model = SeriesModel(PLOTS[2])  # step time: skip_first
    model.put("a", np.arange(1.0, 6.0), np.array([9.0, 0.1, 0.1, 0.1, 0.1]), 0.9, (None, 400))
    x, y = model.display("a", (None, 400))
    assert np.array_equal(x, [2.0, 3.0, 4.0, 5.0]) and np.allclose(y, 100.0), "no spike seeds the smoothing"
    assert model.points("a") == 5, "the CSV keeps every point"


def test_log_mode_gives_every_curve_its_bounds_again_in_log10() -> None:
    model = model_with(np.array([1.0, 10.0, 100.0, 1000.0]), x=np.array([1.0, 2.0, 3.0, 4.0]))
    bounds = model.set_log((False, True))
    assert bounds["a"] == pytest.approx([1.0, 4.0, 0.0, 3.0])
    assert np.allclose(model.display("a", (None, 400))[1], [0.0, 1.0, 2.0, 3.0])


def test_owners_are_in_natural_order_and_removed_curves_are_forgotten() -> None:
    state = RunState()
    for r in (10, 2, 1):
        state.history.load(f"replica/{r}/loss", np.arange(3.0), np.ones(3), np.arange(3.0))
    model = SeriesModel(LOSS)
    assert model.owners(state.history) == ["1", "2", "10"]
    assert sorted(["r10", "r2"], key=natural_key) == ["r2", "r10"]
    model.put("cmp:x:replica/1/loss", np.arange(3.0), np.ones(3), 0.0, (None, 100))
    model.remove("cmp:x:replica/1/loss")
    assert not model.sources and not model.summaries and not len(model.raw)


def test_the_total_is_kept_where_every_series_reported() -> None:
    cache: dict = {}
    xs = [np.arange(1.0, 11.0), np.arange(1.0, 9.0)]
    series = [(f"r{i}", x, np.full(len(x), float(i + 1))) for i, x in enumerate(xs)]
    base_x, summed, stable, final = total(cache, "", series)
    assert stable == 0 and final == 8 and np.allclose(summed[:final], 3.0)
    late = [("r0", np.arange(1.0, 11.0), np.ones(10)), ("r1", np.arange(5.0, 11.0), np.ones(6))]
    _, summed, _, final = total({}, "", late)
    assert np.allclose(summed[:4], 1.0) and np.allclose(summed[4:final], 2.0), "nothing before a series starts"


# ---------------------------------------------------------------------------- following the data


def test_the_view_follows_the_data_in_coarse_steps() -> None:
    assert follow_x(0.0, 100.0, (0.0, 110.0)) is None, "the data fills the view: left alone"
    assert follow_x(0.0, 120.0, (0.0, 110.0)) == (0.0, 150.0), "past its end: a quarter ahead"
    assert follow_x(0.0, 10.0, (0.0, 110.0)) == (0.0, 12.5), "less than half full: shrunk"
    assert follow_y(0.0, 1.0, (-0.1, 1.2)) is None
    assert follow_y(0.0, 2.0, (-0.1, 1.2)) == pytest.approx((-0.1, 2.3))


def test_a_robust_y_range_ignores_rare_spikes_and_rounds_up() -> None:
    values = np.r_[np.full(995, 10.0), np.full(5, 1e6)]  # warm-up spikes: 0.5 % of the points
    assert robust_top([values[:985], values[985:]], 1.0, 0.0) == nice_ceiling(13.0) == 15.0
    assert robust_top([values], 1.0, 14.0) is None, "inside the current range, not well inside: kept"
    assert robust_top([np.array([np.nan])], 1.0, 0.0) is None and robust_top([], 1.0, 0.0) is None
    assert [nice_ceiling(v) for v in (0.9, 1.0, 1.2, 2.5, 6.0, 8.0)] == [1.0, 1.0, 1.5, 3.0, 7.5, 10.0]
