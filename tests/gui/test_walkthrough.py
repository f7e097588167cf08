"""The new-user walkthrough of the window: what a person did, and what they must see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox, QScrollArea

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, Task
from engine.contract.presets import presets_dir
from engine.contract.run_folder import RunFolder
from gui import theme
from tests.gui.conftest import PRESETS, ReplayRun


def preset_action(window: Any, stem: str) -> Any:
    window.presets_menu.aboutToShow.emit()
    return next(a for a in window.presets_menu.actions() if a.text().split(" — ")[0] == stem)


def test_bundled_presets_show_whole_and_open_read_only(qtbot: Any, window: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    action = preset_action(window, "async-embedding-2ps")
    assert " — " in action.text() and "sharded-embedding" in action.toolTip()  # the preset's own words
    action.trigger()
    c = window.controller
    assert c.config.name == "async-embedding-2ps" and c.document.read_only
    canvas = window.canvas
    qtbot.waitUntil(lambda: canvas.hidden_hosts() == [])
    view = canvas.view.mapToScene(canvas.view.viewport().rect()).boundingRect()
    assert all(view.contains(chip.sceneBoundingRect()) for chip in canvas.hosts[0].chips)  # ps:1 included
    assert canvas.scale() >= 0.62
    # Ctrl+S on a shipped preset asks for a new file and leaves the shipped one as it was
    shipped = (presets_dir() / "async-embedding-2ps.yaml").read_text(encoding="utf-8")
    asked: list[str] = []

    def save_dialog(*args: Any, **kwargs: Any) -> tuple[str, str]:
        asked.append(str(args[2]))
        return str(tmp_path / "mine.yaml"), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save_dialog))
    assert window.commands["save"].text() == "&Save As…"
    c.document.set_value("training.steps", 77)
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)
    assert asked and not asked[0].startswith(str(presets_dir()))
    assert (presets_dir() / "async-embedding-2ps.yaml").read_text(encoding="utf-8") == shipped
    assert config_mod.load(tmp_path / "mine.yaml").training.steps == 77
    assert not c.document.read_only and window.commands["save"].text() == "&Save"


def test_a_big_cluster_scrolls_with_a_hint_and_a_small_one_is_large(qtbot: Any, window: Any) -> None:
    doc = window.controller.document
    window.resize(1366, 768)
    hosts = tuple(Host(name=f"h{i}", tasks=tuple(Task("worker", 12 * i + j) for j in range(12))) for i in range(4))
    doc.new(config_mod.replace(config_mod.default_config(), cluster=Cluster(hosts=hosts)))
    window.splitter.setSizes([150, 600])  # the user made the cluster pane small
    canvas = window.canvas
    qtbot.waitUntil(lambda: canvas.scroll_hint.isVisibleTo(window))
    assert canvas.scale() >= 0.62 and "Scroll" in canvas.scroll_hint.text()
    qtbot.keyClick(window, Qt.Key.Key_0, Qt.KeyboardModifier.ControlModifier)  # View › Fit shows everything
    qtbot.waitUntil(lambda: not canvas.scroll_hint.isVisibleTo(window))
    doc.new()  # 1 host x 2 workers: drawn large, never tiny
    window.splitter.setSizes([400, 350])
    qtbot.waitUntil(lambda: canvas.scale() > 1.0)


def test_opening_a_config_clears_the_previous_run(qtbot: Any, window: Any, tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "old-run")
    run.path.mkdir()
    run.write_config(config_mod.replace(config_mod.default_config(), name="old"))
    writer = events.EventWriter(run.events)
    for step in range(1, 201):
        writer.write(events.make("step", "worker:0", replica=0, step=step, loss=1.0 / step))
    writer.write(events.make("status", "worker:0", state="stopped", reason="stopped by the user"))
    writer.write(events.make("run", "launcher", state="finished"))
    writer.close()
    run.write_meta(state="finished")
    assert window.open_run_folder(run.path)
    assert window.layout_mode == "watch" and window.plots.loss.points("replica/0/loss") == 200
    window.open_path(PRESETS / "async-1ps.yaml", ask=False)
    c = window.controller
    assert c.run_dir is None and c.state.step == 0 and window.layout_mode == "design"
    assert window.task_table.model.rowCount() == len(c.config.cluster.tasks())
    assert window.run_status.badge.text() == "Ready" and "0 / " in window.run_status.progress.format()
    qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") == 0)
    assert all(chip.run_state is None or chip.run_state.state == "pending"
               for host in window.canvas.hosts for chip in host.chips)


def test_gpu_owners_are_shown_and_the_async_chief_takes_none(qtbot: Any, window: Any) -> None:
    host = Host(name="box", gpus=2, tasks=(Task("chief", 0), Task("worker", 0), Task("worker", 1), Task("ps", 0)))
    base = config_mod.default_config()
    window.controller.document.new(config_mod.replace(base, cluster=Cluster(hosts=(host,)),
                                               parallelism=config_mod.replace(base.parallelism, mode="async"),
                                               training=config_mod.replace(base.training, global_batch_size=120)))
    # 2 workers + 2 GPUs: the coordinating chief is not counted among the tasks that split them
    assert not [p for p in window.controller.problems if p.field.endswith(".gpus")]
    item = window.canvas.hosts[0]
    assert item.gpu_owner == {0: "worker:0", 1: "worker:1"}
    chips = {chip.task.name: chip for chip in item.chips}
    assert chips["worker:1"].gpus == [1] and "GPU 1" in chips["worker:1"].toolTip()
    assert chips["chief:0"].gpus == [] and chips["worker:0"].gpu_color != chips["worker:1"].gpu_color
    assert "GPU 0 → worker:0" in item.toolTip()


def test_leaving_async_names_every_change_and_what_is_left(qtbot: Any, window: Any, dialogs: Any) -> None:
    window.open_path(PRESETS / "async-1ps.yaml", ask=False)
    panel = window.settings_panel
    dialogs.answers.append(QMessageBox.StandardButton.Yes)
    index = panel.mode.findText("data")
    panel.mode.setCurrentIndex(index)  # as the user's pick in the drop-down leaves it
    panel.mode.activated.emit(index)
    kind, _title, text = dialogs.calls[-1]
    assert kind == "question" and "remove the chief" in text and "remove the 1 ps task" in text
    c = window.controller
    assert [t.role for _, t in c.config.cluster.tasks()] == ["worker", "worker"]
    left = config_mod.validate(c.config)
    assert all(str(p) in text for p in left)  # what the fix leaves is said before it is done


def test_dragging_a_chip_keeps_the_other_tasks_names(qtbot: Any, window: Any) -> None:
    doc = window.controller.document
    doc.add_host()
    doc.add_task(1, "worker")  # worker:2 on host1
    canvas = window.canvas
    view = canvas.view
    chip = canvas.chip(0, 0)  # worker:0
    start = view.mapFromScene(chip.sceneBoundingRect().center())
    end = view.mapFromScene(canvas.hosts[1].sceneBoundingRect().center())
    qtbot.mousePress(view.viewport(), Qt.MouseButton.LeftButton, pos=start)
    for k in range(1, 11):
        qtbot.mouseMove(view.viewport(), start + (end - start) * k / 10)
    qtbot.mouseRelease(view.viewport(), Qt.MouseButton.LeftButton, pos=end)
    qtbot.waitUntil(lambda: len(doc.config.cluster.hosts[1].tasks) == 2)
    assert [[t.name for t in h.tasks] for h in doc.config.cluster.hosts] == [["worker:1"], ["worker:2", "worker:0"]]
    assert not [p for p in config_mod.validate(doc.config) if p.field.startswith("cluster")]  # indices still valid


def test_clicking_a_problem_focuses_its_field(qtbot: Any, window: Any) -> None:
    doc = window.controller.document
    doc.update_host(0, gpus=3)  # 3 GPUs over 2 workers
    item = window.problems.list.item(0)
    rect = window.problems.list.visualItemRect(item)
    qtbot.mouseClick(window.problems.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert doc.selection == ("host", 0)
    qtbot.waitUntil(lambda: window.properties.host_gpus.hasFocus())
    doc.update_host(0, gpus=2)
    doc.set_value("training.global_batch_size", 127)
    item = window.problems.list.item(0)
    qtbot.mouseClick(window.problems.list.viewport(), Qt.MouseButton.LeftButton,
                     pos=window.problems.list.visualItemRect(item).center())
    qtbot.waitUntil(lambda: window.settings_panel.batch.hasFocus())


def test_theme_switch_recolours_legends_and_undo_icons(qtbot: Any, window: Any) -> None:
    plot = window.plots.loss
    import numpy as np

    plot.set_curve("replica/0/loss", "replica 0", "#3b82f6", np.arange(10.0), np.ones(10), 0.0)
    for choice in ("dark", "light"):
        window.set_theme(choice)
        text = window.palette().text().color().name()
        label = plot.legend.items[0][1]
        assert choice == ("dark" if theme.is_dark() else "light")
        assert text in label.text or label.opts.get("color") in (text, window.palette().text().color())
    assert not window.commands["undo"].icon().isNull() and window.commands["undo"].icon().cacheKey() != \
        window.style().standardIcon(window.style().StandardPixmap.SP_ArrowBack).cacheKey()


def test_empty_plots_show_no_numbers(window: Any) -> None:
    plot = window.plots.loss
    assert not plot.curves and plot.empty_note.isVisible()
    assert plot.item.getAxis("left").style["showValues"] is False


def test_starting_tasks_are_counted_not_shown_as_step_zero(qtbot: Any, window: Any) -> None:
    c = window.controller
    run = ReplayRun()
    c.session.watch(run, c.config)
    for fn in run.listeners:
        fn(events.make("status", "worker:0", state="running", pid=1))
    qtbot.waitUntil(lambda: "starting tasks: 1 of 2 ready" in window.run_status.text())
    assert "step 0" not in window.run_status.text()
    assert window.layout_mode == "watch" and window.canvas.compact
    for fn in run.listeners:
        fn(events.make("step", "worker:1", replica=1, step=3, loss=1.0))
    qtbot.waitUntil(lambda: "step 3 of" in window.run_status.text())
    for fn in run.listeners:
        fn(events.make("status", "worker:1", state="failed", reason="worker:1: killed by SIGKILL"))
        fn(events.make("run", "launcher", state="failed", failed_task="worker:1",
                       reason="worker:1: killed by SIGKILL"))
    run.done = True
    qtbot.waitUntil(lambda: c.run is None)
    assert "worker:1: worker:1:" not in window.run_status.text() and "killed by SIGKILL" in window.run_status.text()
    assert "worker:1: worker:1:" not in window.task_table.failure.text()
    assert window.logs.current_task() == "worker:1"  # the Logs tab opens on the failed task


def test_settings_offer_the_choices_that_work_in_the_mode(qtbot: Any, window: Any) -> None:
    panel = window.settings_panel
    doc = window.controller.document
    doc.set_mode("model", fix_cluster=True)
    combo = panel.model_name
    for i in range(combo.count()):
        name = combo.itemText(i)
        works = "model" in config_mod.MODEL_MODES.get(name, config_mod.MODES)
        item = combo.model().item(i)
        assert item.isEnabled() == (works or name == combo.currentText()), name
        assert bool(item.toolTip()) == (not works), name
    # a combination that cannot work says why in the problem list
    bad = next((m for m in config_mod.MODELS if "model" not in config_mod.MODEL_MODES.get(m, config_mod.MODES)), None)
    if bad is not None:
        doc.set_value("model.name", bad)
        assert any(p.field == "model.name" and "'model'" in p.message for p in window.controller.problems)


def test_steps_per_execution_is_a_data_and_async_setting(qtbot: Any, window: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    window.open_path(PRESETS / "async-1ps.yaml", ask=False)
    panel = window.settings_panel
    doc = window.controller.document
    spin = panel.steps_per_execution
    qtbot.waitUntil(lambda: spin.isVisibleTo(window))
    assert spin.value() == 16 and "steps_per_execution" in spin.toolTip()
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), "4")
    qtbot.keyClick(spin.lineEdit(), Qt.Key.Key_Return)
    assert doc.config.training.steps_per_execution == 4
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    panel.choose_mode("data")  # data mode groups steps too: kept, still shown
    assert doc.config.parallelism.mode == "data" and doc.config.training.steps_per_execution == 4
    assert spin.isVisibleTo(window)
    # a mode without groups of steps sets it back to 1 (whether or not the cluster is fixed) and hides it
    panel.choose_mode("model")
    assert doc.config.parallelism.mode == "model" and doc.config.training.steps_per_execution == 1
    qtbot.waitUntil(lambda: not spin.isVisibleTo(window))
    assert "Steps per execution set back to 1 (was 4)" in window.statusBar().currentMessage()
    assert not [p for p in window.controller.problems if p.field == "training.steps_per_execution"]
    window.commands["undo"].trigger()  # Ctrl+Z
    assert doc.config.parallelism.mode == "data" and doc.config.training.steps_per_execution == 4


def test_run_settings_fit_a_laptop_screen_in_model_mode(qtbot: Any, window: Any) -> None:
    window.resize(1366, 768)
    window.open_path(PRESETS / "model-2x2.yaml", ask=False)
    panel = window.settings_panel
    qtbot.waitUntil(lambda: panel.mesh_batch.isVisibleTo(window))
    scroll = panel.parentWidget()  # the settings column's one scroll area
    while scroll is not None and not isinstance(scroll, QScrollArea):
        scroll = scroll.parentWidget()
    assert scroll is not None
    assert scroll.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    body = scroll.widget()
    qtbot.waitUntil(lambda: body.width() >= body.minimumSizeHint().width())  # nothing cut off at the right
    right = panel.mesh_model.mapTo(scroll.viewport(), QPoint(panel.mesh_model.width(), 0)).x()
    assert right <= scroll.viewport().width() + 1


def test_a_run_folder_dropped_or_given_opens_it(qtbot: Any, window: Any, tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "dropped")
    run.path.mkdir()
    run.write_config(config_mod.replace(config_mod.default_config(), name="dropped"))
    run.write_meta(state="finished")
    assert window.open_any(run.path)
    assert window.controller.run_dir == run.path and window.controller.config.name == "dropped"
    assert window.open_any(PRESETS / "data-2workers.yaml")
    assert window.controller.run_dir is None


def test_runs_folder_can_be_changed(qtbot: Any, window: Any, tmp_path: Path) -> None:
    assert window.choose_runs_folder(tmp_path / "elsewhere")
    assert window.controller.runs_root == tmp_path / "elsewhere"
    assert str(tmp_path / "elsewhere") in window.path_label.text()


def test_a_run_held_in_the_scheduler_queue_says_so_with_the_reason(qtbot: Any, window: Any) -> None:
    c = window.controller
    assert window.run_status.badge.text() == "Ready"
    run = ReplayRun()
    c.session.watch(run, c.config)
    for fn in run.listeners:
        fn(events.make("run", "launcher", state="pending", job_id="17", reason="PartitionDown",
                       message="Slurm job 17 is pending (PartitionDown): the partition is down"))
    qtbot.waitUntil(lambda: window.run_status.badge.text() == "Queued")
    assert "PartitionDown" in window.run_status.text()
    run.done = True
    qtbot.waitUntil(lambda: c.run is None)


@pytest.mark.parametrize("reason", ["killed by SIGKILL", "worker:1: killed by SIGKILL"])
def test_the_end_message_names_the_failed_task_once(window: Any, reason: str) -> None:
    session = window.controller.session
    session.state.apply(events.make("run", "launcher", state="failed", failed_task="worker:1", reason=reason))
    assert session.end_message() == "Run failed: worker:1: killed by SIGKILL"
