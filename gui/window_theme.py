"""The colour scheme the user picked (follow the system, light or dark): the View › Theme actions,
remembered in the app's settings and applied to the application's palette.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication
from PySide6.QtWidgets import QApplication

from gui import theme
from gui.preferences import app_settings

THEMES = {"system": "Follow the System", "light": "Light", "dark": "Dark"}


class ThemeSwitcher(QObject):
    """Holds the choice (:attr:`choice`) and one checkable action per scheme (:attr:`actions`).

    ``applied`` follows every change of the palette (a choice, or the system's scheme changing):
    views whose colours are not the palette's redraw then."""

    applied = Signal()

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.group = QActionGroup(parent)
        self.actions: dict[str, QAction] = {}
        for key, text in THEMES.items():
            action = QAction(text, parent, checkable=True)
            action.setToolTip(f"Colour scheme: {text.lower()}")
            action.triggered.connect(lambda _checked=False, key=key: self.set(key))
            self.group.addAction(action)
            self.actions[key] = action
        stored = str(app_settings().value("theme", "system"))
        self.choice = stored if stored in THEMES else "system"
        self.actions[self.choice].setChecked(True)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._scheme_changed)

    def set(self, choice: str) -> None:
        """``system``, ``light`` or ``dark``; remembered."""
        if choice not in THEMES:
            raise ValueError(f"theme: expected one of {sorted(THEMES)}, got {choice!r}")
        self.choice = choice
        self.actions[choice].setChecked(True)
        app_settings().setValue("theme", choice)
        self.apply()

    def apply(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            theme.apply_palette(app, None if self.choice == "system" else self.choice == "dark")
        self.applied.emit()

    def _scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        self.apply()
