"""The window on a laptop screen (1366x768) and a desktop one (1920x1080), light and dark: the run's
state, every plot's axes and legend entries, and a failed run that leaves the window within the screen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QPointF, QRect, Qt
from PySide6.QtWidgets import QWidget

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, Task
from tests.gui.conftest import ReplayRun

SIZES = [(1366, 768), (1920, 1080)]
TF_WALL = ("Traceback (most recent call last): " + "File /usr/lib/python3/dist-packages/tensorflow/python/eager/"
           + "execute" * 60 + " tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error: "
           + "x" * 400)


@pytest.fixture(params=["light", "dark"])
def palette(request: pytest.FixtureRequest, window: Any) -> Iterator[str]:
    window.set_theme(request.param)
    yield request.param
    window.set_theme("light")


def six_workers(name: str = "six") -> config_mod.RunConfig:
    base = config_mod.default_config()
    hosts = (Host(name="a", tasks=tuple(Task("worker", i) for i in range(3))),
             Host(name="b", tasks=tuple(Task("worker", i) for i in range(3, 6))))
    return config_mod.replace(base, name=name, cluster=Cluster(hosts=hosts),
                              training=config_mod.replace(base.training, steps=4000))


def replay(window: Any, config: Any, steps: int = 300, fail: bool = False) -> ReplayRun:
    """``config`` run up to ``steps`` through the real window (its session folds the events)."""
    c = window.controller
    c.new_document(config)
    run = ReplayRun()
    c.session.watch(run, config, state="starting")
    t0 = time.time() - 60
    out = [events.make("run", "launcher", state="starting", t=t0)]
    tasks = [(h.name, t) for h, t in config.cluster.tasks()]
    for k, (host, task) in enumerate(tasks):
        out.append(events.make("status", task.name, state="running", pid=5000 + k, host=host, role=task.role, t=t0))
    out.append(events.make("run", "launcher", state="running", t=t0))
    for step in range(1, steps + 1):
        for r, (_, task) in enumerate(tasks):
            e = events.make("step", task.name, replica=r, step=step, loss=2.0 / step + 0.01 * r,
                            examples_per_sec=900.0 + r, step_time=0.02 + 0.001 * r)
            e["t"] = t0 + step * 0.05
            out.append(e)
        if step % 25 == 0:
            for k, (_, task) in enumerate(tasks):
                e = events.make("device", task.name, cpu_percent=60.0 + k, rss_bytes=(500 + 10 * k) * 2**20,
                                pid=5000 + k)
                e["t"] = t0 + step * 0.05
                out.append(e)
    if fail:
        tail = [f"  File \"/usr/lib/python3/dist-packages/tensorflow/{'deep/' * 40}ops.py\", line {i}"
                for i in range(12)] + ["AssertionError: labels must be in 0..9"]
        out.append(events.make("status", "worker:1", state="failed", reason=TF_WALL, log_tail=tail))
        out.append(events.make("run", "launcher", state="failed", reason=f"worker:1: {TF_WALL}",
                               failed_task="worker:1"))
    run.feed(*out)
    if fail:
        run.done = True
    return run


def inside(window: Any, widget: QWidget) -> bool:
    """``widget`` is shown and wholly inside the window's area."""
    top_left = widget.mapTo(window, QPoint(0, 0))
    return widget.isVisible() and window.rect().contains(QRect(top_left, widget.size()))


def settle(qtbot: Any, window: Any, size: tuple[int, int]) -> None:
    window.resize(*size)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size, timeout=5000)
    qtbot.wait(150)
    window.plots.redraw()
    qtbot.wait(50)


def axes_shown(plot: Any) -> bool:
    """Both axes of ``plot`` are drawn inside its widget (none pushed out of sight by a legend)."""
    view = plot.widget.rect()
    for name in ("left", "bottom"):
        axis = plot.item.getAxis(name)
        # the axis's own box (its scene rect spans the grid lines it draws across the plot)
        rect = plot.widget.mapFromScene(plot.item.mapRectToScene(axis.geometry())).boundingRect()
        if not (axis.isVisible() and view.contains(rect) and rect.height() > 0 and rect.width() > 0):
            return False
    return True


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_run_state_and_every_plot_show_at_every_size(qtbot: Any, window: Any, palette: str,
                                                          size: tuple[int, int], tmp_path: Path) -> None:
    replay(window, six_workers())
    settle(qtbot, window, size)
    status = window.run_status
    assert window.width() <= size[0]
    for part in (status.badge, status.progress, status.detail):
        assert inside(window, part), f"{part.objectName()} hidden at {size} ({palette})"
    assert status.badge.text() == "Running" and "step 300 of 4000" in status.detail.text()
    assert status.detail.width() > 100
    window.grab().save(str(tmp_path / f"running-{size[0]}-{palette}.png"))  # to look at when it fails
    for plot in window.plots.plots.values():
        assert axes_shown(plot), f"{plot.spec.key}: an axis is cut at {size} ({palette})"
        legend = plot.compact_legend if plot._compact else plot.legend
        entries = len(legend) if plot._compact else len(legend.items)
        assert entries == len(plot.curves)  # every entry listed (the compact one scrolls)
        rect = plot.widget.mapFromScene(legend.sceneBoundingRect()).boundingRect()
        assert plot.widget.rect().contains(rect), f"{plot.spec.key}: the legend is cut at {size}"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_failed_run_leaves_the_window_within_the_screen(qtbot: Any, window: Any, size: tuple[int, int]) -> None:
    replay(window, six_workers(), steps=40, fail=True)
    settle(qtbot, window, size)
    qtbot.waitUntil(lambda: window.task_table.failure.isVisibleTo(window))
    assert window.minimumSizeHint().width() <= 1366 and window.width() == size[0]
    status = window.run_status
    assert status.badge.text() == "Failed" and inside(window, status.badge) and inside(window, status.progress)
    # the user's own message first, TensorFlow's wall in the tooltip
    assert "AssertionError: labels must be in 0..9" in status.detail.text()
    assert "AssertionError: labels must be in 0..9" in window.task_table.failure.text()
    assert window.task_table.view.height() > 40  # the table keeps rows under the report


def test_hovering_a_plot_reads_its_step_value_and_replica(qtbot: Any, window: Any) -> None:
    replay(window, six_workers())
    settle(qtbot, window, (1366, 768))
    plot = window.plots.loss
    vb = plot.item.getViewBox()
    x, y = plot.raw["replica/2/loss"]
    target = vb.mapViewToScene(QPointF(float(x[99]), float(y[99]) * 1.0))
    qtbot.mouseMove(plot.widget.viewport(), plot.widget.mapFromScene(target))
    if plot.hover.reading is None:  # offscreen Qt sends no move event without a window system: as it would
        plot.hover.moved(target)
    assert plot.hover.reading is not None and plot.hover.line.isVisible()
    assert plot.hover.text.startswith("step ") and "replica" in plot.hover.text and "worker:" in plot.hover.text
    # log scale is one visible click away, and the readout reads the value, not its log
    qtbot.mouseClick(plot.log_button, Qt.MouseButton.LeftButton)
    assert plot.lines.log[1] and plot.item.ctrl.logYCheck.isChecked()
    window.plots.redraw()
    plot.hover.moved(vb.mapViewToScene(QPointF(float(x[99]), float(__import__("math").log10(y[99])))))
    assert plot.hover.reading is not None and plot.hover.reading.y > 0.0
    qtbot.mouseClick(plot.log_button, Qt.MouseButton.LeftButton)
    assert not plot.lines.log[1]


def test_a_legend_name_toggles_its_line_and_the_order_is_the_runs(qtbot: Any, window: Any) -> None:
    replay(window, six_workers())
    settle(qtbot, window, (1920, 1080))
    loss = window.plots.loss
    assert not loss._compact
    sample, label = loss.legend.items[1]
    assert sample.item.isVisible()
    label.mouseClickEvent(_Click())
    assert not sample.item.isVisible()
    label.mouseClickEvent(_Click())
    assert sample.item.isVisible()
    names = [lab.text for _, lab in loss.legend.items]
    assert names[:2] == ["replica 0 · worker:0", "replica 1 · worker:1"]  # the entry names its task
    tasks = [lab.text for _, lab in window.plots.plots["utilisation"].legend.items]
    assert tasks == [f"worker:{i}" for i in range(6)]  # the task plots list the tasks in the same order


class _Click:
    """A left click as pyqtgraph's scene hands it to an item."""

    def __init__(self) -> None:
        self.accepted = False

    def button(self) -> Qt.MouseButton:
        return Qt.MouseButton.LeftButton

    def accept(self) -> None:
        self.accepted = True


def test_the_keyboard_leaves_the_task_table_and_acts_on_a_problem(qtbot: Any, window: Any) -> None:
    replay(window, six_workers())  # 128 examples over 6 replicas: one problem
    table = window.task_table.view
    table.setFocus()
    qtbot.waitUntil(table.hasFocus)
    qtbot.keyClick(table, Qt.Key.Key_Tab)
    assert not table.hasFocus()  # one Tab, not one per cell
    problems = window.problems.list
    assert problems.count() >= 1 and problems.height() <= 150  # one line takes a line, not a box
    fields: list[str] = []
    window.problems.fieldActivated.connect(fields.append)
    problems.setFocus()
    qtbot.keyClick(problems, Qt.Key.Key_Space)
    qtbot.keyClick(problems, Qt.Key.Key_Return)
    assert fields == ["training.global_batch_size"] * 2
    assert "Del" in window.commands["delete"].text().split("\t")[-1]  # the menu shows the key
