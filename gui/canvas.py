"""The cluster canvas: hosts as boxes with their GPU slots, tasks as coloured chips inside them.

The scene is rebuilt from the document on every cluster edit (clusters are small) and the
view fits it at a readable scale (a cluster too big to read whole scrolls, with a hint saying
so); the shown run only recolours the chips. Each GPU square carries its id and the colour of
the task that owns it; the chip repeats that colour and names its GPUs. Items never change
the config themselves: they call the document model, deferred to the next event-loop turn so
an item is never deleted inside its own event handler.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from functools import partial

from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QBrush,
    QColor,
    QContextMenuEvent,
    QFocusEvent,
    QFont,
    QFontMetricsF,
    QKeyEvent,
    QKeySequence,
    QPainter,
    QPainterPath,
    QPaintEvent,
    QPen,
    QResizeEvent,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsObject,
    QGraphicsScene,
    QGraphicsSceneMouseEvent,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QLabel,
    QMenu,
    QStyleOptionGraphicsItem,
    QVBoxLayout,
    QWidget,
)

from engine.contract.config import ROLES, Host, Problem, Task, split_gpus
from engine.observe.telemetry import TaskState
from gui import canvas_keys, gpu_notice, theme
from gui.document import CHIP_H, CHIP_W, COLUMNS, GPU_ROW_H, HEADER_H, HOST_W, PAD, host_height
from gui.document_model import DocumentModel, Selection, problem_target
from gui.run_session import RunSession

GPU_SLOT_W = 17.0
MAX_GPU_SLOTS = 11
#: Below this zoom the chips' text is too small to read: the view scrolls instead of shrinking more.
#: At 0.85 a chip's smallest text (8 pt, 10.7 px at 96 dpi) is 9 px high.
READABLE_SCALE = 0.85
#: While a run is watched the cluster is a compact status view, still readable (a larger cluster scrolls,
#: and the task table lists every task's state).
COMPACT_SCALE = READABLE_SCALE
MAX_SCALE = 1.3
#: The accent of a Slurm group's badge.
SLURM_COLOR = "#0f7b8a"


def _defer(fn: Callable[[], object]) -> None:
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

    def __init__(self, canvas: ClusterCanvas, host_index: int, task_index: int, task: Task,
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
        self.home = QPointF()
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable | QGraphicsItem.GraphicsItemFlag.ItemIsMovable)
        self.setCursor(Qt.CursorShape.OpenHandCursor)
        self.setAcceptHoverEvents(True)
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
            _defer(lambda: self.canvas.document.move_task(i, j, k))
        else:
            self.setPos(self.home)


class HostItem(QGraphicsObject):
    """One host: name, address, GPU slots and its task chips."""

    def __init__(self, canvas: ClusterCanvas, index: int, host: Host, mode: str) -> None:
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
            _defer(lambda: self.canvas.document.move_host(i, pos))


class ClusterView(QGraphicsView):
    """The view: context menus, Ctrl+wheel zoom, fitting the cluster when its size changes."""

    def __init__(self, canvas: ClusterCanvas) -> None:
        super().__init__(canvas.scene)
        self.canvas = canvas
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setDragMode(QGraphicsView.DragMode.RubberBandDrag)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setToolTip("")

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        if event.reason() == QContextMenuEvent.Reason.Keyboard:  # the Menu key: the selected item's menu
            item = self.canvas.item_for(self.canvas.document.selection)
            where = item.sceneBoundingRect().center() if item is not None else self.mapToScene(self.rect().center())
            menu = self.canvas.context_menu(item, where)  # type: ignore[arg-type]
            menu.exec(self.viewport().mapToGlobal(self.mapFromScene(where)))
            return
        item = self.canvas.item_at(self.mapToScene(event.pos()))
        if item is not None and not item.isSelected():
            self.scene().clearSelection()
            item.setSelected(True)
        menu = self.canvas.context_menu(item, self.mapToScene(event.pos()))
        menu.exec(event.globalPos())

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Arrows walk through hosts and tasks; Ctrl+arrows move the selected task to a neighbouring host."""
        step = canvas_keys.key_step(event.key())
        if not step:
            super().keyPressEvent(event)
            return
        doc = self.canvas.document
        hosts = doc.config.cluster.hosts
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            target = canvas_keys.move_target(len(hosts), doc.selection, step)
            if target is not None and doc.selection is not None:
                i, j = doc.selection[1], doc.selection[2]  # type: ignore[misc]
                _defer(lambda: doc.move_task(i, j, target))
        else:
            doc.select(canvas_keys.step_selection([len(h.tasks) for h in hosts], doc.selection, step))
            item = self.canvas.item_for(doc.selection)
            if item is not None:
                self.ensureVisible(item)
        event.accept()

    def focusInEvent(self, event: QFocusEvent) -> None:
        super().focusInEvent(event)
        self.viewport().update()

    def focusOutEvent(self, event: QFocusEvent) -> None:
        super().focusOutEvent(event)
        self.viewport().update()

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if not self.hasFocus():
            return
        painter = QPainter(self.viewport())  # the keyboard is here: a frame, and a dashed ring on the selection
        color = self.palette().highlight().color()
        painter.setPen(QPen(color, 2))
        painter.drawRect(self.viewport().rect().adjusted(1, 1, -2, -2))
        item = self.canvas.item_for(self.canvas.document.selection)
        if item is not None:
            ring = self.mapFromScene(item.sceneBoundingRect().adjusted(-4, -4, 4, 4)).boundingRect()
            painter.setPen(QPen(color, 2, Qt.PenStyle.DashLine))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(ring, 8, 8)
        painter.end()

    def wheelEvent(self, event: QWheelEvent) -> None:
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            factor = 1.15 if event.angleDelta().y() > 0 else 1 / 1.15
            self.canvas.zoom(factor)
            return
        super().wheelEvent(event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.canvas.view_resized()


class ClusterCanvas(QWidget):
    """Hosts and tasks of the document, editable with mouse, menus and the Delete key; the shown
    run's task states on the chips."""

    itemsRebuilt = Signal()
    taskActivated = Signal(str)  # a shown run's task was double-clicked: show its log

    def __init__(self, document: DocumentModel, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.session = session
        self.scene = QGraphicsScene(self)
        self.view = ClusterView(self)
        self.view.setObjectName("clusterView")
        self.banner = QLabel()
        self.banner.setObjectName("clusterProblems")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet(f"QLabel {{ color: white; background: {theme.PROBLEM_COLOR}; padding: 4px 8px; "
                                  "border-radius: 4px; }")
        self.banner.setToolTip("Problems with the cluster as a whole; fix them before running")
        self.banner.hide()
        self.scroll_hint = QLabel()
        self.scroll_hint.setObjectName("clusterScrollHint")
        self.scroll_hint.setToolTip("The cluster is larger than this pane at a readable size")
        self.scroll_hint.setStyleSheet("QLabel { color: palette(highlighted-text); background: palette(highlight); "
                                       "padding: 2px 8px; border-radius: 4px; }")
        self.scroll_hint.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.banner)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.scroll_hint)
        self.hosts: list[HostItem] = []
        self._syncing = False
        self._user_zoom = False  # the user zoomed by hand: keep it until the cluster changes or Fit
        self._whole = False  # View › Fit asked for the whole cluster: kept through resizes
        self.compact = False  # a status view while a run is watched (see set_compact)
        self._mode = document.config.parallelism.mode
        self.delete_action = QAction("Delete", self)
        self.delete_action.setShortcuts([QKeySequence(QKeySequence.StandardKey.Delete), QKeySequence(Qt.Key.Key_Backspace)])
        self.delete_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.delete_action.setToolTip("Delete the selected host or task")
        self.delete_action.triggered.connect(document.delete_selection)
        self.view.addAction(self.delete_action)
        self.scene.selectionChanged.connect(self._scene_selection)
        document.clusterChanged.connect(self._cluster_changed)
        document.settingsChanged.connect(self._settings_changed)
        document.problemsChanged.connect(self._apply_problems)
        document.selectionChanged.connect(self._select)
        session.runUpdated.connect(self.refresh_states)
        session.runLoaded.connect(self.refresh_states)
        self.rebuild()

    def _cluster_changed(self) -> None:
        self._user_zoom = False
        self._whole = False
        self.rebuild()

    def _settings_changed(self) -> None:
        mode = self.document.config.parallelism.mode
        if mode != self._mode:  # who owns the GPUs depends on the mode
            self.rebuild()

    # ------------------------------------------------------------------ fitting

    def fit(self, minimum: float = READABLE_SCALE) -> float:
        """Zoom so the whole cluster shows, but not below ``minimum`` (then it scrolls, with a hint)."""
        if minimum == READABLE_SCALE and self.compact:
            minimum = COMPACT_SCALE
        rect = self.scene.sceneRect()
        viewport = self.view.viewport().size()
        if rect.isEmpty() or viewport.width() < 20 or viewport.height() < 20:
            return self.scale()
        whole = min((viewport.width() - 2) / rect.width(), (viewport.height() - 2) / rect.height())
        scale = max(minimum, min(MAX_SCALE, whole))
        self.view.resetTransform()
        self.view.scale(scale, scale)
        self.view.centerOn(rect.center())
        if scale > whole:
            self.view.ensureVisible(QRectF(rect.topLeft(), rect.topLeft()), 0, 0)
        self._update_hint()
        return scale

    def set_compact(self, compact: bool) -> None:
        """Compact (a live status view, zoomed out further to show every chip) or full size (designing)."""
        if compact != self.compact:
            self.compact = compact
            self._user_zoom = self._whole = False
            self.fit()

    def fit_all(self) -> float:
        """Fit every host in view whatever the size (View › Fit, Ctrl+0), until the cluster changes."""
        self._user_zoom = False
        self._whole = True  # a resize (the scroll hint going) keeps the whole cluster in view
        return self.fit(minimum=0.05)

    def zoom(self, factor: float) -> None:
        self._user_zoom = True
        self._whole = False
        self.view.scale(factor, factor)
        self._update_hint()

    def scale(self) -> float:
        return float(self.view.transform().m11())

    def view_resized(self) -> None:
        if not self._user_zoom:
            self.fit(minimum=0.05 if self._whole else READABLE_SCALE)
        else:
            self._update_hint()

    def hidden_hosts(self) -> list[str]:
        """Hosts not wholly visible in the view."""
        visible = self.view.mapToScene(self.view.viewport().rect()).boundingRect()
        return [h.host.name for h in self.hosts if not visible.contains(h.sceneBoundingRect().adjusted(2, 2, -2, -2))]

    def _update_hint(self) -> None:
        hidden = self.hidden_hosts()
        if hidden:
            n = len(hidden)
            self.scroll_hint.setText(f"⇕ Scroll to see {'host ' + hidden[0] if n == 1 else f'{n} more hosts'} "
                                     f"(the cluster is larger than this pane) · Ctrl+wheel zooms · Ctrl+0 fits all")
        self.scroll_hint.setVisible(bool(hidden))

    # ------------------------------------------------------------------ building

    def rebuild(self) -> None:
        self._syncing = True
        try:
            self.scene.clear()
            self.hosts = []
            doc = self.document.document
            self._mode = doc.config.parallelism.mode
            for i, host in enumerate(doc.config.cluster.hosts):
                item = HostItem(self, i, host, self._mode)
                x, y = doc.layout[i] if i < len(doc.layout) else (0.0, 0.0)
                item.setPos(x, y)
                self.scene.addItem(item)
                self.hosts.append(item)
            if not self.hosts:
                hint = self.scene.addSimpleText("No hosts yet: press “Add host” or right-click here.")
                hint.setBrush(self.palette().placeholderText())
            self.scene.setSceneRect(self.scene.itemsBoundingRect().adjusted(-16, -12, 16, 12))
            self._apply_problems(self.document.problems)
            self.refresh_states()
            self._select(self.document.selection)
        finally:
            self._syncing = False
        if not self._user_zoom:
            self.fit()
        else:
            self._update_hint()
        self.itemsRebuilt.emit()

    def chip(self, i: int, j: int) -> ChipItem | None:
        if 0 <= i < len(self.hosts) and 0 <= j < len(self.hosts[i].chips):
            return self.hosts[i].chips[j]
        return None

    def item_for(self, selection: Selection) -> QGraphicsObject | None:
        if selection is None:
            return None
        if selection[0] == "host":
            return self.hosts[selection[1]] if selection[1] < len(self.hosts) else None
        return self.chip(selection[1], selection[2])

    def host_at(self, pos: QPointF, exclude: QGraphicsItem | None = None) -> HostItem | None:
        for item in self.scene.items(pos):
            if item is exclude:
                continue
            while item is not None and not isinstance(item, HostItem):
                item = item.parentItem()
            if isinstance(item, HostItem):
                return item
        return None

    def item_at(self, pos: QPointF) -> HostItem | ChipItem | None:
        for item in self.scene.items(pos):
            while item is not None and not isinstance(item, (HostItem, ChipItem)):
                item = item.parentItem()
            if isinstance(item, (HostItem, ChipItem)):
                return item
        return None

    # ------------------------------------------------------------------ state

    def set_drop_target(self, host: HostItem | None) -> None:
        """Highlight the host a dragged task would land on (None: no highlight)."""
        for h in self.hosts:
            if h.drop_target != (h is host):
                h.drop_target = h is host
                h.update()

    def _apply_problems(self, problems: list[Problem]) -> None:
        bad_split = {p.field for p in problems if p.field.endswith((".gpus", ".slurm.gpus_per_node"))}
        for host in self.hosts:
            where = f"cluster.hosts[{host.host_index}]"
            host.show_split(not {f"{where}.gpus", f"{where}.slurm.gpus_per_node"} & bad_split)
            host.problems = []
            for chip in host.chips:
                chip.problems = []
        general: list[str] = []
        for p in problems:
            target = problem_target(p)
            item = self.item_for(target)
            if isinstance(item, HostItem):
                item.problems.append(f"{p.field.split('.', 2)[-1] if '.' in p.field else p.field}: {p.message}")
            elif isinstance(item, ChipItem):
                item.problems.append(f"{p.field.rsplit('.', 1)[-1]}: {p.message}")
            elif p.field in ("cluster", "cluster.hosts"):
                general.append(p.message)
        for host in self.hosts:
            host.update_tooltip()
            host.update()
            for chip in host.chips:
                chip.update_tooltip()
                chip.update()
        self.banner.setText("\n".join(f"⚠ {m}" for m in general))
        self.banner.setVisible(bool(general))

    def emulated_tasks(self) -> set[str]:
        """Tasks whose GPUs are emulated: as the shown run's tasks said, or as a run here would."""
        s = self.session
        names = set(gpu_notice.emulated_by_task(s.state.infos))
        if not s.shows_run or s.is_running:
            config = s.config if s.shows_run else self.document.config
            if gpu_notice.emulated_here(config):
                names |= set(gpu_notice.assigned_gpus(config))
        return names

    def refresh_states(self) -> None:
        tasks = self.session.state.tasks
        emulated = self.emulated_tasks()
        for host in self.hosts:
            for chip in host.chips:
                state = tasks.get(chip.task.name)
                fake = chip.task.name in emulated
                if state is not chip.run_state or (state is not None) or fake != chip.emulated:
                    chip.run_state = state
                    chip.emulated = fake
                    chip.update_tooltip()
                    chip.update()

    # ------------------------------------------------------------------ selection

    def _scene_selection(self) -> None:
        if self._syncing:
            return
        selected = [i for i in self.scene.selectedItems() if isinstance(i, (HostItem, ChipItem))]
        self.document.select(selected[0].selection if len(selected) == 1 else None)

    def _select(self, selection: Selection) -> None:
        was = self._syncing
        self._syncing = True
        try:
            self.scene.clearSelection()
            item = self.item_for(selection)
            if item is not None:
                item.setSelected(True)
        finally:
            self._syncing = was
        self.view.viewport().update()  # the keyboard's focus ring follows the selection

    # ------------------------------------------------------------------ menus

    def context_menu(self, item: HostItem | ChipItem | None, scene_pos: QPointF | None = None) -> QMenu:
        """The right-click menu for a chip, a host or the empty canvas."""
        c = self.document
        menu = QMenu(self)
        menu.setToolTipsVisible(True)

        def add(text: str, slot: Callable[[], object], tip: str, enabled: bool = True) -> QAction:
            action = menu.addAction(text)
            action.setToolTip(tip)
            action.setEnabled(enabled)
            action.triggered.connect(lambda _=False: _defer(slot))
            return action

        if isinstance(item, ChipItem):
            i, j = item.host_index, item.task_index
            roles = menu.addMenu("Role")
            roles.setToolTip("Change this task's role")
            for role in ROLES:
                a = roles.addAction(role)
                a.setCheckable(True)
                a.setChecked(role == item.task.role)
                a.triggered.connect(lambda _=False, r=role: _defer(lambda: c.update_task(i, j, role=r)))
            hosts = c.config.cluster.hosts
            if len(hosts) > 1:
                move = menu.addMenu("Move to host")
                for k, h in enumerate(hosts):
                    if k != i:
                        a = move.addAction(h.name)
                        a.triggered.connect(lambda _=False, k=k: _defer(lambda: c.move_task(i, j, k)))
            menu.addSeparator()
            add("Delete task", lambda: c.remove_task(i, j), "Remove this task from its host")
        elif isinstance(item, HostItem):
            i = item.host_index
            for role in ROLES:
                add(f"Add {role} task", partial(c.add_task, i, role), f"Place a new {role} task on this host")
            menu.addSeparator()
            slurm = item.host.slurm if item.host.is_slurm else None
            if slurm is not None:
                per = slurm.gpus_per_node
                add("Add GPU per node", lambda: c.update_slurm(i, gpus_per_node=per + 1),
                    "Ask Slurm for one more GPU on each node (--gres=gpu:N)")
                add("Remove GPU per node", lambda: c.update_slurm(i, gpus_per_node=per - 1),
                    "Ask Slurm for one GPU fewer on each node", enabled=per > 0)
                add("Make a machine", lambda: c.set_host_kind(i, "machine"),
                    "Turn this Slurm group into one machine (its GPUs per node become the machine's GPUs)")
            else:
                gpus = item.host.gpus
                add("Add GPU", lambda: c.update_host(i, gpus=gpus + 1), "One more GPU slot on this host")
                add("Remove GPU", lambda: c.update_host(i, gpus=gpus - 1), "One GPU slot fewer", enabled=gpus > 0)
                add("Make a Slurm group", lambda: c.set_host_kind(i, "slurm"),
                    "Run these tasks on nodes Slurm allocates (partition, nodes, time limit in its properties)")
            menu.addSeparator()
            add("Delete host", lambda: c.remove_host(i), "Remove this host and its tasks")
        else:
            pos = (scene_pos.x(), scene_pos.y()) if scene_pos is not None else None
            add("Add host here", lambda: c.add_host(pos), "Add a host box at this place")
            add("Add Slurm group here", lambda: c.add_host(pos, kind="slurm"),
                "Add a group of nodes Slurm allocates (partition, nodes, GPUs per node, time limit) at this place")
        return menu
