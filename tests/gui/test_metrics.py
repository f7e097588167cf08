"""Every metric the training reports, as a user sees it: a chooser above the first plot that grows as
metrics arrive, one curve per replica named with its task, the validation curve dashed, what trained
in the Messages dock and the bar, every series in the CSV, and a program that reports nothing."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from engine.contract import config as config_mod
from engine.contract import events
from engine.observe.telemetry import RunState
from gui.metric_series import NO_METRICS_NOTE, describe_training, metric_names, reports_no_metrics
from tests.gui.conftest import ReplayRun

TRAINING = {"source": "compile", "optimizer": "SGD", "learning_rate": 0.001,
            "loss": "SparseCategoricalCrossentropy", "metrics": ["accuracy", "auc"], "train_step": "keras"}


def checked(event: dict[str, Any]) -> dict[str, Any]:
    """The event as the launcher reads it: through the real decoder (a bad event fails the test)."""
    decoded = events.decode(events.encode(event))
    assert decoded is not None, event
    return decoded


def step(replica: int, n: int, **metrics: float | None) -> dict[str, Any]:
    return checked(events.make("step", f"worker:{replica}", replica=replica, step=n, loss=2.0 / n + 0.1 * replica,
                               examples_per_sec=1000.0, step_time=0.01, metrics=metrics))


def validation(n: int, loss: float, **metrics: float) -> dict[str, Any]:
    return checked(events.make("eval", "worker:0", step=n, loss=loss, metrics=metrics, examples=256))


def start(window: Any) -> ReplayRun:
    c = window.controller
    run = ReplayRun()
    c.session.watch(run, c.config)
    run.feed(checked(events.make("run", "launcher", state="running")))
    return run


def feed_steps(run: ReplayRun, first: int, last: int, **extra: float) -> None:
    for n in range(first, last + 1):
        for r in (0, 1):
            run.feed(step(r, n, accuracy=0.5 + n / 100 + r / 50, auc=0.6 + n / 200, **extra))
        if n % 10 == 0:
            run.feed(validation(n, 1.5 / n + 0.2, accuracy=0.45 + n / 100, auc=0.55 + n / 200))


def choose(qtbot: Any, combo: Any, text: str) -> None:
    """Pick ``text`` with the keyboard, as a user tabbing to the chooser would."""
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key.Key_Home)
    for _ in range(combo.count()):
        if combo.currentText() == text:
            return
        qtbot.keyClick(combo, Qt.Key.Key_Down)
    assert combo.currentText() == text


def test_the_chooser_offers_every_metric_as_it_arrives_with_its_validation(qtbot: Any, window: Any) -> None:
    plots = window.plots
    loss, chooser = plots.loss, plots.metric_chooser
    assert chooser.isVisibleTo(window) and [chooser.itemText(i) for i in range(chooser.count())] == ["loss"]
    run = start(window)
    feed_steps(run, 1, 30)
    qtbot.waitUntil(lambda: chooser.count() == 3 and loss.points("replica/1/loss") == 30)
    assert [chooser.itemText(i) for i in range(chooser.count())] == ["loss", "accuracy", "auc"]
    # one curve per replica, named with its task; the validation loss dashed beside them
    qtbot.waitUntil(lambda: "eval/loss" in loss.curves)
    assert loss.labels["replica/0/loss"] == "replica 0 · worker:0"
    assert loss.labels["replica/1/loss"] == "replica 1 · worker:1"
    assert loss.labels["eval/loss"] == "validation" and loss.points("eval/loss") == 3
    assert loss.curves["eval/loss"].pen().style() == Qt.PenStyle.DashLine
    assert [label.text for _, label in loss.legend.items] == ["replica 0 · worker:0", "replica 1 · worker:1",
                                                               "validation"]
    choose(qtbot, chooser, "accuracy")
    qtbot.waitUntil(lambda: loss.points("replica/1/accuracy") == 30)
    assert "Accuracy per replica" in loss.title.text()
    assert set(loss.curves) == {"replica/0/accuracy", "replica/1/accuracy", "eval/accuracy"}
    x, y = loss.raw["eval/accuracy"]
    assert x.tolist() == [10.0, 20.0, 30.0] and y[-1] == pytest.approx(0.75)
    # a metric that appears later joins the list; the shown one stays
    feed_steps(run, 31, 32, precision=0.9)
    qtbot.waitUntil(lambda: chooser.count() == 4)
    assert chooser.itemText(3) == "precision" and chooser.currentText() == "accuracy"
    assert loss.points("replica/0/accuracy") == 32
    choose(qtbot, chooser, "loss")
    qtbot.waitUntil(lambda: loss.points("replica/0/loss") == 32)
    assert "Loss per replica" in loss.title.text() and "eval/loss" in loss.curves


def test_what_trained_is_shown_and_the_csv_holds_every_metric(qtbot: Any, window: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = start(window)
    run.feed(checked(events.make("info", "worker:0", message="training as compiled", training=TRAINING)))
    feed_steps(run, 1, 20)
    expected = "Trained as compiled: SGD (learning rate 0.001), loss SparseCategoricalCrossentropy, " \
               "metrics accuracy, auc"
    qtbot.waitUntil(lambda: any(expected in t for t in window.messages.texts()))
    qtbot.waitUntil(lambda: window.plots.hint.text() == expected and window.plots.hint.isVisible())
    loss = window.plots.loss
    qtbot.waitUntil(lambda: loss.points("replica/1/loss") == 20)
    target = tmp_path / "metrics.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.mouseClick(loss.csv_button, Qt.MouseButton.LeftButton)
    with open(target, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["curve", "x", "y"]
    curves: dict[str, list[tuple[float, float]]] = {}
    for name, x, y in rows[1:]:
        curves.setdefault(name, []).append((float(x), float(y)))
    assert sorted(curves) == sorted([f"replica {r} · worker:{r} · {m}" for r in (0, 1) for m in ("loss", "accuracy", "auc")]
                                    + ["validation · loss", "validation · accuracy", "validation · auc"])
    assert len(curves["replica 1 · worker:1 · auc"]) == 20
    assert curves["validation · accuracy"] == [(10.0, pytest.approx(0.55)), (20.0, pytest.approx(0.65))]


def test_a_program_that_reports_nothing_says_so(qtbot: Any, window: Any) -> None:
    c = window.controller
    c.document.set_value("program", config_mod.Program(script="train.py", args=("--epochs", "2")))
    run = ReplayRun()
    c.session.watch(run, c.config)
    started = checked(events.make("run", "launcher", state="running"))
    started["t"] = time.time() - 1.0
    run.feed(started)
    loss = window.plots.loss
    qtbot.wait(300)
    assert loss.empty_note.toPlainText() == "no data yet"  # a second in: it may still start
    run.feed(checked(events.make("device", "worker:0", cpu_percent=50.0, rss_bytes=300_000_000, pid=1)))
    qtbot.waitUntil(lambda: loss.empty_note.toPlainText() == NO_METRICS_NOTE, timeout=8000)
    assert "reports no metrics" in window.plots.hint.text() and window.plots.hint.isVisible()
    assert window.plots.plots["memory"].points("task/worker:0/rss_bytes") == 1  # still drawn
    run.feed(checked(events.make("run", "launcher", state="finished")))
    run.done = True
    qtbot.waitUntil(lambda: c.run is None)


def test_metric_rules_without_qt() -> None:
    keys = ["replica/0/loss", "replica/0/accuracy", "replica/0/metric:loss", "task/worker:0/cpu_percent",
            "eval/loss", "replica/1/auc"]
    assert metric_names(keys) == ["loss", "accuracy", "metric:loss", "auc"]
    assert describe_training({"source": "config", "optimizer": "adam", "learning_rate": 0.05}) == \
        "Optimizer from the preset: adam 0.05 (the model was not compiled)"
    assert describe_training({**TRAINING, "train_step": "custom", "learning_rate": "ExponentialDecay"}).endswith(
        "metrics accuracy, auc; custom train_step")
    state = RunState()
    state.apply(events.make("run", "launcher", state="running"))
    t = state.started_at or 0.0
    assert not reports_no_metrics(state, True, now=t + 1) and reports_no_metrics(state, True, now=t + 6)
    assert not reports_no_metrics(state, False, now=t + 6)
