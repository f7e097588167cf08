"""Polish a user notices: the About box's version and documentation link, a run folder opened without
its fixed ports in the copy to edit, readable chip text at 1366x768, no GPU split drawn that the app
calls invalid, a drop-target while dragging a task, PNG/CSV exports confirmed and titled, a task's log
from a double-click in a Logs dock tall enough to read, edits during a run said to wait for the next
one, and a first window that uses a large screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task
from gui import about
from gui.window_layout import FIRST_SIZE, first_size
from tests.gui.conftest import ReplayRun
from tests.gui.test_screen_sizes import replay, settle, six_workers


def test_the_about_box_says_the_version_and_links_the_docs(window: Any, dialogs: Any) -> None:
    window.commands["about"].trigger()
    kind, _title, text = dialogs.calls[-1]
    assert kind == "about" and f"ClusterDeck {about.version()}" in text and about.version()[0].isdigit()
    assert f"href='{about.DOCS_URL}'" in text


def test_a_run_folder_opens_without_its_fixed_ports_in_the_copy(qtbot: Any, window: Any, tmp_path: Path) -> None:
    from engine.contract.run_folder import RunFolder
    from tests.gui.test_runs import make_run_folder

    folder = make_run_folder(tmp_path, "ran")
    ran = RunFolder(folder).read_config()
    hosts = (Host(name="local", tasks=(Task("worker", 0, port=40001), Task("worker", 1, port=40002))),)
    RunFolder(folder).write_config(config_mod.replace(ran, cluster=Cluster(hosts=hosts)))  # as the launcher fixed them
    window.open_run_folder(folder)
    assert [t.port for _, t in window.controller.config.cluster.tasks()] == [None, None]
    assert [t.port for _, t in window.controller.session.config.cluster.tasks()] == [40001, 40002]


@pytest.mark.parametrize("mode", ["design", "watch"])
def test_chip_text_is_readable_at_1366(qtbot: Any, window: Any, mode: str, tmp_path: Path) -> None:
    replay(window, six_workers()) if mode == "watch" else window.controller.new_document(six_workers())
    settle(qtbot, window, (1366, 768))
    if mode == "watch":
        assert window.layout_mode == "watch"
    smallest = 8.0  # points: a chip's detail line (its name is 9.5)
    assert smallest * window.logicalDpiY() / 72 * window.canvas.scale() >= 9.0  # pixels on the screen
    window.grab().save(str(Path(tmp_path) / f"chips-{mode}-1366.png"))


def test_an_invalid_gpu_split_is_not_drawn(qtbot: Any, window: Any) -> None:
    doc = window.controller.document
    doc.update_host(0, gpus=3)  # 3 GPUs over 2 workers: a problem
    qtbot.waitUntil(lambda: any(p.field == "cluster.hosts[0].gpus" for p in doc.problems))
    host = window.canvas.hosts[0]
    assert not host.split_valid and host.gpu_owner == {} and all(c.gpus == [] for c in host.chips)
    assert "until the split is fixed" in host.toolTip()
    doc.update_host(0, gpus=4)
    qtbot.waitUntil(lambda: window.canvas.hosts[0].split_valid)
    assert [c.gpus for c in window.canvas.hosts[0].chips] == [[0, 1], [2, 3]]


def test_a_dragged_task_highlights_the_host_it_would_land_on(qtbot: Any, window: Any) -> None:
    base = config_mod.default_config()
    hosts = (Host(name="a", tasks=(Task("worker", 0),)), Host(name="b", tasks=(Task("worker", 1),)))
    window.controller.new_document(config_mod.replace(base, cluster=Cluster(hosts=hosts)))
    canvas = window.canvas
    chip, target = canvas.chip(0, 0), canvas.hosts[1]
    view = canvas.view.viewport()
    start = canvas.view.mapFromScene(chip.sceneBoundingRect().center())
    end = canvas.view.mapFromScene(target.sceneBoundingRect().center())
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=start)
    for k in range(1, 6):
        qtbot.mouseMove(view, start + (end - start) * k / 5)
    if not target.drop_target:  # offscreen Qt may not deliver moves with the button down: as it would
        canvas.set_drop_target(target)
    assert target.drop_target and not canvas.hosts[0].drop_target
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=end)
    canvas.set_drop_target(None)
    assert not any(h.drop_target for h in canvas.hosts)


def test_plot_exports_are_confirmed_and_the_png_has_a_title(qtbot: Any, window: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    replay(window, six_workers(), steps=50)
    qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") > 0)
    plot = window.plots.loss
    png = tmp_path / "loss.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(png), "")))
    said: list[str] = []
    window.plots.exported.connect(said.append)
    qtbot.mouseClick(plot.png_button, Qt.MouseButton.LeftButton)
    assert png.is_file(), "no PNG written"
    assert said and str(png) in said[-1], said
    assert str(png) in window.statusBar().currentMessage(), window.statusBar().currentMessage()
    image = QImage(str(png))
    # a title band on top: text pixels that stand out from the band's background, in either palette
    top = [image.pixelColor(x, y).lightness() for x in range(image.width() // 3, 2 * image.width() // 3)
           for y in range(2, 24)]
    assert max(top) - min(top) > 60, f"no title drawn at the top of the exported PNG ({png}, {image.width()} px wide)"
    assert plot.item.titleLabel.isVisible() is False  # the window's plot keeps its own title bar
    csv = tmp_path / "loss.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(csv), "")))
    qtbot.mouseClick(plot.csv_button, Qt.MouseButton.LeftButton)
    assert csv.is_file() and str(csv) in window.statusBar().currentMessage()


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_double_clicking_a_task_opens_its_log_tall_enough(qtbot: Any, window: Any, tmp_path: Path,
                                                          size: tuple[int, int]) -> None:
    run = replay(window, six_workers(), steps=10)
    run_dir = tmp_path / "run"
    window.controller.session.run_dir = run_dir  # the replay's folder: a log to read
    from gui.logs import task_log_path

    log = task_log_path(run_dir, "worker:3")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(f"line {i}" for i in range(40)) + "\n", encoding="utf-8")
    settle(qtbot, window, size)
    table = window.task_table.view
    row = [t.name for t in window.task_table.model.rows].index("worker:3")
    rect = table.visualRect(window.task_table.model.index(row, 0))
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # a double-click's first
    qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: window.logs.current_task() == "worker:3")
    assert window.logs_dock.isVisible()
    text = window.logs.text
    qtbot.waitUntil(lambda: text.viewport().height() // text.fontMetrics().lineSpacing() > 6, timeout=3000)
    lines = text.viewport().height() // text.fontMetrics().lineSpacing()
    assert lines > 6, f"the Logs dock shows {lines} lines at {size}"
    run.done = True


def test_an_edit_during_a_run_says_it_applies_to_the_next_run(qtbot: Any, window: Any) -> None:
    run = ReplayRun()
    window.controller.session.watch(run, window.controller.config, state="running")
    window.controller.document.set_value("training.steps", 333)
    assert "next run" in window.statusBar().currentMessage()
    run.done = True


def test_the_first_window_uses_a_large_screen() -> None:
    assert first_size(QSize(1920, 1050)) == QSize(int(1920 * 0.85), 940)
    assert first_size(QSize(2560, 1400)) == QSize(int(2560 * 0.85), int(1400 * 0.85))
    laptop = first_size(QSize(1366, 740))
    assert laptop.width() >= int(1366 * 0.9) and laptop.height() <= 740
    assert first_size(QSize(1920, 1050)).width() > FIRST_SIZE.width()
