"""Properties of the selected host or task, edited in place (every change is an undoable edit).

A host is a machine (address, GPUs, SSH) or a Slurm group (partition, nodes, GPUs per node, CPUs and
memory per task, time limit, account, QoS, extra sbatch/srun options): its Kind picks the rows shown
(:class:`~gui.properties_host.HostEditor`); a task has its role and port (:class:`~gui.properties_task.TaskEditor`).
A field the config's checks find a problem with says so on its row: the label turns red with a ⚠ and
the editor's tooltip tells what is wrong; every problem of the selection is also listed below.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QLineEdit, QScrollArea, QSpinBox, QStackedWidget, QVBoxLayout, QWidget

from gui import theme
from gui.document_model import DocumentModel, problem_target
from gui.properties_fields import FieldRows, editor_key, field_key, spec_path
from gui.properties_host import HostEditor, parse_options
from gui.properties_task import TaskEditor
from gui.window_layout import reveal, scroll_area_of

# field_key, spec_path and parse_options are read from here by tests and other modules
__all__ = ["PropertiesPanel", "field_key", "parse_options", "spec_path"]


class PropertiesPanel(QWidget):
    """Shows host fields (name, kind, then address/GPUs/SSH or the Slurm allocation) or task fields
    (role, port) for the selection, a page each, with the selection's problems."""

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.fields = FieldRows()  # both pages' editors and labels, one set of keys
        self.editors = self.fields.editors  # by field relative to the host ("slurm.nodes") or "task.<field>"
        self.labels = self.fields.labels
        self._tips = self.fields.tips
        self.stack = QStackedWidget()
        self.empty = QLabel("Select a host or a task on the canvas to edit it.")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.stack.addWidget(self.empty)
        self.host = HostEditor(document, self.fields)
        self.stack.addWidget(self.host)
        self.task = TaskEditor(document, self.fields)
        self.stack.addWidget(self.task)

        # each editor by name too (the pages own them)
        h = self.host
        self.host_name, self.host_kind, self.host_address, self.host_gpus = h.name, h.kind, h.address, h.gpus
        self.host_ssh_host, self.host_ssh_user, self.host_ssh_port = h.ssh_host, h.ssh_user, h.ssh_port
        self.host_python = h.python
        self.slurm_partition, self.slurm_nodes, self.slurm_gpus = h.slurm_partition, h.slurm_nodes, h.slurm_gpus
        self.slurm_cpus, self.slurm_mem, self.slurm_time = h.slurm_cpus, h.slurm_mem, h.slurm_time
        self.slurm_account, self.slurm_qos = h.slurm_account, h.slurm_qos
        self.slurm_sbatch, self.slurm_srun = h.slurm_sbatch, h.slurm_srun
        self.task_role, self.task_index, self.task_port = self.task.role, self.task.index, self.task.port

        self._needed_width = self.fields.widest((self.host.form, self.task.form))
        self.problems = QLabel()
        self.problems.setObjectName("selectionProblems")
        self.problems.setWordWrap(True)
        self.problems.setStyleSheet(f"color: {theme.PROBLEM_COLOR};")
        self.problems.hide()
        # no scroll area of its own: on a short screen the settings column scrolls as a whole (window_layout)
        self.stack.setMinimumWidth(self._needed_width)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.stack)
        layout.addWidget(self.problems)

        self.host.inputChanged.connect(self._mark_problems)
        document.selectionChanged.connect(self._selection_changed)
        document.clusterChanged.connect(self.refresh)
        document.problemsChanged.connect(self.refresh)
        self.refresh()

    def focus_field(self, field: str) -> bool:
        """Focus the editor of a host's or task's field (``cluster.hosts[0].slurm.nodes``); False when there
        is none."""
        widget = self.editors.get(editor_key(field, task=".tasks[" in field))
        if widget is None or not widget.isVisibleTo(self):
            return False
        reveal(widget)
        widget.setFocus(Qt.FocusReason.OtherFocusReason)
        if isinstance(widget, (QLineEdit, QSpinBox)):
            widget.selectAll()
        return True

    def _selection_changed(self, *_args: object) -> None:
        self.host.input_errors.clear()  # text the last host could not take is not the next one's
        self.refresh()

    # ------------------------------------------------------------------ showing

    def refresh(self, *_args: object) -> None:
        sel = self.document.selection
        widgets = list(self.editors.values())
        for w in widgets:
            w.blockSignals(True)
        try:
            if sel is None:
                self.stack.setCurrentWidget(self.empty)
            elif sel[0] == "host":
                self.host.show_host(sel[1])
                self.stack.setCurrentWidget(self.host)
            else:
                self.task.show_task(sel[1], sel[2])
                self.stack.setCurrentWidget(self.task)
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._mark_problems()
        self._fit_page()

    @property
    def fields_scroll(self) -> QScrollArea | None:
        """The scroll area the fields scroll in: the settings column's (None outside one)."""
        return scroll_area_of(self)

    def _fit_page(self) -> None:
        """As tall as the page shown (and its rows shown), not as the tallest page."""
        page = self.stack.currentWidget()
        if page is None:
            return
        layout = page.layout()
        if layout is not None:
            layout.activate()
        self.stack.setFixedHeight(page.sizeHint().height())

    def _mark_problems(self) -> None:
        """Each problem of the selection on its field's row (red label, the message in the tooltip) and all of
        them listed below the fields."""
        sel = self.document.selection
        mine = [p for p in self.document.problems if sel is not None and problem_target(p) == sel]
        on_host, on_task = sel is not None and sel[0] == "host", sel is not None and sel[0] == "task"
        found: dict[str, list[str]] = {}
        for p in mine:
            found.setdefault(editor_key(p.field, task=on_task), []).append(p.message)
        if on_host:
            for key, message in self.host.input_errors.items():
                found.setdefault(key, []).append(message)
        self.fields.mark(found)
        lines = [f"⚠ {p.message}" for p in mine]
        if on_host:
            lines += [f"⚠ {key.split('.')[-1]}: {m}" for key, m in self.host.input_errors.items()]
        self.problems.setText("\n".join(lines))
        self.problems.setVisible(bool(lines))
