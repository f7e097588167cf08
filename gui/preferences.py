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


#: Whether Run starts runs in a launcher of their own that outlives the app (``clusterdeck run --detach``):
#: asked at the first Run, changeable under Edit > Preferences. Absent: never asked.
KEEP_RUNS_GOING = "runs/keepGoingWhenAppCloses"


def keep_runs_going() -> bool | None:
    """The user's choice of :data:`KEEP_RUNS_GOING`; None while it was never asked."""
    value = app_settings().value(KEEP_RUNS_GOING)
    if value is None or value == "":
        return None
    if isinstance(value, str):  # an INI file gives booleans back as text
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def set_keep_runs_going(on: bool) -> None:
    settings = app_settings()
    settings.setValue(KEEP_RUNS_GOING, bool(on))
    settings.sync()
