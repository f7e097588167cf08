"""Scaling report window, straggler flags, Export… and the host's SSH fields, used as a user would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QInputDialog

from engine.contract import config as config_mod
from engine.contract import events
from engine.control.scaling import ScalingPoint, ScalingReport, read_csv
from gui.scaling_plot import render_png
from gui.task_table import COLUMNS
from tests.gui.conftest import ReplayRun


def menu_action(window: Any, menu: str, text: str) -> Any:
    for top in window.menuBar().actions():
        if top.text().replace("&", "") == menu:
            for action in top.menu().actions():
                if action.text().replace("&", "") == text:
                    return action
    raise AssertionError(f"no {menu} › {text} menu item")


def report() -> ScalingReport:
    pts = (ScalingPoint(1, 1, 64, 100, 20000.0, "window", "finished"),
           ScalingPoint(2, 2, 128, 100, 26000.0, "window", "finished"),
           ScalingPoint(4, 4, 256, 100, 28000.0, "window", "finished"))
    return ScalingReport(preset="data-2workers", scaling="weak", cpu_count=2, points=pts)


# --------------------------------------------------------------------------- scaling report


def test_the_png_renders_at_its_size(qtbot: Any, tmp_path: Path) -> None:
    path = render_png(report(), tmp_path / "fig.png", (900, 420))
    image = QImage(str(path))
    assert path.stat().st_size > 5000 and (image.width(), image.height()) == (900, 420)
    # not a blank canvas: measured points (blue) and the Horovod line (orange) are drawn
    colours = {image.pixelColor(x, y).name() for x in range(0, 900, 3) for y in range(0, 420, 3)}
    assert len(colours) > 20


def test_bad_worker_counts_are_told_and_nothing_starts(qtbot: Any, window: Any, dialogs: Any) -> None:
    menu_action(window, "Run", "Scaling Report…").trigger()
    dialog = window.scaling_dialog
    qtbot.waitExposed(dialog)
    dialog.workers.clear()
    qtbot.keyClicks(dialog.workers, "1, two")
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialogs.calls[-1][0] == "warning" and "workers: expected" in dialogs.calls[-1][2]
    assert dialog.session is None and not dialog.timer.isActive()


@pytest.mark.cluster
def test_the_dialog_runs_a_tiny_report_and_saves_png_and_csv(qtbot: Any, window: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    menu_action(window, "Run", "Scaling Report…").trigger()
    dialog = window.scaling_dialog
    qtbot.waitExposed(dialog)
    dialog.workers.clear()
    qtbot.keyClicks(dialog.workers, "1, 2")
    dialog.steps.lineEdit().selectAll()
    qtbot.keyClicks(dialog.steps.lineEdit(), "40")
    qtbot.keyClick(dialog.steps.lineEdit(), Qt.Key.Key_Enter)
    assert dialog.steps.value() == 40
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialog.running and not dialog.run_button.isEnabled() and dialog.cancel_button.isEnabled()
    texts: list[str] = []
    dialog.timer.timeout.connect(lambda: texts.append(dialog.status.text()))
    qtbot.waitUntil(lambda: "step" in dialog.status.text() and "ETA" in dialog.status.text(), timeout=60_000)
    qtbot.waitUntil(lambda: not dialog.running, timeout=120_000)  # the event loop kept turning meanwhile
    assert any("Run 2 of 2" in t for t in texts)
    assert "2 of 2 runs measured" in dialog.status.text(), dialog.status.text()
    assert dialog.progress.value() == dialog.progress.maximum()
    assert [p.workers for p in dialog.plot.report.points] == [1, 2]
    assert dialog.save_png_button.isEnabled() and dialog.save_csv_button.isEnabled()
    png, csv_path = tmp_path / "out.png", tmp_path / "out.csv"
    answers = iter([(str(png), ""), (str(csv_path), "")])
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: next(answers)))
    qtbot.mouseClick(dialog.save_png_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(dialog.save_csv_button, Qt.MouseButton.LeftButton)
    assert QImage(str(png)).width() == 1200 and QImage(str(png)).height() == 560
    saved = read_csv(csv_path)
    one, two = saved.points
    assert one.examples_per_sec and two.examples_per_sec
    assert saved.efficiency(two) == pytest.approx(two.examples_per_sec / (2 * one.examples_per_sec))
    dialog.close()
    assert not dialog.timer.isActive()


# --------------------------------------------------------------------------- stragglers


def step_events(seconds: float = 12.0, slow: int = 1) -> list[dict[str, Any]]:
    """Two replicas stepping together; ``slow`` spends twice as long on its own share of each step."""
    out = []
    t, step = 1_800_000_000.0, 0
    while t < 1_800_000_000.0 + seconds:
        step += 1
        t += 0.25
        for r in (0, 1):
            own = 0.2 if r == slow else 0.1
            out.append({"v": 1, "kind": "step", "task": f"worker:{r}", "t": t, "replica": r, "step": step,
                        "loss": 1.0, "examples_per_sec": 256.0, "step_time": 0.25, "own_time": own})
    return out


def test_a_straggler_is_flagged_in_the_task_table_and_the_status_bar(qtbot: Any, window: Any) -> None:
    model = window.task_table.model
    column = COLUMNS.index("Straggler")
    rows = [t.name for t in model.rows]
    assert rows == ["worker:0", "worker:1"]
    changes = window.stragglers.feed(step_events())
    assert [c.replica for c in changes if c.flagged] == [1]
    slow = model.index(rows.index("worker:1"), column)
    fine = model.index(rows.index("worker:0"), column)
    assert model.data(slow) == "2.00× (replica 1)" and model.data(fine) == ""
    tip = model.data(slow, Qt.ItemDataRole.ToolTipRole)
    assert "step 200 ms vs median 100 ms" in tip
    assert model.data(slow, Qt.ItemDataRole.BackgroundRole) is not None
    assert model.data(fine, Qt.ItemDataRole.BackgroundRole) is None
    label = window.straggler_label
    assert label.isVisibleTo(window) and "replica 1 (worker:1)" in label.text()
    # a new run view starts over
    window.controller.reset_run_view()
    assert model.data(slow) == "" and not label.isVisibleTo(window)


def test_a_live_run_feeds_the_flags_from_its_dispatcher_thread(qtbot: Any, window: Any) -> None:
    import threading

    c = window.controller
    run = ReplayRun()
    c.session.watch(run, c.config, state="running")
    try:
        assert len(run.listeners) == 2  # the session's fold and the straggler watch
        feeder = threading.Thread(target=lambda: [fn(e) for e in step_events() for fn in run.listeners])
        feeder.start()
        feeder.join()
        assert not window.stragglers.flagged  # nothing is folded off the GUI thread
        qtbot.waitUntil(lambda: list(window.stragglers.flagged) == [1])  # the session's drain timer tells views
        assert "replica 1" in window.straggler_label.text()
    finally:
        run.done = True
        qtbot.waitUntil(lambda: c.run is None)


def ended_run_folder(folder: Path, slow: int) -> Path:
    """A finished run's folder of two replicas, ``slow`` the slower (-1: neither)."""
    folder.mkdir()
    config_mod.save(config_mod.replace(config_mod.default_config(), name=folder.name), folder / "config.yaml")
    writer = events.EventWriter(folder / "events.jsonl")
    for event in step_events(slow=slow):
        writer.write(event)
    writer.write({"v": 1, "kind": "run", "task": "launcher", "t": 1_800_000_100.0, "state": "finished"})
    writer.close()
    return folder


def test_an_opened_run_folder_shows_its_stragglers(qtbot: Any, window: Any, tmp_path: Path) -> None:
    folder = ended_run_folder(tmp_path / "slow-run", slow=0)
    assert window.open_run_folder(folder)
    assert not window.stragglers.flagged  # replayed once the window shows the run, slice by slice
    qtbot.waitUntil(lambda: bool(window.stragglers.flagged))
    model = window.task_table.model
    row = [t.name for t in model.rows].index("worker:0")
    assert model.data(model.index(row, COLUMNS.index("Straggler"))).startswith("2.00×")
    assert "worker:0" in window.straggler_label.text()


def test_a_folder_opened_while_another_is_replayed_shows_only_its_own_stragglers(qtbot: Any, window: Any,
                                                                                 tmp_path: Path) -> None:
    slow = ended_run_folder(tmp_path / "slow-run", slow=0)
    even = ended_run_folder(tmp_path / "even-run", slow=-1)
    assert window.open_run_folder(slow)
    assert window.open_run_folder(even)  # before the first folder's replay ran
    qtbot.wait(300)
    assert not window.stragglers.flagged and "worker:0" not in window.straggler_label.text()
    assert window.open_run_folder(slow)
    qtbot.waitUntil(lambda: list(window.stragglers.flagged) == [0])


# --------------------------------------------------------------------------- export


def test_export_writes_the_files_into_the_chosen_folder(qtbot: Any, window: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "export"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(out)))
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("registry.local/cd:1", True)))
    menu_action(window, "File", "Export…").trigger()
    assert (out / "config.yaml").is_file() and (out / "tf_config" / "worker-1.json").is_file()
    assert "registry.local/cd:1" in (out / "tfjob.yaml").read_text()
    assert "Exported" in window.statusBar().currentMessage()


def test_export_without_an_image_writes_no_tfjob_and_cancel_writes_nothing(qtbot: Any, window: Any, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "export"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(out)))
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("", False)))
    assert window.export_config() == [] and not out.exists()
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("  ", True)))
    paths = window.export_config()
    assert paths and (out / "launch-local.sh").exists() and not (out / "tfjob.yaml").exists()


def test_export_of_an_invalid_config_shows_the_problem(qtbot: Any, window: Any, tmp_path: Path,
                                                       dialogs: Any) -> None:
    window.controller.document.set_value("training.global_batch_size", 127)  # not divisible over 2 replicas
    assert window.export_config(tmp_path / "export", image="") == []
    kind, title, text = dialogs.calls[-1]
    assert kind == "critical" and title == "Cannot export the config" and "global_batch_size" in text
    assert not (tmp_path / "export").exists()


# --------------------------------------------------------------------------- SSH fields


def test_ssh_fields_edit_the_host_and_undo(qtbot: Any, window: Any) -> None:
    c = window.controller
    c.document.select(("host", 0))
    panel = window.properties
    assert panel.host_ssh_port.value() == 22 and panel.host_python.text() == "python3"
    qtbot.mouseClick(panel.host_ssh_host, Qt.MouseButton.LeftButton)
    qtbot.keyClicks(panel.host_ssh_host, "gpu-box")
    qtbot.keyClick(panel.host_ssh_host, Qt.Key.Key_Return)
    panel.host_ssh_user.setFocus()
    qtbot.keyClicks(panel.host_ssh_user, "alice")
    qtbot.keyClick(panel.host_ssh_user, Qt.Key.Key_Return)
    panel.host_ssh_port.lineEdit().selectAll()
    qtbot.keyClicks(panel.host_ssh_port.lineEdit(), "2222")
    qtbot.keyClick(panel.host_ssh_port.lineEdit(), Qt.Key.Key_Return)
    panel.host_python.setFocus()
    panel.host_python.selectAll()
    qtbot.keyClicks(panel.host_python, "/opt/venv/bin/python")
    qtbot.keyClick(panel.host_python, Qt.Key.Key_Return)
    host = c.config.cluster.hosts[0]
    assert (host.ssh_host, host.ssh_user, host.ssh_port, host.python) == ("gpu-box", "alice", 2222,
                                                                         "/opt/venv/bin/python")
    assert not host.is_local  # an SSH target makes it a remote host
    for _ in range(4):
        window.commands["undo"].trigger()
    host = c.config.cluster.hosts[0]
    assert (host.ssh_host, host.ssh_user, host.ssh_port, host.python) == ("", "", 22, "python3")
    assert panel.host_ssh_host.text() == "" and panel.host_ssh_port.value() == 22
    # the field that still has focus shows the undone value, and leaving it edits nothing
    assert panel.host_python.hasFocus() and panel.host_python.text() == "python3"
    panel.host_ssh_user.setFocus()
    assert c.config.cluster.hosts[0].python == "python3" and c.undo_stack.index() == 0
    window.commands["redo"].trigger()
    assert c.config.cluster.hosts[0].ssh_host == "gpu-box" and panel.host_ssh_host.text() == "gpu-box"
