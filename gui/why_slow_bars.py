"""One stacked horizontal bar per replica: where its step goes (compute, collective wait, input wait,
dispatch wait), its length the step time, hover for the figures."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QHelpEvent, QMouseEvent, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from engine.observe.telemetry import BREAKDOWN_PARTS, StepBreakdown
from gui.why_slow_model import PART_COLORS, breakdown_tip, ms

ROW_HEIGHT = 18
ROW_GAP = 4
LABEL_WIDTH = 132
#: Rows drawn at most (a run of 128 replicas scrolls in its scroll area; each row stays readable).
MAX_ROWS = 512


class ReplicaBars(QWidget):
    """Draws ``{replica: (task, breakdown)}``; a click selects a replica (``replicaClicked``)."""

    replicaClicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("whySlowBars")
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self.rows: list[tuple[int, str, StepBreakdown]] = []
        self.mode = ""
        self.flagged: set[int] = set()
        self.selected: int | None = None
        self.setToolTip("Where each replica's step goes: hover a bar for its figures, click it to follow it below")

    def set_rows(self, rows: list[tuple[int, str, StepBreakdown]], mode: str, flagged: set[int]) -> None:
        self.rows = rows[:MAX_ROWS]
        self.mode = mode
        self.flagged = flagged
        self.updateGeometry()
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(420, max(1, len(self.rows)) * (ROW_HEIGHT + ROW_GAP) + ROW_GAP)

    def minimumSizeHint(self) -> QSize:
        return QSize(260, self.sizeHint().height())

    def _scale(self) -> float:
        longest = max((b.total for _, _, b in self.rows), default=0.0)
        return longest if longest > 0 else 1.0

    def _bar_rect(self) -> QRect:
        right = self.fontMetrics().horizontalAdvance("0000.0 ms") + 10
        return QRect(LABEL_WIDTH, 0, max(40, self.width() - LABEL_WIDTH - right), ROW_HEIGHT)

    def row_at(self, pos: QPoint) -> int | None:
        i = (pos.y() - ROW_GAP) // (ROW_HEIGHT + ROW_GAP)
        return i if 0 <= i < len(self.rows) else None

    def part_at(self, pos: QPoint) -> tuple[int, str | None] | None:
        """The row under ``pos`` and the part of its bar there (None: beside the bar)."""
        i = self.row_at(pos)
        if i is None:
            return None
        bar, b = self._bar_rect(), self.rows[i][2]
        x = float(bar.left())
        width = bar.width() / self._scale()
        for part in BREAKDOWN_PARTS:
            w = b.part(part) * width
            if x <= pos.x() < x + w:
                return i, part
            x += w
        return i, None

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        palette = self.palette()
        text = palette.color(QPalette.ColorRole.WindowText)
        if not self.rows:
            painter.setPen(palette.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.rect().adjusted(6, 0, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                             "No step breakdown yet")
            return
        bar, scale = self._bar_rect(), self._scale()
        fm = self.fontMetrics()
        for i, (replica, task, b) in enumerate(self.rows):
            top = ROW_GAP + i * (ROW_HEIGHT + ROW_GAP)
            if replica == self.selected:
                painter.fillRect(QRect(0, top - ROW_GAP // 2, self.width(), ROW_HEIGHT + ROW_GAP),
                                 palette.color(QPalette.ColorRole.AlternateBase))
            painter.setPen(QColor("#e5484d") if replica in self.flagged else text)
            label = fm.elidedText(f"{'⚠ ' if replica in self.flagged else ''}{replica}  {task}",
                                  Qt.TextElideMode.ElideRight, LABEL_WIDTH - 8)
            painter.drawText(QRect(4, top, LABEL_WIDTH - 8, ROW_HEIGHT), Qt.AlignmentFlag.AlignVCenter, label)
            x = float(bar.left())
            for part in BREAKDOWN_PARTS:
                w = b.part(part) * bar.width() / scale
                if w > 0:
                    painter.fillRect(QRect(round(x), top + 2, max(1, round(x + w) - round(x)), ROW_HEIGHT - 4),
                                     QColor(PART_COLORS[part]))
                x += w
            painter.setPen(text)
            painter.drawText(QRect(round(x) + 6, top, self.width() - round(x) - 6, ROW_HEIGHT),
                             Qt.AlignmentFlag.AlignVCenter, ms(b.step_time))

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            hit = self.part_at(event.pos())
            if hit is None:
                QToolTip.showText(event.globalPos(), self.toolTip(), self)
            else:
                QToolTip.showText(event.globalPos(), self.tip_for(hit[0]), self)
            return True
        return super().event(event)

    def tip_for(self, row: int) -> str:
        replica, task, b = self.rows[row]
        return breakdown_tip(replica, task, b, self.mode) + "\n(click to follow this replica over time)"

    def mousePressEvent(self, event: QMouseEvent) -> None:
        i = self.row_at(event.position().toPoint())
        if i is not None and event.button() == Qt.MouseButton.LeftButton:
            self.selected = self.rows[i][0]
            self.update()
            self.replicaClicked.emit(self.selected)
        super().mousePressEvent(event)
