"""The Runs panel: every run under the runs folder (running and past), filterable, with what can be done to it.

It lists what :class:`~gui.runs_scan.RunsScanner` finds, again every second while it is shown (a run started
elsewhere, by ``clusterdeck run --detach`` or another window, appears within that), and asks for what the
user picks through its signals; :class:`gui.runs_commands.RunsCommands` does it (with the questions it needs).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import (
    QByteArray,
    QEvent,
    QModelIndex,
    QObject,
    QPoint,
    QSettings,
    QSize,
    Qt,
    QTimer,
    QUrl,
    Signal,
    SignalInstance,
)
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication, QHideEvent, QKeySequence, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QStyle,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gui.run_session import RunSession
from gui.runs_model import COLUMNS, RunsFilter, RunsModel
from gui.runs_scan import STATES, RunEntry, RunsScanner

#: How often the list is read again while the panel shows (milliseconds).
REFRESH_MS = 1000
SETTINGS_PREFIX = "runsPanel"
SP = QStyle.StandardPixmap
#: The panel's commands (name, text, tip, icon, key): its buttons and its list's context menu.
ACTIONS: tuple[tuple[str, str, str, QStyle.StandardPixmap | None, str | None], ...] = (
    ("open", "Open", "Show the selected run: its config, curves, tasks and logs (a running run is attached "
     "to and followed live) — Enter or double-click", SP.SP_DialogOpenButton, "Return"),
    ("attach", "Attach", "Follow the selected running run live in this window; Stop then stops it. The run "
     "shown before keeps going if it was started detached", SP.SP_MediaPlay, None),
    ("stop", "Stop", "Stop the selected running runs through their control channel (your own runs only)",
     SP.SP_MediaStop, None),
    ("compare", "Compare", "Overlay the selected runs' replica curves, dashed, on the run shown",
     SP.SP_FileDialogContentsView, None),
    ("delete", "Delete…", "Delete the selected runs' folders (asks first; a running run is never deleted) — "
     "Del", SP.SP_TrashIcon, "Delete"),
    ("folder", "Open Folder…", "Open a run folder from anywhere (one not under the runs folder)",
     SP.SP_DirOpenIcon, None),
    ("copy", "Copy Path", "Copy the selected runs' folder paths", None, "Ctrl+C"),
    ("reveal", "Show in File Manager", "Open the run's folder in the file manager", None, None),
    ("find", "Filter", "Filter the runs", None, "Ctrl+F"),
)


class RunsPanel(QWidget):
    """The runs of ``session``'s runs folder; the run the window shows is in bold."""

    openRequested = Signal(object)  # Path: show it (a running run is attached to)
    attachRequested = Signal(object)  # Path: follow a running run live
    stopRequested = Signal(list)  # list[RunEntry]
    compareRequested = Signal(list)  # list[Path]: overlay on the shown run
    deleteRequested = Signal(list)  # list[RunEntry]
    folderRequested = Signal()  # the folder picker: a run folder elsewhere

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runsPanel")
        self.session = session
        self.scanner = RunsScanner(session.runs_root)
        self.model = RunsModel(self)
        self.proxy = RunsFilter(self.model)
        self.problem: str | None = None

        self.filter = QLineEdit()
        self.filter.setObjectName("runsFilter")
        self.filter.setPlaceholderText("Filter runs…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setToolTip("Show the runs whose name, state, mode or hosts hold every word typed "
                               "(Ctrl+F in the panel; Down or Enter goes to the list)")
        self.filter.textChanged.connect(self.proxy.set_text)
        self.filter.textChanged.connect(self._counted)
        self.filter.installEventFilter(self)
        self.state = QComboBox()
        self.state.setObjectName("runsState")
        self.state.addItem("All states", "")
        for state in STATES:
            self.state.addItem(state.capitalize(), state)
        self.state.setToolTip("Show the runs in one state only")
        self.state.currentIndexChanged.connect(lambda _i: self.proxy.set_state(str(self.state.currentData())))
        self.state.currentIndexChanged.connect(self._counted)

        self.table = QTableView()
        self.table.setObjectName("runsTable")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.setTabKeyNavigation(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        header.setSortIndicator(COLUMNS.index("Started"), Qt.SortOrder.DescendingOrder)  # newest first
        for column, width in (("Run", 260), ("State", 130), ("Progress", 150), ("Duration", 80), ("Mode", 64),
                              ("Hosts", 90)):
            header.resizeSection(COLUMNS.index(column), width)
        self.table.doubleClicked.connect(self._activated)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
        self.table.selectionModel().selectionChanged.connect(self._update_actions)
        self.empty = QLabel()
        self.empty.setObjectName("runsEmpty")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.count = QLabel()
        self.count.setObjectName("runsCount")

        self.actions_by_name = self._make_actions()
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.setSpacing(4)
        bar.addWidget(self.filter, 2)
        bar.addWidget(self.state)
        self.buttons: dict[str, QToolButton] = {}
        for name in ("open", "attach", "stop", "compare", "delete"):
            bar.addWidget(self._button(name))
        bar.addWidget(self.count, 1, Qt.AlignmentFlag.AlignRight)
        bar.addWidget(self._button("folder"))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(3)
        layout.addLayout(bar)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.empty, 1)

        self.timer = QTimer(self)
        self.timer.setObjectName("runsRefresh")
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        session.runsRootChanged.connect(self._root_changed)
        session.runLoaded.connect(self._shown_changed)
        session.runStateChanged.connect(self._shown_changed)
        session.runReleased.connect(lambda _path: self.refresh())
        self.refresh()
        self._update_actions()

    # ------------------------------------------------------------------ building

    def _make_actions(self) -> dict[str, QAction]:
        out: dict[str, QAction] = {}
        for name, text, tip, icon, key in ACTIONS:
            action = QAction(text, self)
            action.setObjectName(f"runs_{name}Action")
            action.setToolTip(tip)
            action.setStatusTip(tip)
            if icon is not None:
                action.setIcon(self.style().standardIcon(icon))
            if key is not None:
                action.setShortcut(QKeySequence(key))
                action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            out[name] = action
        for name in ("open", "delete", "copy"):  # keys of the list, not of the filter field
            self.table.addAction(out[name])
            out[name].setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.addAction(out["find"])
        out["open"].triggered.connect(lambda: self._one(self.openRequested))
        out["attach"].triggered.connect(lambda: self._one(self.attachRequested))
        out["stop"].triggered.connect(lambda: self.stopRequested.emit([e for e in self.selected() if e.live]))
        out["compare"].triggered.connect(self._compare)
        out["delete"].triggered.connect(lambda: self.deleteRequested.emit(self.selected()))
        out["folder"].triggered.connect(self.folderRequested.emit)
        out["copy"].triggered.connect(self._copy)
        out["reveal"].triggered.connect(self._reveal)
        out["find"].triggered.connect(self.focus_filter)
        return out

    def _button(self, name: str) -> QToolButton:
        button = QToolButton()
        button.setObjectName(f"runs_{name}Button")
        button.setDefaultAction(self.actions_by_name[name])
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        button.setAutoRaise(True)
        button.setIconSize(QSize(16, 16))
        self.buttons[name] = button
        return button

    # ------------------------------------------------------------------ reading the runs folder

    def refresh(self) -> None:
        """Look at the runs folder again (cheap: a listing and a stat or two per run)."""
        scan = self.scanner.scan()
        self.problem = scan.problem
        self.model.set_entries(scan.entries)
        root = self.scanner.root
        if scan.problem:
            self.empty.setText(f"The runs folder cannot be listed: {scan.problem}.\nChoose another with "
                               "File ▸ Runs Folder…")
        elif not scan.entries:
            self.empty.setText(f"No runs yet in {root}.\nPress Run (F5) to start one; runs started from a terminal "
                               "(clusterdeck run --detach) appear here too.")
        has_rows = bool(scan.entries)
        self.table.setVisible(has_rows)
        self.empty.setVisible(not has_rows)
        self._counted()
        self._update_actions()

    def _counted(self, *_args: object) -> None:
        total = len(self.model.entries)
        running = sum(1 for e in self.model.entries if e.live)
        shown = self.proxy.rowCount()
        text = f"{total} run{'s' if total != 1 else ''}" + (f" · {running} running" if running else "")
        if shown != total:
            text = f"{shown} of {text}"
        self.count.setText(text)
        self.count.setToolTip(f"Runs under {self.scanner.root}")

    def _root_changed(self, root: Path) -> None:
        self.scanner = RunsScanner(root)
        self.refresh()

    def _shown_changed(self, *_args: object) -> None:
        self.model.set_shown(self.session.run_dir)
        if self.session.run_dir is not None:
            self.scanner.forget(self.session.run_dir)
        QTimer.singleShot(300, self._refresh_if_shown)  # a state just changed: the list follows soon

    def _refresh_if_shown(self) -> None:
        if self.timer.isActive():
            self.refresh()

    # ------------------------------------------------------------------ the selection

    def selected(self) -> list[RunEntry]:
        rows = sorted({i.row() for i in self.table.selectionModel().selectedRows()})
        return [self.proxy.entry_at(self.proxy.index(r, 0)) for r in rows]

    def current(self) -> RunEntry | None:
        chosen = self.selected()
        return chosen[0] if len(chosen) == 1 else None

    def row_of(self, path: Path) -> int:
        """The view's row of the run at ``path`` (-1: not listed, or filtered out)."""
        for r in range(self.proxy.rowCount()):
            if self.proxy.entry_at(self.proxy.index(r, 0)).path == Path(path):
                return r
        return -1

    def select(self, path: Path) -> bool:
        """Select (and scroll to) the run at ``path``; False when it is not listed."""
        row = self.row_of(path)
        if row < 0:
            return False
        index = self.proxy.index(row, 0)
        self.table.setCurrentIndex(index)
        self.table.selectRow(row)
        self.table.scrollTo(index)
        return True

    def _update_actions(self, *_args: object) -> None:
        chosen = self.selected()
        one = len(chosen) == 1
        shown = self.session.run_dir
        a = self.actions_by_name
        a["open"].setEnabled(one)
        a["attach"].setEnabled(one and chosen[0].live and not (chosen[0].path == shown and self.session.is_running))
        a["stop"].setEnabled(any(e.live for e in chosen))
        a["compare"].setEnabled(any(e.path != shown for e in chosen))
        a["delete"].setEnabled(bool(chosen) and not any(e.live for e in chosen))
        a["copy"].setEnabled(bool(chosen))
        a["reveal"].setEnabled(one)
        live = [e for e in chosen if e.live]
        a["delete"].setToolTip("A running run is never deleted: stop it first" if live else
                               "Delete the selected runs' folders (asks first) — Del")

    def _one(self, signal: SignalInstance) -> None:
        entry = self.current()
        if entry is not None:
            signal.emit(entry.path)

    def _activated(self, index: QModelIndex) -> None:
        if index.isValid():
            self.openRequested.emit(self.proxy.entry_at(index).path)

    def _compare(self) -> None:
        shown = self.session.run_dir
        self.compareRequested.emit([e.path for e in self.selected() if e.path != shown])

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText("\n".join(str(e.path) for e in self.selected()))

    def _reveal(self) -> None:
        entry = self.current()
        if entry is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(entry.path)))

    def _context_menu(self, pos: QPoint) -> None:
        self._update_actions()
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        a = self.actions_by_name
        menu.addActions([a["open"], a["attach"], a["stop"], a["compare"]])
        menu.addSeparator()
        menu.addActions([a["copy"], a["reveal"]])
        menu.addSeparator()
        menu.addAction(a["delete"])
        menu.popup(self.table.viewport().mapToGlobal(pos))

    # ------------------------------------------------------------------ keys

    def focus_filter(self) -> None:
        self.filter.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.filter.selectAll()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        """Down or Enter in the filter field goes to the list (its first row selected); Escape clears it."""
        if watched is self.filter and event.type() == QEvent.Type.KeyPress:
            key = event.key()  # type: ignore[attr-defined]
            if key in (Qt.Key.Key_Down, Qt.Key.Key_Return, Qt.Key.Key_Enter) and self.proxy.rowCount():
                self.table.setFocus(Qt.FocusReason.OtherFocusReason)
                if not self.selected():
                    self.table.selectRow(0)
                    self.table.setCurrentIndex(self.proxy.index(0, 0))
                return True
            if key == Qt.Key.Key_Escape and self.filter.text():
                self.filter.clear()
                return True
        return super().eventFilter(watched, event)

    # ------------------------------------------------------------------ shown or not

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh()
        self.timer.start()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self.timer.stop()  # a hidden list is not read

    def stop(self) -> None:
        self.timer.stop()

    # ------------------------------------------------------------------ remembered

    def save_state(self, settings: QSettings) -> None:
        settings.setValue(f"{SETTINGS_PREFIX}/header", self.table.horizontalHeader().saveState())
        settings.setValue(f"{SETTINGS_PREFIX}/state", str(self.state.currentData()))

    def restore_state(self, settings: QSettings) -> None:
        header = settings.value(f"{SETTINGS_PREFIX}/header")
        if isinstance(header, QByteArray) and not header.isEmpty():
            self.table.horizontalHeader().restoreState(header)
        index = self.state.findData(str(settings.value(f"{SETTINGS_PREFIX}/state", "")))
        if index >= 0:
            self.state.setCurrentIndex(index)
