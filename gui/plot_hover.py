"""The hover readout of a plot: a vertical crosshair at the pointer, a dot on the nearest point of
the visible curves and a label naming its step (or time), value and replica or task, and what the
gaps near the pointer stand for (points that are not finite are not drawn: only the readout can say)."""

from __future__ import annotations

from typing import Any, Protocol

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QPointF, Qt
from PySide6.QtGui import QColor, QPalette

from gui.plot_curves import non_finite_note
from gui.readout import Reading, describe, gap_notes, nearest


class MetricPlot(Protocol):
    """What the readout reads of a :class:`gui.metric_plot.MetricPlot` (no import of it: no cycle)."""

    item: Any
    widget: Any
    lines: Any
    curves: dict[str, Any]
    raw: Any
    labels: dict[str, str]
    spec: Any
    registry: Any  # (a gui.plot_curves.PlotCurves: the curves' given names, their points not finite)

    @property
    def x_label(self) -> str | None: ...

    def screen_points(self, x: Any, y: Any) -> tuple[Any, Any]: ...

    def palette(self) -> Any: ...


class PlotHover(QObject):
    """Follows the pointer over ``plot``'s view; hidden when it leaves."""

    def __init__(self, plot: MetricPlot) -> None:
        super().__init__(plot)  # type: ignore[arg-type]  # (a QWidget)
        self.plot = plot
        item = plot.item
        self.line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888888", style=Qt.PenStyle.DashLine))
        self.dot = pg.ScatterPlotItem(size=8, pen=pg.mkPen("#ffffff"), brush=pg.mkBrush("#888888"))
        self.label = pg.TextItem(anchor=(0, 1))
        for part in (self.line, self.dot, self.label):
            part.setZValue(1000)
            item.addItem(part, ignoreBounds=True)
        self.reading: Reading | None = None
        self.text = ""
        self.hide()
        item.scene().sigMouseMoved.connect(self.moved)
        item.scene().sigMouseMoved.connect(self.gaps)  # (after the reading)
        plot.widget.viewport().installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.Leave:
            self.hide()
        return False

    def hide(self) -> None:
        for part in (self.line, self.dot, self.label):
            part.hide()
        self.reading = None
        self.text = ""

    def moved(self, scene_pos: QPointF) -> None:
        """The pointer is at ``scene_pos``: show the nearest point of a visible curve."""
        plot = self.plot
        vb = plot.item.getViewBox()
        if not vb.sceneBoundingRect().contains(scene_pos):
            self.hide()
            return
        at = vb.mapSceneToView(scene_pos)
        log_x, log_y = plot.lines.log
        series = {}
        for key, curve in plot.curves.items():
            if curve.isVisible() and key in plot.raw:
                x, y = plot.raw[key]
                series[key] = plot.screen_points(x, y)
        (x0, x1), (y0, y1) = vb.viewRange()
        width, height = max(1.0, vb.width()), max(1.0, vb.height())
        reading = nearest(series, at.x(), at.y(), (y1 - y0) / height, (x1 - x0) / width)
        if reading is None:
            self.hide()
            return
        shown = Reading(reading.key, 10 ** reading.x if log_x else reading.x,
                        10 ** reading.y if log_y else reading.y)
        self.reading = shown
        self.text = describe(shown, plot.labels.get(reading.key, reading.key), plot.x_label or "step",
                             plot.spec.unit if plot.spec.unit not in ("", "%") else "")
        color = plot.curves[reading.key].pen().color()
        self.line.setPos(reading.x)
        self.dot.setData([reading.x], [reading.y], brush=pg.mkBrush(color))
        text = plot.palette().color(QPalette.ColorRole.ToolTipText)
        fill = QColor(plot.palette().color(QPalette.ColorRole.ToolTipBase))
        fill.setAlpha(225)
        self.label.setText(self.text, color=text)
        self.label.fill = pg.mkBrush(fill)
        # the label stays inside the view: left of the point past the middle, below it near the top
        right = reading.x > (x0 + x1) / 2
        above = reading.y < (y0 + y1) / 2  # a low point: its label above it, a high one below
        self.label.setAnchor((1 if right else 0, 1 if above else 0))
        self.label.setPos(reading.x, reading.y)
        for part in (self.line, self.dot, self.label):
            part.show()

    def gaps(self, scene_pos: QPointF) -> None:
        """The readout also says what the gaps under the pointer stand for (a visible curve's point that is
        not finite, within a few pixels of the pointer's x), and how many such points the curve it reads has."""
        plot = self.plot
        vb = plot.item.getViewBox()
        if not vb.sceneBoundingRect().contains(scene_pos):
            return
        bad, given = plot.registry.bad, plot.registry.given
        series = [(given.get(key, key), *plot.raw.stored(key)[:3]) for key, curve in plot.curves.items()
                  if curve.isVisible() and key in plot.raw and any(bad.get(key, (0, 0, 0)))]
        notes = gap_notes(series, vb.mapSceneToView(scene_pos).x(), abs(vb.viewPixelSize()[0]) * 4,  # (4 pixels)
                          plot.lines.log[0], plot.x_label or "step")
        reading = self.reading
        if reading is not None and any(bad.get(reading.key, (0, 0, 0))):
            notes.append(non_finite_note(bad[reading.key]).strip())
        if notes:
            self.text = "\n".join([self.text, *notes]) if self.text else "\n".join(notes)
            self.label.setText(self.text, color=plot.palette().color(QPalette.ColorRole.ToolTipText))
            if reading is None:  # only gaps here: the label at the pointer
                self.label.setPos(vb.mapSceneToView(scene_pos))
                self.label.show()
