"""The "Scaling report" dialog: run the current config at 1, 2, 4, … workers, see and save the figure.

The runs go through :class:`engine.control.scaling.ScalingSession`, which never blocks: a timer polls it
(the launcher already runs every run's I/O on its own threads), so the window stays responsive.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.contract.config import ConfigError
from engine.control.scaling import (
    REFUSED,
    SCALED_MODES,
    ScalingProgress,
    ScalingReport,
    ScalingSession,
    parse_workers,
    write_csv,
)
from gui.controller import Controller
from gui.scaling_plot import ScalingPlot

POLL_INTERVAL_MS = 100
DEFAULT_STEPS = 200


def what_runs(mode: str) -> str:
    """What each worker count runs, said before the report starts (or why it cannot)."""
    if mode == "async":
        return ("Each worker count runs the current config as its own asynchronous run: the chief and the "
                "parameter servers stay, the workers are 1, 2, 4, … local processes.")
    if mode in SCALED_MODES:
        return "Each worker count runs the current config as local data-parallel workers."
    return f"A {mode}-parallel config cannot be scaled by workers: {REFUSED.get(mode, '')}"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA estimating…"
    seconds = int(round(seconds))
    return f"ETA {seconds // 60}:{seconds % 60:02d}"


class ScalingDialog(QDialog):
    """Pick worker counts and steps, run, watch progress with an ETA, then save PNG and CSV."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setObjectName("scalingDialog")
        self.setWindowTitle("Scaling report")
        self.session: ScalingSession | None = None
        self.report: ScalingReport | None = None

        self.workers = QLineEdit("1, 2, 4")
        self.workers.setObjectName("scalingWorkers")
        self.workers.setToolTip("Worker counts to run, separated by commas (each one is a separate run)")
        self.steps = QSpinBox()
        self.steps.setObjectName("scalingSteps")
        self.steps.setRange(10, 1_000_000)
        self.steps.setValue(DEFAULT_STEPS)
        self.steps.setToolTip("Training steps of each run; the first fifth (at most 50) is a warm-up left out "
                              "of the measurement")
        self.strong = QCheckBox("Strong scaling (keep the global batch)")
        self.strong.setObjectName("scalingStrong")
        self.strong.setToolTip("Off: weak scaling, every replica keeps the config's per-replica batch (as in "
                               "Horovod's figures). On: the global batch stays the same and is split over more "
                               "workers.")
        form = QFormLayout()
        form.addRow("Workers", self.workers)
        form.addRow("Steps per run", self.steps)
        form.addRow("", self.strong)

        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("scalingRun")
        self.run_button.setToolTip("Run the current config at each worker count, one run after another")
        self.cancel_button = QPushButton("Stop")
        self.cancel_button.setObjectName("scalingStop")
        self.cancel_button.setToolTip("Stop the run in progress and start no other")
        self.cancel_button.setEnabled(False)
        self.save_png_button = QPushButton("Save PNG…")
        self.save_png_button.setObjectName("scalingSavePng")
        self.save_png_button.setToolTip("Save the figure as a PNG image")
        self.save_csv_button = QPushButton("Save CSV…")
        self.save_csv_button.setObjectName("scalingSaveCsv")
        self.save_csv_button.setToolTip("Save the measurements (one row per worker count) as CSV")
        self.close_button = QPushButton("Close")
        self.close_button.setToolTip("Close this window (a report in progress is stopped)")
        for b in (self.save_png_button, self.save_csv_button):
            b.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        buttons.addWidget(self.save_png_button)
        buttons.addWidget(self.save_csv_button)
        buttons.addWidget(self.close_button)

        self.progress = QProgressBar()
        self.progress.setObjectName("scalingProgress")
        self.progress.setRange(0, 1000)
        self.progress.setToolTip("Progress over all the runs of the report")
        self.status = QLabel(what_runs(controller.config.parallelism.mode))
        self.status.setObjectName("scalingStatus")
        self.status.setWordWrap(True)
        self.plot = ScalingPlot()
        self.plot.setMinimumSize(640, 320)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.plot, 1)
        layout.addLayout(buttons)

        self.timer = QTimer(self)
        self.timer.setObjectName("scalingTimer")
        self.timer.setInterval(POLL_INTERVAL_MS)
        self.timer.timeout.connect(self._poll)
        self.run_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.save_png_button.clicked.connect(lambda: self.save_png())
        self.save_csv_button.clicked.connect(lambda: self.save_csv())
        self.close_button.clicked.connect(self.close)
        self.resize(1000, 680)

    # ------------------------------------------------------------------ running

    @property
    def running(self) -> bool:
        return self.session is not None and not self.session.done

    def start(self) -> bool:
        """Validate the choices and start the first run; False (with the reason shown) when it cannot."""
        if self.running:
            return False
        if self.controller.is_running:
            QMessageBox.warning(self, "Cannot run the scaling report",
                                "A run is in progress; stop it first (its processes would share the CPUs and "
                                "distort every measurement).")
            return False
        try:
            workers = parse_workers(self.workers.text())
            session = ScalingSession(self.controller.config, workers, self.steps.value(), self.controller.runs_root,
                                     strong=self.strong.isChecked())
        except ConfigError as exc:
            QMessageBox.warning(self, "Cannot run the scaling report", str(exc))
            return False
        self.session = session
        self.report = None
        for w in (self.run_button, self.workers, self.steps, self.strong, self.save_png_button,
                  self.save_csv_button):
            w.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setValue(0)
        self.status.setText(f"Starting {len(session.configs)} runs: {', '.join(map(str, workers))} workers…")
        self.timer.start()
        self._poll()
        return True

    def cancel(self) -> None:
        if self.session is not None and not self.session.done:
            self.session.cancel()
            self.cancel_button.setEnabled(False)
            self.status.setText("Stopping…")

    def _poll(self) -> None:
        session = self.session
        if session is None:
            self.timer.stop()
            return
        done = session.poll()
        self._show_progress(session.progress())
        if session.points:
            self.plot.set_report(session.report())
        if done:
            self.timer.stop()
            self._finished(session)

    def _show_progress(self, p: ScalingProgress) -> None:
        self.progress.setValue(int(1000 * p.fraction))
        if p.state == "running":
            step = f"step {p.step} of {p.total_steps}" if p.total_steps else "starting"
            self.status.setText(f"Run {p.index + 1} of {p.runs}: {p.workers} worker(s), {step} — "
                                f"{format_eta(p.eta_s)}" + (f"  ({p.message})" if p.message else ""))

    def _finished(self, session: ScalingSession) -> None:
        report = session.report()
        self.report = report
        self.plot.set_report(report)
        for w in (self.run_button, self.workers, self.steps, self.strong):
            w.setEnabled(True)
        self.cancel_button.setEnabled(False)
        measured = [p for p in report.points if p.examples_per_sec]
        self.save_png_button.setEnabled(bool(measured))
        self.save_csv_button.setEnabled(bool(report.points))
        failed = [p for p in report.points if p.state != "finished"]
        parts = [f"{len(measured)} of {len(session.configs)} runs measured"]
        if session.state == "cancelled":
            parts.insert(0, "Stopped")
        for p in failed:
            parts.append(f"{p.workers} worker(s) {p.state}" + (f": {p.reason}" if p.reason else ""))
        self.status.setText("; ".join(parts) + ".")

    # ------------------------------------------------------------------ saving

    def _ask(self, title: str, name: str, filters: str) -> str:
        suggested = str(Path(self.controller.runs_root) / name)
        path, _ = QFileDialog.getSaveFileName(self, title, suggested, filters)
        return path

    def save_png(self, path: str | Path | None = None) -> Path | None:
        if self.report is None:
            return None
        if path is None:
            path = self._ask("Save the scaling figure", f"{self.report.preset}-scaling.png", "PNG images (*.png)")
            if not path:
                return None
        try:
            out = self.plot.export_png(path)
        except OSError as exc:
            QMessageBox.critical(self, "Cannot save the PNG", str(exc))
            return None
        self.status.setText(f"Saved {out}")
        return out

    def save_csv(self, path: str | Path | None = None) -> Path | None:
        if self.report is None:
            return None
        if path is None:
            path = self._ask("Save the scaling measurements", f"{self.report.preset}-scaling.csv",
                             "CSV files (*.csv)")
            if not path:
                return None
        try:
            out = write_csv(self.report, path)
        except OSError as exc:
            QMessageBox.critical(self, "Cannot save the CSV", f"{path}: {exc.strerror or exc}")
            return None
        self.status.setText(f"Saved {out}")
        return out

    # ------------------------------------------------------------------ closing

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not self.running and self.report is None:  # the config may be another one since it last showed
            self.status.setText(what_runs(self.controller.config.parallelism.mode))

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing stops the report: the run in progress is told to stop, and the timer ends."""
        self.shutdown()
        super().closeEvent(event)

    def reject(self) -> None:  # Escape
        self.shutdown()
        super().reject()

    def shutdown(self) -> None:
        """Stop the run in progress (without waiting) and the timer."""
        if self.session is not None and not self.session.done:
            self.session.cancel()
        self.timer.stop()
