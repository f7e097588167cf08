"""Runs that outlive the window, used as a person does: the question asked at the first Run, a run started
detached from the app that goes on after the window closes, found again in a new window's Runs panel,
attached to, watched live and stopped, with no process left behind."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.contract.run_folder import RunFolder
from engine.control import control_socket
from engine.control.detach import read_launcher
from gui import preferences
from gui.runs_commands import OPEN_WINDOWS
from gui.runs_follow import folder_pids
from gui.runs_model import COLUMNS
from tests.conftest import alive, wait_gone
from tests.engine.test_detach import TINY as DETACH_TINY

TINY = DETACH_TINY.replace("name: tiny-detach", "name: tiny-app-detach")  # the CLI tests' tiny run


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


def never_asked() -> None:
    settings = preferences.app_settings()
    settings.remove(preferences.KEEP_RUNS_GOING)
    settings.sync()
    assert preferences.keep_runs_going() is None


def status_step(run_dir: Path) -> int:
    return int(control_socket.request(RunFolder(run_dir).control_socket, "status")["step"])


def end_run(run_dir: Path | None) -> None:
    """Whatever a failed test left: stop the run through its channel, and wait for its processes."""
    if run_dir is None:
        return
    pids = folder_pids(RunFolder(run_dir))
    try:
        control_socket.request(RunFolder(run_dir).control_socket, "stop", timeout=60)
    except control_socket.ControlError:
        for pid in alive(pids):
            psutil.Process(pid).kill()
    wait_gone(pids, 20)


@pytest.mark.cluster
def test_a_run_started_from_the_app_outlives_it_and_is_attached_to_again(
        qtbot: Any, window: Any, runs_root: Path, tiny: Path, dialogs: Any) -> None:
    from gui.controller import Controller
    from gui.main_window import MainWindow

    never_asked()
    c = window.controller
    assert window.open_path(tiny, ask=False)
    dialogs.answers.append(QMessageBox.StandardButton.Yes)  # keep runs going: asked once, at the first Run
    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert dialogs.kinds() == ["question"] and "keep going" in dialogs.calls[0][2]
    assert preferences.keep_runs_going() is True and window.commands["keep_going"].isChecked()
    assert c.session.attached is not None  # followed through its folder once its launcher says where
    run_dir: Path | None = None
    again: Any = None
    try:
        qtbot.waitUntil(lambda: c.run_dir is not None, timeout=60_000)
        run_dir = c.run_dir
        assert run_dir is not None and run_dir.parent == runs_root
        assert window.commands["stop"].isEnabled()
        qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") >= 3, timeout=90_000)
        assert window.run_status.badge.text() == "Running"
        info = read_launcher(RunFolder(run_dir))
        assert info is not None and info.detached
        pids = folder_pids(RunFolder(run_dir))
        assert info.pid in pids and len(pids) >= 3  # the launcher, its supervisor, the task

        # closing the window asks nothing and leaves the run going
        window.close()
        assert window.isHidden() and dialogs.kinds() == ["question"]
        assert alive(pids) == pids, "the launcher and the tasks outlive the window"
        before = status_step(run_dir)
        deadline = time.monotonic() + 30
        while status_step(run_dir) <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status_step(run_dir) > before, "the run trains on without a window"

        # a new window finds it in the Runs panel, running, and attaches to it
        again = MainWindow(Controller(runs_root=runs_root))
        again.show()
        qtbot.waitExposed(again)
        assert again.runs_dock.isVisible() and "going" in again.statusBar().currentMessage()
        panel = again.show_runs()
        row = panel.row_of(run_dir)
        assert row >= 0
        assert panel.proxy.index(row, COLUMNS.index("State")).data() == "running · detached"
        assert panel.select(run_dir) and panel.actions_by_name["attach"].isEnabled()
        qtbot.mouseClick(panel.buttons["attach"], Qt.MouseButton.LeftButton)
        c2 = again.controller
        assert c2.session.attached is not None and c2.run_dir == run_dir
        shown = c2.state.step
        assert shown > 0, "the history is read first"
        qtbot.waitUntil(lambda: c2.state.step > shown + 5, timeout=30_000)  # then live steps
        qtbot.waitUntil(lambda: again.plots.loss.points("replica/0/loss") > 3, timeout=10_000)
        assert again.commands["stop"].isEnabled() and again.run_status.badge.text() == "Running"

        # Stop, pressed twice: one stop, through the run's channel; every process ends
        stop = again.toolbar.widgetForAction(again.commands["stop"])
        qtbot.mouseClick(stop, Qt.MouseButton.LeftButton, pos=QPoint(8, stop.height() // 2))
        assert again.run_status.badge.text() == "Stopping…" and not again.commands["stop"].isEnabled()
        assert panel.select(run_dir)
        qtbot.mouseClick(panel.buttons["stop"], Qt.MouseButton.LeftButton)
        assert "Already stopping" in again.statusBar().currentMessage()
        qtbot.waitUntil(lambda: c2.run is None, timeout=60_000)
        assert c2.state.state == "stopped" and again.run_status.badge.text() == "Stopped"
        assert wait_gone(pids, 15.0) == [], "no process of the run is left"
        qtbot.waitUntil(lambda: panel.proxy.index(panel.row_of(run_dir), COLUMNS.index("State")).data()
                        == "stopped", timeout=5000)
        run_dir = None
    finally:
        end_run(run_dir)
        if again is not None:
            again.close()
            again.deleteLater()


@pytest.mark.cluster
def test_stop_while_the_detached_launcher_starts_calls_the_run_off(qtbot: Any, window: Any, runs_root: Path,
                                                                   tiny: Path) -> None:
    preferences.set_keep_runs_going(True)  # answered before: nothing is asked
    c = window.controller
    assert window.open_path(tiny, ask=False)
    window.commands["run"].trigger()
    run = c.session.attached
    assert run is not None and c.run_dir is None and window.commands["stop"].isEnabled()
    assert window.run_status.badge.text() == "Starting…"
    qtbot.waitUntil(lambda: run._spawn_proc is not None, timeout=10_000)  # `clusterdeck run --detach` is starting
    window.commands["stop"].trigger()
    qtbot.waitUntil(lambda: c.run is None, timeout=60_000)
    if c.run_dir is None:  # called off before its launcher said it started: nothing runs
        assert "cancelled" in window.statusBar().currentMessage()
        assert not [p for p in runs_root.glob("*") if (p / "config.yaml").exists() and
                    folder_pids(RunFolder(p)) and alive(folder_pids(RunFolder(p)))]
    else:  # it had started: it was stopped through its channel
        assert c.state.state == "stopped"
        assert wait_gone(folder_pids(RunFolder(c.run_dir)), 15.0) == []
    assert window.commands["run"].isEnabled() and not window.commands["stop"].isEnabled()


def test_the_question_and_the_preference(qtbot: Any, window: Any, dialogs: Any) -> None:
    never_asked()
    dialogs.answers.append(QMessageBox.StandardButton.Cancel)
    window.commands["run"].trigger()  # cancelled: nothing starts, nothing is remembered
    assert dialogs.kinds() == ["question"] and window.controller.run is None
    assert preferences.keep_runs_going() is None
    # the Run menu's switch and Edit > Preferences say and change the same thing
    window.commands["keep_going"].trigger()
    assert preferences.keep_runs_going() is True
    dialog = window.open_preferences()
    qtbot.waitUntil(dialog.isVisible)
    assert dialog.keep_going.isChecked() and dialog.keep_going.toolTip()
    qtbot.mouseClick(dialog.keep_going, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(dialog.buttons.button(dialog.buttons.StandardButton.Ok), Qt.MouseButton.LeftButton)
    assert preferences.keep_runs_going() is False and not window.commands["keep_going"].isChecked()
    assert QApplication.activeModalWidget() is None
    # a problem is said before the question is asked
    never_asked()
    window.controller.document.update_host(0, gpus=3)
    window.start_run()
    assert dialogs.kinds()[-1] == "warning" and preferences.keep_runs_going() is None


@pytest.mark.cluster
def test_a_start_its_launcher_refuses_is_told_like_any_other(qtbot: Any, window: Any, runs_root: Path,
                                                             tmp_path: Path, dialogs: Any) -> None:
    from engine.contract import config as config_mod
    from tests.gui.conftest import PRESETS

    preferences.set_keep_runs_going(True)
    script = tmp_path / "broken_model.py"
    script.write_text("def build_model(config):\n    raise RuntimeError('my model is broken on purpose')\n",
                      encoding="utf-8")
    cfg = config_mod.load(PRESETS / "data-1worker-2gpus.yaml")
    cfg = config_mod.replace(cfg, model=config_mod.replace(cfg.model, name="script", script=str(script)))
    c = window.controller
    c.document.set_config(cfg)
    t0 = time.monotonic()
    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert time.monotonic() - t0 < 1.0, "a detached start never blocks the window"
    assert c.session.attached is not None and window.run_status.badge.text() == "Starting…"
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=120_000)
    kind, title, text = dialogs.calls[-1]
    assert kind == "warning" and title == "Cannot run" and "my model is broken on purpose" in text
    assert c.run is None and not c.is_running and window.commands["run"].isEnabled()
    assert any("broken on purpose" in p.message for p in c.pre_run.problems) or "problem" in \
        window.statusBar().currentMessage()
    assert not [p for p in runs_root.glob("*") if p.is_dir()], "a refused start leaves no run folder"


@pytest.mark.cluster
def test_an_attached_run_whose_launcher_dies_reads_interrupted_with_its_history(qtbot: Any, window: Any,
                                                                                runs_root: Path, tiny: Path) -> None:
    import os
    import signal

    preferences.set_keep_runs_going(True)
    c = window.controller
    assert window.open_path(tiny, ask=False)
    window.commands["run"].trigger()
    qtbot.waitUntil(lambda: c.run_dir is not None, timeout=60_000)
    run_dir = c.run_dir
    assert run_dir is not None
    pids: list[int] = []
    try:
        qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") >= 3, timeout=90_000)
        pids = folder_pids(RunFolder(run_dir))
        info = read_launcher(RunFolder(run_dir))
        assert info is not None
        os.kill(info.pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: c.run is None, timeout=20_000)
        assert c.state.state == "interrupted" and window.run_status.badge.text() == "Interrupted"
        assert window.plots.loss.points("replica/0/loss") >= 3, "the history stays on screen"
        assert wait_gone(pids, 15.0) == [], "its tasks end with their launcher"
        panel = window.show_runs()
        qtbot.waitUntil(lambda: panel.proxy.index(panel.row_of(run_dir), COLUMNS.index("State")).data()
                        == "interrupted", timeout=5000)
        assert window.commands["run"].isEnabled() and not window.commands["stop"].isEnabled()
    finally:
        for pid in alive(pids):
            psutil.Process(pid).kill()


@pytest.mark.cluster
def test_two_detached_runs_go_on_while_the_window_switches_between_them(qtbot: Any, window: Any, runs_root: Path,
                                                                        tiny: Path, dialogs: Any) -> None:
    preferences.set_keep_runs_going(True)
    c = window.controller
    assert window.open_path(tiny, ask=False)
    runs: list[Path] = []
    try:
        for _ in range(2):  # Run, and Run again while the first is shown: the first is let go, not stopped
            assert window.commands["run"].isEnabled()
            window.commands["run"].trigger()
            qtbot.waitUntil(lambda: c.run_dir is not None and c.run_dir not in runs, timeout=60_000)
            assert c.run_dir is not None
            runs.append(c.run_dir)
            qtbot.waitUntil(lambda: c.state.step > 0, timeout=90_000)
        first, second = runs
        panel = window.show_runs()
        running = lambda path: panel.proxy.index(panel.row_of(path), COLUMNS.index("State")).data()  # noqa: E731
        qtbot.waitUntil(lambda: running(first) == running(second) == "running · detached", timeout=5000)
        step = status_step(first)
        qtbot.waitUntil(lambda: status_step(first) > step, timeout=30_000)  # not shown, still training

        # both watched at once: the first in a window of its own (Ctrl+Enter), live, beside the second
        assert panel.select(first)
        qtbot.keyClick(panel.table, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
        other = next(iter(OPEN_WINDOWS))
        assert (other.controller.run_dir, c.run_dir) == (first, second)
        seen = other.controller.state.step
        qtbot.waitUntil(lambda: other.controller.state.step > seen, timeout=30_000)
        other.close()  # its run was started detached: it goes on, nothing asked
        qtbot.waitUntil(lambda: not OPEN_WINDOWS, timeout=10_000)
        assert dialogs.kinds() == [] and running(first) == "running · detached"
        window.activateWindow()  # keys go to the active window: this one again
        qtbot.waitUntil(window.isActiveWindow, timeout=5000)

        # back to the first: the second goes on; its history, then live steps
        assert panel.select(first)
        qtbot.keyClick(panel.table, Qt.Key.Key_Return)
        assert c.run_dir == first and c.session.attached is not None
        shown = c.state.step
        qtbot.waitUntil(lambda: c.state.step > shown, timeout=30_000)
        step = status_step(second)
        qtbot.waitUntil(lambda: status_step(second) > step, timeout=30_000)

        # both stopped from the panel: the shown one as Stop does, the other through its channel (asked once)
        panel.table.selectAll()
        dialogs.answers.append(QMessageBox.StandardButton.Yes)
        qtbot.mouseClick(panel.buttons["stop"], Qt.MouseButton.LeftButton)
        assert dialogs.kinds() == ["question"] and second.name in dialogs.calls[-1][2]
        qtbot.waitUntil(lambda: c.run is None, timeout=60_000)
        qtbot.waitUntil(lambda: running(second) == "stopped", timeout=60_000)
        assert c.state.state == "stopped"
        for path in runs:
            assert wait_gone(folder_pids(RunFolder(path)), 15.0) == []
        runs = []
    finally:
        for path in runs:
            end_run(path)
