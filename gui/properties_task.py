"""The properties page of a selected task: its role (which renames it), its index within the role, its port.
Every change is one undoable edit of the document."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QWidget

from engine.contract.config import ROLES, field_spec
from gui.document_model import DocumentModel
from gui.properties_fields import FieldRows, spec_path


class TaskEditor(QWidget):
    """A task's fields: role, index (shown), port ('auto' for one the launcher picks)."""

    def __init__(self, document: DocumentModel, fields: FieldRows, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.form = form = QFormLayout(self)
        self.role = QComboBox()
        self.role.addItems(list(ROLES))
        fields.register("task.role", self.role, "taskRole")
        self.index = QLabel()
        self.index.setToolTip(field_spec(spec_path("task.index")).help)
        self.port = fields.spin("task.port", "taskPort", auto=True)  # 0 shows 'auto'
        self.port.setSpecialValueText("auto")
        fields.row(form, "Role", "task.role")
        form.addRow("Index", self.index)
        fields.row(form, "Port", "task.port")
        self.role.activated.connect(lambda _i: self._task(role=self.role.currentText()))
        self.port.valueChanged.connect(lambda v: self._task(port=int(v) or None))

    def _task(self, **changes: object) -> None:
        sel = self.document.selection
        if sel is None or sel[0] != "task":
            return
        task = self.document.config.cluster.hosts[sel[1]].tasks[sel[2]]
        if any(getattr(task, k) != v for k, v in changes.items()):
            self.document.update_task(sel[1], sel[2], **changes)

    def show_task(self, i: int, j: int) -> None:
        """Show task ``j`` of host ``i`` (the caller blocks the editors' signals)."""
        host = self.document.config.cluster.hosts[i]
        t = host.tasks[j]
        self.role.setCurrentText(t.role)
        self.index.setText(f"{t.index}  ({t.name} on {host.name})")
        self.port.setValue(t.port or 0)
