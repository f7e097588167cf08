"""The Runs panel used as a person does: the runs of the runs folder listed, filtered, sorted, opened with the
keyboard, compared, deleted; a run started elsewhere appears; bad runs are told clearly."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from engine.contract.run_folder import RunFolder, process_token
from engine.control import control_socket
from gui.runs_model import COLUMNS
from tests.gui.test_runs import make_run_folder

SIZES = [(1366, 768), (1920, 1080)]


def past_run(root: Path, name: str, state: str = "finished", steps: int = 120, mode: str = "data",
             t0: float = 1_800_000_000.0) -> Path:
    """A run folder as a launcher leaves it, with what ``run.json`` says of its progress and hosts."""
    folder = make_run_folder(root, name, steps=steps, state=state, t0=t0)
    RunFolder(folder).write_meta(mode=mode, step=steps, summary={"steps": steps, "total_steps": 200},
                                 supervisors={"local": {"pid": 1, "transport": "local", "host": "local"}})
    return folder


def launched_by(folder: Path, pid: int, state: str = "running") -> None:
    """``folder``'s run marked as run by process ``pid`` (alive: a running run; gone: an interrupted one)."""
    who = {"pid": pid, "host": socket.gethostname(), "token": process_token(pid)}
    RunFolder(folder).write_meta(state=state, launcher=who)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def texts(panel: Any, column: str = "Run") -> list[str]:
    col = COLUMNS.index(column)
    return [panel.proxy.index(r, col).data() for r in range(panel.proxy.rowCount())]


def test_the_runs_of_the_runs_folder_are_listed_filtered_sorted_and_opened(qtbot: Any, window: Any,
                                                                          runs_root: Path) -> None:
    runs_root.mkdir(parents=True, exist_ok=True)
    past_run(runs_root, "20260101-100000-data-2workers")
    past_run(runs_root, "20260102-100000-async-1ps", state="failed", steps=40, mode="async")
    interrupted = past_run(runs_root, "20260103-100000-model-2x2", state="running", steps=70, mode="model")
    launched_by(interrupted, dead_pid())  # marked running by a launcher that is gone
    (runs_root / "not-a-run").mkdir()
    panel = window.show_runs()
    assert window.runs_dock.isVisible() and panel.table.hasFocus()
    qtbot.waitUntil(lambda: panel.proxy.rowCount() == 3)
    assert panel.count.text() == "3 runs"
    assert texts(panel, "State") == ["interrupted", "failed", "finished"]  # newest first (by start time)
    row = texts(panel).index("20260102-100000-async-1ps")
    assert texts(panel, "Progress")[row] == "40 of 200 (20 %)" and texts(panel, "Mode")[row] == "async"
    assert texts(panel, "Hosts")[row] == "local"
    tip = panel.proxy.index(texts(panel).index("20260103-100000-model-2x2"), 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "launcher is gone" in tip and "history" in tip
    for name, button in panel.buttons.items():
        assert button.toolTip(), name

    # a run started elsewhere appears within a couple of seconds
    late = past_run(runs_root, "20260104-100000-late")
    qtbot.waitUntil(lambda: panel.row_of(late) >= 0, timeout=2500)

    # filter by words and by state
    qtbot.keyClicks(panel.filter, "async")
    assert texts(panel) == ["20260102-100000-async-1ps"] and panel.count.text() == "1 of 4 runs"
    panel.filter.clear()
    panel.state.setCurrentIndex(panel.state.findData("interrupted"))
    assert texts(panel) == ["20260103-100000-model-2x2"]
    panel.state.setCurrentIndex(0)
    assert panel.proxy.rowCount() == 4

    # sorted by a click on a column's header, and the other way round by a second one
    header = panel.table.horizontalHeader()
    at = QPoint(header.sectionViewportPosition(COLUMNS.index("Progress")) + 10, header.height() // 2)
    steps: list[list[int]] = []
    for _ in range(2):
        qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=at)
        steps.append([int(t.split()[0]) for t in texts(panel, "Progress")])
    assert sorted(steps[0]) in (steps[0], steps[1]) and steps[0] == steps[1][::-1]

    # the keyboard: Ctrl+F to the filter, Down to the list, Enter opens the run
    panel.table.setFocus()
    qtbot.keyClick(panel.table, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert panel.filter.hasFocus()
    qtbot.keyClicks(panel.filter, "late")
    qtbot.keyClick(panel.filter, Qt.Key.Key_Down)
    assert panel.table.hasFocus() and [e.path for e in panel.selected()] == [late]
    qtbot.keyClick(panel.table, Qt.Key.Key_Return)
    c = window.controller
    assert c.run_dir == late and c.state.state == "finished" and window.layout_mode == "watch"
    qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") == 120)
    font = panel.proxy.index(panel.row_of(late), 0).data(Qt.ItemDataRole.FontRole)
    assert font is not None and font.bold()  # the run shown
    assert not panel.actions_by_name["attach"].isEnabled()  # it has ended

    # compare: the selected run overlaid on the one shown
    panel.filter.clear()
    assert panel.select(runs_root / "20260102-100000-async-1ps")
    qtbot.mouseClick(panel.buttons["compare"], Qt.MouseButton.LeftButton)
    key = "cmp:20260102-100000-async-1ps:replica/0/loss"
    qtbot.waitUntil(lambda: window.plots.loss.points(key) == 40)


def test_column_widths_sort_and_state_filter_are_remembered(qtbot: Any, window: Any, runs_root: Path) -> None:
    from gui.controller import Controller
    from gui.main_window import MainWindow

    past_run(runs_root, "20260101-100000-a")
    panel = window.show_runs()
    header = panel.table.horizontalHeader()
    header.resizeSection(COLUMNS.index("Run"), 333)
    header.setSortIndicator(COLUMNS.index("Mode"), Qt.SortOrder.AscendingOrder)
    panel.state.setCurrentIndex(panel.state.findData("failed"))
    window.save_settings()
    again = MainWindow(Controller(runs_root=runs_root))
    try:
        header = again.runs_panel.table.horizontalHeader()
        assert header.sectionSize(COLUMNS.index("Run")) == 333
        assert header.sortIndicatorSection() == COLUMNS.index("Mode")
        assert again.runs_panel.state.currentData() == "failed"
    finally:
        again.shutdown()
        again.deleteLater()


def test_delete_asks_and_never_takes_a_running_run(qtbot: Any, window: Any, runs_root: Path, dialogs: Any) -> None:
    done = past_run(runs_root, "20260101-100000-done")
    going = past_run(runs_root, "20260102-100000-going")
    launched_by(going, os.getpid())  # a launcher that lives: the run reads running
    panel = window.show_runs()
    qtbot.waitUntil(lambda: panel.proxy.rowCount() == 2)
    assert panel.select(going)
    row = panel.row_of(going)
    assert panel.proxy.index(row, COLUMNS.index("State")).data() == "running"
    assert not panel.actions_by_name["delete"].isEnabled() and "never deleted" in \
        panel.actions_by_name["delete"].toolTip()
    window.runs_commands.delete(panel.selected())  # even when asked for: refused, said why
    assert dialogs.kinds() == ["warning"] and "stop it first" in dialogs.calls[-1][2] and going.is_dir()

    assert panel.select(done)
    dialogs.answers.append(QMessageBox.StandardButton.No)
    qtbot.keyClick(panel.table, Qt.Key.Key_Delete)
    assert dialogs.kinds()[-1] == "question" and "cannot be undone" in dialogs.calls[-1][2] and done.is_dir()
    dialogs.answers.append(QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(panel.buttons["delete"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not done.exists() and panel.row_of(done) < 0, timeout=5000)
    assert "Deleted" in window.statusBar().currentMessage()


def test_bad_runs_are_told_clearly(qtbot: Any, window: Any, runs_root: Path, tmp_path: Path, dialogs: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    c = window.controller
    panel = window.show_runs()
    # a folder that is no run, through the panel's folder picker
    stray = tmp_path / "holiday-photos"
    stray.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(stray)))
    qtbot.mouseClick(panel.buttons["folder"], Qt.MouseButton.LeftButton)
    kind, _title, text = dialogs.calls[-1]
    assert kind == "critical" and "not a run folder" in text and "config.yaml" in text

    # a run whose launcher died: interrupted, its history shown
    died = past_run(runs_root, "20260101-100000-died", state="running")  # no end recorded
    launched_by(died, dead_pid())
    panel.refresh()
    assert panel.select(died) and panel.proxy.index(panel.row_of(died), 1).data() == "interrupted"
    qtbot.mouseClick(panel.buttons["open"], Qt.MouseButton.LeftButton)
    assert c.run_dir == died and c.state.state == "interrupted" and c.run is None
    qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") == 120)

    # another user's running run: its channel refuses this uid; Stop says so, the run stays shown as running
    theirs = past_run(runs_root, "20260102-100000-theirs")
    launched_by(theirs, os.getpid())
    server = control_socket.ControlServer(RunFolder(theirs).control_socket, lambda m: {"ok": True},
                                          owner_uid=os.getuid() + 4242).start()
    try:
        panel.refresh()
        assert panel.select(theirs) and panel.actions_by_name["attach"].isEnabled()
        qtbot.mouseClick(panel.buttons["attach"], Qt.MouseButton.LeftButton)
        assert c.session.attached is not None and c.run_dir == theirs and window.commands["stop"].isEnabled()
        assert window.commands["run"].isEnabled()  # another run may start: this one goes on
        window.commands["stop"].trigger()
        qtbot.waitUntil(lambda: dialogs.kinds()[-1] == "warning", timeout=10_000)
        assert "belongs to uid" in dialogs.calls[-1][2] and "Cannot stop" in dialogs.calls[-1][2]
        assert c.session.is_running and not c.session.is_stopping and window.commands["stop"].isEnabled()
        # the panel's Stop on a run the window does not show goes through the channel too
        c.session.release()
        assert c.run is None and theirs.is_dir()
        dialogs.answers.append(QMessageBox.StandardButton.Yes)
        assert panel.select(theirs)
        qtbot.mouseClick(panel.buttons["stop"], Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: dialogs.kinds()[-1] == "warning", timeout=10_000)
        assert "belongs to uid" in dialogs.calls[-1][2]
    finally:
        server.close()
    # a folder of another uid: not stopped, not deleted, and said why
    os.chown(theirs, 65534, 65534)
    panel.source.scanner.forget(theirs)  # a run's owner is read once (it does not change under a run)
    panel.refresh()
    assert panel.select(theirs)
    window.runs_commands.stop(panel.selected())
    assert "another user" in dialogs.calls[-1][2]


@pytest.fixture(params=["light", "dark"])
def palette(request: pytest.FixtureRequest, window: Any) -> Any:
    window.set_theme(request.param)
    yield request.param
    window.set_theme("light")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_runs_panel_at_every_size(qtbot: Any, window: Any, runs_root: Path, palette: str,
                                      size: tuple[int, int]) -> None:
    shown = past_run(runs_root, "20260101-093000-data-2workers", steps=200)
    past_run(runs_root, "20260101-101500-async-1ps", state="failed", steps=40, mode="async")
    past_run(runs_root, "20260101-110000-model-2x2", state="stopped", steps=150, mode="model")
    going = past_run(runs_root, "20260101-120000-data-8workers", steps=130)
    launched_by(going, os.getpid())
    died = past_run(runs_root, "20260101-080000-data-digits-cnn", state="running", steps=60)
    launched_by(died, dead_pid())
    assert window.open_run_folder(shown)
    window.resize(*size)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size, timeout=5000)
    panel = window.show_runs()
    qtbot.waitUntil(lambda: panel.proxy.rowCount() == 5)
    panel.select(going)
    qtbot.wait(200)
    assert panel.isVisible() and panel.table.height() > 3 * panel.table.verticalHeader().defaultSectionSize()
    for button in panel.buttons.values():
        top_left = button.mapTo(window, button.rect().topLeft())
        assert window.rect().contains(top_left) and button.isVisible(), button.objectName()
    window.grab().save(f"/tmp/runs_panel_{size[0]}x{size[1]}_{palette}.png")
