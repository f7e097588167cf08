"""A run of many replicas in the window: the plots draw their mean, their band and a few lines, which a person
picks with the plot's search box and its top-k choice; values that are not finite never reach a range and
are said; a large run folder keeps the window answering (the work of a turn does not grow with replicas).

Run folders are written through the launcher's own writers (``RunRecord``: lifecycle lines and the tiered
store), as ``bench/app_scale.py`` writes its own, without TensorFlow.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from app_scale import T0, write_run_folder  # noqa: E402

from gui import series_model  # noqa: E402
from gui.plots_crowd import CROWD_ABOVE  # noqa: E402


def open_folder(qtbot: Any, window: Any, path: Path) -> Any:
    """Open ``path`` as a person does (File › Open run folder) in a window large enough to read, and wait
    until every plot has folded what it shows."""
    window.resize(1600, 1000)
    assert window.open_run_folder(path)
    panel = window.plots
    qtbot.waitUntil(lambda: panel.loss.curves and panel._caught_up(), timeout=20_000)
    panel.redraw_if_needed()
    return panel


def lines(plot: Any) -> set[str]:
    """The replicas drawn as lines of their own (besides the mean and the band)."""
    return {k.split("/")[1] for k in plot.curves if k.startswith(("replica/", "task/"))}


def legend_texts(plot: Any) -> list[str]:
    if plot.legends.compact:
        return list(plot.compact_legend.labels)
    return [label.text for _, label in plot.legend.items]


def test_the_legend_of_many_replicas_is_searched_and_ranked_as_a_person_uses_it(qtbot: Any, window: Any,
                                                                                tmp_path: Path) -> None:
    def loss(r: int, tick: int, value: float) -> float:
        return value + (0.5 if r == 7 else -0.5 if r == 3 else 0.0)  # 7 the highest loss, 3 the lowest

    folder = write_run_folder(tmp_path / "runs", 200, 200, 8, 30, value=loss)
    panel = open_folder(qtbot, window, folder)
    plot = panel.loss
    assert plot.crowded and plot.crowd_controls.isVisible()
    assert "crowd/loss/mean" in plot.curves and "crowd/loss/band" in plot.curves
    texts = legend_texts(plot)
    assert len(texts) <= 10, f"the legend names what is drawn, not 200 replicas: {texts}"
    assert texts[0] == "mean of 200" and texts[1] == "min–max of 200"
    assert len(lines(plot)) == 5 and "7" in lines(plot) and "3" not in lines(plot), "the 5 highest losses"
    # the band holds every replica: from replica 3's lowest to replica 7's highest loss
    band = plot.band_model
    lo, hi = band.sources["crowd/loss/band#lo"].summary.bounds(), band.sources["crowd/loss/band#hi"].summary.bounds()
    assert lo[0] == pytest.approx(2.0 / (1 + 29 / 50) + 3e-4 - 0.5, abs=1e-5)
    assert hi[1] == pytest.approx(2.0 + 7e-4 + 0.5, abs=1e-5)

    # the hover reads the curve under the pointer (the mean here), named as its legend entry
    x, y = plot.curves["crowd/loss/mean"].getData()
    scene = plot.item.getViewBox().mapViewToScene(QPointF(float(x[len(x) // 2]), float(y[len(y) // 2])))
    plot.hover.moved(scene)
    assert plot.hover.reading is not None and plot.hover.text.startswith("step ")
    assert plot.hover.reading.key in plot.curves and plot.hover.reading.key != "crowd/loss/band"

    # typing a replica's name draws it (and only it) beside the mean and the band
    search = plot.crowd_controls.search
    qtbot.mouseClick(search, Qt.MouseButton.LeftButton)
    qtbot.keyClicks(search, "r3")
    qtbot.waitUntil(lambda: lines(plot) == {"3"})
    assert any(t.startswith("replica 3") for t in legend_texts(plot))
    assert plot.crowd_controls.note.text() == "1"
    # a host names its replicas (25 on host-2: the first 16 drawn, the note says so)
    search.clear()
    qtbot.keyClicks(search, "host-2")
    qtbot.waitUntil(lambda: len(lines(plot)) == 16)
    assert lines(plot) <= {str(r) for r in range(50, 75)}
    assert plot.crowd_controls.note.text() == "16 of 25"
    # the search box cleared: the top 5 again; the choice moved to "5 lowest" with the keyboard
    search.clear()
    qtbot.waitUntil(lambda: "7" in lines(plot))
    choice = plot.crowd_controls.choice
    choice.setFocus()
    qtbot.keyClick(choice, Qt.Key.Key_Down)
    assert choice.currentText() == "5 lowest"
    qtbot.waitUntil(lambda: "3" in lines(plot) and "7" not in lines(plot))
    # one line per host
    qtbot.keyClick(choice, Qt.Key.Key_End)
    assert choice.currentText() == "each host"
    qtbot.waitUntil(lambda: sum(k.startswith("crowd/loss/host/") for k in plot.curves) == 8)
    assert not lines(plot)
    assert any(t.startswith("host-0 (mean of 25)") for t in legend_texts(plot))

    # a click on a legend entry hides its line, as with few replicas
    qtbot.keyClick(choice, Qt.Key.Key_Home)
    qtbot.waitUntil(lambda: "7" in lines(plot))
    window.plots.resize(1600, 900)
    qtbot.waitUntil(lambda: not plot.legends.compact and any(
        s.item is plot.curves["crowd/loss/mean"] for s, _ in plot.legend.items), timeout=5000)
    sample = next(s for s, _ in plot.legend.items if s.item is plot.curves["crowd/loss/mean"])
    pos = plot.widget.mapFromScene(sample.mapToScene(QPointF(10, 10)))
    qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert not plot.curves["crowd/loss/mean"].isVisible()


def test_values_that_are_not_finite_raise_nothing_and_are_said(qtbot: Any, window: Any, tmp_path: Path) -> None:
    def loss(r: int, tick: int, value: float) -> float:
        if not tick:
            return value  # (the store keeps each owner's first values in its owner list, as JSON)
        if r == 0 and 10 <= tick < 13:
            return math.inf
        if r == 1:
            return -1e308 if tick % 2 else 1e308  # finite, at float64's end: a span of them overflows
        if r == 2:
            return math.nan if tick % 3 else -math.inf
        return value

    folder = write_run_folder(tmp_path / "runs", 4, 4, 1, 40, value=loss)
    panel = open_folder(qtbot, window, folder)  # (pytest-qt fails the test on an exception in a Qt call)
    plot = panel.loss
    for p in panel.plots.values():
        (x0, x1), (y0, y1) = p.item.getViewBox().viewRange()
        assert all(math.isfinite(v) for v in (x0, x1, y0, y1)), f"{p.spec.key}: {(x0, x1, y0, y1)}"
    # the lines are drawn where their values are finite; the legend says what is not drawn
    assert "3× +inf" in plot.labels["replica/0/loss"] and "not drawn" in plot.labels["replica/0/loss"]
    # (the store keeps values beyond float32 as +-inf, and a NaN sample as none: see docs/architecture.md)
    assert "+inf" in plot.labels["replica/1/loss"] and "−inf" in plot.labels["replica/1/loss"]
    assert "−inf" in plot.labels["replica/2/loss"]
    assert "⚠" not in plot.labels["replica/3/loss"]
    x, y = plot.curves["replica/0/loss"].getData()
    assert np.isfinite(y[(x < 9) | (x > 13)]).all() and np.isfinite(y).sum() >= 30, "drawn before and after"
    # hovering the gap reads the value it stands for
    plot.curves["replica/1/loss"].setVisible(False)
    plot.curves["replica/2/loss"].setVisible(False)
    vb = plot.item.getViewBox()
    x_in_gap = 11.0
    y_near = float(np.interp(x_in_gap, x[np.isfinite(y)], y[np.isfinite(y)]))
    scene = vb.mapViewToScene(QPointF(x_in_gap, y_near))
    plot.hover.moved(scene)
    plot.hover.gaps(scene)
    assert "step 11 · replica 0 · worker:0: +inf (not drawn)" in plot.hover.text, plot.hover.text

    # the same values live, through the session's fold (as an attached run's raw rows come back from the
    # store: values beyond float32 as +-inf; the wire's decoder would have dropped them): nothing raises
    from gui_scale import _ReplayRun

    run = _ReplayRun()
    session = window.controller.session
    session.watch(run, window.controller.config, state="running")
    for tick in range(40):
        run.deliver(list({"v": 1, "kind": "step", "task": "worker:0", "t": T0 + tick, "replica": r, "step": tick,
                    "loss": loss(r, tick, 1.0 / (1 + tick)), "examples_per_sec": math.inf if r == 3 else 600.0,
                    "step_time": 0.04} for r in range(4)))
        session._drain()
        panel.redraw_if_needed()
    for p in panel.plots.values():
        ranges = p.item.getViewBox().viewRange()
        assert all(math.isfinite(v) for r in ranges for v in r)
    assert "+inf" in panel.plots["throughput"].labels["replica/3/examples_per_sec"]
    live = panel.loss.labels["replica/2/loss"]
    assert "NaN" in live and "−inf" in live, live
    run.done = True
    session._drain()


def test_a_large_folder_keeps_the_window_answering(qtbot: Any, window: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What a turn of the event loop does for the plots, the task table and the canvas is bounded, whatever
    the number of replicas: the curves drawn are as many at 2,000 replicas as at 100, a crowd folds at most
    its budget of owners and points per frame, the table reads only the rows in sight."""
    monkeypatch.setattr(series_model, "CROWD_OWNERS", 300)  # small budgets: the folding spans frames
    monkeypatch.setattr(series_model, "CROWD_BUDGET", 2_000)
    folded: list[int] = []
    feed = series_model.Crowd.feed

    def counted(self: Any, *args: Any, **kwargs: Any) -> int:
        got = feed(self, *args, **kwargs)
        folded.append(got)
        return got

    monkeypatch.setattr(series_model.Crowd, "feed", counted)
    curves = {}
    for replicas in (100, 2_000):
        folder = write_run_folder(tmp_path / f"runs{replicas}", replicas, 64, 4, 10)
        panel = open_folder(qtbot, window, folder)
        assert all(n <= 2_000 for n in folded), "a frame folds at most the budget's points"
        curves[replicas] = {key: len(p.curves) for key, p in panel.plots.items()}
        assert panel.loss.crowded and replicas > CROWD_ABOVE
        crowd = panel.crowds["loss"].crowds[("", "loss", False, "")]
        assert crowd.folded == replicas * 10, "every point folded in the end, over several frames"
        folded.clear()
    assert curves[100] == curves[2_000], f"the curves drawn do not grow with replicas: {curves}"

    # the table compares only the rows in sight at a fold; the canvas draws no chip whose state did not change
    table = window.task_table
    model = table.model
    read: list[str] = []
    row_texts = model._row_texts
    monkeypatch.setattr(model, "_row_texts", lambda task: (read.append(task.name), row_texts(task))[1])
    session = window.controller.session
    session.runUpdated.emit()
    first, last = table._visible_rows()
    assert 0 < len(read) <= last - first + 1 < 100, f"{len(read)} rows read for {len(model.rows)} tasks"
    updates: list[object] = []
    for host in window.canvas.hosts:
        for chip in host.chips:
            monkeypatch.setattr(chip, "update_tooltip", lambda: updates.append(1))
    window.canvas.refresh_states()
    assert not updates, "no chip changed"
    state = session.state.tasks["worker:5"]
    state.state = "failed"
    window.canvas.refresh_states()
    assert len(updates) == 1
