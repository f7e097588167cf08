"""Where the app remembers things between sessions (window layout, theme, recent files, runs folder)."""

from __future__ import annotations

import os

from PySide6.QtCore import QSettings

#: ``~/.config/clusterdeck/clusterdeck.ini`` beside the runs in ``~/.local/share/clusterdeck`` (one name, as the
#: XDG folders expect); earlier versions wrote ``~/.config/ClusterDeck/ClusterDeck.ini``, read once and kept.
ORGANIZATION = "clusterdeck"
APPLICATION = "clusterdeck"
_EARLIER = ("ClusterDeck", "ClusterDeck")


def app_settings() -> QSettings:
    """The app's settings (an INI file under the user's config folder; tests point it elsewhere)."""
    settings = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)
    if not os.path.exists(settings.fileName()):
        earlier = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, *_EARLIER)
        if earlier.fileName() != settings.fileName() and os.path.exists(earlier.fileName()):
            for key in earlier.allKeys():  # the layout, theme, recent files and runs folder a user had
                settings.setValue(key, earlier.value(key))
            settings.sync()
    return settings
