"""What the "Why slow" panel's buttons bring back: a profile's top ops per task in a table, and each task's
newest stack dump side by side (who waits where, the frame to look at highlighted)."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.control import profiling
from engine.control.doctor import Dump
from gui.why_slow_model import dump_lines

PROFILE_COLUMNS = ("Task", "Op", "Type", "Kind", "Self time", "Share")
PROFILE_TIPS = {
    "Task": "The task the op ran on; its first row says how its ops' time splits by kind",
    "Op": "The op's name in the graph (hover for the whole name)",
    "Type": "The op's type (its kernel)",
    "Kind": "compute, collective (an all-reduce or a transfer: its time includes waiting for the peers) or "
            "input (the tf.data pipeline, on threads of its own beside the step)",
    "Self time": "Time spent in the op itself during the capture, summed over its runs and threads",
    "Share": "The op's share of all ops' self time on its task (idle time left out)",
}
#: Ops listed per task.
TOP_ROWS = 5


class ProfileResults(QWidget):
    """A capture's top ops per task (:meth:`show_capture`), or why there are none (:meth:`show_message`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("whySlowProfile")
        self.capture: profiling.ProfileCapture | None = None
        self.note = QLabel("Press Profile to capture every task's ops for 2 s while the run goes on.")
        self.note.setObjectName("whySlowProfileNote")
        self.note.setToolTip("What the last capture found, and how to open it in TensorBoard")
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(PROFILE_COLUMNS))
        self.table.setObjectName("whySlowProfileTable")
        self.table.setHorizontalHeaderLabels(list(PROFILE_COLUMNS))
        for i, name in enumerate(PROFILE_COLUMNS):
            head = self.table.horizontalHeaderItem(i)
            if head is not None:
                head.setToolTip(PROFILE_TIPS[name])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.setToolTip("The top ops of each task by self time during the capture")
        self.open_button = QPushButton("Open profile folder")
        self.open_button.setObjectName("whySlowOpenProfile")
        self.open_button.setEnabled(False)
        self.open_button.setToolTip("No capture yet: press Profile first")
        self.open_button.clicked.connect(self.open_folder)
        bottom = QHBoxLayout()
        bottom.addWidget(self.open_button)
        bottom.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.note)
        layout.addWidget(self.table, 1)
        layout.addLayout(bottom)

    def show_message(self, text: str) -> None:
        self.note.setText(text)

    def show_capture(self, capture: profiling.ProfileCapture) -> None:
        self.capture = capture
        written = capture.written()
        self.note.setText(
            f"Capture {capture.rid}: {len(written)} of {len(capture.tasks)} task(s) profiled. Open it in TensorBoard: "
            f"tensorboard --logdir {capture.logdir} (the Profile tab, run {capture.rid}, one host per task)."
            if written else f"Capture {capture.rid}: no task was profiled (see each task's row).")
        self.open_button.setEnabled(capture.trace_dir.is_dir())
        self.open_button.setToolTip(f"Open {capture.trace_dir} (one .xplane.pb per task)"
                                    if capture.trace_dir.is_dir() else "The capture wrote no trace")
        self.table.setRowCount(0)
        for task, got in capture.tasks.items():
            if not got.ok:
                self._row(task, got.error, "", "", "", "", tip=got.error)
                continue
            split = ", ".join(f"{profiling.CATEGORY_LABELS[c]} {100 * got.breakdown.get(c, 0.0):.0f} %"
                              for c in profiling.CATEGORIES) if got.breakdown else "(no summary)"
            self._row(task, f"all ops: {split}", "", "", f"{(got.busy_us or 0) / 1000:.1f} ms" if got.busy_us else "",
                      "100 %" if got.busy_us else "", bold=True,
                      tip=f"{task}: its ops' self time during the capture, by kind")
            for op in got.top_ops[:TOP_ROWS]:
                self._row("", op.op, op.type, op.category, f"{op.self_us / 1000:.1f} ms", f"{100 * op.share:.1f} %",
                          tip=f"{op.op} ({op.type}): {op.count} runs")
            if got.summary_error:
                self._row("", f"no summary: {got.summary_error}", "", "", "", "", tip=got.summary_error)

    def _row(self, *cells: str, bold: bool = False, tip: str = "") -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(tip or text)
            if bold:
                font = item.font()
                font.setBold(True)
                item.setFont(font)
            if col >= 4:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, col, item)

    def open_folder(self) -> None:
        if self.capture is not None and self.capture.trace_dir.is_dir():
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.capture.trace_dir)))


class StacksView(QWidget):
    """Each task's newest dump in a column of its own: where it waits, then its main thread's frames."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("whySlowStacks")
        self.note = QLabel("Press Dump stacks to see where every task's Python is now (a stuck run: who waits for "
                           "whom).")
        self.note.setWordWrap(True)
        self.note.setToolTip("What the last stack dump found, and where the dumps are kept")
        self.columns = QWidget()
        self.row = QHBoxLayout(self.columns)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.scroller = QScrollArea()
        self.scroller.setWidgetResizable(True)
        self.scroller.setWidget(self.columns)
        self.scroller.setToolTip("Each task's newest stack dump; the highlighted frame is the innermost one of your "
                               "code or ClusterDeck's in its main thread")
        self.browsers: dict[str, QTextBrowser] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.note)
        layout.addWidget(self.scroller, 1)

    def show_message(self, text: str) -> None:
        self.note.setText(text)

    def show_dumps(self, dumps: dict[str, Dump | str], run_dir: Path | None = None) -> None:
        while self.row.count():
            item = self.row.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.browsers = {}
        if not dumps:
            self.note.setText("No live task to ask on this machine (run.json names none running).")
            return
        where = f" (files: {run_dir}/tasks/<task>/stacks.txt)" if run_dir is not None else ""
        self.note.setText(f"The newest dump of each of {len(dumps)} task(s){where}.")
        for task, dump in dumps.items():
            column = QWidget()
            box = QVBoxLayout(column)
            box.setContentsMargins(0, 0, 0, 0)
            title = QLabel(f"<b>{html.escape(task)}</b>")
            title.setToolTip(str(dump.path) if isinstance(dump, Dump) else "")
            said = QLabel(html.escape(dump.where() if isinstance(dump, Dump) else dump))
            said.setWordWrap(True)
            said.setToolTip("Where the task's main thread is: in TensorFlow (an op, a collective waiting for its "
                            "peers) or in Python")
            browser = QTextBrowser()
            browser.setObjectName(f"whySlowStacks:{task}")
            browser.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
            browser.setHtml(self._html(dump))
            browser.scrollToAnchor("own")
            browser.setToolTip(f"{task}'s stack, innermost frame first; the highlighted frame is where to look")
            box.addWidget(title)
            box.addWidget(said)
            box.addWidget(browser, 1)
            column.setMinimumWidth(260)
            self.row.addWidget(column, 1)
            self.browsers[task] = browser

    def _html(self, dump: Dump | str) -> str:
        if not isinstance(dump, Dump):
            return f"<i>{html.escape(dump)}</i>"
        palette = self.palette()
        mark_bg = palette.color(QPalette.ColorRole.Highlight).name()
        mark_fg = palette.color(QPalette.ColorRole.HighlightedText).name()
        rows = []
        for line in dump_lines(dump):
            text = html.escape(line.text)
            if line.header:
                rows.append(f"<div style='margin-top:4px'><i>{text}</i></div>")
            elif line.own:
                rows.append(f"<div style='background:{mark_bg}; color:{mark_fg}'><a name='own'></a><b>▶ {text}</b></div>")
            else:
                rows.append(f"<div>&nbsp;&nbsp;{text}</div>")
        return "<div style='font-family: monospace; white-space: pre'>" + "".join(rows) + "</div>"
