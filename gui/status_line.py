"""The window's status bar: passing messages, and two permanent notes (where new runs are written,
which replicas straggle now)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel, QStatusBar

from gui.run_session import RunSession
from gui.stragglers_view import StragglerWatch


class StatusLine(QObject):
    """Fills ``bar`` from the session (its runs folder) and the straggler watch."""

    def __init__(self, bar: QStatusBar, session: RunSession, stragglers: StragglerWatch) -> None:
        super().__init__(bar)
        self.bar = bar
        self.stragglers = stragglers
        self.path_label = QLabel()
        self.path_label.setObjectName("runsFolder")
        self.path_label.setToolTip("Where new runs are written (File › Runs Folder… changes it)")
        bar.addPermanentWidget(self.path_label)
        self.straggler_label = QLabel()
        self.straggler_label.setObjectName("stragglerStatus")
        self.straggler_label.setToolTip("A replica that stays slower than the others (see the task table's "
                                        "Straggler column)")
        self.straggler_label.setStyleSheet("color: #b7791f;")
        self.straggler_label.hide()
        bar.addPermanentWidget(self.straggler_label)
        self._runs_root_changed(session.runs_root)
        session.runsRootChanged.connect(self._runs_root_changed)
        stragglers.changed.connect(self._stragglers_changed)

    def show(self, text: str, timeout_ms: int = 0) -> None:
        """A passing message (0: until the next one)."""
        self.bar.showMessage(text, timeout_ms)

    def warn(self, text: str) -> None:
        self.bar.showMessage(f"⚠ {text}", 15000)

    def _runs_root_changed(self, path: Path) -> None:
        self.path_label.setText(f"runs: {path}")

    def _stragglers_changed(self) -> None:
        text = self.stragglers.summary()
        self.straggler_label.setText(text)
        self.straggler_label.setVisible(bool(text))
