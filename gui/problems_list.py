"""The visible list of what stops a launch, with a one-line summary; a click shows the culprit.

Two sources: the config's own rules (the document's problems) and what was found of its files or
script before a launch (:mod:`gui.pre_run_problems`), so a failed check never leaves "Ready to run"."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QAbstractItemView, QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from engine.contract.config import Problem
from gui import theme
from gui.document_model import DocumentModel, problem_target

#: The most height of the list of problems: more of them scroll.
MOST_HEIGHT = 150


class ProblemsList(QWidget):
    """Every validation problem of the current config, ``field: message`` per line."""

    fieldActivated = Signal(str)  # the field of the problem the user clicked (e.g. training.global_batch_size)

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.summary = QLabel()
        self.summary.setObjectName("problemsSummary")
        self.summary.setWordWrap(True)
        self.summary.setToolTip("Whether the config can be launched")
        self.list = QListWidget()
        self.list.setObjectName("problemsList")
        self.list.setWordWrap(True)
        self.list.setToolTip("Click a problem (or press Enter or Space on it) to select the host, task or "
                             "setting it is about")
        self.list.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.list.installEventFilter(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.summary)
        layout.addWidget(self.list, 0)
        layout.addStretch(0)  # keeps the summary at the top while the list is hidden
        self.list.itemClicked.connect(self._clicked)
        self.list.itemActivated.connect(self._clicked)  # Enter, as a click
        self._pre_run: list[Problem] = []
        document.problemsChanged.connect(self.refresh)
        self.refresh(document.problems)

    def set_pre_run(self, problems: list[Problem]) -> None:
        """What the files or the last pre-launch check showed (after the config's own problems)."""
        self._pre_run = list(problems)
        self.refresh(self.document.problems)

    def refresh(self, problems: list[Problem]) -> None:
        own = len(problems)
        problems = list(problems) + [p for p in self._pre_run if str(p) not in {str(q) for q in problems}]
        self.list.clear()
        for p in problems:
            item = QListWidgetItem(f"⚠ {p}")
            item.setData(Qt.ItemDataRole.UserRole, p.field)
            item.setToolTip(str(p))
            self.list.addItem(item)
        if own:
            n = len(problems)
            self.summary.setText(f"<b style='color:{theme.PROBLEM_COLOR}'>{n} problem{'s' if n > 1 else ''}</b>"
                                 " — Run is disabled until fixed")
        elif problems:
            n = len(problems)
            self.summary.setText(f"<b style='color:{theme.PROBLEM_COLOR}'>{n} problem{'s' if n > 1 else ''} "
                                 "found before the launch</b> — the run will not start until fixed")
        else:
            self.summary.setText(f"<b style='color:{theme.STATE_COLORS['running']}'>✓ Ready to run</b>")
        self.list.setVisible(bool(problems))
        if problems and self.list.currentRow() < 0:
            self.list.setCurrentRow(0)
        self._fit_height()

    def _fit_height(self) -> None:
        """The list is as tall as its problems (one line takes one line, not a box), at most ``MOST_HEIGHT``."""
        metrics = self.list.fontMetrics()
        width = max(40, self.list.viewport().width() - 8)
        flags = int(Qt.TextFlag.TextWordWrap.value | Qt.TextFlag.TextWrapAnywhere.value)
        rows = sum(max(self.list.sizeHintForRow(i), metrics.height(),  # a long path wraps: all its lines show
                       metrics.boundingRect(0, 0, width, 10_000, flags, self.list.item(i).text()).height() + 4)
                   for i in range(self.list.count()))
        self.list.setFixedHeight(min(MOST_HEIGHT, rows + 2 * self.list.frameWidth() + 4))

    def resizeEvent(self, event: object) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)  # type: ignore[arg-type]
        self._fit_height()  # wrapped lines take more or fewer rows at another width

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if (watched is self.list and event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent)
                and event.key() == Qt.Key.Key_Space and self.list.currentItem() is not None):
            self._clicked(self.list.currentItem())  # Space acts as Enter does
            return True
        return False

    def _clicked(self, item: QListWidgetItem) -> None:
        """Select the host or task the problem is about, then ask for its field's editor."""
        field = str(item.data(Qt.ItemDataRole.UserRole))
        for p in self.document.problems:
            if p.field == field:
                target = problem_target(p)
                if target is not None:
                    self.document.select(target)
                break
        self.fieldActivated.emit(field)
