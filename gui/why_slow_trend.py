"""The step breakdown over time: the parts of a replica's step (or the replicas' mean) stacked, in ms per
step against seconds of the run, with the values under the mouse in a line below."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.observe.telemetry import BREAKDOWN_PARTS
from gui.why_slow_model import PART_COLORS, Stack, stack_point_text


class BreakdownTrend(QWidget):
    """Stacked areas of a :class:`~gui.why_slow_model.Stack`; :meth:`set_stack` redraws (items made once)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("whySlowTrend")
        self.plot = pg.PlotWidget()
        self.plot.setToolTip("Where the step goes over time: each part stacked, in milliseconds per step "
                             "(hover for the values)")
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setLabel("left", "ms per step")
        item.setLabel("bottom", "seconds")
        item.getViewBox().setMouseEnabled(x=False, y=False)
        self.plot.setMinimumHeight(120)
        self.base = item.plot([], [], pen=pg.mkPen(0, 0, 0, 0))  # a path to fill from (pen None draws no path)
        self.tops: dict[str, Any] = {}
        self.fills: dict[str, Any] = {}
        below = self.base
        for part in BREAKDOWN_PARTS:
            color = QColor(PART_COLORS[part])
            top = item.plot([], [], pen=pg.mkPen(color, width=1.2))
            fill_color = QColor(color)
            fill_color.setAlpha(150)
            fill = pg.FillBetweenItem(below, top, brush=pg.mkBrush(fill_color))
            item.addItem(fill)
            self.tops[part], self.fills[part] = top, fill
            below = top
        self.readout = QLabel("")
        self.readout.setObjectName("whySlowTrendReadout")
        self.readout.setToolTip("The values at the mouse's place on the plot")
        self.stack: Stack | None = None
        self.mode = ""
        self._proxy = pg.SignalProxy(self.plot.scene().sigMouseMoved, rateLimit=30, slot=self._moved)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.readout)
        self._apply_palette()

    def set_stack(self, stack: Stack, mode: str = "") -> None:
        """Draw ``stack`` (seconds per step, shown in ms); a part it lacks is drawn flat and its line hidden."""
        self.stack, self.mode = stack, mode
        x = stack.x
        below = np.zeros(len(x))
        self.base.setData(x, below)
        for part in BREAKDOWN_PARTS:
            top = stack.tops.get(part)
            top_ms = top * 1000.0 if top is not None else below
            self.tops[part].setData(x, top_ms)
            self.tops[part].setVisible(top is not None)
            below = top_ms
        if len(x):
            # the first steps (tracing, warm-up) take many times longer: the range follows the usual steps
            usual = float(np.percentile(below, 95)) * 1.25
            self.plot.getPlotItem().setYRange(0.0, max(usual, 1e-3), padding=0)
        last = stack.at(float(x[-1])) if len(x) else None
        self.readout.setText(stack_point_text(*last, mode=mode) if last else "")

    def _moved(self, args: Any) -> None:
        if self.stack is None or not len(self.stack):
            return
        pos: QPointF = args[0]
        if not self.plot.sceneBoundingRect().contains(pos):
            return
        x = self.plot.getPlotItem().getViewBox().mapSceneToView(pos).x()
        got = self.stack.at(x)
        if got is not None:
            self.readout.setText(stack_point_text(*got, mode=self.mode))

    def _apply_palette(self) -> None:
        palette = self.palette()
        self.plot.setBackground(palette.color(QPalette.ColorRole.Base))
        text = palette.color(QPalette.ColorRole.Text)
        for name in ("left", "bottom"):
            axis = self.plot.getPlotItem().getAxis(name)
            axis.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Mid)))
            axis.setTextPen(pg.mkPen(text))
            axis.setLabel(axis.labelText, color=text.name())

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._apply_palette()
        super().changeEvent(event)
