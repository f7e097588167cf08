"""Where the app remembers things between sessions (window layout, theme, recent files, runs folder)."""

from __future__ import annotations

from PySide6.QtCore import QSettings

ORGANIZATION = "ClusterDeck"
APPLICATION = "ClusterDeck"


def app_settings() -> QSettings:
    """The app's settings (an INI file under the user's config folder; tests point it elsewhere)."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)
