"""Many lines of one plot drawn as one item, incrementally.

A pyqtgraph ``PlotDataItem`` per line costs a few hundred microseconds of Python per
``setData`` (bounds, signals, geometry) and its own path and paint at every frame: with
32 replicas on four plots that alone was most of a frame. A :class:`CurveSet` is one
graphics item for every line of a plot. It keeps what it drew in an image the size of the
view; while the view stays put (the plots move it in coarse steps, see
``MetricPlot.follow_data``), a frame only draws each line's new segments onto that image
and puts the image on screen, so the cost of a frame no longer grows with the hours of
points behind it. Anything else (another range, a resize, a hidden line, new pens, a line
whose old points changed) draws every visible line again from its points for the view.

A :class:`Curve` is one line: its pen and visibility, what a pyqtgraph legend entry asks of
an item (``opts['pen']``, ``isVisible``/``setVisible``), and where its points come from: a
*source* callable that returns the line's points for the current view (already cut and
downsampled for the screen), asked only when everything is drawn again. A curve with a
``brush`` is a band: its points are a closed outline (the upper edge forward, the lower edge
back), filled; appended stretches are outlines of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QLineF, QRectF, Qt
from PySide6.QtGui import QBrush, QImage, QPainter, QPen, QTransform

from gui.series_model import Points, finite_range

#: Appends a line keeps for the next paint; past this the next paint draws every line in full.
MAX_PENDING = 64


class Curve:
    """One line of a :class:`CurveSet`; also the item behind its legend entry."""

    def __init__(self, owner: CurveSet, key: str, pen: QPen, name: str = "") -> None:
        self.owner = owner
        self.key = key
        self.opts: dict[str, object] = {"pen": pen, "name": name, "antialias": False}
        self._visible = True
        self.on_top = False  # drawn after the lines that are not (see CurveSet.add)
        self.brush: QBrush | None = None  # a band: its points are an outline, filled (drawn first)
        self.source: Callable[[], Points] | None = None
        self._pending: list[Points] = []  # segments appended since the image was drawn
        self.bounds = [math.inf, -math.inf, math.inf, -math.inf]  # x lo, x hi, y lo, y hi (finite points)

    # -- what a legend entry uses
    def name(self) -> str:
        return str(self.opts["name"])

    def isVisible(self) -> bool:  # noqa: N802 - Qt naming, as pyqtgraph's legend calls it
        return self._visible

    def setVisible(self, visible: bool) -> None:  # noqa: N802
        if bool(visible) != self._visible:
            self._visible = bool(visible)
            self.owner.invalidate()

    def pen(self) -> QPen:
        return self.opts["pen"]  # type: ignore[return-value]

    def setPen(self, pen: QPen) -> None:  # noqa: N802
        self.opts["pen"] = pen
        self.owner.invalidate()

    # -- points
    def set_source(self, source: Callable[[], Points], bounds: list[float]) -> None:
        """Every point of the line may have changed: ``source()`` gives them for the view when
        drawn; ``bounds``: x lo, x hi, y lo, y hi of all of them."""
        self.source = source
        self._pending.clear()
        self.bounds = list(bounds)
        self.owner.invalidate()

    def set_brush(self, brush: QBrush) -> None:
        """Make this curve a band filled with ``brush`` (its legend sample shows the fill)."""
        self.brush = brush
        self.opts["fillLevel"] = 0.0
        self.opts["fillBrush"] = brush
        self.owner.invalidate()

    def append(self, x: np.ndarray, y: np.ndarray) -> None:
        """New points at the end of the line; ``x[0], y[0]`` is the last point it had (the joint). A
        band's: the outline of its new stretch."""
        if len(x) < 2:
            return
        if len(self._pending) >= MAX_PENDING:
            # not painted for a while (a hidden or minimised window): draw everything at the next
            # paint instead of keeping every frame's segments
            self._pending.clear()
            self.owner.invalidate()
        else:
            self._pending.append((x, y))
        new = [*finite_range(x), *finite_range(y)]
        self.bounds = _union(self.bounds, new)
        self.owner.changed(new)

    @property
    def has_pending(self) -> bool:
        """Segments were appended since the line was last drawn."""
        return bool(self._pending)

    def take_pending(self) -> list[Points]:
        """The segments appended since the line was last drawn, handed over once (then none are kept)."""
        pending, self._pending = self._pending, []
        return pending

    def getData(self) -> Points:  # noqa: N802 - as PlotDataItem's
        """The points the line draws for the current view."""
        if self.source is None:
            return np.empty(0), np.empty(0)
        return self.source()

    @property
    def xData(self) -> np.ndarray:  # noqa: N802
        return self.getData()[0]

    @property
    def yData(self) -> np.ndarray:  # noqa: N802
        return self.getData()[1]


def _union(a: list[float], b: list[float]) -> list[float]:
    """Bounds (x lo, x hi, y lo, y hi) holding both."""
    return [min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3])]


class CurveSet(pg.GraphicsObject):
    """Every line of one plot, as one item of its ViewBox (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.curves: dict[str, Curve] = {}
        self._image: QImage | None = None
        self._image_key: tuple[float, ...] = ()
        self._stale = True  # the image must be drawn again from every line's points
        self._dirty: list[float] | None = None  # bounds of the segments appended since the last flush
        self.full_draws = 0  # how many times every line was drawn again (tests and benchmarks read it)
        self.log = (False, False)  # the plot's log x / log y (its context menu sets them)
        self.on_log_mode: Callable[[], None] | None = None

    # -- lines
    def add(self, key: str, pen: QPen, name: str = "", on_top: bool = False) -> Curve:
        """A line; ``on_top`` lines are drawn after the others (an overlaid run's, over the shown one's)."""
        curve = self.curves[key] = Curve(self, key, pen, name)
        curve.on_top = on_top
        self.invalidate()
        return curve

    def remove(self, key: str) -> Curve | None:
        curve = self.curves.pop(key, None)
        if curve is not None:
            self.invalidate()
        return curve

    def clear(self) -> None:
        self.curves.clear()
        self.invalidate()

    def invalidate(self) -> None:
        """Draw every line again at the next paint."""
        self._stale = True
        self.update()

    def changed(self, bounds: list[float]) -> None:
        """A line has new segments within ``bounds`` (x lo, x hi, y lo, y hi): repainted at :meth:`flush`."""
        self._dirty = bounds if self._dirty is None else _union(self._dirty, bounds)

    def flush(self) -> None:
        """Ask for the paint of what changed since the last flush: only the band the new segments
        cover (a few pixels at the lines' ends), so the axes, grid and legend elsewhere stay as they are."""
        d, self._dirty = self._dirty, None
        if d is None or self._stale:
            return  # nothing new, or invalidate() asked for the whole item already
        vx, vy = self.pixelVectors()  # one pixel along x and y, in data units
        px = py = math.nan
        if vx is not None and vy is not None:
            px, py = abs(vx.x()) + abs(vy.x()), abs(vx.y()) + abs(vy.y())
        if not all(math.isfinite(v) for v in (*d, px, py)) or px <= 0 or py <= 0:
            self.update()  # no band to tell: the whole item
            return
        pad = 4.0  # pixels: the widest pen and its joins
        self.update(QRectF(d[0] - pad * px, d[2] - pad * py, d[1] - d[0] + 2 * pad * px, d[3] - d[2] + 2 * pad * py))

    def setLogMode(self, x: bool, y: bool) -> None:  # noqa: N802 - what PlotItem calls on its items
        """The lines' points are given in log10 where the axis is logarithmic: the owner makes them again."""
        if (bool(x), bool(y)) != self.log:
            self.log = (bool(x), bool(y))
            if self.on_log_mode is not None:
                self.on_log_mode()
            self.invalidate()

    # -- geometry: the item covers the view, wherever the points are
    def boundingRect(self) -> QRectF:  # noqa: N802
        rect = self.viewRect()  # kept by pyqtgraph until the view's transform changes
        return QRectF() if rect is None else rect

    def viewTransformChanged(self) -> None:  # noqa: N802 - pyqtgraph hook
        self.prepareGeometryChange()
        super().viewTransformChanged()

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange: object = None) -> tuple[float, float] | None:  # noqa: N802,N803
        """Range of the visible lines' points along ``ax`` (the ViewBox's auto-range asks)."""
        lo = min((c.bounds[2 * ax] for c in self.curves.values() if c.isVisible()), default=math.inf)
        hi = max((c.bounds[2 * ax + 1] for c in self.curves.values() if c.isVisible()), default=-math.inf)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        return lo, hi

    # -- drawing
    def paint(self, p: QPainter, option: object, widget: object = None) -> None:
        if widget is None:
            # an export (PNG, SVG) or another painter: draw every line straight onto it
            self._draw_all(p, keep_pending=True)  # the screen's image still needs them
            return
        transform = p.transform()
        rect = transform.mapRect(self.boundingRect()).toAlignedRect()
        if rect.isEmpty():
            return
        dpr = float(widget.devicePixelRatioF())  # type: ignore[attr-defined]
        key = (transform.m11(), transform.m12(), transform.m21(), transform.m22(), transform.dx(),
               transform.dy(), float(rect.x()), float(rect.y()), float(rect.width()), float(rect.height()), dpr)
        image = self._image
        full = self._stale or image is None or key != self._image_key
        if full or image is None:
            image = QImage(int(rect.width() * dpr), int(rect.height() * dpr), QImage.Format.Format_ARGB32_Premultiplied)
            image.setDevicePixelRatio(dpr)
            image.fill(Qt.GlobalColor.transparent)
            self._image, self._image_key, self._stale = image, key, False
            self.full_draws += 1
        if full or any(c.has_pending for c in self.curves.values()):
            painter = QPainter(image)
            painter.setRenderHints(p.renderHints())
            painter.setTransform(transform * QTransform.fromTranslate(-rect.x(), -rect.y()))
            if full:
                self._draw_all(painter)
            else:
                for curve in self._order():
                    segments = curve.take_pending()
                    if segments and curve.isVisible():
                        painter.setPen(curve.pen())
                        for x, y in segments:
                            _draw(painter, curve, x, y)
            painter.end()
        p.save()
        p.resetTransform()
        p.drawImage(rect.topLeft(), image)
        p.restore()

    def _order(self) -> list[Curve]:
        """Bands first (under every line), then the lines, those ``on_top`` last."""
        return sorted(self.curves.values(), key=lambda c: (c.brush is None, c.on_top))

    def _draw_all(self, painter: QPainter, keep_pending: bool = False) -> None:
        for curve in self._order():
            if not keep_pending:
                curve.take_pending()  # drawn in full below
            if not curve.isVisible() or curve.source is None:
                continue
            x, y = curve.source()
            if len(x) < 2:
                continue
            painter.setPen(curve.pen())
            _draw(painter, curve, x, y)


def _draw(painter: QPainter, curve: Curve, x: np.ndarray, y: np.ndarray) -> None:
    if curve.brush is None:
        _draw_line(painter, x, y)
        return
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.all():
        x, y = x[ok], y[ok]
    if len(x) < 3:
        return
    path = pg.arrayToQPath(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), connect="all")
    path.closeSubpath()
    painter.fillPath(path, curve.brush)


def _draw_line(painter: QPainter, x: np.ndarray, y: np.ndarray) -> None:
    if len(x) <= 8:  # the new segments of a frame: one line each, gaps (NaN) left out
        xs, ys = x.tolist(), y.tolist()
        for i in range(len(xs) - 1):
            x0, y0, x1, y1 = xs[i], ys[i], xs[i + 1], ys[i + 1]
            if math.isfinite(x0 + y0 + x1 + y1):
                painter.drawLine(QLineF(x0, y0, x1, y1))
        return
    painter.drawPath(pg.arrayToQPath(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64),
                                     connect="finite"))
