"""The live plots' drawing: lines drawn incrementally look as if drawn at once, downsampling
keeps every extreme, the legend hides lines, exports draw them, totals stay put."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QImage

from gui.curves import MAX_PENDING
from gui.plots import PLOTS, SUMMARY_BLOCK, MetricPlot, _ema_from, _total, ema
from gui.readout import gap_notes

LOSS = PLOTS[0]
BLUE, ORANGE = "#3b82f6", "#f97316"


def make_plot(qtbot: Any, spec: Any = LOSS, x_range: tuple[float, float] | None = (0.0, 400.0)) -> MetricPlot:
    plot = MetricPlot(spec)
    plot.resize(500, 300)
    qtbot.addWidget(plot)
    plot.show()
    qtbot.waitExposed(plot)
    if x_range is not None:  # a fixed view, as after the user zoomed
        plot.following = False
        plot.item.setXRange(*x_range, padding=0)
        plot.item.setYRange(-1.5, 1.5, padding=0)
    return plot


def pixels(plot: MetricPlot) -> np.ndarray:
    """The plot as the screen shows it (RGB rows)."""
    image = plot.widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    return pg.functions.ndarray_from_qimage(image)[..., :3].copy()


def count_color(img: np.ndarray, color: str, tol: int = 40) -> int:
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])[::-1]  # the array is BGR
    return int((np.abs(img.astype(int) - rgb).max(axis=-1) <= tol).sum())


def test_lines_grown_frame_by_frame_look_like_lines_drawn_at_once(qtbot: Any) -> None:
    x = np.arange(300.0)
    y1, y2 = np.sin(x / 20), np.cos(x / 15)
    grown = make_plot(qtbot)
    grown.set_curve("a", "a", BLUE, x[:30], y1[:30], 0.0)
    grown.set_curve("b", "b", ORANGE, x[:30], y2[:30], 0.0)
    grown.lines.flush()
    pixels(grown)
    full_draws = grown.lines.full_draws
    for k in range(40, 301, 10):  # 27 frames, each adding points at the lines' ends
        grown.set_curve("a", "a", BLUE, x[:k], y1[:k], 0.0)
        grown.set_curve("b", "b", ORANGE, x[:k], y2[:k], 0.0)
        grown.lines.flush()
        pixels(grown)
    assert grown.lines.full_draws == full_draws, "appended points are drawn without drawing every line again"
    at_once = make_plot(qtbot)
    at_once.set_curve("a", "a", BLUE, x, y1, 0.0)
    at_once.set_curve("b", "b", ORANGE, x, y2, 0.0)
    a, b = pixels(grown), pixels(at_once)
    assert count_color(a, BLUE) > 300 and count_color(a, ORANGE) > 300
    assert (a != b).any(axis=-1).mean() < 0.002  # line joins may differ by a pixel, nothing else


def test_a_moved_view_or_a_changed_line_draws_everything_again(qtbot: Any) -> None:
    x = np.arange(100.0)
    plot = make_plot(qtbot)
    plot.set_curve("a", "a", BLUE, x, np.sin(x / 10), 0.0)
    pixels(plot)
    before = plot.lines.full_draws
    plot.item.setXRange(0, 200, padding=0)
    pixels(plot)
    assert plot.lines.full_draws == before + 1
    plot.set_curve("a", "a", BLUE, x, np.sin(x / 10), 0.9)  # new smoothing: every point changes
    pixels(plot)
    assert plot.lines.full_draws >= before + 2


def test_a_plot_not_painted_for_long_keeps_no_backlog(qtbot: Any) -> None:
    x = np.arange(2000.0)
    y = np.sin(x / 50)
    plot = make_plot(qtbot, x_range=(0.0, 2000.0))
    plot.set_curve("a", "a", BLUE, x[:10], y[:10], 0.0)
    pixels(plot)
    before = plot.lines.full_draws
    plot.hide()  # a hidden window is not painted: frames keep coming
    for k in range(11, 2000):
        plot.set_curve("a", "a", BLUE, x[:k], y[:k], 0.0)
        plot.lines.flush()
    assert len(plot.curves["a"]._pending) <= MAX_PENDING
    plot.show()
    qtbot.waitExposed(plot)
    img = pixels(plot)
    assert plot.lines.full_draws == before + 1, "the backlog was dropped: the next paint draws the line in full"
    at_once = make_plot(qtbot, x_range=(0.0, 2000.0))
    at_once.set_curve("a", "a", BLUE, x[:1999], y[:1999], 0.0)
    assert (img != pixels(at_once)).any(axis=-1).mean() < 0.002


def test_lines_that_come_back_into_a_fixed_view_are_painted(qtbot: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtWidgets import QApplication

    from gui.curves import CurveSet

    paints = []
    original = CurveSet.paint
    monkeypatch.setattr(CurveSet, "paint", lambda self, *a: (paints.append(1), original(self, *a))[1])
    x = np.arange(400.0)
    y = np.where(x < MAX_PENDING + 40, 5.0, 0.0)  # above the view for longer than the backlog holds, then in it
    plot = make_plot(qtbot)
    plot.set_curve("a", "a", BLUE, x[:10], y[:10], 0.0)
    pixels(plot)
    for k in range(11, 400):
        plot.set_curve("a", "a", BLUE, x[:k], y[:k], 0.0)
        plot.lines.flush()
        QApplication.processEvents()  # the screen paints what was asked for, nothing more
        if k == MAX_PENDING + 60:
            paints.clear()
    assert paints, "segments back in view were painted on screen"


def test_an_export_between_frames_loses_no_segment_of_the_screen(qtbot: Any, tmp_path: Path) -> None:
    x = np.arange(300.0)
    y = np.sin(x / 20)
    plot = make_plot(qtbot)
    plot.set_curve("a", "a", BLUE, x[:100], y[:100], 0.0)
    pixels(plot)
    plot.set_curve("a", "a", BLUE, x, y, 0.0)  # new segments, not painted yet
    plot.export_png(tmp_path / "between.png")
    plot.lines.flush()
    at_once = make_plot(qtbot)
    at_once.set_curve("a", "a", BLUE, x, y, 0.0)
    assert (pixels(plot) != pixels(at_once)).any(axis=-1).mean() < 0.002


def test_the_right_click_export_writes_this_plots_data(qtbot: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    x = np.arange(30.0)
    plot = make_plot(qtbot)
    plot.set_curve("a", "replica 0", BLUE, x, np.sin(x), 0.5)
    actions = {a.text(): a for a in plot.widget.scene().contextMenu}
    assert set(actions) == {"Export as PNG…", "Export data as CSV…"}
    out = tmp_path / "loss.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "")))
    actions["Export data as CSV…"].trigger()
    rows = out.read_text(encoding="utf-8").splitlines()
    assert rows[0] == "curve,x,y" and len(rows) == 31 and rows[1].startswith("replica 0,0.0,0.0")


def test_the_first_step_left_out_does_not_seed_the_smoothing(qtbot: Any) -> None:
    step_time = next(spec for spec in PLOTS if spec.key == "step_time")
    x = np.arange(1.0, 51.0)
    y = np.full(50, 0.1)
    y[0] = 30.0  # the first step traces the function: 300 times slower
    grown = make_plot(qtbot, step_time, x_range=None)
    for k in range(1, 51):
        grown.set_curve("a", "a", BLUE, x[:k], y[:k], 0.9)
    assert np.allclose(grown.curves["a"].getData()[1], 100.0)  # ms, the first step nowhere


def test_the_total_counts_a_replica_that_joined_late() -> None:
    cache: dict[str, Any] = {}
    early = ("r0", np.arange(1.0, 21.0), np.full(20, 1.0))
    _total(cache, "", [early])
    late = ("r1", np.arange(11.0, 21.0), np.full(10, 2.0))
    base_x, total, stable, final = _total(cache, "", [early, late])
    assert stable == 0, "a new set of series makes the sum again"
    assert np.allclose(total[:10], 1.0) and np.allclose(total[10:final], 3.0)


def test_clicking_a_legend_entry_hides_its_line(qtbot: Any) -> None:
    x = np.arange(200.0)
    plot = make_plot(qtbot)
    plot.set_curve("a", "replica 0", BLUE, x, np.sin(x / 20), 0.0)
    plot.set_curve("b", "replica 1", ORANGE, x, np.cos(x / 20), 0.0)
    assert count_color(pixels(plot), ORANGE) > 200
    sample, label = plot.legend.items[1]
    assert label.text == "replica 1"
    view = plot.widget
    pos = view.mapFromScene(sample.mapToScene(QPointF(10, 10)))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert not plot.curves["b"].isVisible()
    img = pixels(plot)
    assert count_color(img, ORANGE) < 20 and count_color(img, BLUE) > 200  # (the legend's own mark aside)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert plot.curves["b"].isVisible() and count_color(pixels(plot), ORANGE) > 200


def test_a_gap_in_the_data_is_not_bridged(qtbot: Any) -> None:
    x = np.arange(400.0)
    y = np.zeros(400)
    y[150:250] = np.nan
    plot = make_plot(qtbot)
    plot.set_curve("a", "a", BLUE, x[:100], y[:100], 0.0)
    pixels(plot)
    for k in (160, 260, 400):  # the gap arrives over several frames
        plot.set_curve("a", "a", BLUE, x[:k], y[:k], 0.0)
        plot.lines.flush()
        pixels(plot)
    img = pixels(plot)

    def at(px: float) -> tuple[int, int]:
        p = plot.widget.mapFromScene(plot.lines.mapToScene(QPointF(px, 0.0)))
        return p.x(), p.y()

    (left, row), (right, _) = at(170), at(230)
    band = img[row - 2 : row + 3]
    assert count_color(band[:, left:right], BLUE) == 0
    assert count_color(band[:, : left - 20], BLUE) > 50 and count_color(band[:, right + 20 :], BLUE) > 50


def test_the_readout_says_what_a_gap_near_the_pointer_stands_for() -> None:
    x, y = np.arange(10.0), np.ones(10)
    y[4], y[7], y[9] = np.inf, np.nan, -np.inf
    series = [("replica 0", x, y, 0.0), ("none yet", np.array([]), np.array([]), 0.0)]
    assert gap_notes(series, 4.2, 0.5) == ["step 4 · replica 0: +inf (not drawn)"]
    assert gap_notes(series, 8.8, 0.5) == ["step 9 · replica 0: −inf (not drawn)"]
    assert gap_notes(series, 5.5, 0.5) == [], "the point nearest the pointer is drawn"
    assert gap_notes(series, 4.2, 0.1) == [], "the gap is farther than a few pixels"
    assert gap_notes(series, -5.0, 100.0) == []
    # a shifted run's x is shown less its offset; a time axis says tenths
    assert gap_notes([("b", x + 100.0, y, 100.0)], 7.0, 0.5, x_label="time (s)") == ["time (s) 7.0 · b: NaN (not drawn)"]
    # on a log x axis the pointer and the few pixels are in log10 of x
    assert gap_notes(series, math.log10(4.0), 0.01, log_x=True) == ["step 4 · replica 0: +inf (not drawn)"]
    assert gap_notes(series, math.log10(5.0), 0.01, log_x=True) == []


def test_downsampling_keeps_every_extreme_and_the_history_keeps_every_point(qtbot: Any) -> None:
    n = 200_000
    x = np.arange(n, dtype=float)
    y = np.sin(x / 5000.0)
    y[123_457] = 9.0  # one spike, and one dip
    y[77_777] = -7.0
    plot = make_plot(qtbot, x_range=None)
    plot.set_curve("a", "a", BLUE, x, y, 0.0)
    xd, yd = plot.curves["a"].getData()
    assert len(xd) < 3 * plot.item.getViewBox().width(), "about 2 points per pixel reach the screen"
    assert yd.max() == 9.0 and yd.min() == -7.0
    assert plot.points("a") == n and np.array_equal(plot.raw["a"][1], y)
    plot.set_curve("a", "a", BLUE, np.arange(n + 10, dtype=float), np.append(y, np.full(10, -8.0)), 0.0)
    assert plot.curves["a"].getData()[1].min() == -8.0
    plot.follow_data()
    (x0, x1), (y0, y1) = plot.item.getViewBox().viewRange()
    assert x0 <= 0 and x1 >= n + 9 and y0 <= -8.0 and y1 >= 9.0, "following keeps every point in view"


def test_log_y_from_the_plot_menu_draws_log10_of_the_points(qtbot: Any) -> None:
    x = np.arange(1.0, 301.0)
    y = 10.0 ** (-x / 100)  # 0.1 .. 0.001: a straight line on a log axis
    plot = make_plot(qtbot, x_range=None)
    plot.set_curve("a", "a", BLUE, x[:100], y[:100], 0.0)
    plot.item.setLogMode(False, True)  # what the menu's "Log Y" does
    assert np.allclose(plot.curves["a"].getData()[1], np.log10(y[:100])), "at once, not at the next frame"
    lo, hi = plot.lines.dataBounds(1)
    assert lo == pytest.approx(-0.99 - 0.01) and hi == pytest.approx(-0.01), "the range fit sees log10 bounds"
    plot.set_curve("a", "a", BLUE, x[:200], y[:200], 0.0)
    plot.set_curve("a", "a", BLUE, x, y, 0.0)  # and the next frame appends in log coordinates
    plot.follow_data()
    _, yd = plot.curves["a"].getData()
    assert np.allclose(yd, np.log10(y))
    y0, y1 = plot.item.getViewBox().viewRange()[1]
    assert y0 <= -3 and y1 >= -1 and y1 - y0 < 5, "the view holds the log10 of every point"
    assert count_color(pixels(plot), BLUE) > 300
    plot.item.setLogMode(False, False)
    plot.set_curve("a", "a", BLUE, x, y, 0.0)
    assert np.allclose(plot.curves["a"].getData()[1], y)
    menus = [action.text() for action in plot.item.ctrlMenu.actions()]
    assert "Transforms" in menus and "Downsample" not in menus  # only options that apply are offered


def test_export_png_draws_the_lines(qtbot: Any, tmp_path: Path) -> None:
    x = np.arange(200.0)
    plot = make_plot(qtbot)
    plot.set_curve("a", "a", BLUE, x, np.sin(x / 20), 0.0)
    out = plot.export_png(tmp_path / "loss.png", width=800)
    image = QImage(str(out)).convertToFormat(QImage.Format.Format_RGB32)
    assert image.width() == 800
    assert count_color(pg.functions.ndarray_from_qimage(image)[..., :3], BLUE) > 300


def test_many_curves_share_a_compact_legend(qtbot: Any) -> None:
    x = np.arange(50.0)
    plot = make_plot(qtbot)
    for r in range(32):
        plot.set_curve(f"replica/{r}/loss", f"replica {r}", BLUE, x, np.sin(x / 10 + r), 0.0)
    assert plot.legend.columnCount > 1
    assert plot.legend.geometry().height() < 0.8 * plot.item.getViewBox().height()
    assert all(c.pen().widthF() == 1.0 for c in plot.curves.values()), "many curves are drawn 1 pixel wide"


def test_the_total_is_drawn_where_every_replica_reported_and_keeps_its_points() -> None:
    cache: dict[str, Any] = {}
    xs = [np.arange(1.0, 11.0), np.arange(1.0, 9.0)]
    series = [(f"r{i}", x, np.full(len(x), float(i + 1))) for i, x in enumerate(xs)]
    base_x, total, stable, final = _total(cache, "", series)
    assert stable == 0 and final == 8 and np.allclose(total[:final], 3.0)
    # the other replica becomes the longest: the base stays, the first points are kept
    xs = [np.arange(1.0, 11.0), np.arange(1.0, 12.0)]
    series = [(f"r{i}", x, np.full(len(x), float(i + 1))) for i, x in enumerate(xs)]
    base_x2, total2, stable2, final2 = _total(cache, "", series)
    assert stable2 == 8 and final2 == 10 and base_x2 is xs[0] and np.allclose(total2[:final2], 3.0)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.95])
def test_smoothing_extended_frame_by_frame_equals_smoothing_at_once(qtbot: Any, weight: float) -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(size=5000)
    x = np.arange(5000.0)
    plot = make_plot(qtbot, x_range=None)
    for k in (1, 2, 50, 51, 300, 500, 1023, 1024, 1025, 2100, 5000):
        plot.set_curve("a", "a", BLUE, x[:k], y[:k], weight)
    summary = plot._summaries["a"]
    expected = ema(y, weight) if weight else y
    assert np.allclose(summary.values(y, 0, 5000), expected, rtol=0, atol=1e-12)
    for i0, i1 in ((0, 1), (1023, 1025), (1024, 3000), (4999, 5000), (37, 4100)):
        assert np.allclose(summary.values(y, i0, i1), expected[i0:i1], rtol=0, atol=1e-12), (i0, i1)
    # what a frame keeps: block extremes and checkpoints, no smoothed copy of the points
    kept = summary.lo.nbytes + summary.hi.nbytes + summary.marks.nbytes
    assert kept < 0.5 * len(y), kept
    blocks = expected[: summary.blocks * SUMMARY_BLOCK].reshape(-1, SUMMARY_BLOCK)
    assert np.allclose(summary.lo[: summary.blocks], blocks.min(axis=1), atol=1e-6)
    assert np.allclose(summary.hi[: summary.blocks], blocks.max(axis=1), atol=1e-6)


@pytest.mark.parametrize("weight", [0.3, 0.9, 0.999])
def test_the_vectorised_smoothing_is_the_loop(weight: float) -> None:
    y = np.random.default_rng(2).normal(size=3001) * 100
    assert np.allclose(_ema_from(y, weight, 5.0), ema(np.r_[5.0, y], weight)[1:], rtol=1e-12, atol=1e-9)
    y[1500] = np.nan  # a gap at that point only: the smoothing goes on from the state before it
    got = _ema_from(y, weight, 5.0)
    assert np.isfinite(np.delete(got, 1500)).all() and np.isnan(got[1500])


def test_a_smoothed_curve_zoomed_in_draws_every_point_smoothed(qtbot: Any) -> None:
    n = 50_000
    x = np.arange(n, dtype=np.float32)
    y = (np.sin(np.arange(n) / 300.0) + np.random.default_rng(4).normal(size=n) * 0.1).astype(np.float32)
    plot = make_plot(qtbot, x_range=(30_000.0, 30_400.0))
    plot.set_curve("a", "a", BLUE, x, y, 0.9)
    xd, yd = plot.curves["a"].getData()
    smoothed = ema(y.astype(np.float64), 0.9)
    i0 = int(xd[0])
    assert 400 <= len(xd) <= 403 and np.array_equal(xd, np.arange(i0, i0 + len(xd)))
    assert np.allclose(yd, smoothed[i0: i0 + len(xd)], rtol=0, atol=1e-9)
    plot.item.setXRange(0, n, padding=0)  # the whole curve: block extremes of the smoothed points
    plot.lines.flush()
    xd, yd = plot.curves["a"].getData()
    assert len(xd) < 3 * plot.item.getViewBox().width()
    assert yd.max() == pytest.approx(smoothed.max(), abs=1e-6) and yd.min() == pytest.approx(smoothed.min(), abs=1e-6)


def test_a_total_that_changes_its_last_points_is_smoothed_again_from_there(qtbot: Any) -> None:
    x = np.arange(3000.0)
    y = np.random.default_rng(5).normal(size=3000)
    plot = make_plot(qtbot, x_range=None)
    plot.set_curve("total", "total", BLUE, x[:2000], y[:2000], 0.8)
    y2 = y.copy()
    y2[1500:] += 1.0  # from point 1,500 on the sum changed (a replica's points arrived)
    plot.set_curve("total", "total", BLUE, x, y2, 0.8, stable=1500)
    _, yd = plot.curves["total"].getData()
    assert len(yd) < 3000, "downsampled"
    summary = plot._summaries["total"]
    assert summary.n == 3000 and np.allclose(summary.values(y2, 0, 3000), ema(y2, 0.8), atol=1e-12)


def test_past_32_curves_one_compact_legend_names_every_line_and_hides_it_on_a_click(qtbot: Any) -> None:
    x = np.arange(50.0)
    plot = make_plot(qtbot)
    plot.resize(900, 500)
    colors = [BLUE, ORANGE]
    for r in range(40):
        plot.set_curve(f"replica/{r}/loss", f"replica {r}", colors[r % 2], x, np.sin(x / 10 + r), 0.0)
    compact = plot.compact_legend
    assert compact.isVisible() and not plot.legend.isVisible()
    assert plot.legend.items == [], "pyqtgraph's entries (two widgets each) are let go"
    assert compact.names == [f"r{r}" for r in range(40)] and compact.labels[7] == "replica 7"
    assert compact.rows * compact.columns >= 40, "every name fits in a plot this size"
    qtbot.waitUntil(lambda: compact.size().width() > 0)
    # a click on "r7" hides replica 7's line, another shows it again
    cell_w, cell_h = compact._cell
    col, row = 7 % compact.columns, 7 // compact.columns
    at = QPointF(compact.PAD + (col + 0.3) * cell_w, compact.PAD + (row + 0.5) * cell_h)
    pos = plot.widget.mapFromScene(compact.mapToScene(at))
    qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert not plot.curves["replica/7/loss"].isVisible()
    assert sum(c.isVisible() for c in plot.curves.values()) == 39
    qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert plot.curves["replica/7/loss"].isVisible()
    # back to 32 curves: pyqtgraph's legend again, with every remaining curve
    for r in range(32, 40):
        plot.remove_curve(f"replica/{r}/loss")
    assert plot.legend.isVisible() and not compact.isVisible() and len(compact) == 0
    assert [label.text for _, label in plot.legend.items] == [f"r{r}" for r in range(32)]


def test_a_compact_legend_too_long_for_the_plot_scrolls_and_says_how_many_are_out_of_sight(qtbot: Any) -> None:
    from gui.legend import CompactLegend

    class Line:
        def __init__(self) -> None:
            self.shown = True

        def isVisible(self) -> bool:  # noqa: N802
            return self.shown

        def setVisible(self, visible: bool) -> None:  # noqa: N802
            self.shown = visible

        def pen(self) -> Any:
            return pg.mkPen(BLUE)

    legend = CompactLegend()
    for r in range(100):
        legend.add(Line(), f"r{r}", f"replica {r}")
    legend.fit(200.0, 60.0)
    shown = legend.rows * legend.columns - 1  # the last cell says "+N"
    assert legend.rows < 100 / legend.columns and legend._more() == 100 - shown
    legend.first_row = 10_000
    legend.fit(200.0, 60.0)  # scrolled no further than the last row
    assert legend._more() == 0 and legend.first_row == legend._hidden_rows() > 0
