"""The run settings form's Parallelism section: the mode, the DTensor mesh (with its extra named axes), the
parameter servers' partitioner and the collective timeout, each row shown where the mode uses it.

Choosing another mode may call for other tasks: the section asks before it changes the cluster, naming every
change and every problem the switch leaves (:meth:`ParallelismSection.choose_mode`).
"""

from __future__ import annotations

import re

from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from engine.contract import config as config_mod
from engine.contract.config import MAX_MESH_AXES, MODES, PARTITIONERS, RunConfig, field_spec
from gui import document as doc_ops
from gui import theme
from gui.settings_fields import FieldEditors
from gui.settings_sections import Section

MODE_HELP = {
    "data": "data — synchronous data parallelism: every worker holds the whole model, gradients are "
            "all-reduced every step (MirroredStrategy / MultiWorkerMirroredStrategy)",
    "model": "model — the model's layers are sharded over a DTensor mesh of batch × model devices",
    "async": "async — parameter servers hold the variables; a chief schedules steps on workers that "
             "run without waiting for each other (ParameterServerStrategy)",
}
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


class MeshAxesEdit(QLineEdit):
    """The mesh's named axes between ``batch`` and ``model`` (``feature: 2``), as one line."""

    def __init__(self, fields: FieldEditors, form: QFormLayout) -> None:
        super().__init__()
        self.fields = fields
        self.setPlaceholderText("none, e.g. feature: 2")
        self.tip = field_spec("parallelism.mesh_axes").help
        fields.register("parallelism.mesh_axes", self, self.tip)
        self.editingFinished.connect(self._edited)
        fields.readers.append(lambda: self.setText(format_axes(fields.document.config.parallelism.mesh_axes)))
        form.addRow("Extra mesh axes", self)

    def _edited(self) -> None:
        axes = parse_axes(self.text())
        if axes is None:
            self.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR};")
            self.setToolTip(f"{self.tip}\n⚠ parallelism.mesh_axes: expected name: size pairs such as "
                            f"feature: 2, got {self.text()!r}")
            return
        if axes != self.fields.document.config.parallelism.mesh_axes:
            self.fields.document.set_value("parallelism.mesh_axes", axes)


class ParallelismSection(Section):
    """How the training is spread: the mode and the options of the mode chosen."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Parallelism")
        form = self.form
        self.mode = QComboBox()
        self.mode.addItems(list(MODES))
        for i, m in enumerate(MODES):
            self.mode.setItemData(i, MODE_HELP[m], 3)  # ToolTipRole
        fields.register("parallelism.mode", self.mode, field_spec("parallelism.mode").help + ":\n"
                        + "\n".join(MODE_HELP[m] for m in MODES))
        self.mode.activated.connect(lambda _i: self.choose_mode(self.mode.currentText()))
        fields.readers.append(lambda: self.mode.setCurrentText(fields.document.config.parallelism.mode))
        form.addRow("Mode", self.mode)
        self.mesh_row = QWidget()
        mesh_layout = QHBoxLayout(self.mesh_row)
        mesh_layout.setContentsMargins(0, 0, 0, 0)
        self.mesh_batch = fields.spin("parallelism.mesh_batch")
        self.mesh_model = fields.spin("parallelism.mesh_model")
        mesh_layout.addWidget(self.mesh_batch)
        mesh_layout.addWidget(self.mesh_model)
        fields.widgets["parallelism.mesh"] = self.mesh_row
        fields.tips["parallelism.mesh"] = ("DTensor mesh: batch × model (× the extra axes) must equal the worker "
                                           "devices")
        form.addRow("Mesh b × m", self.mesh_row)
        self.mesh_axes = MeshAxesEdit(fields, form)
        self.partitioner = fields.combo("parallelism.partitioner", PARTITIONERS, form, "Partitioner")
        self.shards = fields.spin("parallelism.shards")
        form.addRow("Shards", self.shards)
        self.min_shard_bytes = fields.spin("parallelism.min_shard_bytes")
        form.addRow("Min shard bytes", self.min_shard_bytes)
        self.timeout = fields.decimal("parallelism.collective_timeout_s", decimals=1)
        self.timeout.setSpecialValueText("TF default")
        form.addRow("Collective timeout", self.timeout)

    def refresh(self, config: RunConfig) -> None:
        fields, form = self.fields, self.form
        form.setRowVisible(self.mesh_row, fields.applies("parallelism.mesh_batch"))
        form.setRowVisible(self.mesh_axes, fields.applies("parallelism.mesh_axes") or bool(config.parallelism.mesh_axes))
        for path, row in (("parallelism.partitioner", self.partitioner), ("parallelism.shards", self.shards),
                          ("parallelism.min_shard_bytes", self.min_shard_bytes),
                          ("parallelism.collective_timeout_s", self.timeout)):
            form.setRowVisible(row, fields.applies(path))

    def choose_mode(self, mode: str) -> None:
        """Switch parallelism, offering to fix the cluster when the new mode needs other tasks; the question
        names every change and every problem the switch leaves."""
        c = self.fields.document
        if mode == c.config.parallelism.mode:
            return
        probe = config_mod.replace(c.config, parallelism=config_mod.replace(c.config.parallelism, mode=mode))
        fixed, changes = doc_ops.mode_fix(c.config, mode)
        fix = True  # a mesh that only follows the devices needs no question
        if fixed.cluster != probe.cluster:
            left = config_mod.validate(fixed)
            text = (f"{MODE_HELP[mode]}.\n\nThe current cluster does not fit this mode. Change it?\n\n"
                    + "\n".join(f"• {x}" for x in changes))
            if left:
                text += "\n\nStill to fix after this change:\n" + "\n".join(f"• {p}" for p in left)
            answer = QMessageBox.question(
                self.box, "Fix the cluster?", text,
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes)
            fix = answer == QMessageBox.StandardButton.Yes
        was = c.config.training.steps_per_execution
        c.set_mode(mode, fix_cluster=fix)
        if was != c.config.training.steps_per_execution:  # set_mode keeps only what the mode takes
            window = self.box.window()
            if isinstance(window, QMainWindow):
                modes = " and ".join(config_mod.STEPS_PER_EXECUTION_MODES)
                window.statusBar().showMessage(f"Steps per execution set back to 1 (was {was}): it applies to "
                                               f"{modes} modes only; Undo brings it back", 10000)
