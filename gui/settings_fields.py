"""The run settings form's editors of config fields, each made from its field's one declaration.

An editor writes its field through :meth:`DocumentModel.set_value` (an undoable edit; repeated edits of one field
merge) and is re-read from the config after every edit, with its signals blocked so nothing echoes. Its range and
tooltip come from the field's declaration (:func:`engine.contract.config.field_spec`); a problem naming its field
frames it in red. The form's sections (``gui/settings_sections.py``) build their rows with these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.contract import config as config_mod
from engine.contract.config import Problem, RunConfig, field_spec
from engine.contract.fields import judge
from gui import theme
from gui.document_model import DocumentModel

#: The largest value a QSpinBox holds (a C int).
QSPIN_MAX = 2**31 - 1
#: Files chosen together: a file dialog with nothing chosen yet starts in the folder of its partner (the first
#: one set): a held-out file lies beside the data, a program beside the scripts.
PARTNERS = {"model.script": ("data.path",), "data.path": ("model.script",), "validation.path": ("data.path",),
            "program.script": ("model.script", "data.path")}
#: Fields one Python file can fill both of (build_model and make_dataset side by side): the dialog of one
#: selects the other's script.
SAME_SCRIPT = ("model.script", "data.path")


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


def with_source(data: config_mod.Data, source: str) -> config_mod.Data:
    """The data section with ``source`` chosen (a known data set brings its shape and classes)."""
    if source in config_mod.KNOWN_DATA:
        shape, classes = config_mod.KNOWN_DATA[source]
        return config_mod.replace(data, source=source, shape=shape, classes=classes)
    return config_mod.replace(data, source=source)


class FieldEditors:
    """The form's editors by config field path (``widgets``): how each is built, written, re-read and marked."""

    def __init__(self, document: DocumentModel) -> None:
        self.document = document
        self.widgets: dict[str, QWidget] = {}
        self.tips: dict[str, str] = {}
        #: how each editor is re-read from the config (run with every editor's signals blocked)
        self.readers: list[Callable[[], None]] = []
        #: the file path rows, by field path
        self.rows: dict[str, PathField] = {}
        #: why a setting is greyed out (added to its tooltip), by field path
        self.off_notes: dict[str, str] = {}

    # ------------------------------------------------------------------ building

    def register(self, path: str, widget: QWidget, tip: str | None = None) -> None:
        """Register the editor of ``path``; its tooltip is the field's declared help unless ``tip`` says more."""
        if tip is None:
            tip = field_spec(path).help
        widget.setObjectName(path)
        widget.setToolTip(tip)
        self.widgets[path] = widget
        self.tips[path] = tip

    def line(self, path: str, form: QFormLayout, label: str) -> QLineEdit:
        edit = QLineEdit()
        self.register(path, edit)
        edit.editingFinished.connect(lambda: self.set(path, edit.text().strip()))
        self.readers.append(lambda: edit.setText(str(self.value_of(path))))
        form.addRow(label, edit)
        return edit

    def combo(self, path: str, choices: tuple[str, ...], form: QFormLayout, label: str) -> QComboBox:
        combo = QComboBox()
        combo.addItems(list(choices))
        self.register(path, combo)
        combo.activated.connect(lambda _i: self.set(path, combo.currentText()))
        self.readers.append(lambda: combo.setCurrentText(str(self.value_of(path))))
        form.addRow(label, combo)
        return combo

    def spin(self, path: str) -> QSpinBox | QDoubleSpinBox:
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

    def decimal(self, path: str, decimals: int, step: float = 1.0) -> QDoubleSpinBox:
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
        self.register(path, spin, tip)
        whole = field_spec(path).kind == "int"
        spin.valueChanged.connect(lambda v: self.set(path, int(v) if whole else v))

        def read() -> None:
            value = self.value_of(path)
            spin.setValue(value if value is not None else spin.minimum())  # type: ignore[arg-type]

        self.readers.append(read)

    def path(self, path: str, form: QFormLayout, label: str, filters: str) -> QLineEdit:
        """A file path: typed, or picked with Browse…; a row the form's whole width (see :class:`PathField`)."""
        row = PathField(self, path, label, filters)
        form.addRow(row)
        self.rows[path] = row
        return row.edit

    def ints(self, path: str, form: QFormLayout, label: str) -> QLineEdit:
        """A list of integers, typed as ``256, 128``; committed only within the field's declared bounds."""
        edit = QLineEdit()
        self.register(path, edit)
        tip = self.tips[path]
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
            self.set(path, values)

        edit.editingFinished.connect(commit)
        self.readers.append(lambda: edit.setText(format_ints(self.value_of(path))))
        form.addRow(label, edit)
        return edit

    # ------------------------------------------------------------------ reading and writing

    def value_of(self, path: str) -> Any:
        section, _, name = path.partition(".")
        obj = getattr(self.document.config, section)
        if obj is None and name:  # an optional section that is not set (program)
            return ""
        return getattr(obj, name) if name else obj

    def set(self, path: str, value: Any) -> None:
        """Write one field (an undoable edit) unless it holds ``value`` already."""
        config = self.document.config
        if path == "training.steps":
            training = config_mod.replace(config.training, steps=int(value), epochs=None)
            if training != config.training:
                self.document.set_value("training", training)
            return
        if path == "data.source" and value in config_mod.KNOWN_DATA:
            # a known data set brings its own example shape and classes: one edit, one undo
            data = with_source(config.data, str(value))
            if data != config.data:
                self.document.set_value("data", data)
            return
        if self.value_of(path) != value:
            self.document.set_value(path, value)

    def read_all(self) -> None:
        """Every editor re-read from the config, none of them echoing it back."""
        for w in self.widgets.values():
            w.blockSignals(True)
        try:
            for read in self.readers:
                read()
        finally:
            for w in self.widgets.values():
                w.blockSignals(False)

    def applies(self, path: str) -> bool:
        """Whether the field ``path`` is used by the config as it is now (its declared ``applies``)."""
        return field_spec(path).applies_to(self.document.config)

    def offer_choices(self, combo: QComboBox, path: str, probe: Callable[[str], RunConfig]) -> None:
        """Grey out the choices of ``path`` that cannot work with the rest of the config, their tooltip saying why:
        the config's own rules (``validate`` of the config ``probe`` makes with a choice) decide."""
        items = combo.model()
        for i in range(combo.count()):
            value = combo.itemText(i)
            why = [p.message for p in config_mod.validate(probe(value)) if p.field == path]
            item = items.item(i) if isinstance(items, QStandardItemModel) else None
            if item is not None:
                item.setEnabled(not why or value == combo.currentText())
                item.setToolTip("\n".join(why) if why else "")
                item.setForeground(combo.palette().placeholderText() if why else combo.palette().text())

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
            tip = self.tips[path] + (f"\n{self.off_notes[path]}" if self.off_notes.get(path) else "")
            if path in self.rows and self.value_of(path):  # a path: the whole of it (the field shows its end)
                tip = f"{self.value_of(path)}\n\n{tip}"
            if messages:
                widget.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR}; border-radius: 3px;")
                widget.setToolTip(tip + "\n" + "\n".join(f"⚠ {m}" for m in messages))
            else:
                widget.setStyleSheet("")
                widget.setToolTip(tip)


class PathField(QWidget):
    """A file path as a row the whole width of the form (the label and Browse… above, the path below), so a
    laptop's narrow column still shows some 30 characters of it; the path's end (the file name) is the part in
    view, the whole path is in the tooltip."""

    def __init__(self, fields: FieldEditors, path: str, label: str, filters: str) -> None:
        super().__init__()
        self.fields, self.path, self.label, self.filters = fields, path, label, filters
        self.edit = QLineEdit(self)  # made before Browse…: Tab reaches the path first
        self.edit.setPlaceholderText("none")
        fields.register(path, self.edit)
        self.edit.editingFinished.connect(self._typed)
        fields.readers.append(self.read)
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
        self.show_path(str(self.fields.value_of(self.path)))

    def show_path(self, text: str) -> None:
        """``text`` in the field with its end in view (QLineEdit scrolls to its cursor)."""
        self.edit.setText(text)
        self.edit.setCursorPosition(len(text))

    def _typed(self) -> None:
        self.fields.set(self.path, self.edit.text().strip())
        self.edit.setCursorPosition(len(self.edit.text()))  # typed or pasted: the file name stays in view

    def start(self) -> str:
        """Where the file dialog opens: the path chosen; else the script already picked for the model or the data
        (selected: one file often defines both), or the folder of a partner's file; else the preset's folder."""
        own = self.edit.text().strip()
        if own:
            return self._full(own)
        for partner in PARTNERS.get(self.path, ()):
            value = str(self.fields.value_of(partner)).strip()
            if value:
                full = self._full(value)
                return full if self._takes_script(partner, full) else str(Path(full).parent)
        document = self.fields.document.path
        return str(document.parent) if document is not None else ""

    def _takes_script(self, partner: str, file: str) -> bool:
        """Whether this field could take ``partner``'s ``file`` too (a Python script defining both)."""
        if {self.path, partner} != set(SAME_SCRIPT) or Path(file).suffix.lower() != ".py":
            return False
        return self.path != "data.path" or self.fields.document.config.data.source == "script"

    def _full(self, value: str) -> str:
        """``value`` as a path the dialog finds: a relative one is read from the preset's folder."""
        path = Path(os.path.expanduser(value))  # "~nosuchuser" stays as written
        document = self.fields.document.path
        if not path.is_absolute() and document is not None:
            path = document.parent / path
        return os.path.normpath(path)

    def pick(self) -> None:
        chosen, _ = QFileDialog.getOpenFileName(self, f"Choose {self.label.lower()}", self.start(), self.filters)
        if chosen:
            self.show_path(chosen)
            self.fields.set(self.path, chosen)
