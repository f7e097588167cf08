"""Properties of the selected host or task, edited in place (every change is an undoable edit)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine.contract.config import ROLES
from gui import theme
from gui.document_model import DocumentModel, Selection, problem_target


class PropertiesPanel(QWidget):
    """Shows host fields (name, address, GPUs, SSH) or task fields (role, port) for the selection."""

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.stack = QStackedWidget()
        self.empty = QLabel("Select a host or a task on the canvas to edit it.")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.stack.addWidget(self.empty)

        host_page = QWidget()
        form = QFormLayout(host_page)
        self.host_name = QLineEdit()
        self.host_name.setObjectName("hostName")
        self.host_name.setToolTip("A unique name for this host")
        self.host_address = QLineEdit()
        self.host_address.setObjectName("hostAddress")
        self.host_address.setToolTip("Host name or IP address the tasks are reached at (localhost runs here)")
        self.host_gpus = QSpinBox()
        self.host_gpus.setObjectName("hostGpus")
        self.host_gpus.setRange(0, 64)
        self.host_gpus.setKeyboardTracking(False)
        self.host_gpus.setToolTip("GPUs of this host, split evenly over its chief/worker tasks "
                                  "(emulated as CPU devices where there is no GPU)")
        self.host_ssh_host = QLineEdit()
        self.host_ssh_host.setObjectName("hostSshHost")
        self.host_ssh_host.setPlaceholderText("(the address)")
        self.host_ssh_host.setToolTip("The name ssh dials for this host (an alias of ~/.ssh/config works); "
                                      "empty: the address. Set it to run a host over SSH.")
        self.host_ssh_user = QLineEdit()
        self.host_ssh_user.setObjectName("hostSshUser")
        self.host_ssh_user.setPlaceholderText("(your ssh default)")
        self.host_ssh_user.setToolTip("The user to log in as over SSH; empty: ssh's default")
        self.host_ssh_port = QSpinBox()
        self.host_ssh_port.setObjectName("hostSshPort")
        self.host_ssh_port.setRange(1, 65535)
        self.host_ssh_port.setKeyboardTracking(False)
        self.host_ssh_port.setToolTip("The SSH port of this host (22 unless its sshd listens elsewhere)")
        self.host_python = QLineEdit()
        self.host_python.setObjectName("hostPython")
        self.host_python.setToolTip("The Python on this host that has ClusterDeck and TensorFlow installed "
                                    "(remote hosts; local tasks use the app's own Python)")
        form.addRow("Name", self.host_name)
        form.addRow("Address", self.host_address)
        form.addRow("GPUs", self.host_gpus)
        form.addRow("SSH host", self.host_ssh_host)
        form.addRow("SSH user", self.host_ssh_user)
        form.addRow("SSH port", self.host_ssh_port)
        form.addRow("Python", self.host_python)
        self.stack.addWidget(host_page)

        task_page = QWidget()
        form = QFormLayout(task_page)
        self.task_role = QComboBox()
        self.task_role.setObjectName("taskRole")
        self.task_role.addItems(list(ROLES))
        self.task_role.setToolTip("chief coordinates (async) or trains; workers train; ps hold variables (async); "
                                  "the evaluator evaluates checkpoints")
        self.task_index = QLabel()
        self.task_index.setToolTip("Task indices are numbered 0..n-1 per role, in canvas order")
        self.task_port = QSpinBox()
        self.task_port.setObjectName("taskPort")
        self.task_port.setRange(0, 65535)
        self.task_port.setSpecialValueText("auto")
        self.task_port.setKeyboardTracking(False)
        self.task_port.setToolTip("The task's gRPC port; 'auto' picks a free one at launch")
        form.addRow("Role", self.task_role)
        form.addRow("Index", self.task_index)
        form.addRow("Port", self.task_port)
        self.stack.addWidget(task_page)

        self.problems = QLabel()
        self.problems.setObjectName("selectionProblems")
        self.problems.setWordWrap(True)
        self.problems.setStyleSheet(f"color: {theme.PROBLEM_COLOR};")
        self.problems.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.stack)
        layout.addWidget(self.problems)

        self.host_name.editingFinished.connect(lambda: self._text_edited(self.host_name, "name"))
        self.host_address.editingFinished.connect(lambda: self._text_edited(self.host_address, "address"))
        self.host_gpus.valueChanged.connect(lambda v: self._host(gpus=int(v)))
        self.host_ssh_host.editingFinished.connect(lambda: self._text_edited(self.host_ssh_host, "ssh_host"))
        self.host_ssh_user.editingFinished.connect(lambda: self._text_edited(self.host_ssh_user, "ssh_user"))
        self.host_ssh_port.valueChanged.connect(lambda v: self._host(ssh_port=int(v)))
        # an empty interpreter could never start a task: back to the default
        self.host_python.editingFinished.connect(lambda: self._text_edited(self.host_python, "python", "python3"))
        self.task_role.activated.connect(lambda _i: self._task(role=self.task_role.currentText()))
        self.task_port.valueChanged.connect(lambda v: self._task(port=int(v) or None))
        document.selectionChanged.connect(self.refresh)
        document.clusterChanged.connect(self.refresh)
        document.problemsChanged.connect(self.refresh)
        self.refresh()

    def focus_field(self, field: str) -> bool:
        """Focus the editor of a host's or task's field (``cluster.hosts[0].gpus``); False when there is none."""
        name = field.rsplit(".", 1)[-1] if "." in field else ""
        editors: dict[str, QWidget] = {
            "name": self.host_name, "address": self.host_address, "gpus": self.host_gpus,
            "ssh_host": self.host_ssh_host, "ssh_user": self.host_ssh_user, "ssh_port": self.host_ssh_port,
            "python": self.host_python, "role": self.task_role, "port": self.task_port, "index": self.task_role,
        }
        if ".tasks[" in field and name == "name":
            name = "role"
        widget = editors.get(name)
        if widget is None or not widget.isVisibleTo(self):
            return False
        widget.setFocus(Qt.FocusReason.OtherFocusReason)
        if isinstance(widget, (QLineEdit, QSpinBox)):
            widget.selectAll()
        return True

    def _host(self, **changes: object) -> None:
        sel = self.document.selection
        if sel is None or sel[0] != "host":
            return
        host = self.document.config.cluster.hosts[sel[1]]
        if any(getattr(host, k) != v for k, v in changes.items()):
            self.document.update_host(sel[1], **changes)

    def _text_edited(self, edit: QLineEdit, field: str, default: str = "") -> None:
        """A host field typed into: one edit. Leaving a field the user did not type in changes nothing, so
        focus leaving after an undo never brings the undone text back."""
        if not edit.isModified():
            return
        text = edit.text().strip() or default
        if text != edit.text():
            edit.setText(text)
        edit.setModified(False)
        self._host(**{field: text})

    def _task(self, **changes: object) -> None:
        sel = self.document.selection
        if sel is None or sel[0] != "task":
            return
        task = self.document.config.cluster.hosts[sel[1]].tasks[sel[2]]
        if any(getattr(task, k) != v for k, v in changes.items()):
            self.document.update_task(sel[1], sel[2], **changes)

    def refresh(self, *_args: object) -> None:
        sel: Selection = self.document.selection
        hosts = self.document.config.cluster.hosts
        widgets = (self.host_name, self.host_address, self.host_gpus, self.host_ssh_host, self.host_ssh_user,
                   self.host_ssh_port, self.host_python, self.task_role, self.task_port)
        for w in widgets:
            w.blockSignals(True)
        try:
            if sel is None:
                self.stack.setCurrentIndex(0)
            elif sel[0] == "host":
                h = hosts[sel[1]]
                self.host_gpus.setValue(h.gpus)
                for edit, value in ((self.host_name, h.name), (self.host_address, h.address),
                                    (self.host_ssh_host, h.ssh_host), (self.host_ssh_user, h.ssh_user),
                                    (self.host_python, h.python)):
                    # text being typed (focused and changed since the last edit) is left alone
                    if not (edit.hasFocus() and edit.isModified()) or edit.text().strip() == value:
                        edit.setText(value)
                self.host_ssh_port.setValue(h.ssh_port)
                self.stack.setCurrentIndex(1)
            else:
                t = hosts[sel[1]].tasks[sel[2]]
                self.task_role.setCurrentText(t.role)
                self.task_index.setText(f"{t.index}  ({t.name} on {hosts[sel[1]].name})")
                self.task_port.setValue(t.port or 0)
                self.stack.setCurrentIndex(2)
        finally:
            for w in widgets:
                w.blockSignals(False)
        page = self.stack.currentWidget()
        if page is not None:  # as tall as the page shown, not as the tallest page
            self.stack.setFixedHeight(page.sizeHint().height())
        mine = [p for p in self.document.problems if sel is not None and problem_target(p) == sel]
        self.problems.setText("\n".join(f"⚠ {p.message}" for p in mine))
        self.problems.setVisible(bool(mine))
