"""The Settings dock on a laptop screen (1366x768), light and dark: one scroll area for the whole column,
path fields that show the file name, and the small courtesies of a form (rows that apply, file dialogs that
start where the other files are)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog, QLineEdit, QScrollArea, QWidget

from engine.contract import config as config_mod
from tests.gui.conftest import PRESETS
from tests.gui.test_screen_sizes import palette, settle  # noqa: F401 - the light/dark fixture

LAPTOP = (1366, 768)
#: A long path, as a project's data usually has (the file name is what must show).
DEEP = "/home/someone/projects/distributed-training/experiments/2024-spring/inputs/"
#: A file name of 30 characters: a path field at 1366 shows at least this much.
THIRTY = "experiment_2024_final_data.npz"


def scroll_ancestors(widget: QWidget, stop: QWidget) -> list[QScrollArea]:
    out = []
    parent = widget.parentWidget()
    while parent is not None and parent is not stop:
        if isinstance(parent, QScrollArea):
            out.append(parent)
        parent = parent.parentWidget()
    return out


def fully_shown(widget: QWidget) -> bool:
    return widget.isVisible() and widget.visibleRegion().boundingRect().size() == widget.size()


def pick(qtbot: Any, combo: Any, text: str) -> None:
    combo.setCurrentText(text)
    combo.activated.emit(combo.currentIndex())
    qtbot.wait(10)


def tail_shown(edit: QLineEdit) -> bool:
    """The file name at the end of ``edit``'s text is wholly in view (the characters at its edges tell)."""
    edit.grab()  # a paint: QLineEdit scrolls its text to the cursor while painting
    text = edit.text()
    name = Path(text).name
    box, middle = edit.contentsRect(), edit.height() // 2
    first = edit.cursorPositionAt(QPoint(box.left() + 6, middle))
    last = edit.cursorPositionAt(QPoint(box.right() - 6, middle))
    return first <= len(text) - len(name) and last >= len(text) - 1


def test_the_settings_column_scrolls_as_one_on_a_laptop(qtbot: Any, window: Any, palette: str,  # noqa: F811
                                                         tmp_path: Path) -> None:
    window.open_path(PRESETS / "slurm-async.yaml", ask=False)
    doc = window.controller.document
    doc.update_slurm(0, nodes=2, gpus_per_node=3)  # a problem listed, and a row of the selection marked
    doc.select(("host", 0))  # the tallest selection: a Slurm group's rows
    settle(qtbot, window, LAPTOP)
    dock = window.settings_dock
    areas = dock.findChildren(QScrollArea)
    assert len(areas) == 1, [a.objectName() for a in areas]
    assert all(not scroll_ancestors(a, dock) for a in areas)
    column = areas[0]
    assert column.widget().isAncestorOf(window.settings_panel) and column.widget().isAncestorOf(window.properties)
    assert column.widget().isAncestorOf(window.problems)
    assert window.minimumSizeHint().height() <= LAPTOP[1] and window.height() == LAPTOP[1]
    assert column.verticalScrollBar().maximum() > 0  # the column is taller than the dock: it scrolls, as one
    assert fully_shown(window.problems.summary) and window.problems.list.isVisible()
    props = window.properties
    assert props.focus_field("cluster.hosts[0].slurm.srun_options")  # the selection's last row
    qtbot.waitUntil(lambda: fully_shown(props.slurm_srun))
    panel = window.settings_panel
    assert panel.focus_field("validation.every")  # and the form's last group, in the same scroll area
    qtbot.waitUntil(lambda: fully_shown(panel.widgets["validation.every"]))
    assert not fully_shown(props.slurm_srun)
    assert panel.width() <= column.viewport().width()  # no row cut off at the right
    dock.grab().save(str(tmp_path / f"settings-1366x768-{palette}.png"))  # to look at when it fails


@pytest.mark.parametrize("field", ["data.path", "model.script", "validation.path", "program.script"])
def test_a_path_field_shows_the_file_name(qtbot: Any, window: Any, field: str) -> None:
    doc = window.controller.document
    config = doc.config
    if field == "model.script":
        config = config_mod.replace(config, model=config_mod.replace(config.model, name="script"))
    elif field == "program.script":
        config = config_mod.replace(config, program=config_mod.Program(script=""))
    else:
        config = config_mod.replace(config, data=config_mod.replace(config.data, source="npz"))
    window.controller.new_document(config)
    settle(qtbot, window, LAPTOP)
    panel = window.settings_panel
    edit = panel.widgets[field]
    assert edit.isVisible() and panel._rows[field].isVisible()
    assert edit.width() >= edit.fontMetrics().horizontalAdvance(THIRTY)  # some 30 characters in view
    long_path = DEEP + THIRTY
    doc.set_value(field, long_path) if field != "program.script" else doc.set_value(
        "program", config_mod.Program(script=long_path))
    assert edit.text() == long_path and edit.fontMetrics().horizontalAdvance(long_path) > edit.width()
    assert tail_shown(edit), f"{field}: the file name is out of view"
    assert edit.toolTip().startswith(long_path)  # the whole path in the tooltip

    # the user looks at the start of the path, then leaves the field: the file name comes back into view
    edit.setFocus()
    qtbot.keyClick(edit, Qt.Key.Key_Home)
    assert not tail_shown(edit)
    edit.clearFocus()
    qtbot.waitUntil(lambda: tail_shown(edit))
    assert edit.text() == long_path


def test_hidden_sizes_are_shown_only_for_models_that_read_them(qtbot: Any, window: Any) -> None:
    panel = window.settings_panel
    assert panel.hidden.isVisibleTo(window)
    pick(qtbot, panel.model_name, "script")
    assert window.controller.config.model.name == "script"
    assert not panel.hidden.isVisibleTo(window)
    assert panel._rows["model.script"].isVisibleTo(window)
    pick(qtbot, panel.model_name, "mlp")
    assert panel.hidden.isVisibleTo(window)


def test_the_file_dialogs_start_at_the_files_already_chosen(qtbot: Any, window: Any,
                                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    window.open_path(PRESETS / "data-user-script.yaml", ask=False)
    doc = window.controller.document
    script = doc.config.data.path
    assert script.endswith("user_script.py") and doc.config.model.script == script
    asked: list[str] = []
    answer = {"file": ""}

    def dialog(parent: Any, caption: str, start: str, filters: str) -> tuple[str, str]:
        asked.append(start)
        return answer["file"], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(dialog))
    panel = window.settings_panel

    def browse(field: str) -> None:
        qtbot.mouseClick(panel._rows[field].browse, Qt.MouseButton.LeftButton)

    doc.set_value("model.script", "")
    browse("model.script")  # the model's script: the data script already picked is offered (selected)
    assert asked[-1] == script
    mine = tmp_path / "mine.py"
    answer["file"] = str(mine)
    browse("model.script")
    assert doc.config.model.script == str(mine)
    browse("model.script")  # a path chosen: the dialog starts at it
    assert asked[-1] == str(mine)

    doc.set_value("data.path", "")
    answer["file"] = ""
    browse("data.path")  # and the other way round
    assert asked[-1] == str(mine)

    pick(qtbot, panel.source, "npz")  # npz data: a script is no data file, its folder is where to look
    browse("data.path")
    assert asked[-1] == str(tmp_path)
    doc.set_value("data.path", str(tmp_path / "train.npz"))
    qtbot.waitUntil(lambda: panel._rows["validation.path"].isVisibleTo(window))
    browse("validation.path")  # the held-out file: beside the training data
    assert asked[-1] == str(tmp_path)


def test_tab_goes_from_a_path_to_its_browse_button(qtbot: Any, window: Any) -> None:
    window.open_path(PRESETS / "data-user-script.yaml", ask=False)
    row = window.settings_panel._rows["data.path"]
    assert row.edit.nextInFocusChain() is row.browse
