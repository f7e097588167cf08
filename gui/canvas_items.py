"""The cluster canvas's graphics items: a host as a box with its name, address (or Slurm request) and GPU
slots, a task as a chip inside it coloured by role, naming its GPUs and, while a run is shown, its
state. Items never change the config themselves: they call the document model, deferred to the next
event-loop turn so an item is never deleted inside its own event handler."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsObject,
    QGraphicsSceneMouseEvent,
    QGraphicsSimpleTextItem,
    QStyleOptionGraphicsItem,
    QWidget,
)

from engine.contract.config import Host, Task, split_gpus
from engine.observe.telemetry import TaskState
from gui import theme
from gui.document import CHIP_H, CHIP_W, COLUMNS, GPU_ROW_H, HEADER_H, HOST_W, PAD, host_height
from gui.document_model import DocumentModel, Selection
from gui.run_session import RunSession

GPU_SLOT_W = 17.0
MAX_GPU_SLOTS = 11
#: The accent of a Slurm group's badge.
SLURM_COLOR = "#0f7b8a"


class Canvas(Protocol):
    """What the items ask of :class:`gui.canvas.ClusterCanvas` (no import of it: no cycle)."""

    document: DocumentModel
    session: RunSession
    taskActivated: Any  # Signal(str): a shown run's task was double-clicked

    def palette(self) -> QPalette: ...

    def host_at(self, pos: QPointF, exclude: QGraphicsItem | None = None) -> HostItem | None: ...

    def set_drop_target(self, host: HostItem | None) -> None: ...


def defer(fn: Callable[[], object]) -> None:
    """Call ``fn`` at the next event-loop turn."""
    QTimer.singleShot(0, fn)


def gpu_list(ids: list[int]) -> str:
    """``[0, 1, 2]`` -> ``0–2``; ``[3]`` -> ``3``."""
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(str(g) for g in ids)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def slurm_subtitle(host: Host) -> str:
    """What a Slurm group's header says instead of an address: ``Slurm · partition debug · 2 nodes``."""
    s = host.slurm
    if s is None:
        return "Slurm · no slurm block"
    where = f"partition {s.partition}" if s.partition else "default partition"
    return f"Slurm · {where} · {plural(s.nodes, 'node')}"


def slurm_resources(host: Host) -> str:
    """A Slurm group's request per node and per task and its time limit, in one line (its GPU row; the
    tooltip says the rest)."""
    s = host.slurm
    if s is None:
        return ""
    parts = [f"{plural(s.gpus_per_node, 'GPU')}/node" if s.gpus_per_node > 0 else "no GPU (CPU only)",
             f"{plural(s.cpus_per_task, 'CPU')}/task"]
    if s.time_limit:
        parts.append(f"limit {s.time_limit}")
    return " · ".join(parts)


class ChipItem(QGraphicsObject):
    """One task: a chip coloured by role, with a state dot while a run is shown."""

    def __init__(self, canvas: Canvas, host_index: int, task_index: int, task: Task,
                 parent: QGraphicsItem) -> None:
        super().__init__(parent)
        self.canvas = canvas
        self.host_index = host_index
        self.task_index = task_index
        self.task = task
        self.problems: list[str] = []
        self.run_state: TaskState | None = None
        self.gpus: list[int] = []  # the host's GPU ids this task owns
        self.gpu_color: QColor | None = None  # the colour of its GPUs on the host's GPU row
        self.node: int | None = None  # a Slurm group's task: the node of the allocation it runs on
        self.emulated = False  # its GPUs are logical CPU devices (no GPU on the machine)
        self.shown: tuple[object, ...] = ()  # what of its run state it shows (see ClusterCanvas.refresh_states)
        self.home = QPointF()
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable | QGraphicsItem.GraphicsItemFlag.ItemIsMovable)
        self.setCursor(Qt.CursorShape.OpenHandCursor)
        self.setAcceptHoverEvents(True)
        # drawn from a cache: a chip is painted again only when it changed, not whenever the view scrolls
        # or a neighbour repaints (a cluster of 1,024 tasks scrolls at the speed of a blit)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.update_tooltip()

    @property
    def selection(self) -> Selection:
        return ("task", self.host_index, self.task_index)

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -2, CHIP_W + 4, CHIP_H + 4)

    def update_tooltip(self) -> None:
        t = self.task
        lines = [f"<b>{t.name}</b> — port {'auto' if t.port is None else t.port}"]
        if self.node is not None:
            lines.append(f"On node {self.node} of the Slurm allocation (tasks fill the nodes in drawn order)")
        if self.gpus:
            lines.append(f"GPU {gpu_list(self.gpus)} of its {'node' if self.node is not None else 'host'}"
                         + (" — emulated as logical CPU devices (no GPU here)" if self.emulated else ""))
        lines.append("Drag onto another host to move it; right-click for more.")
        if self.run_state is not None and self.run_state.state != "pending":
            s = self.run_state
            lines.append(f"State: <b>{s.state}</b>" + (f" (pid {s.pid})" if s.pid else ""))
            if s.reason:
                lines.append(f"Reason: {s.reason}")
        for p in self.problems:
            lines.append(f"<span style='color:{theme.PROBLEM_COLOR}'>⚠ {p}</span>")
        self.setToolTip("<br>".join(lines))

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fill = QColor(theme.ROLE_COLORS.get(self.task.role, "#777777"))
        rect = QRectF(0, 0, CHIP_W, CHIP_H)
        if self.problems:
            pen = QPen(QColor(theme.PROBLEM_COLOR), 3)
        elif self.isSelected():
            pen = QPen(self.canvas.palette().highlight().color().lighter(140), 3)
        else:
            pen = QPen(fill.darker(140), 1)
        painter.setPen(pen)
        painter.setBrush(QBrush(fill))
        painter.drawRoundedRect(rect, 7, 7)
        if self.gpu_color is not None:  # the colour of this task's GPU squares
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(self.gpu_color)
            painter.drawRoundedRect(QRectF(2.5, 5, 4, CHIP_H - 10), 2, 2)
        painter.setPen(QColor("white"))
        font = QFont(painter.font())
        font.setBold(True)
        font.setPointSizeF(9.5)
        painter.setFont(font)
        painter.drawText(QRectF(10, 3, CHIP_W - 30, 18), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         self.task.name)
        font.setBold(False)
        font.setPointSizeF(8)
        painter.setFont(font)
        port = "port auto" if self.task.port is None else f"port {self.task.port}"
        where = (f"GPU {gpu_list(self.gpus)}" + (" (emulated)" if self.emulated else "")) if self.gpus else port
        state = self.run_state.state if self.run_state is not None else ""
        if self.node is not None:
            where = f"node {self.node} · {where}"
        detail = f"{state} · {where}" if state and state != "pending" else where
        width = CHIP_W - (34 if self.problems else 14)
        detail = QFontMetricsF(font).elidedText(detail, Qt.TextElideMode.ElideRight, width)
        painter.drawText(QRectF(10, 20, width, 16), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         detail)
        if state and state != "pending":
            painter.setPen(QPen(QColor("white"), 1.5))
            painter.setBrush(QColor(theme.STATE_COLORS.get(state, "#888888")))
            painter.drawEllipse(QPointF(CHIP_W - 13, 12), 6, 6)
        if self.problems:
            painter.setPen(QColor("white"))
            painter.drawText(QRectF(CHIP_W - 24, 20, 20, 16), Qt.AlignmentFlag.AlignCenter, "⚠")

    def mousePressEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        self.setCursor(Qt.CursorShape.ClosedHandCursor)
        self.setZValue(10)
        super().mousePressEvent(event)

    def mouseDoubleClickEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        if self.canvas.session.shows_run:  # a run's task: its log
            self.canvas.taskActivated.emit(self.task.name)
        super().mouseDoubleClickEvent(event)

    def mouseMoveEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        super().mouseMoveEvent(event)
        target = self.canvas.host_at(event.scenePos(), exclude=self)
        self.canvas.set_drop_target(target if target is not None and target.host_index != self.host_index else None)

    def mouseReleaseEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        self.canvas.set_drop_target(None)
        self.setCursor(Qt.CursorShape.OpenHandCursor)
        self.setZValue(0)
        if (self.pos() - self.home).manhattanLength() < 4:
            self.setPos(self.home)
            return
        target = self.canvas.host_at(event.scenePos(), exclude=self)
        if target is not None and target.host_index != self.host_index:
            i, j, k = self.host_index, self.task_index, target.host_index
            defer(lambda: self.canvas.document.move_task(i, j, k))
        else:
            self.setPos(self.home)


class HostItem(QGraphicsObject):
    """One host: name, address, GPU slots and its task chips."""

    def __init__(self, canvas: Canvas, index: int, host: Host, mode: str) -> None:
        super().__init__()
        self.canvas = canvas
        self.host_index = index
        self.host = host
        self.problems: list[str] = []
        self.chips: list[ChipItem] = []
        self.press_pos = QPointF()
        self.height = host_height(len(host.tasks))
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable | QGraphicsItem.GraphicsItemFlag.ItemIsMovable)
        gpus = self.split = split_gpus(host, mode)
        # a Slurm group's GPU ids repeat on every node: its row names the request, the chips their GPUs
        self.gpu_owner: dict[int, str] = {} if host.is_slurm else {g: name for name, ids in gpus.items() for g in ids}
        owners = [name for name, ids in gpus.items() if ids]
        self.owner_colors: dict[str, QColor] = {name: QColor(theme.curve_color(k)) for k, name in enumerate(owners)}
        self.split_valid = True  # False while the config says the GPUs cannot be split (none is drawn as given)
        self.drop_target = False  # a dragged task would land here
        nodes = {t.name: n for n, group in enumerate(host.node_tasks()) for t in group} if host.is_slurm else {}
        for j, task in enumerate(host.tasks):
            chip = ChipItem(canvas, index, j, task, self)
            chip.gpus = gpus.get(task.name, [])
            chip.gpu_color = self.owner_colors.get(task.name)
            chip.node = nodes.get(task.name)
            chip.update_tooltip()
            chip.home = QPointF(PAD + (j % COLUMNS) * (CHIP_W + PAD), HEADER_H + GPU_ROW_H + (j // COLUMNS) * (CHIP_H + PAD))
            chip.setPos(chip.home)
            self.chips.append(chip)
        if not host.tasks:
            hint = QGraphicsSimpleTextItem("Right-click to add a task", self)
            hint.setBrush(canvas.palette().placeholderText())
            hint.setPos(PAD + 4, HEADER_H + GPU_ROW_H + 12)
        self.update_tooltip()

    @property
    def selection(self) -> Selection:
        return ("host", self.host_index)

    def show_split(self, valid: bool) -> None:
        """Draw the GPUs given to the tasks, or none while the split is invalid (the ⚠ says why)."""
        if valid == self.split_valid:
            return
        self.split_valid = valid
        if not self.host.is_slurm:
            self.gpu_owner = {g: name for name, ids in self.split.items() for g in ids} if valid else {}
        for chip in self.chips:
            chip.gpus = self.split.get(chip.task.name, []) if valid else []
            chip.gpu_color = self.owner_colors.get(chip.task.name) if valid else None

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -2, HOST_W + 4, self.height + 4)

    def subtitle(self) -> str:
        """The header's second line: the address, or what a Slurm group allocates."""
        return slurm_subtitle(self.host) if self.host.is_slurm else self.host.address

    def _slurm_tooltip(self) -> list[str]:
        h = self.host
        s = h.slurm
        if s is None:
            return [f"<b>{html.escape(h.name)}</b> — a Slurm group without its slurm block"]
        where = f"partition <b>{html.escape(s.partition)}</b>" if s.partition else "the default partition"
        lines = [f"<b>{html.escape(h.name)}</b> — Slurm group: {plural(s.nodes, 'node')} in {where}, "
                 f"{plural(s.gpus_per_node, 'GPU')} per node" + (f" (--gres=gpu:{s.gpus_per_node})"
                                                                  if s.gpus_per_node else "")]
        for n, group in enumerate(h.node_tasks()):
            lines.append(f"node {n}: {', '.join(t.name for t in group) or 'no task'}")
        ask = [f"{plural(s.cpus_per_task, 'CPU')} per task"]
        for text, value in (("memory per task", s.mem_per_task), ("time limit", s.time_limit),
                            ("account", s.account), ("QoS", s.qos)):
            if value:
                ask.append(f"{text} {html.escape(value)}")
        lines.append(", ".join(ask))
        for text, options in (("sbatch", s.sbatch_options), ("srun", s.srun_options)):
            if options:
                lines.append(f"{text} options: {html.escape(' '.join(options))}")
        lines.append("Tasks fill the nodes in drawn order; salloc allocates them, srun starts one supervisor "
                     "per node.")
        return lines

    def update_tooltip(self) -> None:
        h = self.host
        if h.is_slurm:
            lines = self._slurm_tooltip()
            lines.append("Drag to move; right-click to add tasks or GPUs per node.")
            for p in self.problems:
                lines.append(f"<span style='color:{theme.PROBLEM_COLOR}'>⚠ {html.escape(p)}</span>")
            self.setToolTip("<br>".join(lines))
            return
        lines = [f"<b>{h.name}</b> at {h.address} — {h.gpus} GPU{'s' if h.gpus != 1 else ''}"]
        by_owner: dict[str, list[int]] = {}
        for g, owner in sorted(self.gpu_owner.items()):
            by_owner.setdefault(owner, []).append(g)
        lines += [f"GPU {gpu_list(ids)} → {owner}" for owner, ids in by_owner.items()]
        if not self.split_valid:
            lines.append("No GPU is given to a task until the split is fixed (see the problem below)")
        elif h.gpus and len(self.gpu_owner) < h.gpus:
            lines.append(f"{h.gpus - len(self.gpu_owner)} GPU(s) left unused")
        lines.append("Drag to move; right-click to add tasks or GPUs.")
        for p in self.problems:
            lines.append(f"<span style='color:{theme.PROBLEM_COLOR}'>⚠ {p}</span>")
        self.setToolTip("<br>".join(lines))

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.canvas.palette()
        dark = theme.is_dark(pal)
        rect = QRectF(0, 0, HOST_W, self.height)
        if self.drop_target:  # a task dragged over this host lands here
            pen = QPen(pal.highlight().color(), 3.5, Qt.PenStyle.DashLine)
        elif self.problems:
            pen = QPen(QColor(theme.PROBLEM_COLOR), 2.5)
        elif self.isSelected():
            pen = QPen(pal.highlight().color(), 2.5)
        else:
            pen = QPen(pal.mid().color(), 1.2)
        painter.setPen(pen)
        fill = QColor("#2c313a") if dark else QColor("#ffffff")
        painter.setBrush(pal.highlight().color().lighter(170 if not dark else 60) if self.drop_target else fill)
        painter.drawRoundedRect(rect, 10, 10)
        header = QPainterPath()
        header.addRoundedRect(QRectF(1, 1, HOST_W - 2, HEADER_H - 2), 9, 9)
        slurm = self.host.is_slurm
        if slurm:
            painter.fillPath(header, QColor("#2f3d45") if dark else QColor("#e3f1f3"))
        else:
            painter.fillPath(header, QColor("#363c47") if dark else QColor("#eef1f5"))
        text = pal.text().color()
        painter.setPen(text)
        font = QFont(painter.font())
        font.setBold(True)
        font.setPointSizeF(10.5)
        painter.setFont(font)
        name_w = HOST_W - 2 * PAD - 20 - (52 if slurm else 0)
        name = QFontMetricsF(font).elidedText(self.host.name, Qt.TextElideMode.ElideRight, name_w)
        painter.drawText(QRectF(PAD, 3, name_w, 20), Qt.AlignmentFlag.AlignVCenter, name)
        if slurm:
            self._paint_badge(painter, font)
        font.setBold(False)
        font.setPointSizeF(8.5)
        painter.setFont(font)
        painter.setPen(pal.placeholderText().color())
        sub = QFontMetricsF(font).elidedText(self.subtitle(), Qt.TextElideMode.ElideRight, HOST_W - 2 * PAD)
        painter.drawText(QRectF(PAD, 21, HOST_W - 2 * PAD, 16), Qt.AlignmentFlag.AlignVCenter, sub)
        if self.problems:
            painter.setPen(QColor(theme.PROBLEM_COLOR))
            painter.drawText(QRectF(HOST_W - 28, 4, 20, 20), Qt.AlignmentFlag.AlignCenter, "⚠")
        self._paint_gpus(painter, text)

    def _paint_badge(self, painter: QPainter, font: QFont) -> None:
        """The SLURM badge at the header's right (left of a problem's ⚠)."""
        badge = QRectF(HOST_W - PAD - 24 - 46, 6, 46, 15)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(SLURM_COLOR))
        painter.drawRoundedRect(badge, 4, 4)
        small = QFont(font)
        small.setPointSizeF(7)
        painter.setFont(small)
        painter.setPen(QColor("white"))
        painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, "SLURM")

    def _paint_gpus(self, painter: QPainter, text: QColor) -> None:
        y = HEADER_H + 3
        gpus = self.host.gpus
        painter.setPen(self.canvas.palette().placeholderText().color())
        if self.host.is_slurm:
            line = QFontMetricsF(painter.font()).elidedText(slurm_resources(self.host), Qt.TextElideMode.ElideRight,
                                                            HOST_W - 2 * PAD)
            painter.drawText(QRectF(PAD, y, HOST_W - 2 * PAD, 16), Qt.AlignmentFlag.AlignVCenter, line)
            return
        if gpus <= 0:
            painter.drawText(QRectF(PAD, y, 120, 16), Qt.AlignmentFlag.AlignVCenter, "no GPU (CPU only)")
            return
        painter.drawText(QRectF(PAD, y, 40, 16), Qt.AlignmentFlag.AlignVCenter, "GPUs")
        x = PAD + 36
        font = QFont(painter.font())
        font.setPointSizeF(7)
        font.setBold(True)
        painter.setFont(font)
        for g in range(min(gpus, MAX_GPU_SLOTS)):
            owner = self.gpu_owner.get(g)
            color = self.owner_colors.get(owner or "", QColor("#9aa0a6"))
            slot = QRectF(x, y + 1, GPU_SLOT_W - 3, 14)
            painter.setPen(QPen(color.darker(130), 1))
            painter.setBrush(color if owner else QColor(0, 0, 0, 0))
            painter.drawRoundedRect(slot, 2, 2)
            painter.setPen(QColor("white") if owner else text)
            painter.drawText(slot, Qt.AlignmentFlag.AlignCenter, str(g))
            x += GPU_SLOT_W
        if gpus > MAX_GPU_SLOTS:
            painter.setPen(text)
            painter.drawText(QRectF(x + 2, y, 40, 16), Qt.AlignmentFlag.AlignVCenter, f"+{gpus - MAX_GPU_SLOTS}")

    def mousePressEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        self.press_pos = self.pos()
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        if (self.pos() - self.press_pos).manhattanLength() >= 2:
            i, pos = self.host_index, (self.pos().x(), self.pos().y())
            defer(lambda: self.canvas.document.move_host(i, pos))
