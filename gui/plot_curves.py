"""The curves of one plot, by key: each one's line or band (a :class:`~gui.curves.Curve`), its name in
the legend (with a note of its points that are not finite, drawn as gaps) and the points behind it
(the plot's :class:`~gui.series_model.SeriesModel`; a band's two edges in a model of their own). Kept
apart from :class:`~gui.metric_plot.MetricPlot`, which draws the widgets around the curves: what a
curve is made of and how the plot around it looks change for different reasons."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from gui.curves import Curve, CurveSet
from gui.plot_legend import PlotLegend
from gui.series_model import COMPARE_PREFIX, Grown, Points, SeriesModel, View

#: Above this many curves a plot draws 1-pixel lines: Qt strokes wider ones many times slower,
#: and with that many curves wide lines only hide one another.
THIN_ABOVE = 8
#: How opaque a band (the min–max of many replicas) is drawn over the plot's background.
BAND_ALPHA = 60


def non_finite_note(bad: tuple[int, int, int]) -> str:
    """What a legend entry adds for a curve with points that are not finite (drawn as gaps):
    ``⚠ 3× +inf, 1× NaN not drawn``; '' for none."""
    parts = [f"{n}× {name}" for n, name in zip(bad, ("NaN", "+inf", "−inf"), strict=True) if n]
    return f" ⚠ {', '.join(parts)} not drawn" if parts else ""


class PlotCurves:
    """The curves of a plot whose points ``model`` keeps, drawn as ``lines`` and named in ``legends``;
    ``view`` says what the plot shows now (the range and width curves are cut for), ``changed`` is
    called when a curve was added or removed (a plot without curves shows no axes)."""

    def __init__(self, model: SeriesModel, lines: CurveSet, legends: PlotLegend, view: Callable[[], View],
                 changed: Callable[[], None]) -> None:
        self.model, self.lines, self.legends = model, lines, legends
        self._view, self._changed = view, changed
        self.curves: dict[str, Curve] = lines.curves
        self.labels: dict[str, str] = legends.labels  # curve -> its name as the legend shows it
        self.given: dict[str, str] = {}  # curve -> its label as given (before a non-finite note)
        self.bad: dict[str, tuple[int, int, int]] = {}  # curve -> its points that are NaN, +inf, -inf
        self.band_model = SeriesModel(model.spec)  # bands' edges (kept apart: no line, no robust range of their own)
        # a plot of many replicas or tasks draws its mean, band and a few lines: never many, its mean stays bold
        self.crowded = False

    def clear(self) -> None:
        """No curves: their lines, legend entries, names and points go."""
        self.lines.clear()
        self.legends.clear()
        self._changed()
        self.model.clear()
        self.band_model.clear()
        self.labels.clear()
        self.given.clear()
        self.bad.clear()

    def log_changed(self) -> None:
        """Log x or y was switched: every curve's points are given again in the new coordinates, at
        once (pyqtgraph fits the range to the curves' bounds right after)."""
        for key, bounds in self.model.set_log(self.lines.log).items():
            curve = self.curves.get(key)
            if curve is not None:
                curve.set_source(functools.partial(self._display, key), bounds)
        self.band_model.set_log(self.lines.log)
        for key in {k.rsplit("#", 1)[0] for k in self.band_model.sources}:
            curve = self.curves.get(key)
            if curve is not None:
                curve.set_source(functools.partial(self._band_outline, key), self._band_bounds(key))

    def relabel(self, key: str, label: str) -> None:
        """Curve ``key`` is named ``label`` (and its legend entry, with a note of its points that are not finite)."""
        self.given[key] = label
        shown = label + non_finite_note(self.bad.get(key, (0, 0, 0)))
        if self.labels.get(key) == shown:
            return
        curve = self.curves.get(key)
        if curve is None:
            return
        self.labels[key] = shown
        curve.opts["name"] = shown
        self.legends.relabel(curve, shown)

    def _curve(self, key: str, label: str, color: str, style: Qt.PenStyle = Qt.PenStyle.SolidLine,
               width: float = 1.6, rank: tuple[object, ...] = ()) -> Curve:
        curve = self.curves.get(key)
        if curve is None:
            thin = len(self.curves) >= THIN_ABOVE and not self.crowded
            on_top = key.startswith(COMPARE_PREFIX)  # an overlaid run is drawn over the shown one's lines
            curve = self.lines.add(key, pg.mkPen(color, width=1.0 if thin else width, style=style), label,
                                   on_top=on_top)
            rank = (on_top, *rank) if rank else (on_top, len(self.labels))
            self.labels[key] = label
            self.legends.added(curve, label, rank)
            self._changed()
            if len(self.curves) == THIN_ABOVE + 1 and not self.crowded:
                for other in self.curves.values():
                    pen = pg.mkPen(other.pen())
                    pen.setWidthF(1.0)
                    other.setPen(pen)
        return curve

    def forget_runs(self, prefix: str) -> None:
        """Remove the curves whose key starts with ``prefix`` (an overlaid run's) and what was
        kept of those runs for drawing (their owners, their totals)."""
        for key in [k for k in self.curves if k.startswith(prefix)]:
            self.remove_curve(key)
        self.model.forget_runs(prefix)

    def remove_curve(self, key: str) -> None:
        curve = self.lines.remove(key)
        self.labels.pop(key, None)
        self.given.pop(key, None)
        self.bad.pop(key, None)
        self.band_model.remove(key + "#lo")
        self.band_model.remove(key + "#hi")
        self.legends.removed(key, curve)
        if curve is not None:
            self._changed()
        self.model.remove(key)

    def set_curve(self, key: str, label: str, color: str, x: np.ndarray, y: np.ndarray, smoothing: float,
                  style: Qt.PenStyle = Qt.PenStyle.SolidLine, width: float = 1.6, *, x_offset: float = 0.0,
                  stable: int | None = None, rank: tuple[object, ...] = (), revision: int = 0,
                  envelope: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Show ``(x - x_offset, y * scale)``: ~2 points per horizontal pixel of the view (each block's
        min and max), or every point in view when fewer (see :meth:`SeriesModel.put`).

        ``stable``: how many leading points are unchanged since the last call (default: all that were
        there; the history only grows); ``revision``: moves when earlier points changed; ``envelope``:
        per point the min and max of what it summarises (a run's tiers). Points that are not finite
        are gaps, and the legend entry says how many."""
        curve = self._curve(key, label, color, style, width, rank)
        change = self.model.put(key, x, y, smoothing, self._view(), x_offset=x_offset, stable=stable,
                                revision=revision, envelope=envelope)
        if change is None:
            if self.given.get(key, label) != label:
                self.relabel(key, label)
            return
        if isinstance(change, Grown):
            curve.append(change.x, change.y)
        else:
            curve.set_source(functools.partial(self._display, key), change.bounds)
        bad = self.model.non_finite(key)
        if bad != self.bad.get(key, (0, 0, 0)) or self.given.get(key, label) != label:
            self.bad[key] = bad
            self.relabel(key, label)

    def set_band(self, key: str, label: str, color: str, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, *,
                 x_offset: float = 0.0, stable: int | None = None, revision: int = 0,
                 rank: tuple[object, ...] = ()) -> None:
        """A filled band from ``lo`` to ``hi`` at ``x`` (the min and max of many curves), under every line,
        downsampled as lines are (each block's lowest ``lo`` and highest ``hi``)."""
        fill = QColor(color)
        fill.setAlpha(BAND_ALPHA)
        curve = self._curve(key, label, color, width=1.0, rank=rank)  # (the pen: its legend sample and name)
        if curve.brush is None:
            curve.set_brush(pg.mkBrush(fill))
        view = self._view()
        kw = {"x_offset": x_offset, "stable": stable, "revision": revision}
        low = self.band_model.put(key + "#lo", x, lo, 0.0, view, **kw)  # type: ignore[arg-type]
        high = self.band_model.put(key + "#hi", x, hi, 0.0, view, **kw)  # type: ignore[arg-type]
        if self.given.get(key, label) != label:
            self.relabel(key, label)
        if low is None and high is None:
            return
        if isinstance(low, Grown) and isinstance(high, Grown) and np.array_equal(low.x, high.x):
            curve.append(np.concatenate([high.x, low.x[::-1]]), np.concatenate([high.y, low.y[::-1]]))
        else:
            curve.set_source(functools.partial(self._band_outline, key), self._band_bounds(key))

    def _band_outline(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """A band's outline for the current view: its upper edge forward, its lower edge back."""
        view = self._view()
        xl, yl = self.band_model.display(key + "#lo", view)
        xh, yh = self.band_model.display(key + "#hi", view)
        return np.concatenate([xh, xl[::-1]]), np.concatenate([yh, yl[::-1]])

    def _band_bounds(self, key: str) -> list[float]:
        b = [math.inf, -math.inf, math.inf, -math.inf]
        for edge in ("#lo", "#hi"):
            src = self.band_model.sources.get(key + edge)
            if src is not None:
                e = self.band_model.bounds(src)
                b = [min(b[0], e[0]), max(b[1], e[1]), min(b[2], e[2]), max(b[3], e[3])]
        return b

    def _display(self, key: str) -> Points:
        """What the curve draws for the current view (the curve asks when it draws every point)."""
        return self.model.display(key, self._view())
