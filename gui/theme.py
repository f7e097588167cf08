"""Colours of the app: light and dark palettes that follow the system, role and state colours."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPainterPath, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QApplication

#: Fill colour of a task chip, by role.
ROLE_COLORS: dict[str, str] = {
    "chief": "#c77d1a",
    "worker": "#2f7fc1",
    "ps": "#7b5bb5",
    "evaluator": "#3a9a74",
}

#: Colour of a task's run state (chip ring, task table, status text).
STATE_COLORS: dict[str, str] = {
    "pending": "#8a8f98",
    "queued": "#b08a2e",
    "ready": "#8a8f98",
    "starting": "#d9a400",
    "restarting": "#d9a400",
    "running": "#2ea043",
    "finished": "#3b82f6",
    "failed": "#e5484d",
    "stopped": "#8a8f98",
    "stopping": "#d9a400",
}

#: Curve colours (one per replica or task, cycled).
CURVE_COLORS = ("#3b82f6", "#f97316", "#22c55e", "#e11d48", "#a855f7", "#14b8a6", "#eab308", "#64748b")

PROBLEM_COLOR = "#e5484d"
#: The validation curve of a metric (dashed), apart from every replica's colour.
VALIDATION_COLOR = "#db2777"


def curve_color(i: int) -> str:
    return CURVE_COLORS[i % len(CURVE_COLORS)]


def system_prefers_dark() -> bool:
    """True when the desktop asks for a dark colour scheme (Qt 6.5+ style hints)."""
    app = QGuiApplication.instance()
    if app is None:
        return False
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether the palette in use is a dark one."""
    palette = palette or QApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor("#1e2127"), QColor("#272b33"), QColor("#e6e6e6")
    disabled = QColor("#7a7f88")
    p.setColor(QPalette.ColorRole.Window, window)
    p.setColor(QPalette.ColorRole.WindowText, text)
    p.setColor(QPalette.ColorRole.Base, base)
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#2c313a"))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor("#343a45"))
    p.setColor(QPalette.ColorRole.ToolTipText, text)
    p.setColor(QPalette.ColorRole.PlaceholderText, disabled)
    p.setColor(QPalette.ColorRole.Text, text)
    p.setColor(QPalette.ColorRole.Button, QColor("#30353e"))
    p.setColor(QPalette.ColorRole.ButtonText, text)
    p.setColor(QPalette.ColorRole.BrightText, QColor("#ff6b6b"))
    p.setColor(QPalette.ColorRole.Link, QColor("#6cb6ff"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#3b82f6"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Mid, QColor("#444a55"))
    p.setColor(QPalette.ColorRole.Dark, QColor("#15171b"))
    p.setColor(QPalette.ColorRole.Light, QColor("#3d434d"))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def light_palette() -> QPalette:
    p = QPalette()
    p.setColor(QPalette.ColorRole.Window, QColor("#f3f4f6"))
    p.setColor(QPalette.ColorRole.WindowText, QColor("#1f2328"))
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#f6f8fa"))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor("#ffffe8"))
    p.setColor(QPalette.ColorRole.ToolTipText, QColor("#1f2328"))
    p.setColor(QPalette.ColorRole.Text, QColor("#1f2328"))
    p.setColor(QPalette.ColorRole.Button, QColor("#e9ebef"))
    p.setColor(QPalette.ColorRole.ButtonText, QColor("#1f2328"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#2f7fc1"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Link, QColor("#0969da"))
    p.setColor(QPalette.ColorRole.Mid, QColor("#c9ccd1"))
    disabled = QColor("#8c959f")
    p.setColor(QPalette.ColorRole.PlaceholderText, disabled)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def apply_palette(app: QApplication, dark: bool | None = None) -> bool:
    """Fusion style with a light or dark palette (the system's choice unless ``dark`` is given)."""
    dark = system_prefers_dark() if dark is None else dark
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if dark else light_palette())
    return dark


def undo_icon(redo: bool = False, color: QColor | None = None, size: int = 32) -> QIcon:
    """A hooked arrow turning back (undo) or forward (redo): the theme's edit-undo/edit-redo where the
    desktop has them, else drawn (the style's own back/forward arrows read as navigation)."""
    themed = QIcon.fromTheme("edit-redo" if redo else "edit-undo")
    if not themed.isNull():
        return themed
    color = color or QApplication.palette().color(QPalette.ColorRole.ButtonText)
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    if redo:  # the mirror image of undo
        painter.translate(size, 0)
        painter.scale(-1, 1)
    s = size / 32.0
    pen = QPen(color, 3.2 * s)
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    painter.setPen(pen)
    path = QPainterPath(QPointF(9 * s, 13 * s))
    path.lineTo(19 * s, 13 * s)
    path.arcTo(QRectF(12 * s, 13 * s, 14 * s, 13 * s), 90, -180)
    path.lineTo(11 * s, 26 * s)
    painter.drawPath(path)
    head = QPainterPath(QPointF(3 * s, 13 * s))
    head.lineTo(11 * s, 6 * s)
    head.lineTo(11 * s, 20 * s)
    head.closeSubpath()
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawPath(head)
    painter.end()
    return QIcon(pixmap)
