"""The settings a user edits for validation, for running their own program and for a mesh's extra axes:
shown where they apply, explained in tooltips, and kept through saving and opening a preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLineEdit

from engine.contract import config as config_mod
from tests.gui.conftest import PRESETS


def type_into(qtbot: Any, edit: QLineEdit, text: str) -> None:
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClick(edit, Qt.Key.Key_Backspace)
    qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def spin_to(qtbot: Any, spin: Any, text: str) -> None:
    type_into(qtbot, spin.lineEdit(), text)


def pick(qtbot: Any, combo: Any, text: str) -> None:
    """Choose ``text`` with the keyboard (activated, as a user's choice is)."""
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key.Key_Home)
    for _ in range(combo.count()):
        if combo.currentText() == text:
            break
        qtbot.keyClick(combo, Qt.Key.Key_Down)
    assert combo.currentText() == text


def save_as(window: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))
    window.commands["save_as"].trigger()
    assert path.is_file()


def test_validation_settings_show_where_they_apply_and_survive_a_preset(qtbot: Any, window: Any, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    panel = window.settings_panel
    doc = window.controller.document
    section = panel.validation_section
    assert section.box.isVisibleTo(window) and section.split.isVisibleTo(window)
    assert "held out" in section.split.toolTip() and "every N training steps" in section.every.toolTip()
    path_row = panel._rows["validation.path"]
    assert doc.config.data.source == "synthetic" and not path_row.isVisibleTo(window)  # no files to hold out
    assert not section.batches.isVisibleTo(window)  # never evaluated: no batches to count
    spin_to(qtbot, section.split, "0.1")
    assert any(p.field == "validation.every" for p in doc.problems)  # held out but never evaluated: said
    spin_to(qtbot, section.every, "50")
    qtbot.waitUntil(lambda: section.batches.isVisibleTo(window))
    spin_to(qtbot, section.batches, "4")
    assert doc.config.validation == config_mod.Validation(split=0.1, every=50, batches=4)
    assert not any(p.field.startswith("validation") for p in doc.problems)
    pick(qtbot, panel.source, "npz")  # a file source: a held-out file can be chosen
    qtbot.waitUntil(lambda: path_row.isVisibleTo(window))
    held_out = tmp_path / "held_out.npz"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(held_out), "")))
    browse = next(b for b in path_row.findChildren(type(window.plots.compare_button)) if b.text() == "Browse…")
    qtbot.mouseClick(browse, Qt.MouseButton.LeftButton)
    assert doc.config.validation.path == str(held_out)
    target = tmp_path / "validated.yaml"
    save_as(window, target, monkeypatch)
    assert "validation:" in target.read_text(encoding="utf-8")
    window.open_path(PRESETS / "data-2workers.yaml", ask=False)
    assert doc.config.validation == config_mod.Validation() and section.split.value() == 0.0
    window.open_path(target, ask=False)
    v = doc.config.validation
    assert (v.split, v.every, v.batches) == (0.1, 50, 4) and (target.parent / v.path).resolve() == held_out.resolve()
    assert section.split.value() == pytest.approx(0.1) and section.every.value() == 50
    assert section.batches.value() == 4 and section.path.text().endswith("held_out.npz")


def test_your_own_program_replaces_the_model_and_data_and_survives_a_preset(
        qtbot: Any, window: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    panel = window.settings_panel
    doc = window.controller.document
    program = panel.program_section
    assert program.kind.currentText() == "ClusterDeck's model and data"
    assert not program.args.isVisibleTo(window)
    pick(qtbot, program.kind, "Your own program")
    assert doc.config.program == config_mod.Program()
    qtbot.waitUntil(lambda: program.args.isVisibleTo(window))
    # no script yet: the field says what it expects
    assert any(p.field == "program.script" for p in doc.problems)
    assert "expected the path of your training program" in program.script.toolTip()
    # what a program does not use is greyed out, saying why
    for box in panel.loop_boxes:
        assert not box.isEnabled() and "not used by your program" in box.title()
        assert "Not used when you run your own program" in box.toolTip()
    assert not panel.optimizer.isEnabled() and "Not used when you run your own program" in panel.optimizer.toolTip()
    assert panel.restarts.isEnabled()  # the launcher still restarts a failed program
    script = tmp_path / "train.py"
    script.write_text("print('training')\n", encoding="utf-8")
    type_into(qtbot, program.script, str(script))
    type_into(qtbot, program.args, "--epochs 3 --name 'my run'")
    assert doc.config.program == config_mod.Program(script=str(script), args=("--epochs", "3", "--name", "my run"))
    assert not any(p.field.startswith("program") for p in doc.problems)
    target = tmp_path / "program.yaml"
    save_as(window, target, monkeypatch)
    window.open_path(PRESETS / "data-2workers.yaml", ask=False)
    assert program.kind.currentText() == "ClusterDeck's model and data" and panel.optimizer.isEnabled()
    assert all(box.isEnabled() for box in panel.loop_boxes)
    window.open_path(target, ask=False)
    assert doc.config.program is not None and doc.config.program.args == ("--epochs", "3", "--name", "my run")
    assert program.kind.currentText() == "Your own program" and program.args.text() == "--epochs 3 --name 'my run'"
    assert Path(program.script.text()).name == "train.py"
    # back to ClusterDeck's loop, and Undo brings the program back
    pick(qtbot, program.kind, "ClusterDeck's model and data")
    assert doc.config.program is None and panel.optimizer.isEnabled()
    window.commands["undo"].trigger()
    assert doc.config.program is not None and program.kind.currentText() == "Your own program"


def test_a_mesh_with_a_feature_axis_is_shown_edited_and_kept(qtbot: Any, window: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "feature-mesh.yaml"
    text = (PRESETS / "model-2x2.yaml").read_text(encoding="utf-8")
    source.write_text(text.replace("mesh: {batch: 2, model: 2}", "mesh: {batch: 1, feature: 2, model: 2}"),
                      encoding="utf-8")
    window.open_path(source, ask=False)
    panel = window.settings_panel
    doc = window.controller.document
    assert doc.config.parallelism.mesh_axes == (("feature", 2),)
    assert panel.mesh_axes.isVisibleTo(window) and panel.mesh_axes.text() == "feature: 2"
    assert not any(p.field == "parallelism.mesh" for p in doc.problems)
    target = tmp_path / "saved.yaml"
    save_as(window, target, monkeypatch)
    assert config_mod.load(target, check=False).parallelism.mesh_dims() == [("batch", 1), ("feature", 2), ("model", 2)]
    # a bad entry is marked and changes nothing; a good one is one undoable edit
    type_into(qtbot, panel.mesh_axes, "feature 2")
    assert doc.config.parallelism.mesh_axes == (("feature", 2),) and "expected name: size" in panel.mesh_axes.toolTip()
    type_into(qtbot, panel.mesh_axes, "feature: 1, seq: 2")
    assert doc.config.parallelism.mesh_axes == (("feature", 1), ("seq", 2))
    assert not any(p.field == "parallelism.mesh" for p in doc.problems)
    type_into(qtbot, panel.mesh_axes, "")
    assert doc.config.parallelism.mesh_axes == ()
    assert any(p.field == "parallelism.mesh" for p in doc.problems)  # 1 x 2 = 2 of 4 devices: said


def test_the_mesh_fix_leaves_room_for_the_extra_axes() -> None:
    from gui.document import mesh_fix

    config = config_mod.load(PRESETS / "model-2x2.yaml")  # one worker with 4 devices
    with_axis = config_mod.replace(config, parallelism=config_mod.replace(config.parallelism, mesh_axes=(("feature", 2),)))
    assert mesh_fix(config) == (2, 2) and mesh_fix(with_axis) == (1, 2)
