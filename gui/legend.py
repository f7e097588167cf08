"""The legend of a plot with many lines: every line named, in one item that paints itself.

pyqtgraph's ``LegendItem`` holds two graphics widgets per entry (a sample and a label with its
own text document): ~55 KB each, 28 MB for 128 replicas on four plots, for entries too small to
read. A :class:`CompactLegend` keeps only the list of its lines and draws their short names
("r17") in a grid, each in its line's colour (a hidden line's name greyed and struck out): every
replica is still named and still hidden or shown by a click on its name, and the tooltip of a
name gives its full label. When the names need more rows than the plot is high, the wheel
scrolls them (the last row says how many are out of sight).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPen
from PySide6.QtWidgets import QGraphicsSceneWheelEvent, QSizePolicy

__all__ = ["CompactLegend", "ToggleLegend"]


class Line(Protocol):
    """What the legend asks of a line (a :class:`gui.curves.Curve`)."""

    def isVisible(self) -> bool: ...  # noqa: N802

    def setVisible(self, visible: bool) -> None: ...  # noqa: N802

    def pen(self) -> QPen: ...


class CompactLegend(pg.GraphicsWidget):
    """Short coloured names of many lines in a grid; a click on a name hides or shows its line."""

    PAD = 3.0  # pixels around the grid
    GAP = 8.0  # pixels between columns

    def __init__(self, point_size: float = 8.0) -> None:
        super().__init__()
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.setAcceptHoverEvents(True)
        self.font = QFont()
        self.font.setPointSizeF(point_size)
        self._metrics = QFontMetricsF(self.font)
        self.lines: list[Line] = []
        self.names: list[str] = []  # what each cell shows
        self.labels: list[str] = []  # the full labels (tooltips)
        self.text_color = QColor("#808080")
        self.columns = 1
        self.rows = 1  # rows shown
        self.first_row = 0  # scrolled by the wheel
        self._cell = (1.0, 1.0)
        self._room: tuple[float, float] | None = None  # the room last given to fit()

    # -- entries
    def add(self, line: Line, name: str, label: str) -> None:
        self.lines.append(line)
        self.names.append(name)
        self.labels.append(label)
        self._refit()

    def remove(self, line: Line) -> None:
        for i, other in enumerate(self.lines):
            if other is line:
                del self.lines[i], self.names[i], self.labels[i]
                self._refit()
                return

    def _refit(self) -> None:
        """Columns and rows again for the room last given (an entry came, went or was renamed)."""
        if self._room is not None:
            self.fit(*self._room)
        else:
            self.update()

    def clear(self) -> None:
        self.lines, self.names, self.labels = [], [], []
        self.first_row = 0
        self.update()

    def relabel(self, line: Line, name: str, label: str) -> bool:
        """``line``'s entry now reads ``name`` (its tooltip ``label``); False when it has none."""
        for i, other in enumerate(self.lines):
            if other is line:
                self.names[i], self.labels[i] = name, label
                self._refit()
                return True
        return False

    def __len__(self) -> int:
        return len(self.lines)

    def set_text_color(self, color: QColor) -> None:
        """The colour of what is not a line's name (the "+N more" row)."""
        self.text_color = QColor(color)
        self.update()

    # -- layout
    def fit(self, max_width: float, max_height: float) -> None:
        """Columns and rows for at most ``max_width`` x ``max_height`` pixels; the item takes that size."""
        self._room = (max_width, max_height)
        n = len(self.lines)
        widest = max((self._metrics.horizontalAdvance(name) for name in self.names), default=0.0)
        cell_w, cell_h = math.ceil(widest + self.GAP), math.ceil(self._metrics.height())
        self._cell = (float(cell_w), float(cell_h))
        columns = max(1, min(n, int((max_width - 2 * self.PAD) // cell_w))) if n else 1
        needed = math.ceil(n / columns) if n else 0
        rows = max(1, min(needed, int((max_height - 2 * self.PAD) // cell_h))) if n else 0
        self.columns, self.rows = columns, rows
        self.first_row = max(0, min(self.first_row, needed - rows))
        width = 2 * self.PAD + columns * cell_w if n else 0.0
        height = 2 * self.PAD + rows * cell_h if n else 0.0
        for setter in (self.setMinimumSize, self.setMaximumSize, self.setPreferredSize):
            setter(width, height)
        self.update()

    def _hidden_rows(self) -> int:
        return max(0, math.ceil(len(self.lines) / self.columns) - self.rows)

    def _index_at(self, pos: QPointF) -> int | None:
        """The entry under ``pos`` (item coordinates), or None."""
        cell_w, cell_h = self._cell
        col = int((pos.x() - self.PAD) // cell_w)
        row = int((pos.y() - self.PAD) // cell_h)
        if not (0 <= col < self.columns and 0 <= row < self.rows) or pos.x() < self.PAD or pos.y() < self.PAD:
            return None
        if row == self.rows - 1 and col == self.columns - 1 and self._more() > 0:
            return None  # the "+N more" cell
        i = (self.first_row + row) * self.columns + col
        return i if i < len(self.lines) else None

    def _more(self) -> int:
        """Entries after the shown rows."""
        shown_end = (self.first_row + self.rows) * self.columns
        return max(0, len(self.lines) - shown_end + (1 if shown_end < len(self.lines) else 0))

    # -- drawing
    def paint(self, p: QPainter, *_args: Any) -> None:
        if not self.lines:
            return
        p.setFont(self.font)
        cell_w, cell_h = self._cell
        more = self._more()
        ascent = self._metrics.ascent()
        grey = QColor(self.text_color)
        grey.setAlpha(110)
        for row in range(self.rows):
            for col in range(self.columns):
                x, y = self.PAD + col * cell_w, self.PAD + row * cell_h
                if more and row == self.rows - 1 and col == self.columns - 1:
                    p.setPen(self.text_color)
                    p.drawText(QPointF(x, y + ascent), f"+{more}")
                    continue
                i = (self.first_row + row) * self.columns + col
                if i >= len(self.lines):
                    return
                line = self.lines[i]
                shown = line.isVisible()
                p.setPen(line.pen().color() if shown else grey)
                p.drawText(QPointF(x, y + ascent), self.names[i])
                if not shown:
                    mid = y + ascent * 0.65
                    p.drawLine(QPointF(x, mid), QPointF(x + self._metrics.horizontalAdvance(self.names[i]), mid))

    def boundingRect(self) -> QRectF:  # noqa: N802
        return QRectF(0, 0, self.size().width(), self.size().height())

    # -- the user
    def mouseClickEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph's scene calls it
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        i = self._index_at(ev.pos())
        if i is not None:
            line = self.lines[i]
            line.setVisible(not line.isVisible())
            self.update()
        ev.accept()

    def hoverEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph's scene calls it
        if ev.isExit():
            return
        i = self._index_at(ev.pos())
        if i is not None:
            state = "shown" if self.lines[i].isVisible() else "hidden"
            self.setToolTip(f"{self.labels[i]} ({state}): click to hide or show its line")
        elif self._more():
            self.setToolTip(f"{self._more()} more: scroll with the wheel over the names")
        else:
            self.setToolTip("")

    def wheelEvent(self, ev: QGraphicsSceneWheelEvent) -> None:  # noqa: N802
        hidden = self._hidden_rows()
        if not hidden:
            ev.ignore()  # the plot zooms as usual
            return
        step = -1 if ev.delta() > 0 else 1
        self.first_row = max(0, min(hidden, self.first_row + step))
        self.update()
        ev.accept()


class _EntryLabel(pg.LabelItem):
    """A legend entry's name: a click on it does what a click on its line sample does."""

    def __init__(self, sample: Any, text: str, **opts: Any) -> None:
        super().__init__(text, **opts)
        self.sample = sample
        self.setToolTip("Click to hide or show this line")

    def mouseClickEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph's scene calls it
        self.sample.mouseClickEvent(ev)
        self.setOpacity(1.0 if self.sample.item.isVisible() else 0.45)


class ToggleLegend(pg.LegendItem):
    """pyqtgraph's legend, whose entries' names toggle their lines as their samples do (users of
    TensorBoard and W&B click the name), a hidden line's name dimmed."""

    def addItem(self, item: Any, name: str) -> None:  # noqa: N802 - pyqtgraph's name
        sample = item if isinstance(item, self.sampleType) else self.sampleType(item)
        label = _EntryLabel(sample, name, color=self.opts["labelTextColor"], justify="left",
                            size=self.opts["labelTextSize"])
        sample.sigClicked.connect(self.sigSampleClicked)
        sample.sigClicked.connect(lambda _item, label=label: label.setOpacity(
            1.0 if label.sample.item.isVisible() else 0.45))
        self.items.append((sample, label))
        self._addItemToLayout(sample, label)
        self.updateSize()

    def relabel(self, item: Any, text: str) -> bool:
        """The entry of ``item`` now reads ``text``; False when it has none."""
        for sample, label in self.items:
            if sample.item is item:
                if label.text != text:
                    label.setText(text)
                    self.updateSize()
                return True
        return False
