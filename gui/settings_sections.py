"""Parts of the run settings form that follow the rest of the config: what trains (ClusterDeck's model
and data, or the user's own program), validation on held-out examples, and the mesh's extra axes.

Each part builds its rows with the :class:`~gui.settings_panel.SettingsPanel`'s own builders (so every
field is edited, re-read and marked for problems as the others are) and says in ``refresh`` which rows
apply to the config as it is now.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.contract import config as config_mod
from engine.contract.config import MAX_MESH_AXES, Program, RunConfig, field_spec
from gui import theme

#: The SettingsPanel whose builders a section uses (not imported: the panel imports this module).
SettingsPanel = Any

#: The choices of "What trains", in the combo's order.
TRAINS = ("ClusterDeck's model and data", "Your own program")
PROGRAM_NOTE = ("Not used when you run your own program: it builds its model, reads its data and trains "
                "itself (see “What trains”)")
#: Training settings a program still takes (the launcher's, not the loop's).
PROGRAM_TRAINING = ("training.restarts",)
#: Files chosen together: a file dialog with nothing chosen yet starts in the folder of its partner (the first
#: one set): a held-out file lies beside the data, a program beside the scripts.
PARTNERS = {"model.script": ("data.path",), "data.path": ("model.script",), "validation.path": ("data.path",),
            "program.script": ("model.script", "data.path")}
#: Fields one Python file can fill both of (build_model and make_dataset side by side): the dialog of one
#: selects the other's script.
SAME_SCRIPT = ("model.script", "data.path")
_AXIS = re.compile(r"^\s*([a-z][a-z0-9_]{0,31})\s*[:=]\s*(\d+)\s*$")


def parse_axes(text: str) -> tuple[tuple[str, int], ...] | None:
    """``"feature: 2, seq: 4"`` -> ``(("feature", 2), ("seq", 4))``; None when it is not a list of
    ``name: size`` pairs (lower-case names other than batch and model, sizes within the declared bounds, at
    most 4)."""
    sizes = field_spec("parallelism.mesh_axes")
    axes: list[tuple[str, int]] = []
    for part in (p for p in re.split(r"[,;]", text) if p.strip()):
        m = _AXIS.match(part)
        if m is None or m.group(1) in (config_mod.MESH_BATCH, config_mod.MESH_MODEL) or \
                not (sizes.minimum or 1) <= int(m.group(2)) <= (sizes.maximum or 1):
            return None
        axes.append((m.group(1), int(m.group(2))))
    names = [name for name, _ in axes]
    return tuple(axes) if len(set(names)) == len(names) <= MAX_MESH_AXES else None


def format_axes(axes: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{name}: {size}" for name, size in axes)


class ProgramSection:
    """"What trains": ClusterDeck's model and data, or your own Python program with its arguments."""

    def __init__(self, panel: SettingsPanel, outer: QVBoxLayout) -> None:
        self.panel = panel
        self.box, form = panel._group("What trains", outer)
        self.form = form
        self.kind = QComboBox()
        self.kind.addItems(list(TRAINS))
        panel._register("program", self.kind,
                        "ClusterDeck's model and data: the model, data and training settings below.\n"
                        "Your own program: a Python file run unchanged in every chief and worker task, with "
                        "TF_CONFIG written for it; it builds its own model and data")
        self.kind.activated.connect(self._chosen)
        panel._readers.append(lambda: self.kind.setCurrentIndex(int(panel.document.config.program is not None)))
        form.addRow("Trains", self.kind)
        self.script = panel._path("program.script", form, "Program", "Python (*.py);;All files (*)")
        self.args = QLineEdit()
        self.args.setPlaceholderText("none")
        panel._register("program.args", self.args)
        self.args.editingFinished.connect(self._args_edited)
        panel._readers.append(self._read_args)
        form.addRow("Arguments", self.args)
        self._last = Program()  # the program chosen before switching back, offered again

    def _chosen(self, index: int) -> None:
        doc = self.panel.document
        current = doc.config.program
        if index == 1 and current is None:
            doc.set_value("program", self._last)
        elif index == 0 and current is not None:
            self._last = current
            doc.set_value("program", None)

    def _read_args(self) -> None:
        program = self.panel.document.config.program
        self.args.setText(shlex.join(program.args) if program is not None else "")

    def _args_edited(self) -> None:
        program = self.panel.document.config.program
        if program is None:
            return
        try:
            args = tuple(shlex.split(self.args.text()))
        except ValueError as exc:
            self.args.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR};")
            self.args.setToolTip(f"program.args: expected arguments a shell can split, got {self.args.text()!r} ({exc})")
            return
        if args != program.args:
            self.panel.document.set_value("program", config_mod.replace(program, args=args))

    def refresh(self, config: RunConfig) -> None:
        """Show the program's rows for a program; grey out what a program does not use, saying why."""
        own = config.program is not None
        self.form.setRowVisible(self.panel._rows["program.script"], own)  # the program's fields apply to it alone
        self.form.setRowVisible(self.args, own)
        panel = self.panel
        for box in panel.loop_boxes:
            box.setEnabled(not own)
            title = box.title().removesuffix(" (not used by your program)")
            box.setTitle(f"{title} (not used by your program)" if own else title)
            box.setToolTip(PROGRAM_NOTE if own else "")
        for path, widget in panel.widgets.items():
            if path.startswith("training.") and path not in PROGRAM_TRAINING:
                widget.setEnabled(not own)
                panel.off_notes[path] = PROGRAM_NOTE if own else ""


class ValidationSection:
    """Held-out examples evaluated while training: a split of the data, or a file of the data's kind."""

    def __init__(self, panel: SettingsPanel, outer: QVBoxLayout) -> None:
        self.panel = panel
        self.box, form = panel._group("Validation", outer)
        self.form = form
        self.split = panel._decimal("validation.split", decimals=2, step=0.05)
        self.split.setSpecialValueText("none")
        form.addRow("Held-out split", self.split)
        self.path = panel._path("validation.path", form, "Held-out file",
                                "Data (*.npz *.csv *.tfrecord *.tfrecords *.tfrec);;All files (*)")
        self.every = panel._spin("validation.every")
        self.every.setSpecialValueText("never")
        form.addRow("Every (steps)", self.every)
        self.batches = panel._spin("validation.batches")
        self.batches.setSpecialValueText("all examples")
        form.addRow("Batches", self.batches)

    def refresh(self, config: RunConfig) -> None:
        files = field_spec("validation.path").applies_to(config)
        self.form.setRowVisible(self.panel._rows["validation.path"], files or bool(config.validation.path.strip()))
        evaluated = field_spec("validation.batches").applies_to(config)
        self.form.setRowVisible(self.batches, evaluated or config.validation.batches != 0)


class MeshAxesEdit(QLineEdit):
    """The mesh's named axes between ``batch`` and ``model`` (``feature: 2``), as one line."""

    def __init__(self, panel: SettingsPanel, form: QFormLayout) -> None:
        super().__init__()
        self.panel = panel
        self.setPlaceholderText("none, e.g. feature: 2")
        self.tip = field_spec("parallelism.mesh_axes").help
        panel._register("parallelism.mesh_axes", self, self.tip)
        self.editingFinished.connect(self._edited)
        panel._readers.append(lambda: self.setText(format_axes(panel.document.config.parallelism.mesh_axes)))
        form.addRow("Extra mesh axes", self)

    def _edited(self) -> None:
        axes = parse_axes(self.text())
        if axes is None:
            self.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR};")
            self.setToolTip(f"{self.tip}\n⚠ parallelism.mesh_axes: expected name: size pairs such as "
                            f"feature: 2, got {self.text()!r}")
            return
        if axes != self.panel.document.config.parallelism.mesh_axes:
            self.panel.document.set_value("parallelism.mesh_axes", axes)



class PathField(QWidget):
    """A file path as a row the whole width of the form (the label and Browse… above, the path below), so a
    laptop's narrow column still shows some 30 characters of it; the path's end (the file name) is the part in
    view, the whole path is in the tooltip."""

    def __init__(self, panel: SettingsPanel, path: str, label: str, filters: str) -> None:
        super().__init__()
        self.panel, self.path, self.label, self.filters = panel, path, label, filters
        self.edit = QLineEdit(self)  # made before Browse…: Tab reaches the path first
        self.edit.setPlaceholderText("none")
        panel._register(path, self.edit)
        self.edit.editingFinished.connect(self._typed)
        panel._readers.append(self.read)
        self.browse = QPushButton("Browse…", self)
        self.browse.setToolTip(f"Choose the file for {path}")
        self.browse.clicked.connect(self.pick)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        caption = QLabel(label)
        caption.setBuddy(self.edit)
        top.addWidget(caption, 1)
        top.addWidget(self.browse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(top)
        layout.addWidget(self.edit)

    def read(self) -> None:
        self.show_path(str(self.panel._value_of(self.path)))

    def show_path(self, text: str) -> None:
        """``text`` in the field with its end in view (QLineEdit scrolls to its cursor)."""
        self.edit.setText(text)
        self.edit.setCursorPosition(len(text))

    def _typed(self) -> None:
        self.panel._set(self.path, self.edit.text().strip())
        self.edit.setCursorPosition(len(self.edit.text()))  # typed or pasted: the file name stays in view

    def start(self) -> str:
        """Where the file dialog opens: the path chosen; else the script already picked for the model or the data
        (selected: one file often defines both), or the folder of a partner's file; else the preset's folder."""
        own = self.edit.text().strip()
        if own:
            return self._full(own)
        for partner in PARTNERS.get(self.path, ()):
            value = str(self.panel._value_of(partner)).strip()
            if value:
                full = self._full(value)
                return full if self._takes_script(partner, full) else str(Path(full).parent)
        document = self.panel.document.path
        return str(document.parent) if document is not None else ""

    def _takes_script(self, partner: str, file: str) -> bool:
        """Whether this field could take ``partner``'s ``file`` too (a Python script defining both)."""
        if {self.path, partner} != set(SAME_SCRIPT) or Path(file).suffix.lower() != ".py":
            return False
        return self.path != "data.path" or self.panel.document.config.data.source == "script"

    def _full(self, value: str) -> str:
        """``value`` as a path the dialog finds: a relative one is read from the preset's folder."""
        path = Path(os.path.expanduser(value))  # "~nosuchuser" stays as written
        document = self.panel.document.path
        if not path.is_absolute() and document is not None:
            path = document.parent / path
        return os.path.normpath(path)

    def pick(self) -> None:
        chosen, _ = QFileDialog.getOpenFileName(self.panel, f"Choose {self.label.lower()}", self.start(),
                                                self.filters)
        if chosen:
            self.show_path(chosen)
            self.panel._set(self.path, chosen)
