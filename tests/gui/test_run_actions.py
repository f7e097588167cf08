"""Quitting while a run is in progress: the user is asked; yes stops the run and closes once it ended."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QMessageBox

from tests import kit


def Replay() -> kit.ScriptedRun:  # noqa: N802 - reads as the class it makes
    """A run whose events (and end) the test gives; a stop is only asked for."""
    return kit.ScriptedRun(ends_on_stop=False)


def test_quit_during_a_run_asks_then_stops_it_first(qtbot: Any, window: Any, dialogs: Any) -> None:
    c = window.controller
    run = Replay()
    c.session.watch(run, c.config, state="running")
    assert window.commands["stop"].isEnabled() and not window.commands["run"].isEnabled()

    dialogs.answers.append(QMessageBox.StandardButton.No)
    window.close()
    assert window.isVisible() and len(run.stops) == 0 and dialogs.kinds() == ["question"]

    dialogs.answers.append(QMessageBox.StandardButton.Yes)
    window.close()
    assert window.isVisible() and len(run.stops) == 1
    assert window.statusBar().currentMessage() == "Stopping the run before quitting…"
    assert not window.commands["stop"].isEnabled()  # stopping already
    window.close()  # asked once: a second quit waits for the same stop
    assert window.isVisible() and len(run.stops) == 1 and dialogs.kinds() == ["question", "question"]

    run.end("stopped")
    qtbot.waitUntil(lambda: not window.isVisible())
    assert c.run is None and dialogs.kinds() == ["question", "question"]  # no "save changes?" on the way out


def test_start_problems_are_told(qtbot: Any, window: Any, dialogs: Any) -> None:
    run = Replay()
    window.controller.session.watch(run, window.controller.config, state="running")
    window.start_run()  # F5 is disabled now; the command itself says why it cannot start
    assert "in progress" in window.statusBar().currentMessage() and dialogs.kinds() == []
    window.controller.stop_run()
    run.end("stopped")
    qtbot.waitUntil(lambda: window.controller.run is None)
    window.controller.document.update_host(0, gpus=3)  # 3 GPUs cannot be split over 2 workers
    window.start_run()  # as `clusterdeck gui preset --run` does
    assert dialogs.kinds() == ["warning"] and "cannot be split" in dialogs.calls[0][2]
    assert window.controller.run is None
