"""The view of one plot: the x range and width its curves are cut for, and the view following the
data in coarse steps (pyqtgraph's auto-range moves the view every frame, and a moved view makes every
curve and axis redo their geometry). The rules of when and where to move are
:func:`gui.series_model.follow_x`, :func:`~gui.series_model.follow_y` and
:func:`~gui.series_model.robust_top`."""

from __future__ import annotations

import math
from collections.abc import Callable

import pyqtgraph as pg

from gui.curves import CurveSet
from gui.series_model import SeriesModel, View, follow_x, follow_y


class PlotView:
    """The view of a plot item whose lines are ``lines`` and series ``model``; ``moved`` is called when
    the x range or the width changed (and when the view follows the data again: the "A" button)."""

    def __init__(self, item: pg.PlotItem, lines: CurveSet, model: SeriesModel, moved: Callable[[], None]) -> None:
        self.item, self.lines, self.model, self._moved = item, lines, model, moved
        self.vb = item.getViewBox()
        self.robust = model.spec.robust_y
        # the plot follows its data itself (see follow_data)
        self.following = True
        self.vb.disableAutoRange()
        self.vb.sigRangeChangedManually.connect(self.user_range)
        self.vb.sigXRangeChanged.connect(moved)
        self.vb.sigResized.connect(moved)
        self._cache: View | None = None

    def current(self) -> View:
        """The shown x range (None while x follows the data) and the plot's width in pixels (asked of
        the view once, then again after it moved, was resized or given to the user)."""
        if self._cache is None:
            self._cache = self._ask()
        return self._cache

    def forget(self) -> None:
        """The view moved or was resized: asked again at the next :meth:`current`."""
        self._cache = None

    def _ask(self) -> View:
        vb = self.vb
        pixels = int(vb.width()) or 800
        if self.following or vb.autoRangeEnabled()[0]:
            return None, pixels
        lo, hi = vb.viewRange()[0]
        if self.lines.log[0]:  # the view is in log10 of x
            lo, hi = 10.0 ** min(lo, 300.0), 10.0 ** min(hi, 300.0)
        return (float(lo), float(hi)), pixels

    def user_range(self, *_args: object) -> None:
        self.robust = False  # the user zoomed: leave the range alone
        self.following = False
        self._cache = None

    def log_changed(self) -> None:
        self.robust = self.model.spec.robust_y and not self.lines.log[1]

    def follow_data(self) -> None:
        """Keep every point in view, moving the view only when the data leaves it or fills
        less than half of it (x grows by a quarter ahead): most frames leave it alone."""
        vb = self.vb
        if vb.autoRangeEnabled()[0] or vb.autoRangeEnabled()[1]:
            # the user asked for auto-range (the plot's "A" button): follow the data again
            vb.disableAutoRange()
            self.following = True
            self.log_changed()
            self._cache = None
            self._moved()
        if not self.following:
            return
        bounds = [c.bounds for c in self.lines.curves.values() if c.isVisible() and c.source is not None]
        lo = min((b[0] for b in bounds), default=math.inf)
        hi = max((b[1] for b in bounds), default=-math.inf)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return
        x_view, y_view = vb.viewRange()
        x_range = follow_x(lo, hi, x_view)
        if x_range is not None:
            vb.setXRange(*x_range, padding=0)
        if self.robust:
            return  # fit_robust_y keeps y
        ylo = min(b[2] for b in bounds)
        yhi = max(b[3] for b in bounds)
        if not (math.isfinite(ylo) and math.isfinite(yhi)):
            return
        y_range = follow_y(ylo, yhi, y_view)
        if y_range is not None:
            vb.setYRange(*y_range, padding=0)

    def fit_robust_y(self) -> None:
        """Y from 0 to a little above the 99th percentile of the shown points."""
        if not self.robust or self.lines.log[1]:
            return
        curves = self.lines.curves
        top = self.model.robust_top(lambda key: curves[key].isVisible(), self.vb.viewRange()[1][1])
        if top is not None:
            self.item.setYRange(0.0, top, padding=0)
