"""Run settings: what trains (ClusterDeck's model and data, or your own program), parallelism and its
options, data, model, training and validation, as one form.

The form is its sections (``gui/settings_sections.py``, ``gui/settings_parallelism.py``), each a group box whose
rows are built by the form's one :class:`~gui.settings_fields.FieldEditors`: each widget writes one config field
through :meth:`DocumentModel.set_value` (an undoable edit; repeated edits of one field merge) and is re-read from
the config after every edit, with its signals blocked so nothing echoes. Its range, tooltip and when it is shown
come from the field's one declaration (:func:`engine.contract.config.field_spec`).
"""

from __future__ import annotations

from PySide6.QtWidgets import QStyle, QVBoxLayout, QWidget

from engine.contract.config import Problem
from gui.document_model import DocumentModel
from gui.settings_fields import FieldEditors
from gui.settings_parallelism import ParallelismSection
from gui.settings_sections import (
    DataSection,
    ModelSection,
    ProgramSection,
    RunSection,
    Section,
    TrainingSection,
    ValidationSection,
)
from gui.window_layout import reveal


class SettingsPanel(QWidget):
    """The run settings form. ``widgets`` maps config field paths to their editor.

    No scroll area of its own: it lies in the settings column, which scrolls as a whole (window_layout)."""

    def __init__(self, document: DocumentModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document = document
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        self.fields = fields = FieldEditors(document)
        self.widgets = fields.widgets
        #: the file path rows, by field path
        self._rows = fields.rows
        #: why a setting is greyed out (added to its tooltip), by field path
        self.off_notes = fields.off_notes

        self.run_section = RunSection(fields, outer)
        self.program_section = ProgramSection(fields, outer)
        self.parallelism_section = ParallelismSection(fields, outer)
        self.data_section = DataSection(fields, outer)
        self.model_section = ModelSection(fields, outer)
        self.training_section = TrainingSection(fields, outer)
        self.validation_section = ValidationSection(fields, outer)
        self.sections: tuple[Section, ...] = (
            self.run_section, self.program_section, self.parallelism_section, self.data_section,
            self.model_section, self.training_section, self.validation_section)
        #: the groups only ClusterDeck's own loop uses (greyed out for your own program)
        self.loop_boxes = (self.data_section.box, self.model_section.box, self.validation_section.box)
        self.program_section.loop_boxes = self.loop_boxes
        outer.addStretch(1)

        # each editor by name too (the sections own them)
        self.name = self.run_section.name
        p = self.parallelism_section
        self.mode, self.mesh_batch, self.mesh_model, self.mesh_axes = p.mode, p.mesh_batch, p.mesh_model, p.mesh_axes
        self.partitioner, self.shards, self.min_shard_bytes, self.timeout = (
            p.partitioner, p.shards, p.min_shard_bytes, p.timeout)
        d = self.data_section
        self.source, self.shape, self.classes, self.data_size = d.source, d.shape, d.classes, d.size
        self.data_path, self.x_key, self.y_key = d.path, d.x_key, d.y_key
        m = self.model_section
        self.model_name, self.hidden, self.script = m.name, m.hidden, m.script
        self.vocab_size, self.embed_dim, self.heads = m.vocab_size, m.embed_dim, m.heads
        t = self.training_section
        self.batch, self.steps, self.optimizer, self.learning_rate = t.batch, t.steps, t.optimizer, t.learning_rate
        self.seed, self.checkpoint_every, self.restarts = t.seed, t.checkpoint_every, t.restarts
        self.steps_per_execution = t.steps_per_execution

        document.settingsChanged.connect(self.refresh)
        document.problemsChanged.connect(self.mark_problems)
        self.refresh()

    def choose_mode(self, mode: str) -> None:
        """Switch parallelism, asking before the cluster changes (see :meth:`ParallelismSection.choose_mode`)."""
        self.parallelism_section.choose_mode(mode)

    def refresh(self) -> None:
        """Every editor re-read from the config; each section's rows shown where they apply."""
        self.fields.read_all()
        config = self.document.config
        for section in self.sections:
            section.refresh(config)
        self.mark_problems(self.document.problems)

    def applies(self, path: str) -> bool:
        """Whether the field ``path`` is used by the config as it is now (its declared ``applies``)."""
        return self.fields.applies(path)

    def mark_problems(self, problems: list[Problem]) -> None:
        """A red frame and the message in the tooltip of each setting a problem names."""
        self.fields.mark_problems(problems)

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
