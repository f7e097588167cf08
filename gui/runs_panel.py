"""The Runs panel: every run under the runs folder (running and past), filterable, with what can be done to it.

It lists what its :class:`~gui.runs_location.RunsSource` finds, again every second while it is shown (a run started
elsewhere, by ``clusterdeck run --detach`` or another window, appears within that) — this machine's runs folder,
or one on another machine chosen in its Location (listed over ssh, every 10 s) — and asks for what the user picks
through its signals; :class:`gui.runs_commands.RunsCommands` does it (with the questions it needs).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QModelIndex, QPoint, QSettings, Qt, QTimer, QUrl, Signal, SignalInstance
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication, QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gui import runs_actions
from gui.run_session import RunSession
from gui.runs_filter_field import FilterField
from gui.runs_location import Listing, LocationBar, RunsSource
from gui.runs_model import COLUMNS, RunsFilter, RunsModel
from gui.runs_scan import STATES, RunEntry

#: How often the list is read again while the panel shows (milliseconds; a remote folder: every 10 s).
REFRESH_MS = 1000
SETTINGS_PREFIX = "runsPanel"


def empty_text(listing: Listing, root: Path) -> str:
    """What the panel says where it lists no run."""
    if listing.location:
        if listing.problem:
            return f"No runs listed from {listing.location} (why: the line above)."
        return (f"No runs in the runs folder on {listing.location}.\nRuns started there (clusterdeck run --detach) "
                "appear here.")
    if listing.problem:
        return f"The runs folder cannot be listed: {listing.problem}.\nChoose another with File ▸ Runs Folder…"
    return (f"No runs yet in {root}.\nPress Run (F5) to start one; runs started from a terminal "
            "(clusterdeck run --detach) appear here too.")


class RunsPanel(QWidget):
    """The runs of ``session``'s runs folder (or of a remote one); the run the window shows is in bold."""

    openRequested = Signal(object)  # Path: show it (a running run is attached to)
    remoteRequested = Signal(str)  # user@host:/path: attach to a run on another machine over ssh
    attachRequested = Signal(object)  # Path: follow a running run live
    windowRequested = Signal(object)  # Path: show it in a new window
    stopRequested = Signal(list)  # list[RunEntry]
    compareRequested = Signal(list)  # list[Path]: overlay on the shown run
    deleteRequested = Signal(list)  # list[RunEntry]
    folderRequested = Signal()  # the folder picker: a run folder elsewhere

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runsPanel")
        self.session = session
        self.source = RunsSource(session.runs_root, self)
        self.source.listed.connect(self._listed)
        self.model = RunsModel(self)
        self.proxy = RunsFilter(self.model)
        self.problem: str | None = None  # why the runs cannot be listed (one line), or None

        self.location = LocationBar()
        self.location.chosen.connect(self._location_chosen)
        self.location.reload.connect(self.refresh)
        self.source.busyChanged.connect(self.location.set_busy)
        self.filter = FilterField()
        self.filter.textChanged.connect(self.proxy.set_text)
        self.filter.textChanged.connect(self._counted)
        self.filter.toList.connect(self._to_list)
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
        bar.addWidget(self.location, 3)
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
        layout.addWidget(self.location.notice)  # why the location cannot be listed, in one line
        layout.addWidget(self.table, 1)
        layout.addWidget(self.empty, 1)

        self.timer = QTimer(self)
        self.timer.setObjectName("runsRefresh")
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.source.tick)
        session.runsRootChanged.connect(self._root_changed)
        session.runLoaded.connect(self._shown_changed)
        session.runStateChanged.connect(self._shown_changed)
        session.runReleased.connect(lambda _path: self.refresh())
        self.refresh()
        self._update_actions()

    # ------------------------------------------------------------------ building

    def _make_actions(self) -> dict[str, QAction]:
        out = runs_actions.make_actions(self, self.table)
        out["open"].triggered.connect(lambda: self._one(self.openRequested))
        out["attach"].triggered.connect(lambda: self._one(self.attachRequested))
        out["window"].triggered.connect(lambda: self._one(self.windowRequested))
        out["stop"].triggered.connect(lambda: self.stopRequested.emit([e for e in self.selected() if e.live]))
        out["compare"].triggered.connect(self._compare)
        out["delete"].triggered.connect(lambda: self.deleteRequested.emit(self.selected()))
        out["folder"].triggered.connect(self.folderRequested.emit)
        out["copy"].triggered.connect(self._copy)
        out["reveal"].triggered.connect(self._reveal)
        out["find"].triggered.connect(self.focus_filter)
        return out

    def _button(self, name: str) -> QToolButton:
        self.buttons[name] = button = runs_actions.tool_button(self.actions_by_name[name])
        return button

    # ------------------------------------------------------------------ reading the runs folder

    def refresh(self) -> None:
        """Look at the runs again: this machine's folder now (cheap: a listing and a stat or two per run), a remote
        one over ssh (off the GUI thread: the list follows when it comes)."""
        self.source.refresh()

    def _listed(self, listing: Listing) -> None:
        self.problem = listing.problem
        if not listing.location or listing.problem is None:  # a remote folder that failed keeps what it listed
            self.model.set_entries(listing.entries)
        if listing.location and listing.problem is None:
            self.location.remember(listing.location)
        self.location.say(listing.problem if listing.location else None)
        self.empty.setText(empty_text(listing, self.source.scanner.root))
        self._rows_shown()
        self._update_actions()

    def _rows_shown(self) -> None:
        has_rows = bool(self.model.entries)
        self.table.setVisible(has_rows)
        self.empty.setVisible(not has_rows)
        self._counted()

    def _location_chosen(self) -> None:
        """Another location: its runs replace the list (a remote one's once they come, over ssh)."""
        target = self.location.target
        self.source.set_target(target)
        self.model.set_entries([])
        self.location.say(None)
        self.empty.setText(f"Listing the runs on {target} over ssh…" if target is not None else "")
        self._rows_shown()
        self.refresh()

    def _counted(self, *_args: object) -> None:
        total = len(self.model.entries)
        running = sum(1 for e in self.model.entries if e.live)
        shown = self.proxy.rowCount()
        text = f"{total} run{'s' if total != 1 else ''}" + (f" · {running} running" if running else "")
        if shown != total:
            text = f"{shown} of {text}"
        self.count.setText(text)
        target = self.source.target
        self.count.setToolTip(f"Runs under {self.source.scanner.root}" if target is None else
                              f"Runs in the runs folder on {target}, listed over ssh")

    def _root_changed(self, root: Path) -> None:
        self.source.set_root(root)
        self.refresh()

    def _shown_changed(self, *_args: object) -> None:
        self.model.set_shown(self.session.remote_run or self.session.run_dir)
        if self.session.run_dir is not None:
            self.source.scanner.forget(self.session.run_dir)
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

    def row_of(self, path: Path | str) -> int:
        """The view's row of the run at ``path`` (or ``user@host:/path``; -1: not listed, or filtered out)."""
        for r in range(self.proxy.rowCount()):
            entry = self.proxy.entry_at(self.proxy.index(r, 0))
            if entry.key == str(path) or entry.path == Path(path):
                return r
        return -1

    def select(self, path: Path | str) -> bool:
        """Select (and scroll to) the run at ``path``; False when it is not listed."""
        row = self.row_of(path)
        if row < 0:
            return False
        index = self.proxy.index(row, 0)
        self.table.setCurrentIndex(index)
        self.table.selectRow(row)
        self.table.scrollTo(index)
        return True

    def is_shown(self, entry: RunEntry) -> bool:
        """Whether ``entry`` is the run the window shows."""
        return entry.key == self.session.remote_run if entry.remote else entry.path == self.session.run_dir

    def _update_actions(self, *_args: object) -> None:
        chosen = tuple(self.selected())
        runs_actions.update(self.actions_by_name, runs_actions.Selected(
            chosen, tuple(self.is_shown(e) for e in chosen), self.session.is_running))

    def _one(self, signal: SignalInstance) -> None:
        entry = self.current()
        if entry is not None:
            self._request(entry, signal)

    def _activated(self, index: QModelIndex) -> None:
        if index.isValid():
            self._request(self.proxy.entry_at(index), self.openRequested)

    def _request(self, entry: RunEntry, signal: SignalInstance) -> None:
        """Open or attach to ``entry``: a remote run is attached to over ssh, history first."""
        if entry.remote:
            self.remoteRequested.emit(entry.remote)
        else:
            signal.emit(entry.path)

    def _compare(self) -> None:
        self.compareRequested.emit([e.path for e in self.selected() if not e.remote and not self.is_shown(e)])

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText("\n".join(e.key for e in self.selected()))

    def _reveal(self) -> None:
        entry = self.current()
        if entry is not None and not entry.remote:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(entry.path)))

    def _context_menu(self, pos: QPoint) -> None:
        self._update_actions()
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        a = self.actions_by_name
        menu.addActions([a["open"], a["window"], a["attach"], a["stop"], a["compare"]])
        menu.addSeparator()
        menu.addActions([a["copy"], a["reveal"]])
        menu.addSeparator()
        menu.addAction(a["delete"])
        menu.popup(self.table.viewport().mapToGlobal(pos))

    # ------------------------------------------------------------------ keys

    def focus_filter(self) -> None:
        self.filter.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.filter.selectAll()

    def _to_list(self) -> None:
        """Down or Enter in the filter field: the list takes the focus (its first row selected)."""
        if self.proxy.rowCount():
            self.table.setFocus(Qt.FocusReason.OtherFocusReason)
            if not self.selected():
                self.table.selectRow(0)
                self.table.setCurrentIndex(self.proxy.index(0, 0))

    # ------------------------------------------------------------------ shown or not

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh()
        self.timer.start()  # this machine's folder every second; a remote one every 10 s

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
