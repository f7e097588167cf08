"""The window's layout: the central splitter (the cluster above, the plots below) in a design and a
watch layout, each with the sizes the user gave it, and the window's geometry and docks, all
remembered between sessions.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QEvent, QObject, QSettings, QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDockWidget,
    QFrame,
    QGroupBox,
    QLabel,
    QMainWindow,
    QScrollArea,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

#: Share of the central splitter the cluster gets: large while designing, a compact status view
#: while a run is watched (the plots get the room); the user's own sizes per layout are remembered.
LAYOUT_SHARES = {"design": 0.58, "watch": 0.34}
#: The window's size on first start (shrunk to the screen).
FIRST_SIZE = QSize(1500, 940)


#: Share of a large screen's free area the first window takes (a laptop's gets nearly all of it).
FIRST_SHARE = 0.85


def first_size(available: QSize) -> QSize:
    """The window's size on first start: 85 % of the screen's free area, but never smaller than
    :data:`FIRST_SIZE` shrunk to fit (a laptop screen gets nearly all of its area)."""
    fit = screen_fit_size(FIRST_SIZE, available)
    return QSize(max(fit.width(), int(available.width() * FIRST_SHARE)),
                 max(fit.height(), int(available.height() * FIRST_SHARE)))


def screen_fit_size(wanted: QSize, available: QSize) -> QSize:
    """``wanted``, shrunk to fit ``available`` (a screen's free area) with a margin."""
    return QSize(min(wanted.width(), int(available.width() * 0.96)),
                 min(wanted.height(), int(available.height() * 0.94)))


def titled(title: str, widget: QWidget, tip: str) -> QWidget:
    """``widget`` under a bold title (``tip`` on the title)."""
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(4, 4, 4, 0)
    layout.setSpacing(2)
    label = QLabel(f"<b>{title}</b>")
    label.setToolTip(tip)
    layout.addWidget(label)
    layout.addWidget(widget, 1)
    return box


#: Docks whose content is a column of forms (the problems, the selected host or task, the run settings): on a
#: short screen the column scrolls as a whole, in one scroll area, instead of each part scrolling on its own.
SCROLLING_DOCKS = ("settingsDock",)


class ColumnScroll(QScrollArea):
    """The one scroll area of a dock's column: up and down only, never narrower than the column needs (so no
    row is cut off at the right), as short as the dock likes (the column scrolls)."""

    def __init__(self, column: QWidget, name: str) -> None:
        super().__init__()
        self.setObjectName(name)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(column)
        column.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()  # a row shown or hidden may change the width the column needs
        return super().eventFilter(watched, event)

    def minimumSizeHint(self) -> QSize:
        column = self.widget()
        needed = column.minimumSizeHint().width() if column is not None else 0
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        return QSize(needed + bar + 2 * self.frameWidth(), 4 * self.fontMetrics().height())


def scroll_area_of(widget: QWidget) -> QScrollArea | None:
    """The scroll area ``widget`` lies in; None when it lies in none."""
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QScrollArea):
        parent = parent.parentWidget()
    return parent


def reveal(widget: QWidget) -> None:
    """Scroll the scroll area ``widget`` lies in (if any) so that it is in view."""
    area = scroll_area_of(widget)
    if area is not None:
        area.ensureWidgetVisible(widget)


def add_dock(window: QMainWindow, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
    """``widget`` in a dock of ``window`` (``name``: its key in the saved window state); the column of a dock
    named in :data:`SCROLLING_DOCKS` scrolls as a whole."""
    dock = QDockWidget(title, window)
    dock.setObjectName(name)
    dock.setWidget(ColumnScroll(widget, f"{name}Scroll") if name in SCROLLING_DOCKS else widget)
    dock.setToolTip("")
    window.addDockWidget(area, dock)
    return dock


class WindowLayout(QObject):
    """Owns the central ``splitter`` of ``window`` and which layout it shows (:attr:`mode`)."""

    modeChanged = Signal(str)  # "design" or "watch", before the splitter takes that layout's sizes

    def __init__(self, window: QMainWindow, top: QWidget, bottom: QWidget | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.mode = "design"
        self._sizes: dict[str, list[int]] = {}
        self._shown = False
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setObjectName("centralSplitter")
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(top)
        if bottom is not None:
            self.set_bottom(bottom)
        self.splitter.splitterMoved.connect(lambda _pos, _index: self.remember())
        window.setCentralWidget(self.splitter)

    def set_bottom(self, bottom: QWidget) -> None:
        """The lower pane (the plots); a window may add it after its docks, for their Tab order."""
        self.splitter.addWidget(bottom)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)

    def set_mode(self, mode: str) -> None:
        """``design`` (the canvas large) or ``watch`` (the plots large); each keeps the user's sizes."""
        if mode not in LAYOUT_SHARES:
            raise ValueError(f"mode: expected one of {sorted(LAYOUT_SHARES)}, got {mode!r}")
        if mode == self.mode:
            return
        self.remember()
        self.mode = mode
        self.modeChanged.emit(mode)
        self.apply()

    def sizes(self, mode: str) -> list[int] | None:
        """The sizes the user gave ``mode`` (None until there are some)."""
        sizes = self._sizes.get(mode)
        return list(sizes) if sizes is not None else None

    def apply(self) -> None:
        """The current layout's sizes, as proportions of the splitter's height now."""
        total = sum(self.splitter.sizes()) or max(1, self.splitter.height())
        sizes = self._sizes.get(self.mode)
        if sizes and len(sizes) == 2 and sum(sizes) > 0:
            first = round(total * sizes[0] / sum(sizes))
        else:
            first = int(total * LAYOUT_SHARES[self.mode])
        self.splitter.setSizes([first, total - first])

    def remember(self) -> None:
        """Keep the splitter's sizes now as the current layout's."""
        sizes = self.splitter.sizes()
        if sum(sizes) > 0:
            self._sizes[self.mode] = sizes

    def shown(self) -> None:
        """The window is shown: the first time, the splitter has its real height only now."""
        if not self._shown:
            self._shown = True
            self.apply()

    # ------------------------------------------------------------------ remembered between sessions

    def restore(self, settings: QSettings, side_dock: QDockWidget, bottom_dock: QDockWidget) -> None:
        """The window's geometry, docks and splitter sizes as last saved; on first start a size that
        fits the screen, ``side_dock`` a fifth of its width and ``bottom_dock`` a sixth of its height."""
        window = self.window
        screen = window.screen() or QGuiApplication.primaryScreen()
        available = screen.availableGeometry().size() if screen is not None else FIRST_SIZE
        geometry = settings.value("window/geometry")
        # Qt refuses a geometry it cannot place (one saved on another screen, or unreadable): a first start's size
        if isinstance(geometry, QByteArray) and not geometry.isEmpty() and window.restoreGeometry(geometry):
            window.resize(screen_fit_size(window.size(), available))  # the screen may be smaller now
        else:
            size = first_size(available)
            window.resize(size)
            window.resizeDocks([side_dock], [max(280, min(340, size.width() // 5))], Qt.Orientation.Horizontal)
            window.resizeDocks([bottom_dock], [max(130, size.height() // 6)], Qt.Orientation.Vertical)
        state = settings.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            window.restoreState(state)
        for mode in LAYOUT_SHARES:
            value = settings.value(f"window/splitter/{mode}")
            if isinstance(value, list) and len(value) == 2:
                try:
                    self._sizes[mode] = [int(v) for v in value]
                except (TypeError, ValueError):
                    pass
        self.apply()

    def save(self, settings: QSettings) -> None:
        self.remember()
        settings.setValue("window/geometry", self.window.saveGeometry())
        settings.setValue("window/state", self.window.saveState())
        for mode, sizes in self._sizes.items():
            settings.setValue(f"window/splitter/{mode}", sizes)


def show_dock(window: QMainWindow, dock: QDockWidget, share: float = 1 / 3, most: int = 320) -> None:
    """Show and raise ``dock``, at least ``share`` of the window's height (up to ``most`` pixels) when it
    sits in a top or bottom area: a log needs more than the three lines a laptop screen's docks leave."""
    dock.show()
    dock.raise_()
    if window.dockWidgetArea(dock) in (Qt.DockWidgetArea.BottomDockWidgetArea, Qt.DockWidgetArea.TopDockWidgetArea):
        wanted = min(most, int(window.height() * share))
        if dock.height() < wanted:
            window.resizeDocks([dock], [wanted], Qt.Orientation.Vertical)


def scrolled(view: QWidget) -> QScrollArea:
    """``view`` in a frameless scroll area: a tall view in a bottom dock never takes height from the plots."""
    area = QScrollArea()
    area.setObjectName(f"{view.objectName()}Scroll")
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setWidget(view)
    return area


def bottom_docks(window: QMainWindow, views: tuple[tuple[str, str, QWidget, str], ...]) -> list[QDockWidget]:
    """A bottom dock per ``(title, name, widget, tip)``, tabbed together in that order, the first raised."""
    docks = []
    for title, name, widget, tip in views:
        dock = add_dock(window, title, name, widget, Qt.DockWidgetArea.BottomDockWidgetArea)
        if tip:
            dock.setToolTip(tip)
        docks.append(dock)
    for above, below in zip(docks, docks[1:], strict=False):
        window.tabifyDockWidget(above, below)
    docks[0].raise_()
    return docks


def inspector(problems: QWidget, properties: QWidget, settings: QWidget) -> tuple[QWidget, QGroupBox]:
    """One column: what stops a run, the selected host or task (in the box returned), the run settings."""
    selection_box = QGroupBox("Selected")
    selection_box.setObjectName("selectionBox")
    box_layout = QVBoxLayout(selection_box)
    box_layout.setContentsMargins(2, 2, 2, 2)
    box_layout.addWidget(properties)
    column = QWidget()
    column.setObjectName("inspector")
    layout = QVBoxLayout(column)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(2)
    layout.addWidget(problems, 0)
    layout.addWidget(selection_box, 0)
    layout.addWidget(settings, 1)
    return column, selection_box
