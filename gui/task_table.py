"""The task table: host, role, pid, state, CPU %, memory, restarts and straggler flags of every task of the shown run."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QFrame, QHeaderView, QLabel, QScrollArea, QSizePolicy, QTableView, QVBoxLayout, QWidget

from engine.observe.stragglers import StragglerChange
from engine.observe.telemetry import TaskState
from gui import theme
from gui.failure_text import headline
from gui.run_session import RunSession
from gui.run_status import strip_task
from gui.stragglers_view import StragglerWatch, describe_change

COLUMNS = ("Task", "Host", "Role", "PID", "State", "CPU %", "Memory", "GPU %", "Restarts", "Reason", "Straggler")
TIPS = {
    "Task": "role:index of the task",
    "Host": "Host the task runs on",
    "Role": "chief, worker, ps or evaluator",
    "PID": "Process id of the task",
    "State": "starting, running, finished, failed or stopped",
    "CPU %": "CPU use of the task process (100 % = one core)",
    "Memory": "Resident memory of the task process",
    "GPU %": "GPU utilisation of the task's GPUs, where there are GPUs",
    "Restarts": "How often the task was restarted",
    "Straggler": "How much slower than the median of the other replicas a replica of this task steps, "
                 "while it stays slower (hover for its step time)",
    "Reason": "Why the task stopped or failed",
}

_STATE, _REASON, _STRAGGLER = COLUMNS.index("State"), COLUMNS.index("Reason"), COLUMNS.index("Straggler")
_Index = QModelIndex | QPersistentModelIndex
#: The failure report's most height (it scrolls beyond): the table keeps a few rows at 1366x768.
FAILURE_HEIGHT = 96
#: Rows of straggling tasks: a translucent amber that reads on light and dark palettes.
STRAGGLER_BACKGROUND = QColor(234, 179, 8, 70)
#: Rows a column's width is fitted to (Qt reads every cell of the column otherwise: 1.4 s at 1,024 tasks).
FIT_ROWS = 64


def format_bytes(n: float | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class TaskTableModel(QAbstractTableModel):
    """Rows: the tasks of ``session.state``; refreshed when the session folds new events.

    A refresh compares only the rows in sight (``visible()``, set by the view: ``(first, last)``) with
    what they showed: with 1,024 tasks a fold costs the few dozen rows on screen, not every row; a row
    scrolled into sight is read afresh by the view anyway."""

    def __init__(self, session: RunSession, stragglers: StragglerWatch | None = None) -> None:
        super().__init__(session)
        self.session = session
        self.stragglers = stragglers
        self.visible: Callable[[], tuple[int, int]] | None = None
        self.rows: list[TaskState] = []
        self._shown: list[tuple[object, ...]] = []  # per row: what it showed when last refreshed
        if stragglers is not None:
            stragglers.changed.connect(self.refresh)
        session.runLoaded.connect(self.refresh)
        session.runUpdated.connect(self.refresh)
        session.runStateChanged.connect(self.refresh)
        self.refresh()

    def refresh(self, *_args: object) -> None:
        rows = list(self.session.state.tasks.values())
        if len(rows) != len(self.rows) or any(a is not b for a, b in zip(rows, self.rows, strict=False)):
            self.beginResetModel()
            self.rows = rows
            self.endResetModel()
            self._shown = [()] * len(rows)  # (made as rows come into sight)
        elif rows:
            # only the cells in sight whose text changed are repainted (a fold changes a column or two)
            first_row = last_row = first_col = last_col = -1
            low, high = self.visible() if self.visible is not None else (0, len(rows) - 1)
            low, high = max(0, low), min(len(rows) - 1, high)
            for i in range(low, high + 1):
                task = rows[i]
                texts = self._row_texts(task)
                old = self._shown[i]
                if texts == old:
                    continue
                self._shown[i] = texts
                if old:
                    cols = [c for c, (a, b) in enumerate(zip(texts, old, strict=True)) if a != b]
                else:  # first compared in sight: the whole row, once
                    cols = [0, len(COLUMNS) - 1]
                if cols[-1] >= len(COLUMNS):  # the log tail or reason: tooltips of State and Reason
                    cols = sorted({*(c for c in cols if c < len(COLUMNS)), _STATE, _REASON})
                if _STRAGGLER in cols:  # the row's background: every cell
                    cols = [0, len(COLUMNS) - 1]
                first_row = i if first_row < 0 else first_row
                last_row = i
                first_col = cols[0] if first_col < 0 else min(first_col, cols[0])
                last_col = max(last_col, cols[-1])
            if first_row >= 0:
                self.dataChanged.emit(self.index(first_row, first_col), self.index(last_row, last_col))

    def _row_texts(self, task: TaskState) -> tuple[object, ...]:
        """What a row shows (text per column, with the state's colour and the straggler flags)."""
        return (*(self.text(task, c) for c in COLUMNS), tuple(task.log_tail[-10:]), task.reason)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal:
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return TIPS[COLUMNS[section]]
        return None

    def text(self, task: TaskState, column: str) -> str:
        if column == "Task":
            return task.name
        if column == "Host":
            return task.host
        if column == "Role":
            return task.role
        if column == "PID":
            return str(task.pid) if task.pid else ""
        if column == "State":
            return task.state
        if column == "CPU %":
            return "" if task.cpu_percent is None else f"{task.cpu_percent:.0f}"
        if column == "Memory":
            return format_bytes(task.rss_bytes)
        if column == "GPU %":
            return "" if task.gpu_util is None else f"{task.gpu_util:.0f}"
        if column == "Restarts":
            return str(task.restarts) if task.restarts else ""
        if column == "Reason":
            return task.reason
        if column == "Straggler":
            flags = self.straggling(task)
            return ", ".join(f"{c.ratio:.2f}× (replica {c.replica})" for c in flags)
        return ""

    def straggling(self, task: TaskState) -> list[StragglerChange]:
        return self.stragglers.for_task(task.name) if self.stragglers is not None else []

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self.rows):
            return None
        task = self.rows[index.row()]
        column = COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self.text(task, column)
        if role == Qt.ItemDataRole.ForegroundRole and column == "State":
            return QColor(theme.STATE_COLORS.get(task.state, "#888888"))
        if role == Qt.ItemDataRole.BackgroundRole and self.straggling(task):
            return QBrush(STRAGGLER_BACKGROUND)
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == "Straggler" and self.straggling(task):
                return "Straggling since it stayed slower than its peers:\n" + "\n".join(
                    describe_change(c) for c in self.straggling(task))
            if column in ("Reason", "State") and task.log_tail:
                return f"{task.reason}\n\nLast log lines:\n" + "\n".join(task.log_tail[-10:])
            return self.text(task, column) or TIPS[column]
        if role == Qt.ItemDataRole.TextAlignmentRole and column in ("PID", "CPU %", "Memory", "GPU %", "Restarts"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class TaskTable(QWidget):
    """The table, with a failure report above it when the run failed (which task, why, its last lines)."""

    taskActivated = Signal(str)  # a task's row was double-clicked (or Enter pressed on it): show its log

    def __init__(self, session: RunSession, parent: QWidget | None = None, *,
                 stragglers: StragglerWatch | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.model = TaskTableModel(session, stragglers)
        self.view = QTableView()
        self.view.setObjectName("taskTable")
        self.view.setModel(self.model)
        self.view.setAlternatingRowColors(True)
        self.view.setTabKeyNavigation(False)  # Tab leaves the table (arrows move between its cells)
        self.view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.view.verticalHeader().setVisible(False)
        header = self.view.horizontalHeader()
        # columns fit their contents when the rows change, then stay (and the user may resize them):
        # fitting them at every refresh made the view read every cell of the table each time
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(_REASON, QHeaderView.ResizeMode.Stretch)  # the long text gets the room
        header.setStretchLastSection(False)
        header.setResizeContentsPrecision(FIT_ROWS)
        self.model.visible = self._visible_rows
        self.model.modelReset.connect(self._fit_columns)
        self.model.dataChanged.connect(self._fit_if_clipped)
        self._fit_columns()  # the rows already there
        self.view.setToolTip("Every task of the shown run; hover a failed task for its last log lines, "
                             "double-click a task (or press Enter on it) for its log")
        self.view.activated.connect(self._activated)  # double-click, or Enter, as the platform has it
        self.failure = QLabel()
        self.failure.setObjectName("failureReport")
        self.failure.setWordWrap(True)
        # the report wraps to the dock's width and never asks for more: a log line of TensorFlow's
        # (hundreds of characters, no space) must not make the window wider than the screen
        self.failure.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.failure.setMinimumWidth(0)
        self.failure.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.failure.setToolTip("Why the run failed and the failed task's last log lines")
        # in a box of bounded height: the table below keeps its rows on a laptop screen
        self.failure_box = QScrollArea()
        self.failure_box.setObjectName("failureBox")
        self.failure_box.setWidgetResizable(True)
        self.failure_box.setFrameShape(QFrame.Shape.NoFrame)
        self.failure_box.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.failure_box.setMaximumHeight(FAILURE_HEIGHT)
        self.failure_box.setWidget(self.failure)
        self.failure_box.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.failure_box)
        layout.addWidget(self.view, 1)
        session.runStateChanged.connect(self._update_failure)
        session.runLoaded.connect(self._update_failure)

    def _activated(self, index: QModelIndex) -> None:
        if 0 <= index.row() < len(self.model.rows):
            self.taskActivated.emit(self.model.rows[index.row()].name)

    def _fit_columns(self) -> None:
        for column in range(len(COLUMNS)):
            if column != _REASON:
                self.view.resizeColumnToContents(column)

    def _visible_rows(self) -> tuple[int, int]:
        """The first and last row in sight (a little margin either side)."""
        view = self.view
        first = view.rowAt(0)
        last = view.rowAt(view.viewport().height() - 1)
        n = self.model.rowCount()
        if first < 0:
            return (0, min(n, 64) - 1)  # not laid out yet: the first rows
        return max(0, first - 2), (n - 1 if last < 0 else min(n - 1, last + 2))

    def _fit_if_clipped(self, top_left: QModelIndex, bottom_right: QModelIndex, *_args: object) -> None:
        """Widen a column whose changed cells no longer fit (a state or a straggler flag got longer)."""
        metrics = self.view.fontMetrics()
        low, high = self._visible_rows()
        for column in range(top_left.column(), bottom_right.column() + 1):
            if column == _REASON:
                continue
            width = self.view.columnWidth(column)
            for row in range(max(low, top_left.row()), min(high, bottom_right.row()) + 1):
                text = self.model.data(self.model.index(row, column))
                if text and metrics.horizontalAdvance(str(text)) + 12 > width:
                    self.view.resizeColumnToContents(column)
                    break

    def _update_failure(self, *_args: object) -> None:
        state = self.session.state
        if state.state != "failed":
            self.failure_box.hide()
            return
        task = state.tasks.get(state.failed_task)
        lines = task.log_tail[-12:] if task is not None else []
        why = strip_task(state.reason or (task.reason if task is not None else ""), state.failed_task)
        tail = "<br>".join(_breakable(_escape(x)) for x in lines)
        said = headline(why, lines)
        self.failure.setText(
            f"<b style='color:{theme.PROBLEM_COLOR}'>Run failed</b> — task <b>{_escape(state.failed_task or '?')}"
            f"</b>: " + (f"<b>{_breakable(_escape(said))}</b><br>" if said and said != why else "")
            + _breakable(_escape(why))
            + (f"<div style='font-family:monospace; margin:4px 0'>{tail}</div>" if tail else ""))
        self.failure.show()
        self.failure_box.show()


def _breakable(text: str, every: int = 40) -> str:
    """``text`` with a zero-width space in each run of ``every`` characters without a space: a long
    path or a TensorFlow op name wraps instead of widening the report."""
    return re.sub(rf"(\S{{{every}}})(?=\S)", "\\1\u200b", text)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
