"""Properties of the selected host or task, edited in place (every change is an undoable edit).

A host is a machine (address, GPUs, SSH) or a Slurm group (partition, nodes, GPUs per node, CPUs and
memory per task, time limit, account, QoS, extra sbatch/srun options): its Kind picks the rows shown.
A field the config's checks find a problem with says so on its row: the label turns red with a ⚠ and
the editor's tooltip tells what is wrong; every problem of the selection is also listed below.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from PySide6.QtCore import QRegularExpression, Qt
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine.contract.config import ROLES, Slurm, field_spec
from gui import theme
from gui.document_model import DocumentModel, Selection, problem_target
from gui.window_layout import reveal, scroll_area_of

#: The kinds of host a user picks from: (shown text, config value).
KINDS = (("Machine", "machine"), ("Slurm group", "slurm"))
#: What Slurm accepts as a partition, account or QoS name (as the config reads it).
SLURM_NAME = r"[A-Za-z0-9_.,:+-]*"

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


def parse_options(text: str) -> tuple[str, ...]:
    """Extra sbatch/srun options typed as a shell would read them (``--constraint=a100 --exclusive``)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"expected options a shell can split, got {text!r} ({exc})") from None
    if words and not words[0].startswith("-"):
        raise ValueError(f"expected options starting with '-', e.g. --constraint=a100, got {words[0]!r}")
    return tuple(words)


class PropertiesPanel(QWidget):
    """Shows host fields (name, kind, then address/GPUs/SSH or the Slurm allocation) or task fields
    (role, port) for the selection."""

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.editors: dict[str, QWidget] = {}  # by field relative to the host ("slurm.nodes") or "task.<field>"
        self.labels: dict[str, QLabel] = {}
        self._tips: dict[str, str] = {}
        self._input_errors: dict[str, str] = {}  # typed text the config cannot hold (not committed)
        self.stack = QStackedWidget()
        self.empty = QLabel("Select a host or a task on the canvas to edit it.")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.stack.addWidget(self.empty)

        host_page = QWidget()
        self.host_form = form = QFormLayout(host_page)
        form.setVerticalSpacing(4)
        self.host_name = self._line("name", "hostName")
        self.host_kind = QComboBox()
        for text, kind in KINDS:
            self.host_kind.addItem(text, kind)
        self._register("kind", self.host_kind, "hostKind")
        self.host_address = self._line("address", "hostAddress")
        self.host_gpus = self._spin("gpus", "hostGpus")
        self.host_ssh_host = self._line("ssh_host", "hostSshHost", "(the address)")
        self.host_ssh_user = self._line("ssh_user", "hostSshUser", "(your ssh default)")
        self.host_ssh_port = self._spin("ssh_port", "hostSshPort")
        names = QRegularExpressionValidator(QRegularExpression(SLURM_NAME), self)
        self.slurm_partition = self._line("slurm.partition", "slurmPartition", "(the default one)", names)
        self.slurm_nodes = self._spin("slurm.nodes", "slurmNodes")
        self.slurm_gpus = self._spin("slurm.gpus_per_node", "slurmGpusPerNode")
        self.slurm_cpus = self._spin("slurm.cpus_per_task", "slurmCpusPerTask")
        self.slurm_mem = self._line("slurm.mem_per_task", "slurmMemPerTask", "e.g. 4G",
                                    QRegularExpressionValidator(QRegularExpression(r"\d*[KMGTkmgt]?"), self))
        self.slurm_time = self._line("slurm.time_limit", "slurmTimeLimit", "(partition's limit)")
        self.slurm_account = self._line("slurm.account", "slurmAccount", "(default)", names)
        self.slurm_qos = self._line("slurm.qos", "slurmQos", "(default)", names)
        self.slurm_sbatch = self._line("slurm.sbatch_options", "slurmSbatchOptions", "(none)")
        self.slurm_srun = self._line("slurm.srun_options", "slurmSrunOptions", "(none)")
        self.host_python = self._line("python", "hostPython")
        self._row(form, "Name", "name")
        self._row(form, "Kind", "kind")
        self.machine_rows = [self._row(form, "Address", "address"), self._row(form, "GPUs", "gpus"),
                             self._row(form, "SSH host", "ssh_host"), self._row(form, "SSH user", "ssh_user"),
                             self._row(form, "SSH port", "ssh_port")]
        self.slurm_rows = [self._row(form, text, key) for text, key in (
            ("Partition", "slurm.partition"), ("Nodes", "slurm.nodes"), ("GPUs per node", "slurm.gpus_per_node"),
            ("CPUs per task", "slurm.cpus_per_task"), ("Memory per task", "slurm.mem_per_task"),
            ("Time limit", "slurm.time_limit"), ("Account", "slurm.account"), ("QoS", "slurm.qos"),
            ("sbatch options", "slurm.sbatch_options"), ("srun options", "slurm.srun_options"))]
        self.kind_rows = {key: self.editors[key] for key in ("address", "gpus", "ssh_host", "ssh_user", "ssh_port",
                                                              *(k for k in self.editors if k.startswith("slurm.")))}
        self._row(form, "Python", "python")
        self.stack.addWidget(host_page)

        task_page = QWidget()
        form = QFormLayout(task_page)
        self._forms = (self.host_form, form)
        self.task_role = QComboBox()
        self.task_role.addItems(list(ROLES))
        self._register("task.role", self.task_role, "taskRole")
        self.task_index = QLabel()
        self.task_index.setToolTip(field_spec(spec_path("task.index")).help)
        self.task_port = self._spin("task.port", "taskPort", auto=True)  # 0 shows 'auto'
        self.task_port.setSpecialValueText("auto")
        self._row(form, "Role", "task.role")
        form.addRow("Index", self.task_index)
        self._row(form, "Port", "task.port")
        self.stack.addWidget(task_page)

        self._needed_width = self._widest_pages()
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

        for key in ("name", "address", "ssh_host", "ssh_user", "slurm.partition", "slurm.time_limit",
                    "slurm.account", "slurm.qos"):
            self._on_text(key)
        # an empty interpreter could never start a task: back to the default
        self._on_text("python", default="python3")
        self._on_text("slurm.mem_per_task", parse=str.upper)
        self._on_text("slurm.sbatch_options", parse=parse_options, show=shlex.join)
        self._on_text("slurm.srun_options", parse=parse_options, show=shlex.join)
        for key, spin in (("gpus", self.host_gpus), ("ssh_port", self.host_ssh_port), ("slurm.nodes", self.slurm_nodes),
                          ("slurm.gpus_per_node", self.slurm_gpus), ("slurm.cpus_per_task", self.slurm_cpus)):
            spin.valueChanged.connect(lambda v, key=key: self._set(key, int(v)))
        self.host_kind.activated.connect(lambda i: self._kind(str(self.host_kind.itemData(i))))
        self.task_role.activated.connect(lambda _i: self._task(role=self.task_role.currentText()))
        self.task_port.valueChanged.connect(lambda v: self._task(port=int(v) or None))
        document.selectionChanged.connect(self._selection_changed)
        document.clusterChanged.connect(self.refresh)
        document.problemsChanged.connect(self.refresh)
        self.refresh()

    # ------------------------------------------------------------------ building

    def _register(self, key: str, widget: QWidget, name: str) -> None:
        """Register the editor of ``key``; its tooltip is the field's declared help."""
        tip = field_spec(spec_path(key)).help
        widget.setObjectName(name)
        widget.setToolTip(tip)
        self.editors[key] = widget
        self._tips[key] = tip

    def _line(self, key: str, name: str, placeholder: str = "",
              validator: QRegularExpressionValidator | None = None) -> QLineEdit:
        edit = QLineEdit()
        if placeholder:
            edit.setPlaceholderText(placeholder)
        if validator is not None:
            edit.setValidator(validator)
        self._register(key, edit, name)
        return edit

    def _spin(self, key: str, name: str, auto: bool = False) -> QSpinBox:
        """An integer field's editor over its declared range (``auto``: one below it stands for 'auto')."""
        spec = field_spec(spec_path(key))
        assert spec.low is not None and spec.high is not None, f"{key}: an editor needs the field's bounds"
        spin = QSpinBox()
        spin.setRange(int(spec.low) - int(auto), int(spec.high))
        spin.setKeyboardTracking(False)
        self._register(key, spin, name)
        return spin

    def _label(self, text: str, key: str) -> QLabel:
        label = QLabel(text)
        label.setToolTip(self._tips[key])
        label.setProperty("text0", text)
        self.labels[key] = label
        return label

    def _row(self, form: QFormLayout, text: str, key: str) -> QWidget:
        """A form row for the field ``key``; returns its editor."""
        field = self.editors[key]
        form.addRow(self._label(text, key), field)
        return field

    def _widest_pages(self) -> int:
        """The width the pages need with every row marked with a problem (so marking one never cuts a row)."""
        for label in self.labels.values():
            label.setText(f"⚠ {label.property('text0')}")
        for form in self._forms:
            form.activate()
        width = max(form.minimumSize().width() for form in self._forms)
        for label in self.labels.values():
            label.setText(str(label.property("text0")))
        return width

    def _on_text(self, key: str, default: str = "", parse: Callable[[str], object] | None = None,
                 show: Callable[[tuple[str, ...]], str] | None = None) -> None:
        edit = self.editors[key]
        assert isinstance(edit, QLineEdit)
        edit.editingFinished.connect(lambda: self._text_edited(edit, key, default, parse, show))

    # ------------------------------------------------------------------ editing

    def focus_field(self, field: str) -> bool:
        """Focus the editor of a host's or task's field (``cluster.hosts[0].slurm.nodes``); False when there
        is none."""
        key = field_key(field)
        if ".tasks[" in field:
            key = "task." + {"name": "role", "index": "role"}.get(key, key)
        elif key == "slurm":  # the block itself (missing, or on a machine): the host's kind decides
            key = "kind"
        widget = self.editors.get(key)
        if widget is None or not widget.isVisibleTo(self):
            return False
        reveal(widget)
        widget.setFocus(Qt.FocusReason.OtherFocusReason)
        if isinstance(widget, (QLineEdit, QSpinBox)):
            widget.selectAll()
        return True

    def _selection_changed(self, *_args: object) -> None:
        self._input_errors.clear()  # text the last host could not take is not the next one's
        self.refresh()

    def _selected_host(self) -> int | None:
        sel = self.document.selection
        return sel[1] if sel is not None and sel[0] == "host" else None

    def _set(self, key: str, value: object) -> None:
        """One host field (``gpus``) or one field of its slurm block (``slurm.nodes``) set: one edit."""
        i = self._selected_host()
        if i is None:
            return
        host = self.document.config.cluster.hosts[i]
        if key.startswith("slurm."):
            name = key.split(".", 1)[1]
            if host.is_slurm and getattr(host.slurm or Slurm(), name) != value:
                self.document.update_slurm(i, **{name: value})
        elif getattr(host, key) != value:
            self.document.update_host(i, **{key: value})

    def _kind(self, kind: str) -> None:
        i = self._selected_host()
        if i is not None and self.document.config.cluster.hosts[i].kind != kind:
            self.document.set_host_kind(i, kind)

    def _text_edited(self, edit: QLineEdit, key: str, default: str = "",
                     parse: Callable[[str], object] | None = None,
                     show: Callable[[tuple[str, ...]], str] | None = None) -> None:
        """A field typed into: one edit. Leaving a field the user did not type in changes nothing, so
        focus leaving after an undo never brings the undone text back. Text the config cannot hold
        (options a shell cannot split) stays, marked on its row, and changes nothing."""
        if not edit.isModified():
            return
        text = edit.text().strip() or default
        value: object = text
        if parse is not None:
            try:
                value = parse(text)
            except ValueError as exc:
                self._input_errors[key] = str(exc)
                self._mark_problems()
                return
        self._input_errors.pop(key, None)
        shown = show(value) if show is not None and isinstance(value, tuple) else str(value)
        if shown != edit.text():
            edit.setText(shown)
        edit.setModified(False)
        self._set(key, value)
        self._mark_problems()

    def _task(self, **changes: object) -> None:
        sel = self.document.selection
        if sel is None or sel[0] != "task":
            return
        task = self.document.config.cluster.hosts[sel[1]].tasks[sel[2]]
        if any(getattr(task, k) != v for k, v in changes.items()):
            self.document.update_task(sel[1], sel[2], **changes)

    # ------------------------------------------------------------------ showing

    def refresh(self, *_args: object) -> None:
        sel: Selection = self.document.selection
        hosts = self.document.config.cluster.hosts
        widgets = list(self.editors.values())
        for w in widgets:
            w.blockSignals(True)
        try:
            if sel is None:
                self.stack.setCurrentIndex(0)
            elif sel[0] == "host":
                self._show_host(sel[1])
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

    def _show_host(self, i: int) -> None:
        h = self.document.config.cluster.hosts[i]
        s = h.slurm or Slurm()
        self.host_kind.setCurrentIndex(max(0, self.host_kind.findData(h.kind)))
        for spin, number in ((self.host_gpus, h.gpus), (self.host_ssh_port, h.ssh_port), (self.slurm_nodes, s.nodes),
                             (self.slurm_gpus, s.gpus_per_node), (self.slurm_cpus, s.cpus_per_task)):
            spin.setValue(number)
        texts = {"name": h.name, "address": h.address, "ssh_host": h.ssh_host, "ssh_user": h.ssh_user,
                 "python": h.python, "slurm.partition": s.partition, "slurm.mem_per_task": s.mem_per_task,
                 "slurm.time_limit": s.time_limit, "slurm.account": s.account, "slurm.qos": s.qos,
                 "slurm.sbatch_options": shlex.join(s.sbatch_options),
                 "slurm.srun_options": shlex.join(s.srun_options)}
        for key, value in texts.items():
            edit = self.editors[key]
            assert isinstance(edit, QLineEdit)
            # text being typed (focused and changed since the last edit) is left alone, as is text the
            # config could not take (marked on its row until it is fixed or the host changes)
            typing = edit.isModified() and (edit.hasFocus() or key in self._input_errors)
            if not typing or edit.text().strip() == value:
                edit.setText(value)
                edit.setModified(False)
                self._input_errors.pop(key, None)
        for key, row in self.kind_rows.items():  # each field's declared 'applies' (its host's kind)
            shown = field_spec(spec_path(key)).applies_to(h)
            self.host_form.setRowVisible(row, shown or (row is self.host_gpus and h.gpus != 0))

    def _mark_problems(self) -> None:
        """Each problem of the selection on its field's row (red label, the message in the tooltip) and all of
        them listed below the fields."""
        sel = self.document.selection
        mine = [p for p in self.document.problems if sel is not None and problem_target(p) == sel]
        found: dict[str, list[str]] = {}
        for p in mine:
            key = field_key(p.field)
            if sel is not None and sel[0] == "task":
                key = "task." + {"name": "role", "index": "role"}.get(key, key)
            elif key == "slurm":
                key = "kind"
            found.setdefault(key, []).append(p.message)
        if sel is not None and sel[0] == "host":
            for key, message in self._input_errors.items():
                found.setdefault(key, []).append(message)
        for key, label in self.labels.items():
            messages = found.get(key, [])
            base = str(label.property("text0"))
            label.setText(f"⚠ {base}" if messages else base)
            label.setStyleSheet(f"color: {theme.PROBLEM_COLOR};" if messages else "")
            tip = self._tips[key] + "".join(f"\n⚠ {m}" for m in messages)
            label.setToolTip(tip)
            self.editors[key].setToolTip(tip)
        lines = [f"⚠ {p.message}" for p in mine]
        if sel is not None and sel[0] == "host":
            lines += [f"⚠ {key.split('.')[-1]}: {m}" for key, m in self._input_errors.items()]
        self.problems.setText("\n".join(lines))
        self.problems.setVisible(bool(lines))
