"""The Runs panel's table: a row per run under the runs folder, and the filter (text and state) over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPixmap

from engine.contract.run_folder import INTERRUPTED
from gui import theme
from gui.runs_scan import RunEntry

COLUMNS = ("Run", "State", "Progress", "Duration", "Mode", "Hosts", "Started")
TIPS = {
    "Run": "The run's folder under the runs folder (its config's name after the start time)",
    "State": "running (its launcher is alive), finished, failed, stopped, or interrupted (its launcher "
             "died without recording an end; its history is kept)",
    "Progress": "The step it reached, of the steps it was to train",
    "Duration": "How long it ran (a running run: until now)",
    "Mode": "Parallelism: data, async (parameter servers) or model",
    "Hosts": "Where its tasks run: this machine (local), over SSH, or on a Slurm allocation",
    "Started": "When it started",
}
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
#: An interrupted run: its launcher died; amber, apart from a stopped run's grey.
INTERRUPTED_COLOR = "#d97706"
_Index = QModelIndex | QPersistentModelIndex


def state_color(state: str) -> str:
    return INTERRUPTED_COLOR if state == INTERRUPTED else theme.STATE_COLORS.get(state, "#8a8f98")


def duration_text(seconds: float | None) -> str:
    """``42s``, ``4m05s``, ``1h02m`` (``-`` when unknown)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(step: int, total: int | None) -> str:
    if total:
        return f"{step:,} of {total:,} ({min(100, 100 * step // total)} %)"
    return f"{step:,}"


def _dot(color: str) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(color))
    painter.drawEllipse(2, 2, 8, 8)
    painter.end()
    return QIcon(pixmap)


class RunsModel(QAbstractTableModel):
    """The runs of the last scan, by folder; :meth:`set_entries` changes only the rows that changed."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.entries: list[RunEntry] = []
        self.shown: Path | str | None = None  # the run the window shows (its row is bold): its folder, or user@host:/path
        self._icons: dict[str, QIcon] = {}

    # ------------------------------------------------------------------ updating

    def set_entries(self, entries: list[RunEntry]) -> None:
        new = {e.row.path: e for e in entries}
        for i in reversed(range(len(self.entries))):  # gone
            if self.entries[i].row.path not in new:
                self.beginRemoveRows(QModelIndex(), i, i)
                del self.entries[i]
                self.endRemoveRows()
        index = {e.row.path: i for i, e in enumerate(self.entries)}
        for path, entry in new.items():
            at = index.get(path)
            if at is None:  # new: appended (the view sorts)
                n = len(self.entries)
                self.beginInsertRows(QModelIndex(), n, n)
                self.entries.append(entry)
                self.endInsertRows()
            elif self.entries[at] != entry:
                self.entries[at] = entry
                self.dataChanged.emit(self.index(at, 0), self.index(at, len(COLUMNS) - 1))

    def is_shown(self, entry: RunEntry) -> bool:
        return self.shown is not None and (entry.key == self.shown if entry.remote else entry.path == self.shown)

    def set_shown(self, path: Path | str | None) -> None:
        if path != self.shown:
            self.shown = path
            if self.entries:
                self.dataChanged.emit(self.index(0, 0), self.index(len(self.entries) - 1, 0))

    def entry(self, row: int) -> RunEntry:
        return self.entries[row]

    # ------------------------------------------------------------------ Qt's model

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802 - Qt's signature
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:  # noqa: N802
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return TIPS[COLUMNS[section]]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.entries):
            return None
        entry = self.entries[index.row()]
        column = COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(entry, column)
        if role == SORT_ROLE:
            return self._sort_key(entry, column)
        if role == Qt.ItemDataRole.ToolTipRole:
            return row_tip(entry, self.is_shown(entry))
        if role == Qt.ItemDataRole.DecorationRole and column == "State":
            color = state_color(entry.row.state)
            if color not in self._icons:
                self._icons[color] = _dot(color)
            return self._icons[color]
        if role == Qt.ItemDataRole.FontRole and column == "Run" and self.is_shown(entry):
            font = QFont()
            font.setBold(True)
            return font
        return None

    @staticmethod
    def _text(entry: RunEntry, column: str) -> str:
        row = entry.row
        if column == "Run":
            return row.run
        if column == "State":
            if entry.live and row.detached:
                return f"{row.state} · detached"
            return row.state
        if column == "Progress":
            return progress_text(row.step, row.total_steps)
        if column == "Duration":
            return duration_text(row.duration_s)
        if column == "Mode":
            return row.mode
        if column == "Hosts":
            return entry.hosts
        return row.started.replace("T", " ")

    @staticmethod
    def _sort_key(entry: RunEntry, column: str) -> Any:
        return sort_key(entry, column)


def sort_key(entry: RunEntry, column: str) -> tuple[Any, ...]:
    """How ``column`` orders runs; runs alike in it by their folder's name (its start time first)."""
    row = entry.row
    if column == "Progress":
        key: Any = row.step / row.total_steps if row.total_steps else float(row.step)
    elif column == "Duration":
        key = row.duration_s if row.duration_s is not None else -1.0
    elif column == "Started":
        key = row.started if row.started != "-" else ""
    elif column == "State":
        key = entry.state_group
    else:
        key = RunsModel._text(entry, column).lower()
    return (key, row.run)


def row_tip(entry: RunEntry, shown: bool) -> str:
    """A run's tooltip: where it is, who runs it, what can be done with it."""
    row = entry.row
    lines = [f"<b>{row.name}</b> — {row.state}", entry.key]
    if entry.remote:
        lines.append(f"On {entry.launcher_host}, reached over your ssh. Enter or double-click attaches: its history, then "
                     "live steps; Stop stops it there. Closing the window or showing another run detaches (it runs on).")
    elif entry.live:
        who = "a launcher of its own (detached: it outlives the app that started it)" if row.detached \
            else "the process that started it (an app window or a clusterdeck run in a terminal)"
        pid = f" (pid {entry.launcher_pid}" + (f" on {entry.launcher_host}" if entry.launcher_host else "") + ")" \
            if entry.launcher_pid else ""
        lines.append(f"Run by {who}{pid}.")
        lines.append("Enter or double-click attaches: its curves and tasks follow it live, Stop stops it.")
    elif row.state == INTERRUPTED:
        lines.append("Its launcher is gone without recording an end (killed, or the machine went down): its "
                     "history up to then is kept and opens as any past run.")
    else:
        lines.append("Enter or double-click opens it: its config, curves, tasks and logs.")
    if not entry.mine and not entry.remote:
        lines.append(f"Another user's run (uid {entry.owner_uid}): it can be looked at, not stopped or deleted.")
    if shown:
        lines.append("<i>Shown in the window now.</i>")
    if row.duration_s is not None and row.started not in ("", "-"):
        lines.append(f"Started {row.started.replace('T', ' ')}, ran {duration_text(row.duration_s)}.")
    return "<br>".join(lines)


class RunsFilter(QSortFilterProxyModel):
    """Rows whose text holds every word typed (any column) and whose state is the chosen one."""

    def __init__(self, model: RunsModel) -> None:
        super().__init__(model)
        self.runs = model
        self.setSourceModel(model)
        self.setDynamicSortFilter(True)
        self._words: list[str] = []
        self._state = ""

    def set_text(self, text: str) -> None:
        words = text.lower().split()
        if words != self._words:
            self._refilter(lambda: setattr(self, "_words", words))

    def set_state(self, state: str) -> None:
        """``""``: every state; else a word of :data:`gui.runs_scan.STATES`."""
        if state != self._state:
            self._refilter(lambda: setattr(self, "_state", state))

    def _refilter(self, change: Any) -> None:
        begin = getattr(self, "beginFilterChange", None)  # Qt 6.9+; invalidateFilter() before
        if begin is None:
            change()
            self.invalidateFilter()
            return
        begin()
        change()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, source_parent: _Index) -> bool:  # noqa: N802 - Qt's name
        entry = self.runs.entry(source_row)
        if self._state and entry.state_group != self._state:
            return False
        if not self._words:
            return True
        row = entry.row
        text = " ".join((row.run, row.name, row.state, row.mode, entry.hosts, row.started,
                         "detached" if row.detached else "")).lower()
        return all(w in text for w in self._words)

    def lessThan(self, left: _Index, right: _Index) -> bool:  # noqa: N802 - Qt's name
        column = COLUMNS[left.column()]
        return sort_key(self.runs.entry(left.row()), column) < sort_key(self.runs.entry(right.row()), column)

    def entry_at(self, index: QModelIndex) -> RunEntry:
        return self.runs.entry(self.mapToSource(index).row())
