"""Other runs overlaid on the shown run's curves, for comparison: each read from its folder once and kept by its
label (the folder's name) until cleared. :class:`~gui.run_session.RunSession` owns one (its ``comparisons``)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal

from engine.contract.config import ConfigError, Problem
from engine.observe.run_reader import read_run_folder
from engine.observe.telemetry import RunState


class RunComparisons(QObject):
    """The runs compared with the shown one: ``runs`` by label."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.runs: dict[str, RunState] = {}

    def add(self, path: str | Path) -> str:
        """Read another run's folder to overlay; returns its label (ConfigError when it recorded no steps)."""
        path = Path(path)
        _, state, _ = read_run_folder(path)
        if not state.history.series:
            raise ConfigError([Problem("", "this run has no recorded steps to compare with")], str(path))
        label = path.name
        self.runs[label] = state
        self.changed.emit()
        return label

    def clear(self) -> None:
        if self.runs:
            self.runs.clear()
            self.changed.emit()
