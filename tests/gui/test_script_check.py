"""A config naming the user's script is checked off the GUI thread before the run starts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from engine.contract import config as config_mod
from tests.gui.conftest import PRESETS


@pytest.mark.cluster
def test_broken_script_is_reported_without_blocking_the_window(window: Any, qtbot: Any, tmp_path: Path,
                                                                dialogs: Any) -> None:
    script = tmp_path / "broken_model.py"
    script.write_text("def build_model(config):\n    raise RuntimeError('my model is broken on purpose')\n",
                      encoding="utf-8")
    cfg = config_mod.load(PRESETS / "data-1worker-2gpus.yaml")
    cfg = config_mod.replace(cfg, model=config_mod.replace(cfg.model, name="script", script=str(script)))
    window.controller.document.set_config(cfg)
    assert not window.controller.problems
    t0 = time.monotonic()
    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert time.monotonic() - t0 < 1.0, "starting a checked run must not block the window"
    assert window.controller.run_state == "checking"
    assert not window.commands["run"].isEnabled()
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=120_000)
    kind, title, text = dialogs.calls[-1]
    assert kind == "warning" and "my model is broken on purpose" in text
    assert window.controller.run is None and not window.controller.is_running
    assert window.commands["run"].isEnabled()
