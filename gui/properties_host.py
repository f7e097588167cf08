"""The properties page of a selected host: a machine (address, GPUs, SSH) or a Slurm group (partition, nodes, GPUs
per node, CPUs and memory per task, time limit, account, QoS, extra sbatch/srun options); its Kind picks the rows
shown, each row where its field's declaration says it applies.

Every change is one undoable edit of the document. Text the config cannot hold (options a shell cannot split) stays
as typed, changes nothing and is kept in :attr:`HostEditor.input_errors` for the panel to mark.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from PySide6.QtCore import QRegularExpression, Signal
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import QComboBox, QFormLayout, QLineEdit, QWidget

from engine.contract.config import Slurm, field_spec
from gui.document_model import DocumentModel
from gui.properties_fields import FieldRows, spec_path

#: The kinds of host a user picks from: (shown text, config value).
KINDS = (("Machine", "machine"), ("Slurm group", "slurm"))
#: What Slurm accepts as a partition, account or QoS name (as the config reads it).
SLURM_NAME = r"[A-Za-z0-9_.,:+-]*"


def parse_options(text: str) -> tuple[str, ...]:
    """Extra sbatch/srun options typed as a shell would read them (``--constraint=a100 --exclusive``)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"expected options a shell can split, got {text!r} ({exc})") from None
    if words and not words[0].startswith("-"):
        raise ValueError(f"expected options starting with '-', e.g. --constraint=a100, got {words[0]!r}")
    return tuple(words)


class HostEditor(QWidget):
    """A host's fields: name, kind, then address/GPUs/SSH or the Slurm allocation, and its Python."""

    inputChanged = Signal()  # ``input_errors`` changed: the rows' marks are due again

    def __init__(self, document: DocumentModel, fields: FieldRows, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        self.fields = fields
        self.input_errors: dict[str, str] = {}  # typed text the config cannot hold (not committed)
        self.form = form = QFormLayout(self)
        form.setVerticalSpacing(4)
        self.name = fields.line("name", "hostName")
        self.kind = QComboBox()
        for text, kind in KINDS:
            self.kind.addItem(text, kind)
        fields.register("kind", self.kind, "hostKind")
        self.address = fields.line("address", "hostAddress")
        self.gpus = fields.spin("gpus", "hostGpus")
        self.ssh_host = fields.line("ssh_host", "hostSshHost", "(the address)")
        self.ssh_user = fields.line("ssh_user", "hostSshUser", "(your ssh default)")
        self.ssh_port = fields.spin("ssh_port", "hostSshPort")
        names = QRegularExpressionValidator(QRegularExpression(SLURM_NAME), self)
        self.slurm_partition = fields.line("slurm.partition", "slurmPartition", "(the default one)", names)
        self.slurm_nodes = fields.spin("slurm.nodes", "slurmNodes")
        self.slurm_gpus = fields.spin("slurm.gpus_per_node", "slurmGpusPerNode")
        self.slurm_cpus = fields.spin("slurm.cpus_per_task", "slurmCpusPerTask")
        self.slurm_mem = fields.line("slurm.mem_per_task", "slurmMemPerTask", "e.g. 4G",
                                     QRegularExpressionValidator(QRegularExpression(r"\d*[KMGTkmgt]?"), self))
        self.slurm_time = fields.line("slurm.time_limit", "slurmTimeLimit", "(partition's limit)")
        self.slurm_account = fields.line("slurm.account", "slurmAccount", "(default)", names)
        self.slurm_qos = fields.line("slurm.qos", "slurmQos", "(default)", names)
        self.slurm_sbatch = fields.line("slurm.sbatch_options", "slurmSbatchOptions", "(none)")
        self.slurm_srun = fields.line("slurm.srun_options", "slurmSrunOptions", "(none)")
        self.python = fields.line("python", "hostPython")
        fields.row(form, "Name", "name")
        fields.row(form, "Kind", "kind")
        self.machine_rows = [fields.row(form, "Address", "address"), fields.row(form, "GPUs", "gpus"),
                             fields.row(form, "SSH host", "ssh_host"), fields.row(form, "SSH user", "ssh_user"),
                             fields.row(form, "SSH port", "ssh_port")]
        self.slurm_rows = [fields.row(form, text, key) for text, key in (
            ("Partition", "slurm.partition"), ("Nodes", "slurm.nodes"), ("GPUs per node", "slurm.gpus_per_node"),
            ("CPUs per task", "slurm.cpus_per_task"), ("Memory per task", "slurm.mem_per_task"),
            ("Time limit", "slurm.time_limit"), ("Account", "slurm.account"), ("QoS", "slurm.qos"),
            ("sbatch options", "slurm.sbatch_options"), ("srun options", "slurm.srun_options"))]
        editors = fields.editors
        self.kind_rows = {key: editors[key] for key in ("address", "gpus", "ssh_host", "ssh_user", "ssh_port",
                                                        *(k for k in editors if k.startswith("slurm.")))}
        fields.row(form, "Python", "python")

        for key in ("name", "address", "ssh_host", "ssh_user", "slurm.partition", "slurm.time_limit",
                    "slurm.account", "slurm.qos"):
            self._on_text(key)
        # an empty interpreter could never start a task: back to the default
        self._on_text("python", default="python3")
        self._on_text("slurm.mem_per_task", parse=str.upper)
        self._on_text("slurm.sbatch_options", parse=parse_options, show=shlex.join)
        self._on_text("slurm.srun_options", parse=parse_options, show=shlex.join)
        for key, spin in (("gpus", self.gpus), ("ssh_port", self.ssh_port), ("slurm.nodes", self.slurm_nodes),
                          ("slurm.gpus_per_node", self.slurm_gpus), ("slurm.cpus_per_task", self.slurm_cpus)):
            spin.valueChanged.connect(lambda v, key=key: self._set(key, int(v)))
        self.kind.activated.connect(lambda i: self._kind(str(self.kind.itemData(i))))

    def _on_text(self, key: str, default: str = "", parse: Callable[[str], object] | None = None,
                 show: Callable[[tuple[str, ...]], str] | None = None) -> None:
        edit = self.fields.editors[key]
        assert isinstance(edit, QLineEdit)
        edit.editingFinished.connect(lambda: self._text_edited(edit, key, default, parse, show))

    # ------------------------------------------------------------------ editing

    def _selected(self) -> int | None:
        sel = self.document.selection
        return sel[1] if sel is not None and sel[0] == "host" else None

    def _set(self, key: str, value: object) -> None:
        """One host field (``gpus``) or one field of its slurm block (``slurm.nodes``) set: one edit."""
        i = self._selected()
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
        i = self._selected()
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
                self.input_errors[key] = str(exc)
                self.inputChanged.emit()
                return
        self.input_errors.pop(key, None)
        shown = show(value) if show is not None and isinstance(value, tuple) else str(value)
        if shown != edit.text():
            edit.setText(shown)
        edit.setModified(False)
        self._set(key, value)
        self.inputChanged.emit()

    # ------------------------------------------------------------------ showing

    def show_host(self, i: int) -> None:
        """Show host ``i``'s fields, and the rows of its kind (the caller blocks the editors' signals)."""
        h = self.document.config.cluster.hosts[i]
        s = h.slurm or Slurm()
        self.kind.setCurrentIndex(max(0, self.kind.findData(h.kind)))
        for spin, number in ((self.gpus, h.gpus), (self.ssh_port, h.ssh_port), (self.slurm_nodes, s.nodes),
                             (self.slurm_gpus, s.gpus_per_node), (self.slurm_cpus, s.cpus_per_task)):
            spin.setValue(number)
        texts = {"name": h.name, "address": h.address, "ssh_host": h.ssh_host, "ssh_user": h.ssh_user,
                 "python": h.python, "slurm.partition": s.partition, "slurm.mem_per_task": s.mem_per_task,
                 "slurm.time_limit": s.time_limit, "slurm.account": s.account, "slurm.qos": s.qos,
                 "slurm.sbatch_options": shlex.join(s.sbatch_options),
                 "slurm.srun_options": shlex.join(s.srun_options)}
        for key, value in texts.items():
            edit = self.fields.editors[key]
            assert isinstance(edit, QLineEdit)
            # text being typed (focused and changed since the last edit) is left alone, as is text the
            # config could not take (marked on its row until it is fixed or the host changes)
            typing = edit.isModified() and (edit.hasFocus() or key in self.input_errors)
            if not typing or edit.text().strip() == value:
                edit.setText(value)
                edit.setModified(False)
                self.input_errors.pop(key, None)
        for key, row in self.kind_rows.items():  # each field's declared 'applies' (its host's kind)
            shown = field_spec(spec_path(key)).applies_to(h)
            self.form.setRowVisible(row, shown or (row is self.gpus and h.gpus != 0))
