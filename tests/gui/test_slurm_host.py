"""A Slurm host group in the app, as a user makes and edits it: kind, every field of its slurm block,
undo and redo, problems on the fields, save and reopen, the shipped Slurm presets on the canvas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLineEdit, QSpinBox

from engine.contract import config as config_mod
from engine.contract.config import Slurm
from gui import document as doc_ops
from gui.canvas import slurm_resources
from gui.properties_panel import field_key, parse_options
from tests.gui.conftest import PRESETS

CTRL = Qt.KeyboardModifier.ControlModifier
SHIFT = Qt.KeyboardModifier.ShiftModifier


def click_item(qtbot: Any, window: Any, item: Any) -> None:
    view = window.canvas.view
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                     pos=view.mapFromScene(item.sceneBoundingRect().center()))


def type_into(qtbot: Any, widget: QLineEdit | QSpinBox, text: str) -> None:
    """Click into a field, replace its text by typing and press Return, as a user does."""
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)
    widget.selectAll()
    qtbot.keyClicks(widget, text)
    qtbot.keyClick(widget, Qt.Key.Key_Return)


def slurm_of(window: Any, i: int = 0) -> Slurm:
    host = window.controller.config.cluster.hosts[i]
    assert host.kind == "slurm" and host.slurm is not None
    return host.slurm


def test_make_a_host_a_slurm_group_edit_undo_redo_save_and_reopen(qtbot: Any, window: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c = window.controller
    props = window.properties
    click_item(qtbot, window, window.canvas.hosts[0])
    assert c.selection == ("host", 0)
    assert props.host_address.isVisibleTo(props) and not props.slurm_nodes.isVisibleTo(props)

    # Kind: Machine -> Slurm group, with the keyboard on the drop-down
    qtbot.mouseClick(props.host_kind, Qt.MouseButton.LeftButton)
    props.host_kind.hidePopup()
    qtbot.keyClick(props.host_kind, Qt.Key.Key_Down)
    assert slurm_of(window) == Slurm()
    assert props.host_kind.currentText() == "Slurm group"
    assert props.slurm_nodes.isVisibleTo(props) and props.slurm_partition.isVisibleTo(props)
    assert not props.host_address.isVisibleTo(props) and not props.host_ssh_host.isVisibleTo(props)
    assert window.canvas.hosts[0].subtitle() == "Slurm · default partition · 1 node"

    type_into(qtbot, props.slurm_nodes, "2")
    type_into(qtbot, props.slurm_partition, "debug")
    assert (slurm_of(window).nodes, slurm_of(window).partition) == (2, "debug")
    item = window.canvas.hosts[0]
    assert item.subtitle() == "Slurm · partition debug · 2 nodes"
    assert [chip.node for chip in item.chips] == [0, 1]  # two workers fill the two nodes in drawn order
    assert "node 1: worker:1" in item.toolTip()

    # undo the partition, then the nodes; redo both
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)
    assert slurm_of(window).partition == "" and props.slurm_partition.text() == ""
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)
    assert slurm_of(window).nodes == 1 and props.slurm_nodes.value() == 1
    assert window.canvas.hosts[0].subtitle() == "Slurm · default partition · 1 node"
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL | SHIFT)
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL | SHIFT)
    assert (slurm_of(window).nodes, slurm_of(window).partition) == (2, "debug")
    assert props.slurm_partition.text() == "debug" and props.slurm_nodes.value() == 2

    # every other field of the block
    type_into(qtbot, props.slurm_gpus, "2")
    type_into(qtbot, props.slurm_cpus, "4")
    type_into(qtbot, props.slurm_mem, "4g")
    type_into(qtbot, props.slurm_time, "00:30:00")
    type_into(qtbot, props.slurm_account, "proj_a")
    type_into(qtbot, props.slurm_qos, "high")
    type_into(qtbot, props.slurm_sbatch, "--constraint=a100  --exclusive")
    type_into(qtbot, props.slurm_srun, "--cpu-bind=cores")
    expected_block = Slurm(partition="debug", nodes=2, gpus_per_node=2, cpus_per_task=4, mem_per_task="4G",
                           time_limit="00:30:00", account="proj_a", qos="high",
                           sbatch_options=("--constraint=a100", "--exclusive"), srun_options=("--cpu-bind=cores",))
    assert slurm_of(window) == expected_block
    assert props.slurm_mem.text() == "4G" and props.slurm_sbatch.text() == "--constraint=a100 --exclusive"
    assert c.problems == [] and window.commands["run"].isEnabled()
    assert [chip.gpus for chip in window.canvas.hosts[0].chips] == [[0, 1], [0, 1]]  # each node's own GPUs
    assert "GPU 0–1 of its node" in window.canvas.hosts[0].chips[1].toolTip()
    expected = c.config

    # save as, a new document, reopen: the block comes back, on the canvas and in the fields
    target = tmp_path / "slurm-mine.yaml"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.keyClick(window, Qt.Key.Key_S, CTRL | SHIFT)
    saved = yaml.safe_load(target.read_text(encoding="utf-8"))["cluster"]["hosts"][0]
    assert saved["kind"] == "slurm"
    assert saved["slurm"] == {"partition": "debug", "nodes": 2, "gpus_per_node": 2, "cpus_per_task": 4,
                              "mem_per_task": "4G", "time_limit": "00:30:00", "account": "proj_a", "qos": "high",
                              "sbatch_options": ["--constraint=a100", "--exclusive"],
                              "srun_options": ["--cpu-bind=cores"]}
    qtbot.keyClick(window, Qt.Key.Key_N, CTRL)
    assert not c.config.cluster.hosts[0].is_slurm
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.keyClick(window, Qt.Key.Key_O, CTRL)
    assert c.config == expected
    assert window.canvas.hosts[0].subtitle() == "Slurm · partition debug · 2 nodes"
    click_item(qtbot, window, window.canvas.hosts[0])
    assert props.host_kind.currentText() == "Slurm group"
    shown = {"partition": props.slurm_partition.text(), "nodes": props.slurm_nodes.value(),
             "gpus": props.slurm_gpus.value(), "cpus": props.slurm_cpus.value(), "mem": props.slurm_mem.text(),
             "time": props.slurm_time.text(), "account": props.slurm_account.text(), "qos": props.slurm_qos.text(),
             "sbatch": props.slurm_sbatch.text(), "srun": props.slurm_srun.text()}
    assert shown == {"partition": "debug", "nodes": 2, "gpus": 2, "cpus": 4, "mem": "4G", "time": "00:30:00",
                     "account": "proj_a", "qos": "high", "sbatch": "--constraint=a100 --exclusive",
                     "srun": "--cpu-bind=cores"}


def test_slurm_field_problems_show_on_their_rows_and_a_click_focuses_the_field(qtbot: Any, window: Any) -> None:
    c = window.controller
    props = window.properties
    c.document.set_host_kind(0, "slurm")
    click_item(qtbot, window, window.canvas.hosts[0])
    type_into(qtbot, props.slurm_time, "half an hour")
    assert slurm_of(window).time_limit == "half an hour"
    fields = [p.field for p in c.problems]
    assert "cluster.hosts[0].slurm.time_limit" in fields and not window.commands["run"].isEnabled()
    label = props.labels["slurm.time_limit"]
    assert label.text().startswith("⚠") and "Slurm time limit" in props.slurm_time.toolTip()
    assert not props.labels["slurm.nodes"].text().startswith("⚠")
    assert "half an hour" in props.problems.text()

    # three nodes for two tasks: the nodes row says so; clicking that problem focuses the nodes box
    type_into(qtbot, props.slurm_nodes, "3")
    assert props.labels["slurm.nodes"].text().startswith("⚠")
    qtbot.mouseClick(window.canvas.view.viewport(), Qt.MouseButton.LeftButton, pos=window.canvas.view.rect().topLeft())
    items = [window.problems.list.item(k) for k in range(window.problems.list.count())]
    item = next(i for i in items if "slurm.nodes" in str(i.data(Qt.ItemDataRole.UserRole)))
    qtbot.mouseClick(window.problems.list.viewport(), Qt.MouseButton.LeftButton,
                     pos=window.problems.list.visualItemRect(item).center())
    assert c.selection == ("host", 0)
    qtbot.waitUntil(lambda: props.slurm_nodes.hasFocus())

    # fixed: the rows are plain again, the run can start
    type_into(qtbot, props.slurm_nodes, "2")
    type_into(qtbot, props.slurm_time, "2:00:00")
    assert c.problems == [] and not props.labels["slurm.time_limit"].text().startswith("⚠")
    assert props.slurm_time.toolTip() == props._tips["slurm.time_limit"]

    # options a shell cannot split stay in the field, marked, and change nothing
    before = c.config
    type_into(qtbot, props.slurm_sbatch, "--comment='unclosed")
    assert c.config == before and props.slurm_sbatch.text() == "--comment='unclosed"
    assert props.labels["slurm.sbatch_options"].text().startswith("⚠") and "split" in props.problems.text()
    type_into(qtbot, props.slurm_sbatch, "constraint=a100")
    assert c.config == before and "starting with '-'" in props.slurm_sbatch.toolTip()
    type_into(qtbot, props.slurm_sbatch, "--comment='two words'")
    assert slurm_of(window).sbatch_options == ("--comment=two words",)
    assert not props.labels["slurm.sbatch_options"].text().startswith("⚠")
    assert props.slurm_sbatch.text() == "'--comment=two words'"  # as a shell would read it back


def test_a_slurm_group_becomes_a_machine_again_keeping_its_gpus(qtbot: Any, window: Any) -> None:
    c = window.controller
    props = window.properties
    c.document.update_host(0, gpus=2)
    click_item(qtbot, window, window.canvas.hosts[0])
    qtbot.keyClick(props.host_kind, Qt.Key.Key_Down)
    host = c.config.cluster.hosts[0]
    assert host.gpus == 0 and slurm_of(window).gpus_per_node == 2  # validate asks GPUs per node of a group
    assert props.slurm_gpus.value() == 2 and not props.host_gpus.isVisibleTo(props)
    assert c.problems == []
    qtbot.keyClick(props.host_kind, Qt.Key.Key_Up)
    host = c.config.cluster.hosts[0]
    assert (host.kind, host.slurm, host.gpus) == ("machine", None, 2)
    assert props.host_gpus.isVisibleTo(props) and props.host_gpus.value() == 2
    assert window.canvas.hosts[0].subtitle() == "localhost"
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)  # one undo: the group again
    assert slurm_of(window).gpus_per_node == 2 and props.host_kind.currentText() == "Slurm group"


@pytest.mark.parametrize("stem, tasks", [("slurm-data", ["worker:0", "worker:1"]),
                                         ("slurm-async", ["chief:0", "ps:0", "worker:0", "worker:1"])])
def test_a_slurm_preset_shows_its_group_on_the_canvas(qtbot: Any, window: Any, stem: str, tasks: list[str]) -> None:
    window.open_path(PRESETS / f"{stem}.yaml", ask=False)
    c = window.controller
    assert c.problems == []
    item = window.canvas.hosts[0]
    assert item.subtitle() == "Slurm · default partition · 1 node"
    assert [chip.task.name for chip in item.chips] == tasks and {chip.node for chip in item.chips} == {0}
    assert "Slurm group" in item.toolTip() and "time limit 30" in item.toolTip()
    assert slurm_resources(item.host) == "no GPU (CPU only) · 1 CPU/task · limit 30"
    click_item(qtbot, window, item)
    props = window.properties
    assert props.host_kind.currentText() == "Slurm group" and props.slurm_time.text() == "30"
    assert props.slurm_nodes.value() == 1 and props.slurm_partition.placeholderText()


def test_a_selected_slurm_group_fits_a_laptop_screen(qtbot: Any, window: Any) -> None:
    window.open_path(PRESETS / "slurm-async.yaml", ask=False)
    doc = window.controller.document
    doc.update_slurm(0, nodes=2, gpus_per_node=3)  # 3 GPUs over a node's 2 workers: a row marked ⚠
    doc.select(("host", 0))
    props = window.properties
    assert props.labels["slurm.gpus_per_node"].text().startswith("⚠")
    hint = window.minimumSizeHint()
    assert hint.width() <= 1366 and hint.height() <= 768
    window.resize(1366, 768)
    qtbot.waitUntil(lambda: window.width() == 1366)
    qtbot.waitUntil(lambda: props.stack.width() >= props.stack.minimumSizeHint().width())  # no row cut off
    assert props.stack.width() <= props.fields_scroll.viewport().width()
    assert props.focus_field("cluster.hosts[0].slurm.srun_options")  # the last row scrolls into view
    qtbot.waitUntil(lambda: props.slurm_srun.visibleRegion().boundingRect().height() == props.slurm_srun.height())


def test_the_canvas_menus_add_a_slurm_group_and_its_gpus(qtbot: Any, window: Any) -> None:
    c = window.controller
    canvas = window.canvas
    add = next(a for a in canvas.context_menu(None).actions() if a.text() == "Add Slurm group here")
    assert add.toolTip()
    add.trigger()
    qtbot.waitUntil(lambda: len(c.config.cluster.hosts) == 2)
    host = c.config.cluster.hosts[1]
    assert host.name == "slurm" and host.is_slurm and host.slurm == Slurm()
    assert c.selection == ("host", 1) and window.properties.host_kind.currentText() == "Slurm group"
    menu = canvas.context_menu(canvas.hosts[1])
    next(a for a in menu.actions() if a.text() == "Add GPU per node").trigger()
    qtbot.waitUntil(lambda: slurm_of(window, 1).gpus_per_node == 1)
    menu = canvas.context_menu(canvas.hosts[1])
    next(a for a in menu.actions() if a.text() == "Make a machine").trigger()
    qtbot.waitUntil(lambda: not c.config.cluster.hosts[1].is_slurm)
    assert c.config.cluster.hosts[1].gpus == 1
    menu = canvas.context_menu(canvas.hosts[0])
    make = next(a for a in menu.actions() if a.text() == "Make a Slurm group")
    assert make.toolTip()
    make.trigger()
    qtbot.waitUntil(lambda: c.config.cluster.hosts[0].is_slurm)


def test_every_new_field_has_a_tooltip(window: Any) -> None:
    props = window.properties
    for key, widget in props.editors.items():
        assert widget.toolTip(), key
        assert props.labels[key].toolTip(), key


# --------------------------------------------------------------------------- without widgets


def test_kind_changes_and_slurm_edits_are_pure_and_round_trip() -> None:
    doc = doc_ops.Document.of(config_mod.default_config())
    group = doc_ops.set_host_kind(doc, 0, "slurm")
    assert group.config.cluster.hosts[0].slurm == Slurm() and doc.config.cluster.hosts[0].kind == "machine"
    assert doc_ops.set_host_kind(group, 0, "slurm") is group
    edited = doc_ops.update_slurm(group, 0, nodes=2, time_limit="1-00:00:00", srun_options=("--exclusive",))
    assert config_mod.validate(edited.config) == []
    assert config_mod.from_dict(config_mod.to_dict(edited.config)) == edited.config
    with pytest.raises(ValueError, match="kind"):
        doc_ops.update_slurm(doc, 0, nodes=2)
    with pytest.raises(ValueError, match="kind"):
        doc_ops.set_host_kind(doc, 0, "kubernetes")
    added = doc_ops.add_host(doc_ops.add_host(edited, kind="slurm"), kind="slurm")
    assert [h.name for h in added.config.cluster.hosts] == ["local", "slurm", "slurm2"]
    assert all(h.slurm == Slurm() for h in added.config.cluster.hosts[1:])


def test_problem_fields_and_typed_options() -> None:
    assert field_key("cluster.hosts[3].slurm.nodes") == "slurm.nodes"
    assert field_key("cluster.hosts[0].tasks[2].port") == "port"
    assert field_key("cluster.hosts[0]") == ""
    assert parse_options("--constraint=a100 --comment='a b'") == ("--constraint=a100", "--comment=a b")
    assert parse_options("") == ()
    for bad in ("--x='open", "constraint=a100"):
        with pytest.raises(ValueError, match="expected options"):
            parse_options(bad)


def test_edit_menu_adds_a_slurm_group(qtbot: Any, window: Any) -> None:
    before = len(window.controller.config.cluster.hosts)
    window.commands["add_slurm"].trigger()
    hosts = window.controller.config.cluster.hosts
    assert len(hosts) == before + 1 and hosts[-1].kind == "slurm"
    window.commands["undo"].trigger()
    assert len(window.controller.config.cluster.hosts) == before
