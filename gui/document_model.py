"""The edited document as a Qt model: the config and its canvas layout, undo, selection, file and problems.

Views take this model, connect to its fine-grained signals and change it only through its
methods (every edit an undoable snapshot). It never shows a dialog: methods raise
(:class:`~engine.contract.config.ConfigError` for anything a user can fix).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack

from engine.contract import config as config_mod
from engine.contract import presets
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.control.launcher import launch_problems
from gui import document as doc_ops
from gui.document import Document

#: Selection on the canvas: None, ("host", i) or ("task", i, j).
Selection = tuple[Any, ...] | None

_HOST_FIELD = re.compile(r"^cluster\.hosts\[(\d+)\](?:\.tasks\[(\d+)\])?")


def problem_target(problem: Problem) -> Selection:
    """The host or task a problem is about (None when it is about something else)."""
    m = _HOST_FIELD.match(problem.field)
    if not m:
        return None
    if m.group(2) is not None:
        return ("task", int(m.group(1)), int(m.group(2)))
    return ("host", int(m.group(1)))


class DocumentCommand(QUndoCommand):
    """One undoable edit: the document before and after. Edits of the same field merge."""

    _ids: dict[str, int] = {}

    def __init__(self, model: DocumentModel, before: Document, after: Document, text: str,
                 merge_key: str = "") -> None:
        super().__init__(text)
        self.model = model
        self.before = before
        self.after = after
        self.merge_key = merge_key

    def id(self) -> int:
        if not self.merge_key:
            return -1
        return DocumentCommand._ids.setdefault(self.merge_key, len(DocumentCommand._ids) + 1)

    def mergeWith(self, other: QUndoCommand) -> bool:
        if not isinstance(other, DocumentCommand) or other.merge_key != self.merge_key or other.before != self.after:
            return False
        self.after = other.after
        return True

    def redo(self) -> None:
        self.model.restore(self.after)

    def undo(self) -> None:
        self.model.restore(self.before)


class DocumentModel(QObject):
    """Owns the current :class:`Document`, its undo stack, file, selection and launch problems."""

    changed = Signal()  # anything of the document changed (config or layout)
    clusterChanged = Signal()  # hosts, tasks or their layout
    settingsChanged = Signal()  # any field outside the cluster (name, parallelism, data, model, training)
    problemsChanged = Signal(list)  # list[Problem]
    selectionChanged = Signal(object)  # Selection
    pathChanged = Signal(object)  # Path | None
    replaced = Signal()  # a new document (new, opened preset or run): the old one is gone
    message = Signal(str)

    def __init__(self, config: RunConfig | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.undo_stack = QUndoStack(self)
        self._doc = Document.of(config if config is not None else config_mod.default_config())
        self._problems: list[Problem] = launch_problems(self._doc.config)
        self._selection: Selection = None
        self._path: Path | None = None

    # ------------------------------------------------------------------ reading

    @property
    def config(self) -> RunConfig:
        return self._doc.config

    @property
    def document(self) -> Document:
        return self._doc

    @property
    def problems(self) -> list[Problem]:
        return list(self._problems)

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def read_only(self) -> bool:
        """The file is a bundled preset: saving goes to a new file."""
        return self._path is not None and presets.is_bundled(self._path)

    @property
    def is_modified(self) -> bool:
        return not self.undo_stack.isClean()

    @property
    def selection(self) -> Selection:
        return self._selection

    # ------------------------------------------------------------------ snapshots

    def restore(self, doc: Document) -> None:
        """Make ``doc`` current (undo commands call this); signals say what changed."""
        old = self._doc
        self._doc = doc
        self._fix_selection()
        cluster = old.config.cluster != doc.config.cluster or old.layout != doc.layout
        settings = config_mod.replace(old.config, cluster=doc.config.cluster) != doc.config
        if cluster:
            self.clusterChanged.emit()
        if settings:
            self.settingsChanged.emit()
        self.changed.emit()
        problems = launch_problems(doc.config)
        if problems != self._problems:
            self._problems = problems
            self.problemsChanged.emit(self.problems)

    def _fix_selection(self) -> None:
        sel = self._selection
        hosts = self._doc.config.cluster.hosts
        ok = sel is None or (sel[1] < len(hosts) and (sel[0] == "host" or sel[2] < len(hosts[sel[1]].tasks)))
        if not ok:
            self._selection = None
            self.selectionChanged.emit(None)

    def edit(self, after: Document, text: str, merge_key: str = "") -> None:
        """Push an edit onto the undo stack (nothing when it changes nothing)."""
        if after == self._doc:
            return
        self.undo_stack.push(DocumentCommand(self, self._doc, after, text, merge_key))

    # ------------------------------------------------------------------ settings

    def set_config(self, config: RunConfig, text: str = "Edit config", merge_key: str = "") -> None:
        self.edit(Document(config, self._doc.layout).with_cluster(config.cluster), text, merge_key)

    def set_value(self, path: str, value: Any) -> None:
        """Set one field by its attribute path (``training.steps``, ``parallelism.mesh_batch``, ``name``) or
        its declared YAML path (``parallelism.mesh.batch``, ``parallelism.partitioner.kind``)."""
        if path in config_mod.FIELDS and "[]" not in path:
            path = config_mod.attribute_path(path)
        parts = path.split(".")
        config = self._doc.config
        if len(parts) == 1:
            new = config_mod.replace(config, **{parts[0]: value})
        elif len(parts) == 2:
            section = getattr(config, parts[0])
            new = config_mod.replace(config, **{parts[0]: config_mod.replace(section, **{parts[1]: value})})
        else:
            raise ValueError(f"path: expected 'section.field' or 'field', got {path!r}")
        self.set_config(new, f"Set {path}", merge_key=path)

    def set_mode(self, mode: str, fix_cluster: bool = False) -> list[str]:
        """Switch parallelism (with ``fix_cluster``, change the cluster to what the mode needs).

        Returns what the fix changed, in words."""
        config = self._doc.config
        parallelism = config_mod.replace(config.parallelism, mode=mode)
        new = config_mod.replace(config, parallelism=parallelism)
        changes: list[str] = []
        if fix_cluster:
            new, changes = doc_ops.mode_fix(config, mode)
        training = new.training.for_mode(mode)  # settings another mode does not take go back to their default
        if training is not new.training:
            new = config_mod.replace(new, training=training)
        self.set_config(new, f"Parallelism: {mode}" + (" (cluster fixed)" if fix_cluster else ""))
        return changes

    # ------------------------------------------------------------------ cluster

    def add_host(self, position: tuple[float, float] | None = None, kind: str = "machine") -> int:
        """Add a machine (or, ``kind='slurm'``, a Slurm group) and select it; returns its index."""
        text = "Add Slurm group" if kind == "slurm" else "Add host"
        self.edit(doc_ops.add_host(self._doc, position, kind=kind), text)
        i = len(self.config.cluster.hosts) - 1
        self.select(("host", i))
        return i

    def remove_host(self, i: int) -> None:
        self.select(None)
        self.edit(doc_ops.remove_host(self._doc, i), f"Delete host {self.config.cluster.hosts[i].name}")

    def update_host(self, i: int, **changes: Any) -> None:
        key = f"host[{i}]." + ",".join(sorted(changes))
        self.edit(doc_ops.update_host(self._doc, i, **changes), f"Edit host {self.config.cluster.hosts[i].name}", key)

    def set_host_kind(self, i: int, kind: str) -> None:
        """Make host ``i`` a machine or a Slurm group (one undoable edit)."""
        name = self.config.cluster.hosts[i].name
        text = f"Make {name} a Slurm group" if kind == "slurm" else f"Make {name} a machine"
        self.edit(doc_ops.set_host_kind(self._doc, i, kind), text)

    def update_slurm(self, i: int, **changes: Any) -> None:
        """Edit the slurm block of Slurm group ``i`` (``nodes=2``); edits of one field in a row merge."""
        key = f"host[{i}].slurm." + ",".join(sorted(changes))
        name = self.config.cluster.hosts[i].name
        self.edit(doc_ops.update_slurm(self._doc, i, **changes), f"Edit Slurm group {name}", key)

    def move_host(self, i: int, position: tuple[float, float]) -> None:
        self.edit(doc_ops.move_host(self._doc, i, position), f"Move host {self.config.cluster.hosts[i].name}")

    def add_task(self, i: int, role: str = "worker") -> tuple[int, int]:
        self.edit(doc_ops.add_task(self._doc, i, role), f"Add {role} task")
        j = len(self.config.cluster.hosts[i].tasks) - 1
        self.select(("task", i, j))
        return i, j

    def remove_task(self, i: int, j: int) -> None:
        self.select(None)
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.remove_task(self._doc, i, j), f"Delete task {name}")

    def update_task(self, i: int, j: int, **changes: Any) -> None:
        key = f"task[{i},{j}]." + ",".join(sorted(changes))
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.update_task(self._doc, i, j, **changes), f"Edit task {name}", key)

    def move_task(self, i: int, j: int, k: int) -> None:
        if i == k:
            return
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.move_task(self._doc, i, j, k), f"Move {name} to {self.config.cluster.hosts[k].name}")
        self.select(("task", k, len(self.config.cluster.hosts[k].tasks) - 1))

    def delete_selection(self) -> None:
        sel = self._selection
        if sel is None:
            return
        if sel[0] == "host":
            self.remove_host(sel[1])
        else:
            self.remove_task(sel[1], sel[2])

    def select(self, selection: Selection) -> None:
        if selection != self._selection:
            self._selection = selection
            self.selectionChanged.emit(selection)

    # ------------------------------------------------------------------ files

    def new(self, config: RunConfig | None = None) -> None:
        self.replace(config if config is not None else config_mod.default_config(), None)

    def open(self, path: str | Path) -> RunConfig:
        """Load a YAML preset (raises :class:`ConfigError` naming the field)."""
        path = Path(path)
        config = config_mod.load(path, check=False)
        self.replace(config, path)
        return config

    def save(self, path: str | Path | None = None) -> Path:
        """Save to ``path`` (or the current file); the undo stack becomes clean.

        A bundled preset is never written: saving it without a new path raises ConfigError."""
        target = Path(path) if path is not None else self._path
        if target is None:
            raise ValueError("path: expected a file name for a document never saved, got None")
        if presets.is_bundled(target):
            raise ConfigError([Problem("", "is a preset shipped with ClusterDeck and is never overwritten; "
                                           "expected a path outside the bundled presets folder")], str(target))
        try:
            config_mod.save(self.config, target)
        except OSError as exc:
            raise ConfigError([Problem("", f"cannot be written: {exc.strerror or exc}")], str(target)) from None
        self.undo_stack.setClean()
        if target != self._path:
            self._path = target
            self.pathChanged.emit(target)
        self.message.emit(f"Saved {target}")
        return target

    def replace(self, config: RunConfig, path: Path | None) -> None:
        """A new document (its undo history starts empty)."""
        self.undo_stack.clear()
        self._selection = None
        self.selectionChanged.emit(None)
        self._path = path
        self.restore(Document.of(config))
        self.undo_stack.setClean()
        self.pathChanged.emit(path)
        self.replaced.emit()
