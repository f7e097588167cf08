"""Past run folders: curves, task table, logs with noise folded, comparison, export."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.run_folder import RunFolder

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795966716.562316    4911 port.cc:153] oneDNN custom operations are on.",
]


def make_run_folder(root: Path, name: str, steps: int = 120, loss_scale: float = 1.0, state: str = "finished",
                    t0: float = 1_800_000_000.0) -> Path:
    """A run folder as the launcher leaves it: config.yaml, events.jsonl, run.json, task logs."""
    run = RunFolder(root / name)
    folder = run.path
    folder.mkdir(parents=True)
    config = config_mod.replace(config_mod.default_config(), name=name)
    run.write_config(config)
    writer = events.EventWriter(run.events)

    def put(kind: str, task: str, t: float, **fields: Any) -> None:
        event = events.make(kind, task, **fields)
        event["t"] = t
        writer.write(event)

    put("run", "launcher", t0, state="starting")
    put("run", "launcher", t0 + 0.01, state="running")
    for r in (0, 1):
        put("status", f"worker:{r}", t0 + 0.1, state="starting", pid=1000 + r, host="local", role="worker")
    for step in range(1, steps + 1):
        t = t0 + 3 + step * 0.02
        for r in (0, 1):
            put("step", f"worker:{r}", t, replica=r, step=step, loss=loss_scale * 2.5 * math.exp(-step / 40) + 0.1 * r,
                examples_per_sec=4000.0 + 100 * r, step_time=0.016)
        if step % 10 == 0:
            for r in (0, 1):
                put("device", f"worker:{r}", t, cpu_percent=90.0 + r, rss_bytes=500_000_000 + r, pid=1000 + r)
    writer.write_line("{not json")  # a bad line is skipped, never trusted
    for r in (0, 1):
        put("status", f"worker:{r}", t0 + 6, state="finished", pid=1000 + r, steps=steps)
    put("run", "launcher", t0 + 6.1, state=state, reason="")
    writer.close()
    run.write_meta(name=name, state=state)
    for r in (0, 1):
        lines = [f"--- starting worker:{r}", *NOISE, f"worker:{r} training step 10 loss 1.23", "checkpoint saved"]
        log = run.task_log(f"worker:{r}")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_reopening_a_run_folder_shows_its_curves_and_tasks(qtbot: Any, window: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_run_folder(tmp_path, "past-run")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    window.commands["open_run"].trigger()
    c = window.controller
    assert c.run_dir == folder and c.state.state == "finished"
    assert c.config.name == "past-run"
    loss = window.plots.loss
    qtbot.waitUntil(lambda: loss.points("replica/0/loss") == 120 and loss.points("replica/1/loss") == 120)
    assert window.plots.plots["throughput"].points("total") == 120
    assert window.plots.plots["utilisation"].points("task/worker:0/cpu_percent") == 12
    memory = window.plots.plots["memory"]
    x, y = memory.raw["task/worker:0/rss_bytes"]
    assert y[0] == pytest.approx(500_000_000 / 2**20)
    assert not window.plots.hint.isVisibleTo(window)
    # the task table and the status
    model = window.task_table.model
    assert model.rowCount() == 2
    assert [model.text(t, "State") for t in model.rows] == ["finished", "finished"]
    assert "Finished" in window.run_status.badge.text() and "120 steps" in window.run_status.detail.text()
    # smoothing changes what is drawn, not the data
    curve = loss.curves["replica/0/loss"]
    window.plots.smoothing.setValue(0)
    raw_last = curve.yData[-1]
    window.plots.smoothing.setValue(95)
    assert curve.yData[-1] > raw_last
    assert loss.raw["replica/0/loss"][1][-1] == pytest.approx(raw_last)
    # x by wall time
    window.plots.x_mode.setCurrentIndex(1)
    assert curve.xData[0] == pytest.approx(3.01, abs=1e-6)  # seconds since the run started
    assert window.plots.x_mode.currentText() == "Wall time"


def test_compare_with_another_run_overlays_dashed_curves(qtbot: Any, window: Any, tmp_path: Path) -> None:
    first = make_run_folder(tmp_path, "run-a")
    second = make_run_folder(tmp_path, "run-b", steps=80, loss_scale=0.5)
    assert window.open_run_folder(first)
    assert window.compare_with_run(second)
    loss = window.plots.loss
    key = "cmp:run-b:replica/0/loss"
    qtbot.waitUntil(lambda: loss.points(key) == 80)
    assert loss.curves[key].opts["pen"].style() == Qt.PenStyle.DashLine
    assert "run-b" in loss.labels[key]
    assert window.commands["clear_compare"].isEnabled()
    window.plots.clear_compare.click()
    assert key not in loss.curves and loss.points("replica/0/loss") == 120


def test_export_plot_as_png_and_csv(qtbot: Any, window: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert window.open_run_folder(make_run_folder(tmp_path, "exported"))
    loss = window.plots.loss
    qtbot.waitUntil(lambda: loss.points("replica/1/loss") == 120)
    png = tmp_path / "loss.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(png), "")))
    qtbot.mouseClick(loss.png_button, Qt.MouseButton.LeftButton)
    image = QImage(str(png))
    assert not image.isNull() and image.width() == 1200 and image.height() > 100
    target = tmp_path / "loss.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.mouseClick(loss.csv_button, Qt.MouseButton.LeftButton)
    with open(target, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["curve", "x", "y"]
    assert len(rows) == 1 + 2 * 120
    first = rows[1]
    assert first[0] == "replica 0 · worker:0 · loss" and float(first[1]) == 1.0 and float(first[2]) == pytest.approx(2.5 * math.exp(-1 / 40))


def test_logs_fold_tensorflow_noise_and_filter(qtbot: Any, window: Any, tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path, "logged")
    assert window.open_run_folder(folder)
    logs = window.logs
    assert logs.current_task() == "worker:0"
    text = logs.text.toPlainText()
    assert "training step 10" in text and "oneDNN" not in text and "absl" not in text
    assert "2 noise lines folded" in logs.folded.text()
    logs.show_noise.setChecked(True)
    assert "oneDNN" in logs.text.toPlainText()
    logs.show_noise.setChecked(False)
    qtbot.keyClicks(logs.filter, "checkpoint")
    assert logs.text.toPlainText().strip() == "checkpoint saved"
    logs.filter.clear()
    logs.task.setCurrentText("worker:1")
    assert "worker:1 training step" in logs.text.toPlainText()
    # a log that grows is followed incrementally (a run still going is polled by the timer)
    with open(RunFolder(folder).task_log("worker:1"), "a", encoding="utf-8") as fh:
        fh.write("a new line\npartial")
    logs.poll()
    assert logs.text.toPlainText().endswith("a new line")
    with open(RunFolder(folder).task_log("worker:1"), "a", encoding="utf-8") as fh:
        fh.write(" line done\n")
    logs.poll()
    assert logs.text.toPlainText().endswith("partial line done")


def test_a_folder_that_is_no_run_gives_a_message(window: Any, tmp_path: Path, dialogs: Any) -> None:
    assert not window.open_run_folder(tmp_path)
    assert dialogs.calls[-1][0] == "critical" and "config.yaml" in dialogs.calls[-1][2]


def test_a_failed_run_names_the_task_the_reason_and_its_last_lines(window: Any, tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path, "broken", steps=20, state="failed")
    writer = events.EventWriter(folder / "events.jsonl")
    tail = ["Traceback (most recent call last):", "tensorflow.python.framework.errors_impl.UnavailableError: peer gone"]
    failed = events.make("status", "worker:1", state="failed", reason="exited with code 1", log_tail=tail)
    writer.write(failed)
    writer.write(events.make("run", "launcher", state="failed", reason="worker:1: exited with code 1",
                             failed_task="worker:1"))
    writer.close()
    assert window.open_run_folder(folder)
    report = window.task_table.failure
    assert report.isVisibleTo(window)
    assert "worker:1" in report.text() and "exited with code 1" in report.text() and "UnavailableError" in report.text()
    assert window.run_status.badge.text() == "Failed" and "worker:1" in window.run_status.detail.text()
    row = [t.name for t in window.task_table.model.rows].index("worker:1")
    index = window.task_table.model.index(row, 9)
    assert "UnavailableError" in window.task_table.model.data(index, Qt.ItemDataRole.ToolTipRole)
    chip = window.canvas.chip(0, 1)
    assert chip.run_state is not None and chip.run_state.state == "failed" and "exited with code 1" in chip.toolTip()
