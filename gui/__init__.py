"""ClusterDeck's desktop app (PySide6, pyqtgraph). It imports the engine's control half only."""

from gui.qt_binding import guard_singletons

guard_singletons()
