"""The Runs panel's filter field: words typed narrow the list; Down or Enter goes to the list, Escape clears it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QLineEdit, QWidget


class FilterField(QLineEdit):
    """``toList`` when Down or Enter is pressed (the panel moves the focus to its list)."""

    toList = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runsFilter")
        self.setPlaceholderText("Filter runs…")
        self.setClearButtonEnabled(True)
        self.setToolTip("Show the runs whose name, state, mode or hosts hold every word typed "
                        "(Ctrl+F in the panel; Down or Enter goes to the list)")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        if event.key() in (Qt.Key.Key_Down, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.toList.emit()
            return
        if event.key() == Qt.Key.Key_Escape and self.text():
            self.clear()
            return
        super().keyPressEvent(event)
