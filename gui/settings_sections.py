"""The run settings form's sections: one group box each — the run, what trains (ClusterDeck's model and data, or
the user's own program), data, model, training, and validation on held-out examples (parallelism has a module of
its own, ``gui/settings_parallelism.py``).

A section builds its rows with the form's :class:`~gui.settings_fields.FieldEditors` (so every field is edited,
re-read and marked for problems as the others are) and says in ``refresh`` which rows apply to the config as it is
now (each field's declared ``applies``).
"""

from __future__ import annotations

import shlex

from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QLineEdit, QVBoxLayout

from engine.contract import config as config_mod
from engine.contract.config import DATA_SOURCES, MODELS, OPTIMIZERS, Program, RunConfig, field_spec
from gui import theme
from gui.settings_fields import FieldEditors, with_source

#: The choices of "What trains", in the combo's order.
TRAINS = ("ClusterDeck's model and data", "Your own program")
PROGRAM_NOTE = ("Not used when you run your own program: it builds its model, reads its data and trains "
                "itself (see “What trains”)")
#: Training settings a program still takes (the launcher's, not the loop's).
PROGRAM_TRAINING = ("training.restarts",)


class Section:
    """One group box of the form and its rows; ``refresh`` shows the rows that apply to the config."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout, title: str) -> None:
        self.fields = fields
        self.box = QGroupBox(title)
        self.form: QFormLayout = QFormLayout(self.box)
        outer.addWidget(self.box)

    def refresh(self, config: RunConfig) -> None:
        """Show the rows that apply to ``config`` (every row, unless a section says otherwise)."""


class RunSection(Section):
    """The run's name."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Run")
        self.name = fields.line("name", self.form, "Name")


class ProgramSection(Section):
    """"What trains": ClusterDeck's model and data, or your own Python program with its arguments."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "What trains")
        form = self.form
        self.kind = QComboBox()
        self.kind.addItems(list(TRAINS))
        fields.register("program", self.kind,
                        "ClusterDeck's model and data: the model, data and training settings below.\n"
                        "Your own program: a Python file run unchanged in every chief and worker task, with "
                        "TF_CONFIG written for it; it builds its own model and data")
        self.kind.activated.connect(self._chosen)
        fields.readers.append(lambda: self.kind.setCurrentIndex(int(fields.document.config.program is not None)))
        form.addRow("Trains", self.kind)
        self.script = fields.path("program.script", form, "Program", "Python (*.py);;All files (*)")
        self.args = QLineEdit()
        self.args.setPlaceholderText("none")
        fields.register("program.args", self.args)
        self.args.editingFinished.connect(self._args_edited)
        fields.readers.append(self._read_args)
        form.addRow("Arguments", self.args)
        self._last = Program()  # the program chosen before switching back, offered again
        #: the groups only ClusterDeck's own loop uses (greyed out for your own program); the form sets them
        self.loop_boxes: tuple[QGroupBox, ...] = ()

    def _chosen(self, index: int) -> None:
        doc = self.fields.document
        current = doc.config.program
        if index == 1 and current is None:
            doc.set_value("program", self._last)
        elif index == 0 and current is not None:
            self._last = current
            doc.set_value("program", None)

    def _read_args(self) -> None:
        program = self.fields.document.config.program
        self.args.setText(shlex.join(program.args) if program is not None else "")

    def _args_edited(self) -> None:
        program = self.fields.document.config.program
        if program is None:
            return
        try:
            args = tuple(shlex.split(self.args.text()))
        except ValueError as exc:
            self.args.setStyleSheet(f"border: 2px solid {theme.PROBLEM_COLOR};")
            self.args.setToolTip(f"program.args: expected arguments a shell can split, got {self.args.text()!r} ({exc})")
            return
        if args != program.args:
            self.fields.document.set_value("program", config_mod.replace(program, args=args))

    def refresh(self, config: RunConfig) -> None:
        """Show the program's rows for a program; grey out what a program does not use, saying why."""
        own = config.program is not None
        self.form.setRowVisible(self.fields.rows["program.script"], own)  # the program's fields apply to it alone
        self.form.setRowVisible(self.args, own)
        for box in self.loop_boxes:
            box.setEnabled(not own)
            title = box.title().removesuffix(" (not used by your program)")
            box.setTitle(f"{title} (not used by your program)" if own else title)
            box.setToolTip(PROGRAM_NOTE if own else "")
        for path, widget in self.fields.widgets.items():
            if path.startswith("training.") and path not in PROGRAM_TRAINING:
                widget.setEnabled(not own)
                self.fields.off_notes[path] = PROGRAM_NOTE if own else ""


class DataSection(Section):
    """Where the examples come from: a synthetic or known data set, or files (with their keys)."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Data")
        form = self.form
        self.source = fields.combo("data.source", DATA_SOURCES, form, "Source")
        self.shape = fields.ints("data.shape", form, "Shape")
        self.classes = fields.spin("data.classes")
        form.addRow("Classes", self.classes)
        self.size = fields.spin("data.size")
        form.addRow("Size", self.size)
        self.path = fields.path("data.path", form, "Path",
                                "Data (*.npz *.csv *.tfrecord *.tfrecords *.tfrec *.py);;All files (*)")
        self.x_key = fields.line("data.x_key", form, "Inputs key")
        self.y_key = fields.line("data.y_key", form, "Labels key")

    def refresh(self, config: RunConfig) -> None:
        fields, form = self.fields, self.form
        form.setRowVisible(fields.rows["data.path"], fields.applies("data.path"))
        form.setRowVisible(self.x_key, fields.applies("data.x_key"))
        form.setRowVisible(self.y_key, fields.applies("data.y_key"))
        form.setRowVisible(self.size, True)
        # data sources that cannot work with the rest of the config (the mode above all) are greyed out
        fields.offer_choices(self.source, "data.source",
                             lambda v: config_mod.replace(config, data=with_source(config.data, v)))


class ModelSection(Section):
    """ClusterDeck's model: its kind and sizes, or a script that builds it."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Model")
        form = self.form
        self.name = fields.combo("model.name", MODELS, form, "Model")
        self.hidden = fields.ints("model.hidden", form, "Hidden sizes")  # none: a linear model
        self.vocab_size = fields.spin("model.vocab_size")
        form.addRow("Vocab size", self.vocab_size)
        self.embed_dim = fields.spin("model.embed_dim")
        form.addRow("Embed dim", self.embed_dim)
        self.heads = fields.spin("model.heads")
        form.addRow("Heads", self.heads)
        self.script = fields.path("model.script", form, "Script", "Python (*.py);;All files (*)")

    def refresh(self, config: RunConfig) -> None:
        fields, form = self.fields, self.form
        # a script builds its own layers: hidden sizes are not read (nor checked against the mesh) for it
        form.setRowVisible(self.hidden, fields.applies("model.hidden"))
        for path in ("model.vocab_size", "model.embed_dim", "model.heads"):
            form.setRowVisible(fields.widgets[path], fields.applies(path))
        form.setRowVisible(fields.rows["model.script"], fields.applies("model.script"))
        # models that cannot work with the rest of the config (the mode above all) are greyed out
        fields.offer_choices(self.name, "model.name",
                             lambda v: config_mod.replace(config, model=config_mod.replace(config.model, name=v)))


class TrainingSection(Section):
    """How long and how the model trains, checkpoints and restarts."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Training")
        form = self.form
        self.batch = fields.spin("training.global_batch_size")
        form.addRow("Global batch", self.batch)
        self.steps = fields.spin("training.steps")
        form.addRow("Steps", self.steps)
        self.optimizer = fields.combo("training.optimizer", OPTIMIZERS, form, "Optimizer")
        self.learning_rate = fields.decimal("training.learning_rate", decimals=5, step=0.005)
        form.addRow("Learning rate", self.learning_rate)
        self.seed = fields.spin("training.seed")
        form.addRow("Seed", self.seed)
        self.checkpoint_every = fields.spin("training.checkpoint_every")
        self.checkpoint_every.setSpecialValueText("at the end")
        form.addRow("Checkpoint every", self.checkpoint_every)
        self.restarts = fields.spin("training.restarts")
        form.addRow("Restarts", self.restarts)
        self.steps_per_execution = fields.spin("training.steps_per_execution")
        form.addRow("Steps per execution", self.steps_per_execution)

    def refresh(self, config: RunConfig) -> None:
        self.form.setRowVisible(self.steps_per_execution, self.fields.applies("training.steps_per_execution")
                                or config.training.steps_per_execution != 1)


class ValidationSection(Section):
    """Held-out examples evaluated while training: a split of the data, or a file of the data's kind."""

    def __init__(self, fields: FieldEditors, outer: QVBoxLayout) -> None:
        super().__init__(fields, outer, "Validation")
        form = self.form
        self.split = fields.decimal("validation.split", decimals=2, step=0.05)
        self.split.setSpecialValueText("none")
        form.addRow("Held-out split", self.split)
        self.path = fields.path("validation.path", form, "Held-out file",
                                "Data (*.npz *.csv *.tfrecord *.tfrecords *.tfrec);;All files (*)")
        self.every = fields.spin("validation.every")
        self.every.setSpecialValueText("never")
        form.addRow("Every (steps)", self.every)
        self.batches = fields.spin("validation.batches")
        self.batches.setSpecialValueText("all examples")
        form.addRow("Batches", self.batches)

    def refresh(self, config: RunConfig) -> None:
        files = field_spec("validation.path").applies_to(config)
        self.form.setRowVisible(self.fields.rows["validation.path"], files or bool(config.validation.path.strip()))
        evaluated = field_spec("validation.batches").applies_to(config)
        self.form.setRowVisible(self.batches, evaluated or config.validation.batches != 0)
