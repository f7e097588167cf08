"""Run settings: what trains (ClusterDeck's model and data, or your own program), parallelism and its
options, data, model, training and validation, as one form.

Each widget writes one config field through :meth:`DocumentModel.set_value` (an
undoable edit; repeated edits of one field merge) and is re-read from the
config after every edit, with its signals blocked so nothing echoes. Its range, tooltip and when it is
shown come from the field's one declaration (:func:`engine.contract.config.field_spec`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QSpinBox,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from engine.contract import config as config_mod
from engine.contract.config import DATA_SOURCES, MODELS, MODES, OPTIMIZERS, PARTITIONERS, Problem, field_spec
from engine.contract.fields import judge
from gui import document as doc_ops
from gui import theme
from gui.document_model import DocumentModel
from gui.settings_sections import MeshAxesEdit, PathField, ProgramSection, ValidationSection
from gui.window_layout import reveal

MODE_HELP = {
    "data": "data — synchronous data parallelism: every worker holds the whole model, gradients are "
            "all-reduced every step (MirroredStrategy / MultiWorkerMirroredStrategy)",
    "model": "model — the model's layers are sharded over a DTensor mesh of batch × model devices",
    "async": "async — parameter servers hold the variables; a chief schedules steps on workers that "
             "run without waiting for each other (ParameterServerStrategy)",
}


#: The largest value a QSpinBox holds (a C int).
QSPIN_MAX = 2**31 - 1


def parse_ints(text: str) -> tuple[int, ...] | None:
    """``"256, 128"`` → ``(256, 128)``; None when it is not a list of positive integers."""
    parts = [p for p in text.replace(";", ",").replace(" ", ",").split(",") if p]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        return None
    return values if all(v >= 1 for v in values) else None


def format_ints(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


class SettingsPanel(QWidget):
    """The run settings form. ``widgets`` maps config field paths to their editor.

    No scroll area of its own: it lies in the settings column, which scrolls as a whole (window_layout)."""

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        self.widgets: dict[str, QWidget] = {}
        self._tips: dict[str, str] = {}
        self._readers: list[Callable[[], None]] = []
        #: the file path rows, by field path
        self._rows: dict[str, PathField] = {}
        #: why a setting is greyed out (added to its tooltip), by field path
        self.off_notes: dict[str, str] = {}

        # -- run
        box, form = self._group("Run", outer)
        self.name = self._line("name", form, "Name")
        self.program_section = ProgramSection(self, outer)

        # -- parallelism
        box, form = self._group("Parallelism", outer)
        self.mode = QComboBox()
        self.mode.addItems(list(MODES))
        for i, m in enumerate(MODES):
            self.mode.setItemData(i, MODE_HELP[m], 3)  # ToolTipRole
        self._register("parallelism.mode", self.mode, field_spec("parallelism.mode").help + ":\n"
                       + "\n".join(MODE_HELP[m] for m in MODES))
        self.mode.activated.connect(lambda _i: self.choose_mode(self.mode.currentText()))
        self._readers.append(lambda: self.mode.setCurrentText(document.config.parallelism.mode))
        form.addRow("Mode", self.mode)
        mesh_row = QWidget()
        mesh_layout = QHBoxLayout(mesh_row)
        mesh_layout.setContentsMargins(0, 0, 0, 0)
        self.mesh_batch = self._spin("parallelism.mesh_batch")
        self.mesh_model = self._spin("parallelism.mesh_model")
        mesh_layout.addWidget(self.mesh_batch)
        mesh_layout.addWidget(self.mesh_model)
        self.widgets["parallelism.mesh"] = mesh_row
        self._tips["parallelism.mesh"] = ("DTensor mesh: batch × model (× the extra axes) must equal the worker "
                                          "devices")
        form.addRow("Mesh b × m", mesh_row)
        self.mesh_form_row = mesh_row
        self.mesh_axes = MeshAxesEdit(self, form)
        self.partitioner = self._combo("parallelism.partitioner", PARTITIONERS, form, "Partitioner")
        self.shards = self._spin("parallelism.shards")
        form.addRow("Shards", self.shards)
        self.min_shard_bytes = self._spin("parallelism.min_shard_bytes")
        form.addRow("Min shard bytes", self.min_shard_bytes)
        self.timeout = self._decimal("parallelism.collective_timeout_s", decimals=1)
        self.timeout.setSpecialValueText("TF default")
        form.addRow("Collective timeout", self.timeout)
        self.parallelism_form = form

        # -- data
        data_box, form = self._group("Data", outer)
        self.source = self._combo("data.source", DATA_SOURCES, form, "Source")
        self.shape = self._ints("data.shape", form, "Shape")
        self.classes = self._spin("data.classes")
        form.addRow("Classes", self.classes)
        self.data_size = self._spin("data.size")
        form.addRow("Size", self.data_size)
        self.data_path = self._path("data.path", form, "Path",
                                    "Data (*.npz *.csv *.tfrecord *.tfrecords *.tfrec *.py);;All files (*)")
        self.x_key = self._line("data.x_key", form, "Inputs key")
        self.y_key = self._line("data.y_key", form, "Labels key")
        self.data_form = form

        # -- model
        model_box, form = self._group("Model", outer)
        self.model_name = self._combo("model.name", MODELS, form, "Model")
        self.hidden = self._ints("model.hidden", form, "Hidden sizes")  # none: a linear model
        self.vocab_size = self._spin("model.vocab_size")
        form.addRow("Vocab size", self.vocab_size)
        self.embed_dim = self._spin("model.embed_dim")
        form.addRow("Embed dim", self.embed_dim)
        self.heads = self._spin("model.heads")
        form.addRow("Heads", self.heads)
        self.script = self._path("model.script", form, "Script", "Python (*.py);;All files (*)")
        self.model_form = form

        # -- training
        box, form = self._group("Training", outer)
        self.batch = self._spin("training.global_batch_size")
        form.addRow("Global batch", self.batch)
        self.steps = self._spin("training.steps")
        form.addRow("Steps", self.steps)
        self.optimizer = self._combo("training.optimizer", OPTIMIZERS, form, "Optimizer")
        self.learning_rate = self._decimal("training.learning_rate", decimals=5, step=0.005)
        form.addRow("Learning rate", self.learning_rate)
        self.seed = self._spin("training.seed")
        form.addRow("Seed", self.seed)
        self.checkpoint_every = self._spin("training.checkpoint_every")
        self.checkpoint_every.setSpecialValueText("at the end")
        form.addRow("Checkpoint every", self.checkpoint_every)
        self.restarts = self._spin("training.restarts")
        form.addRow("Restarts", self.restarts)
        self.steps_per_execution = self._spin("training.steps_per_execution")
        form.addRow("Steps per execution", self.steps_per_execution)
        self.training_form = form
        self.validation_section = ValidationSection(self, outer)
        #: the groups only ClusterDeck's own loop uses (greyed out for your own program)
        self.loop_boxes = (data_box, model_box, self.validation_section.box)
        outer.addStretch(1)

        document.settingsChanged.connect(self.refresh)
        document.problemsChanged.connect(self.mark_problems)
        self.refresh()

    # ------------------------------------------------------------------ building helpers

    def _group(self, title: str, outer: QVBoxLayout) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        form = QFormLayout(box)
        outer.addWidget(box)
        return box, form

    def _register(self, path: str, widget: QWidget, tip: str | None = None) -> None:
        """Register the editor of ``path``; its tooltip is the field's declared help unless ``tip`` says more."""
        if tip is None:
            tip = field_spec(path).help
        widget.setObjectName(path)
        widget.setToolTip(tip)
        self.widgets[path] = widget
        self._tips[path] = tip

    def _value_of(self, path: str) -> Any:
        section, _, name = path.partition(".")
        obj = getattr(self.document.config, section)
        if obj is None and name:  # an optional section that is not set (program)
            return ""
        return getattr(obj, name) if name else obj

    def _line(self, path: str, form: QFormLayout, label: str) -> QLineEdit:
        edit = QLineEdit()
        self._register(path, edit)
        edit.editingFinished.connect(lambda: self._set(path, edit.text().strip()))
        self._readers.append(lambda: edit.setText(str(self._value_of(path))))
        form.addRow(label, edit)
        return edit

    def _combo(self, path: str, choices: tuple[str, ...], form: QFormLayout, label: str) -> QComboBox:
        combo = QComboBox()
        combo.addItems(list(choices))
        self._register(path, combo)
        combo.activated.connect(lambda _i: self._set(path, combo.currentText()))
        self._readers.append(lambda: combo.setCurrentText(str(self._value_of(path))))
        form.addRow(label, combo)
        return combo

    def _spin(self, path: str) -> QSpinBox | QDoubleSpinBox:
        """An integer field's editor over its declared range (a whole-number QDoubleSpinBox where the range is
        wider than a QSpinBox holds)."""
        spec = field_spec(path)
        low, high = spec.low, spec.high
        assert low is not None and high is not None, f"{path}: an editor needs the field's bounds"
        if high <= QSPIN_MAX:
            spin: QSpinBox | QDoubleSpinBox = QSpinBox()
            spin.setRange(int(low), int(high))
        else:
            spin = QDoubleSpinBox()
            spin.setDecimals(0)
            spin.setRange(low, high)
        self._bind_number(path, spin)
        return spin

    def _decimal(self, path: str, decimals: int, step: float = 1.0) -> QDoubleSpinBox:
        """A number field's editor over its declared range (``editor_min``/``editor_max`` where it has none)."""
        spec = field_spec(path)
        spin = QDoubleSpinBox()
        spin.setDecimals(decimals)
        spin.setRange(spec.low if spec.low is not None else 0.0, spec.high if spec.high is not None else 1e9)
        spin.setSingleStep(step)
        self._bind_number(path, spin)
        return spin

    def _bind_number(self, path: str, spin: QSpinBox | QDoubleSpinBox, tip: str | None = None) -> None:
        spin.setKeyboardTracking(False)
        self._register(path, spin, tip)
        whole = field_spec(path).kind == "int"
        spin.valueChanged.connect(lambda v: self._set(path, int(v) if whole else v))

        def read() -> None:
            value = self._value_of(path)
            spin.setValue(value if value is not None else spin.minimum())  # type: ignore[arg-type]

        self._readers.append(read)

    def _path(self, path: str, form: QFormLayout, label: str, filters: str) -> QLineEdit:
        """A file path: typed, or picked with Browse…; a row the form's whole width (see :class:`PathField`)."""
        row = PathField(self, path, label, filters)
        form.addRow(row)
        self._rows[path] = row
        return row.edit

    def _ints(self, path: str, form: QFormLayout, label: str) -> QLineEdit:
        """A list of integers, typed as ``256, 128``; committed only within the field's declared bounds."""
        edit = QLineEdit()
        self._register(path, edit)
        tip = self._tips[path]
        spec = field_spec(path)

        def commit() -> None:
            values = parse_ints(edit.text())
            problem = judge(spec, list(values)) if values is not None else (
                f"expected {spec.expected()}, got {edit.text()!r}")
            if problem is not None:
                edit.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR};")
                edit.setToolTip(f"{tip}\n⚠ {path}: {problem}")
                return
            assert values is not None
            self._set(path, values)

        edit.editingFinished.connect(commit)
        self._readers.append(lambda: edit.setText(format_ints(self._value_of(path))))
        form.addRow(label, edit)
        return edit

    # ------------------------------------------------------------------ behaviour

    def _set(self, path: str, value: Any) -> None:
        if path == "training.steps":
            training = config_mod.replace(self.document.config.training, steps=int(value), epochs=None)
            if training != self.document.config.training:
                self.document.set_value("training", training)
            return
        if path == "data.source" and value in config_mod.KNOWN_DATA:
            # a known data set brings its own example shape and classes: one edit, one undo
            data = self._data_for(str(value))
            if data != self.document.config.data:
                self.document.set_value("data", data)
            return
        if self._value_of(path) != value:
            self.document.set_value(path, value)

    def choose_mode(self, mode: str) -> None:
        """Switch parallelism, offering to fix the cluster when the new mode needs other tasks; the question
        names every change and every problem the switch leaves."""
        c = self.document
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
                self, "Fix the cluster?", text,
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes)
            fix = answer == QMessageBox.StandardButton.Yes
        was = c.config.training.steps_per_execution
        c.set_mode(mode, fix_cluster=fix)
        if was != c.config.training.steps_per_execution:  # set_mode keeps only what the mode takes
            window = self.window()
            if isinstance(window, QMainWindow):
                modes = " and ".join(config_mod.STEPS_PER_EXECUTION_MODES)
                window.statusBar().showMessage(f"Steps per execution set back to 1 (was {was}): it applies to "
                                               f"{modes} modes only; Undo brings it back", 10000)

    def refresh(self) -> None:
        for w in self.widgets.values():
            w.blockSignals(True)
        try:
            for read in self._readers:
                read()
        finally:
            for w in self.widgets.values():
                w.blockSignals(False)
        c = self.document.config
        form = self.parallelism_form
        form.setRowVisible(self.mesh_form_row, self.applies("parallelism.mesh_batch"))
        form.setRowVisible(self.mesh_axes, self.applies("parallelism.mesh_axes") or bool(c.parallelism.mesh_axes))
        for path, row in (("parallelism.partitioner", self.partitioner), ("parallelism.shards", self.shards),
                          ("parallelism.min_shard_bytes", self.min_shard_bytes),
                          ("parallelism.collective_timeout_s", self.timeout)):
            form.setRowVisible(row, self.applies(path))
        self.data_form.setRowVisible(self._rows["data.path"], self.applies("data.path"))
        self.data_form.setRowVisible(self.x_key, self.applies("data.x_key"))
        self.data_form.setRowVisible(self.y_key, self.applies("data.y_key"))
        self.data_form.setRowVisible(self.data_size, True)
        # a script builds its own layers: hidden sizes are not read (nor checked against the mesh) for it
        self.model_form.setRowVisible(self.hidden, self.applies("model.hidden"))  # a script builds its own layers
        for path in ("model.vocab_size", "model.embed_dim", "model.heads"):
            self.model_form.setRowVisible(self.widgets[path], self.applies(path))
        self.model_form.setRowVisible(self._rows["model.script"], self.applies("model.script"))
        self.training_form.setRowVisible(self.steps_per_execution, self.applies("training.steps_per_execution")
                                         or c.training.steps_per_execution != 1)
        self.validation_section.refresh(c)
        self.program_section.refresh(c)
        self._offer_choices()
        self.mark_problems(self.document.problems)

    def applies(self, path: str) -> bool:
        """Whether the field ``path`` is used by the config as it is now (its declared ``applies``)."""
        return field_spec(path).applies_to(self.document.config)

    def _offer_choices(self) -> None:
        """Data sources and models that cannot work with the rest of the config (the mode above all) are
        greyed out, their tooltip saying why: the config's own rules decide, so the choices follow them."""
        config = self.document.config
        for combo, path, probe in (
            (self.source, "data.source", lambda v: config_mod.replace(config, data=self._data_for(v))),
            (self.model_name, "model.name", lambda v: config_mod.replace(config, model=config_mod.replace(config.model, name=v))),
        ):
            items = combo.model()
            for i in range(combo.count()):
                value = combo.itemText(i)
                why = [p.message for p in config_mod.validate(probe(value)) if p.field == path]
                item = items.item(i) if isinstance(items, QStandardItemModel) else None
                if item is not None:
                    item.setEnabled(not why or value == combo.currentText())
                    item.setToolTip("\n".join(why) if why else "")
                    item.setForeground(combo.palette().placeholderText() if why else combo.palette().text())

    def _data_for(self, source: str) -> config_mod.Data:
        """The data section with ``source`` chosen (a known data set brings its shape and classes)."""
        data = self.document.config.data
        if source in config_mod.KNOWN_DATA:
            shape, classes = config_mod.KNOWN_DATA[source]
            return config_mod.replace(data, source=source, shape=shape, classes=classes)
        return config_mod.replace(data, source=source)

    def mark_problems(self, problems: list[Problem]) -> None:
        """A red frame and the message in the tooltip of each setting a problem names."""
        marked: dict[str, list[str]] = {}
        for p in problems:
            path = p.field.split("[")[0]
            if path.startswith("parallelism.partitioner."):
                path = "parallelism." + path.rsplit(".", 1)[-1]
            if path in self.widgets:
                marked.setdefault(path, []).append(p.message)
        for path, widget in self.widgets.items():
            messages = marked.get(path)
            tip = self._tips[path] + (f"\n{self.off_notes[path]}" if self.off_notes.get(path) else "")
            if path in self._rows and self._value_of(path):  # a path: the whole of it (the field shows its end)
                tip = f"{self._value_of(path)}\n\n{tip}"
            if messages:
                widget.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR}; border-radius: 3px;")
                widget.setToolTip(tip + "\n" + "\n".join(f"⚠ {m}" for m in messages))
            else:
                widget.setStyleSheet("")
                widget.setToolTip(tip)

    def needed_width(self) -> int:
        """The width the form needs without cutting a row off, with the settings column's scroll bar."""
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        return self.minimumSizeHint().width() + bar + 4

    def focus_field(self, path: str) -> bool:
        """Scroll to and focus the editor of ``path`` (a problem's field); False when there is none."""
        path = path.split("[")[0]
        widget = self.widgets.get(path)
        if widget is None and "." in path:
            widget = self.widgets.get(path.rsplit(".", 1)[0])
        if widget is None:
            return False
        reveal(widget)
        widget.setFocus()
        return True
