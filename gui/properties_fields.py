"""The selection's editors (a host's or a task's fields), each made from its field's declaration, with a label
that shows the problems the config's checks find with it.

Editors are keyed by their field relative to the host (``slurm.nodes``) or as ``task.<field>``: :func:`spec_path`
turns a key into the declared path (help, range), :func:`editor_key` a problem's field into the key of its editor.
"""

from __future__ import annotations

import re

from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import QFormLayout, QLabel, QLineEdit, QSpinBox, QWidget

from engine.contract.config import field_spec
from gui import theme

_OWNER = re.compile(r"^cluster\.hosts\[\d+\](?:\.tasks\[\d+\])?\.?")


def field_key(field: str) -> str:
    """A problem's field relative to its host or task: ``cluster.hosts[0].slurm.nodes`` -> ``slurm.nodes``."""
    return _OWNER.sub("", field, count=1)


def spec_path(key: str) -> str:
    """The declared path of a panel key: ``slurm.nodes`` -> ``cluster.hosts[].slurm.nodes``, ``task.port`` ->
    ``cluster.hosts[].tasks[].port``."""
    if key.startswith("task."):
        return "cluster.hosts[].tasks[]." + key.removeprefix("task.")
    return "cluster.hosts[]." + key


def editor_key(field: str, task: bool) -> str:
    """The key of the editor that shows a problem's ``field`` (of a task when ``task``): a task's name and index
    are its role's; a host's slurm block itself (missing, or on a machine) is its kind's."""
    key = field_key(field)
    if task:
        return "task." + {"name": "role", "index": "role"}.get(key, key)
    return "kind" if key == "slurm" else key


class FieldRows:
    """The editors of the selection's fields and their row labels, by key; rows marked with their problems."""

    def __init__(self) -> None:
        self.editors: dict[str, QWidget] = {}  # by field relative to the host ("slurm.nodes") or "task.<field>"
        self.labels: dict[str, QLabel] = {}
        self.tips: dict[str, str] = {}

    def register(self, key: str, widget: QWidget, name: str) -> None:
        """Register the editor of ``key``; its tooltip is the field's declared help."""
        tip = field_spec(spec_path(key)).help
        widget.setObjectName(name)
        widget.setToolTip(tip)
        self.editors[key] = widget
        self.tips[key] = tip

    def line(self, key: str, name: str, placeholder: str = "",
             validator: QRegularExpressionValidator | None = None) -> QLineEdit:
        edit = QLineEdit()
        if placeholder:
            edit.setPlaceholderText(placeholder)
        if validator is not None:
            edit.setValidator(validator)
        self.register(key, edit, name)
        return edit

    def spin(self, key: str, name: str, auto: bool = False) -> QSpinBox:
        """An integer field's editor over its declared range (``auto``: one below it stands for 'auto')."""
        spec = field_spec(spec_path(key))
        assert spec.low is not None and spec.high is not None, f"{key}: an editor needs the field's bounds"
        spin = QSpinBox()
        spin.setRange(int(spec.low) - int(auto), int(spec.high))
        spin.setKeyboardTracking(False)
        self.register(key, spin, name)
        return spin

    def row(self, form: QFormLayout, text: str, key: str) -> QWidget:
        """A form row for the field ``key``, its label ready to show problems; returns its editor."""
        label = QLabel(text)
        label.setToolTip(self.tips[key])
        label.setProperty("text0", text)
        self.labels[key] = label
        field = self.editors[key]
        form.addRow(label, field)
        return field

    def widest(self, forms: tuple[QFormLayout, ...]) -> int:
        """The width ``forms`` need with every row marked with a problem (so marking one never cuts a row)."""
        for label in self.labels.values():
            label.setText(f"⚠ {label.property('text0')}")
        for form in forms:
            form.activate()
        width = max(form.minimumSize().width() for form in forms)
        for label in self.labels.values():
            label.setText(str(label.property("text0")))
        return width

    def mark(self, found: dict[str, list[str]]) -> None:
        """Each row with messages in ``found`` (by key) marked: a red label with a ⚠, the messages in the label's
        and the editor's tooltips; every other row plain."""
        for key, label in self.labels.items():
            messages = found.get(key, [])
            base = str(label.property("text0"))
            label.setText(f"⚠ {base}" if messages else base)
            label.setStyleSheet(f"color: {theme.PROBLEM_COLOR};" if messages else "")
            tip = self.tips[key] + "".join(f"\n⚠ {m}" for m in messages)
            label.setToolTip(tip)
            self.editors[key].setToolTip(tip)
