"""The run's messages, warnings included, are shown in the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.run_folder import RunFolder
from tests.gui.conftest import PRESETS


def test_run_messages_and_warnings_of_an_opened_run(window: Any, tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    folder = run.path
    folder.mkdir(parents=True, exist_ok=True)
    run.write_config(config_mod.load(PRESETS / "data-2workers.yaml"))
    lines = [
        events.make("info", "launcher", message="multi-host cluster: ports are exposed", warning="ports-exposed"),
        events.make("info", "worker:0", message="MultiWorkerMirroredStrategy: 2 replicas in sync"),
        events.make("step", "worker:0", replica=0, step=1, loss=2.0),
        events.make("run", "launcher", state="finished"),
    ]
    writer = events.EventWriter(run.events)
    for event in lines:
        writer.write(event)
    writer.close()
    run.write_meta(state="finished")
    assert window.open_run_folder(folder)
    texts = window.messages.texts()
    assert len(texts) == 2
    assert texts[0].startswith("⚠") and "ports are exposed" in texts[0]
    assert "2 replicas in sync" in texts[1] and not texts[1].startswith("⚠")
    # a warning arriving while the run is shown reaches the status bar too
    window.controller.state.apply(events.make("info", "launcher", message="cannot isolate the run's ports",
                                              warning="ports-exposed"))
    window.controller.session.runUpdated.emit()
    assert "cannot isolate" in window.statusBar().currentMessage()
    assert len(window.messages.texts()) == 3
    # opening a run replaces the list
    assert window.open_run_folder(folder)
    assert len(window.messages.texts()) == 2
