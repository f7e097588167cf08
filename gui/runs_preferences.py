"""Edit ▸ Preferences: the app's own settings (not a run's): whether runs outlive the app."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from gui import preferences

KEEP_TEXT = "&Keep runs going when ClusterDeck closes"
KEEP_TIP = ("On: Run starts each run in a launcher of its own (as clusterdeck run --detach does). Closing the app "
            "leaves it running; the Runs panel finds it again to watch or stop it.\n"
            "Off: a run lives in its window, and closing the window asks to stop it first.")


class PreferencesDialog(QDialog):
    """The app's preferences; OK writes them (``changed`` says what the keep-going choice became)."""

    changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("preferencesDialog")
        self.setWindowTitle("Preferences")
        self.keep_going = QCheckBox(KEEP_TEXT)
        self.keep_going.setObjectName("keepRunsGoing")
        self.keep_going.setToolTip(KEEP_TIP)
        self.keep_going.setChecked(bool(preferences.keep_runs_going()))
        note = QLabel("Takes effect at the next Run; runs already going keep the way they were started.")
        note.setWordWrap(True)
        note.setEnabled(False)  # a secondary line, in the palette's muted text
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        column = QVBoxLayout(self)
        column.addWidget(self.keep_going)
        column.addWidget(note)
        column.addStretch(1)
        column.addWidget(buttons)
        self.setMinimumWidth(420)

    def accept(self) -> None:
        keep = self.keep_going.isChecked()
        preferences.set_keep_runs_going(keep)
        self.changed.emit(keep)
        super().accept()
