"""No stale text around a launch that did not happen: a missing data file is listed before Run (once),
a failed pre-launch check leaves neither "Ready to run" nor "Checking your script…", a stop during the
check does not bring back the previous run's badge, and a failed run has its line in Messages."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Problem
from tests.gui.test_screen_sizes import replay, six_workers


def missing_file(tmp_path: Path) -> config_mod.RunConfig:
    base = config_mod.default_config()
    return config_mod.replace(base, data=config_mod.replace(base.data, source="npz", path=str(tmp_path / "gone.npz")))


def script_model(tmp_path: Path) -> config_mod.RunConfig:
    script = tmp_path / "model.py"
    script.write_text("def build_model(config):\n    raise RuntimeError('broken')\n", encoding="utf-8")
    base = config_mod.default_config()
    return config_mod.replace(base, model=config_mod.replace(base.model, name="script", script=str(script)))


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_missing_data_file_is_listed_before_run_and_once(qtbot: Any, window: Any, dialogs: Any, tmp_path: Path,
                                                           size: tuple[int, int]) -> None:
    window.resize(*size)
    window.controller.new_document(missing_file(tmp_path))
    problems = window.problems
    qtbot.waitUntil(lambda: problems.list.count() == 1, timeout=10_000)  # before Run is pressed
    assert "gone.npz" in problems.list.item(0).text() and "Ready to run" not in problems.summary.text()
    assert "found before the launch" in problems.summary.text()
    assert "found before the launch" in window.run_status.detail.text()
    window.grab().save(str(tmp_path / f"missing-file-{size[0]}.png"))
    window.start_run()
    assert dialogs.kinds() == ["warning"] and dialogs.calls[0][2].count("gone.npz") == 1
    assert problems.list.count() == 1  # the launch's own check found the same: said once
    assert window.controller.run is None
    # the file put in place: the problem goes once the window looks again
    base = window.controller.config
    window.controller.document.set_config(config_mod.replace(base, data=config_mod.replace(base.data,
                                                                                          source="synthetic")))
    qtbot.waitUntil(lambda: problems.list.count() == 0, timeout=10_000)
    assert "Ready to run" in problems.summary.text()


def test_a_failed_check_leaves_no_ready_text_and_no_checking_message(qtbot: Any, window: Any, dialogs: Any,
                                                                      tmp_path: Path) -> None:
    replay(window, six_workers(), steps=20).done = True  # a previous run on screen
    window.controller.session.stop()
    qtbot.waitUntil(lambda: window.controller.run is None)
    window.controller.new_document(script_model(tmp_path))
    window.controller.checks.checker = lambda config: [Problem("model.script", "build_model raised: broken")]
    window.start_run()
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=10_000)
    assert "broken" in dialogs.calls[-1][2]
    assert "Ready to run" not in window.problems.summary.text()
    assert any("broken" in window.problems.list.item(i).text() for i in range(window.problems.list.count()))
    assert "Checking" not in window.statusBar().currentMessage()
    assert "Run not started" in window.statusBar().currentMessage()
    assert window.run_status.badge.text() == "Ready" and window.commands["run"].isEnabled()


def test_a_stop_during_the_check_does_not_bring_back_the_previous_badge(qtbot: Any, window: Any,
                                                                        tmp_path: Path) -> None:
    run = replay(window, six_workers(), steps=20)
    run.done = True
    window.controller.session.stop()
    qtbot.waitUntil(lambda: window.controller.run is None)
    assert window.run_status.badge.text() != "Ready"  # the previous run's state is shown
    window.controller.new_document(script_model(tmp_path))
    release = threading.Event()
    window.controller.checks.checker = lambda config: (release.wait(10), [])[1]
    try:
        window.start_run()
        assert window.run_status.badge.text() == "Checking…"
        window.commands["stop"].trigger()
        assert window.run_status.badge.text() == "Ready"
        assert window.run_status.progress.text() != "20 / 4000"
    finally:
        release.set()


def test_a_failed_run_has_its_line_in_messages(qtbot: Any, window: Any) -> None:
    replay(window, six_workers(), steps=30, fail=True)
    qtbot.waitUntil(lambda: window.controller.state.state == "failed")
    lines = [t for t in window.messages.texts() if "run failed" in t]
    assert len(lines) == 1
    assert "run failed: worker:1: AssertionError: labels must be in 0..9" in lines[0]
