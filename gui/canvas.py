"""The cluster canvas: hosts as boxes with their GPU slots, tasks as coloured chips inside them.

The scene is rebuilt from the document on every cluster edit (clusters are small) and the
view fits it at a readable scale (a cluster too big to read whole scrolls, with a hint saying
so); the shown run only recolours the chips. Each GPU square carries its id and the colour of
the task that owns it; the chip repeats that colour and names its GPUs. Items never change
the config themselves: they call the document model, deferred to the next event-loop turn so
an item is never deleted inside its own event handler.

The items are :mod:`gui.canvas_items`, the right-click menu :mod:`gui.canvas_menu` (their public
names are importable from here too).
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QContextMenuEvent,
    QFocusEvent,
    QKeyEvent,
    QKeySequence,
    QPainter,
    QPaintEvent,
    QPen,
    QResizeEvent,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsObject,
    QGraphicsScene,
    QGraphicsView,
    QLabel,
    QMenu,
    QVBoxLayout,
    QWidget,
)

from engine.contract.config import Problem
from gui import canvas_keys, gpu_notice, theme
from gui.canvas_items import (
    GPU_SLOT_W,
    MAX_GPU_SLOTS,
    SLURM_COLOR,
    ChipItem,
    HostItem,
    defer,
    gpu_list,
    plural,
    slurm_resources,
    slurm_subtitle,
)
from gui.canvas_menu import context_menu
from gui.document_model import DocumentModel, Selection, problem_target
from gui.run_session import RunSession

__all__ = [
    "COMPACT_SCALE", "GPU_SLOT_W", "MAX_GPU_SLOTS", "MAX_SCALE", "READABLE_SCALE", "SLURM_COLOR", "ChipItem",
    "ClusterCanvas", "ClusterView", "HostItem", "gpu_list", "plural", "slurm_resources", "slurm_subtitle",
]

#: Below this zoom the chips' text is too small to read: the view scrolls instead of shrinking more.
#: At 0.85 a chip's smallest text (8 pt, 10.7 px at 96 dpi) is 9 px high.
READABLE_SCALE = 0.85
#: While a run is watched the cluster is a compact status view, still readable (a larger cluster scrolls,
#: and the task table lists every task's state).
COMPACT_SCALE = READABLE_SCALE
MAX_SCALE = 1.3


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
                defer(lambda: doc.move_task(i, j, target))
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
        """Each chip shows its task's state: only the chips whose state, pid, reason or emulation changed
        are drawn again (a fold of 1,024 tasks' CPU figures changes none of them)."""
        tasks = self.session.state.tasks
        emulated = self.emulated_tasks()
        for host in self.hosts:
            for chip in host.chips:
                state = tasks.get(chip.task.name)
                fake = chip.task.name in emulated
                shown = (id(state), None if state is None else (state.state, state.pid, state.reason), fake)
                if shown != chip.shown:
                    chip.shown = shown
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
        """The right-click menu for a chip, a host or the empty canvas (see :mod:`gui.canvas_menu`)."""
        return context_menu(self, self.document, item, scene_pos)
