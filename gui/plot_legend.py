"""The legend beside one plot: pyqtgraph's (click an entry to hide its curve) while the curves' names
fit, a :class:`~gui.legend.CompactLegend` naming every line in one item past that; entries in the
run's one order, the legend sized to the room the plot leaves it."""

from __future__ import annotations

import math
import re

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF
from PySide6.QtWidgets import QGraphicsItem, QSizePolicy, QWidget

from gui.curves import Curve
from gui.legend import CompactLegend, ToggleLegend

#: Legend entries per column: more curves than this make more columns.
LEGEND_ROWS = 8
#: Height of one entry of pyqtgraph's legend (8 pt labels, -6 px spacing), in pixels.
LEGEND_ROW_HEIGHT = 17.0
#: Above this many curves a plot's legend is a :class:`~gui.legend.CompactLegend` (one item naming
#: every line) instead of pyqtgraph's, whose two widgets per entry cost ~55 KB each.
COMPACT_LEGEND_ABOVE = 32


def short_label(label: str) -> str:
    """A legend entry's short form: ``replica 3 · run`` -> ``r3 · run``."""
    return re.sub(r"^replica (\d+)", r"r\1", label)


class PlotLegend:
    """The legends of one plot (``host``: the plot's widget, ``widget`` and ``item``: its pyqtgraph
    widget and plot item); ``curves`` and ``labels`` are the plot's own (curve key -> line, name)."""

    def __init__(self, host: QWidget, widget: pg.PlotWidget, item: pg.PlotItem, curves: dict[str, Curve],
                 labels: dict[str, str]) -> None:
        self.host, self.widget, self.item = host, widget, item
        self.curves, self.labels = curves, labels
        # the legend sits beside the plot, never on its curves
        self.legend = ToggleLegend(labelTextSize="8pt", verSpacing=-6)
        self.legend.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        item.layout.addItem(self.legend, 2, 3)
        item.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignTop)
        # the legend and its entries are drawn from a cache: repainted only when they change, not at
        # every frame that draws the lines under them
        self.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        # many curves: one item names them all (in the legend's place while there are that many)
        self.compact_legend = CompactLegend()
        self.compact_legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.compact = False
        self._compact_fit: tuple[float, float] = (0.0, 0.0)
        self._font = QFont()
        self._font.setPointSizeF(8.0)
        self._size = (0, 0)
        self._keys: list[str] = []  # the legend's entries, in order
        self._ranks: dict[str, tuple[object, ...]] = {}  # curve -> its place in the legend
        self._short = False

    def set_text_color(self, text: QColor) -> None:
        self.legend.setLabelTextColor(text)
        self.compact_legend.set_text_color(text)
        for _sample, label in self.legend.items:  # entries drawn before the switch take the new colour
            label.setText(label.text, color=text)
            label.update()
        self.legend.update()

    def clear(self) -> None:
        self.legend.clear()
        self.compact_legend.clear()
        self._keys = []
        self._ranks.clear()
        self._choose()
        self._fit()

    def added(self, curve: Curve, label: str, rank: tuple[object, ...]) -> None:
        """A new curve (already in ``curves``, its name in ``labels``): its entry, at ``rank``."""
        self._ranks[curve.key] = rank
        if not self._choose():  # (a legend made again holds every curve already)
            self._add(curve, label)
        self._fit()

    def removed(self, key: str, curve: Curve | None) -> None:
        """A curve left the plot (``curve``: the line it was, None when there was none)."""
        self._ranks.pop(key, None)
        if key in self._keys:
            self._keys.remove(key)
        if curve is not None:
            if self.compact:
                self.compact_legend.remove(curve)
            else:
                self.legend.removeItem(curve)
            self._choose()
            self._fit()

    def relabel(self, curve: Curve, label: str) -> None:
        """A curve was renamed ``label`` (already in ``labels``): its entry says so."""
        if self.compact:
            self.compact_legend.relabel(curve, short_label(label), label)
        else:
            self.legend.relabel(curve, short_label(label) if self._short else label)
            self._fit()  # (the entry's new width)

    def resized(self) -> None:
        """The plot may have changed size: the legend fits the new room."""
        size = (self.host.width(), self.widget.height())
        if size != self._size:
            self._size = size
            self._choose()
            self._fit()

    def rank(self, key: str) -> tuple[object, ...]:
        return self._ranks.get(key, ())

    def _add(self, curve: Curve, label: str) -> None:
        """An entry for ``curve``: at its place in the run's one order (the shown run's entries
        first, each run's replicas or tasks in order, then its validation and total)."""
        rank = self._ranks.get(curve.key, ())
        if self._keys and rank < self._ranks.get(self._keys[-1], ()):
            self._rebuild()
            return
        self._keys.append(curve.key)
        if self.compact:
            self.compact_legend.add(curve, short_label(label), label)
            return
        self.legend.addItem(curve, short_label(label) if self._short else label)
        sample, text = self.legend.items[-1]
        for entry in (sample, text, text.item):  # drawn from a cache, as the legend itself
            entry.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

    def _rebuild(self) -> None:
        """Every entry again, in rank order."""
        (self.compact_legend if self.compact else self.legend).clear()
        self._keys = []
        for key in sorted(self.curves, key=lambda k: self._ranks.get(k, ())):
            self._add(self.curves[key], self.labels.get(key, key))

    def _choose(self) -> bool:
        """pyqtgraph's legend for up to :data:`COMPACT_LEGEND_ABOVE` curves, the compact one above; True
        when it switched (the legend shown was made again from every curve)."""
        compact = len(self.curves) > COMPACT_LEGEND_ABOVE or not self._fits()
        if compact == self.compact:
            return False
        self.compact = compact
        layout = self.item.layout
        old, new = (self.legend, self.compact_legend) if compact else (self.compact_legend, self.legend)
        old.clear()  # (pyqtgraph's: its entries' widgets go)
        layout.removeItem(old)
        old.hide()
        layout.addItem(new, 2, 3)
        layout.setAlignment(new, Qt.AlignmentFlag.AlignTop)
        new.show()
        self._rebuild()
        self._compact_fit = (0.0, 0.0)
        return True

    def _room(self) -> tuple[float, float]:
        """Width and height the legend may take beside the plot: half the width, and the height of
        the plot area above the x axis (never more: a taller legend pushes the axis out of sight)."""
        axis = self.item.getAxis("bottom")
        height = self.widget.height() - max(axis.height(), 36.0) - 22  # (the legend's own margins)
        return max(60.0, self.host.width() * 0.5), max(20.0, height)

    def _rows(self) -> int:
        """How many entries of pyqtgraph's legend fit one above the other."""
        return max(1, int(self._room()[1] // LEGEND_ROW_HEIGHT))

    def _fits(self) -> bool:
        """True when pyqtgraph's legend can show every entry in the room it has (in columns); else
        the compact legend, which scrolls, names them."""
        n = len(self.curves)
        if n <= 1 or not self.host.isVisible():
            return True
        labels = [self.labels.get(k, k) for k in self.curves]
        if n > LEGEND_ROWS:
            labels = [short_label(x) for x in labels]
        metrics = QFontMetricsF(self._font)
        entry = max(metrics.horizontalAdvance(x) for x in labels) + 30
        columns = math.ceil(n / self._rows())
        return columns * entry <= self._room()[0]

    def _fit(self) -> None:
        """Many curves make more columns (a compact block, not a column taller than the plot); the
        legend is sized to its entries (pyqtgraph sizes it from its entries' last geometry, which
        keeps it stretched once it was)."""
        if self.compact:  # the compact legend takes at most half of the plot's width and its height
            size = self._room()
            if size != self._compact_fit:
                self._compact_fit = size
                self.compact_legend.fit(*size)
            return
        short = len(self.curves) > LEGEND_ROWS
        if short != self._short:  # many entries: "r3" for "replica 3", so more columns fit
            self._short = short
            names = {id(curve): self.labels.get(key, "") for key, curve in self.curves.items()}
            for sample, label in self.legend.items:
                full = names.get(id(sample.item), label.text)
                label.setText(short_label(full) if short else full)
        columns = max(1, math.ceil(len(self.curves) / min(LEGEND_ROWS, self._rows())))
        if columns > 1:  # the legend takes at most about half of the plot's width
            entry = max(label.preferredWidth() for _, label in self.legend.items) + 26
            columns = max(1, min(columns, int(max(entry, self.host.width() * 0.5) // entry)))
        if columns != self.legend.columnCount:
            self.legend.setColumnCount(columns)
        layout = self.legend.layout
        layout.invalidate()
        layout.activate()
        hint = layout.effectiveSizeHint(Qt.SizeHint.PreferredSize)
        if not self.curves:
            hint.setWidth(0)
            hint.setHeight(0)
        self.legend.setMinimumSize(hint)
        self.legend.setMaximumSize(hint)
        self.legend.setPreferredSize(hint)
