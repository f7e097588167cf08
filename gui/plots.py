"""Live plots of a run: loss, throughput and step time per replica; CPU, GPU and memory per task.

Curves are created once per series and only ``setData`` afterwards, from one
timer at <= 30 Hz, and only when :attr:`History.version` moved (or a view
setting changed). Other runs can be overlaid (dashed) for comparison.

The panel is here; one plot is :class:`gui.metric_plot.MetricPlot`, its series maths
:mod:`gui.series_model`, its legend :mod:`gui.plot_legend`, the bar above the plots
:mod:`gui.plots_bar` and the curves of one run :mod:`gui.run_curves` (their public names are
importable from here too).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QGridLayout, QVBoxLayout, QWidget

from gui.metric_plot import MetricPlot
from gui.metric_series import NO_METRICS_NOTE, csv_series, plot_title, reports_no_metrics, training_text
from gui.plot_curves import THIN_ABOVE
from gui.plot_legend import COMPACT_LEGEND_ABOVE, LEGEND_ROW_HEIGHT, LEGEND_ROWS, short_label
from gui.plots_bar import NO_CURVES_HINT, MetricChooser, PlotsBar
from gui.plots_crowd import CROWD_ABOVE, CrowdDraw, crowded
from gui.run_curves import COMPARE_SHIFT, SECONDARY_LABEL, draw_run, short_run_label
from gui.run_session import RunSession
from gui.series_model import (
    CHECKPOINT,
    COMPARE_PREFIX,
    EMA_BLOCK,
    PIXELS_PER_BLOCK,
    PLOTS,
    SUMMARY_BLOCK,
    PlotSpec,
    ema,
    x_label,
)
from gui.series_model import ema_from as _ema_from
from gui.series_model import total as _total

__all__ = [
    "CHECKPOINT", "COMPACT_LEGEND_ABOVE", "COMPARE_PREFIX", "CROWD_ABOVE", "COMPARE_SHIFT", "EMA_BLOCK", "LEGEND_ROWS",
    "LEGEND_ROW_HEIGHT", "MIN_REDRAW_SPACING_S", "NO_CURVES_HINT", "PIXELS_PER_BLOCK", "PLOTS",
    "REDRAW_INTERVAL_MS", "SECONDARY_LABEL", "SUMMARY_BLOCK", "THIN_ABOVE", "MetricPlot", "PlotSpec",
    "PlotsPanel", "_ema_from", "_total", "ema", "short_label", "short_run_label",
]

REDRAW_INTERVAL_MS = 40  # 25 Hz: the fallback timer
#: New events are drawn as soon as the session has folded them, but never more often than this.
MIN_REDRAW_SPACING_S = 0.030


class PlotsPanel(QWidget):
    """All live plots with shared view settings: x axis (step or wall time) and EMA smoothing."""

    redrawn = Signal()
    compareRequested = Signal()  # the user asked to overlay another run (the window asks which)
    exported = Signal(str)  # a plot was saved as PNG or CSV: what to tell the user

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.bar = PlotsBar()
        # (the bar's widgets, as the panel's: the window and tests reach them here)
        self.x_mode, self.smoothing, self.smoothing_label = self.bar.x_mode, self.bar.smoothing, self.bar.smoothing_label
        self.compare_button, self.clear_compare, self.hint = self.bar.compare_button, self.bar.clear_compare, self.bar.hint
        self.plots: dict[str, MetricPlot] = {spec.key: MetricPlot(spec) for spec in PLOTS}
        # a plot of more replicas or tasks than lines a person reads: mean, band and a few (gui.plots_crowd)
        self.crowds: dict[str, CrowdDraw] = {key: CrowdDraw(plot) for key, plot in self.plots.items()}
        # the first plot shows one metric at a time: the loss, or any metric the training reports
        self.metric_chooser = MetricChooser()
        self.loss.header.insertWidget(1, self.metric_chooser)
        self.loss.csv_source = self.csv_series
        grid = QGridLayout()
        grid.setContentsMargins(2, 2, 2, 2)
        grid.setSpacing(6)
        grid.addWidget(self.plots["loss"], 0, 0, 1, 2)
        grid.addWidget(self.plots["throughput"], 0, 2)
        grid.addWidget(self.plots["step_time"], 1, 0)
        grid.addWidget(self.plots["utilisation"], 1, 1)
        grid.addWidget(self.plots["memory"], 1, 2)
        for c in range(3):
            grid.setColumnStretch(c, 1)
        grid.setRowStretch(0, 3)
        grid.setRowStretch(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.bar)
        layout.addLayout(grid, 1)

        self._version = -1
        self._no_metrics = False
        self._dirty = True
        self._last_redraw = 0.0
        self.timer = QTimer(self)
        self.timer.setObjectName("plotsTimer")
        self.timer.setInterval(REDRAW_INTERVAL_MS)
        self.timer.timeout.connect(self.redraw_if_needed)
        self.x_mode.currentIndexChanged.connect(self._settings_changed)
        self.metric_chooser.currentIndexChanged.connect(self._metric_chosen)
        self.smoothing.valueChanged.connect(self._settings_changed)
        self.clear_compare.clicked.connect(session.clear_comparisons)
        self.compare_button.clicked.connect(self.compareRequested)
        session.runLoaded.connect(self._reset)
        # drawn in the same event-loop turn as the session folds them: a point waits for one
        # timer (the session's drain) instead of two
        session.runUpdated.connect(self._run_updated)
        session.comparisonsChanged.connect(self._comparisons_changed)
        for plot in self.plots.values():
            plot.viewChanged.connect(self._view_changed)
            plot.exported.connect(self.exported)
            plot.crowdChanged.connect(self._settings_changed)
        session.runLoaded.connect(self._note_run)
        self._settings_changed()
        self.timer.start()

    def _note_run(self) -> None:
        """Exported PNGs name the run they show (or the config, before it ran)."""
        s = self.session
        note = f"{s.config.name} ({s.run_dir.name})" if s.run_dir is not None else s.config.name
        for plot in self.plots.values():
            plot.export_note = note

    @property
    def loss(self) -> MetricPlot:
        return self.plots["loss"]

    @property
    def weight(self) -> float:
        return self.bar.weight

    @property
    def by_time(self) -> bool:
        return self.bar.by_time

    def _settings_changed(self, *_args: object) -> None:
        self.bar.show_weight()
        self._dirty = True
        self.redraw_if_needed()

    @property
    def shown_metric(self) -> str:
        """The metric the first plot shows (a series name: ``loss``, ``accuracy``, ``metric:loss``)."""
        return self.metric_chooser.shown

    def _metric_chosen(self, *_args: object) -> None:
        metric = self.shown_metric
        self.loss.show_spec(replace(PLOTS[0], title=plot_title(metric), metrics=(metric,)))
        self.crowds["loss"].forget()
        self._dirty = True
        self.redraw_if_needed()

    def _list_metrics(self) -> None:
        """Offer every metric the shown run has reported (checked only when the history gained series)."""
        if self.metric_chooser.offer(self.session.state.history.series):
            self._metric_chosen()

    def csv_series(self) -> Iterable[tuple[str, np.ndarray, np.ndarray]]:
        """What the first plot's CSV export holds: every metric of every replica and every validation
        series of the shown run, then of each overlaid run (named with `` · <run>``)."""
        yield from csv_series(self.session.state, self.by_time)
        for label, other in self.session.comparisons.items():
            for name, x, y in csv_series(other, self.by_time):
                yield f"{name} · {label}", x, y

    def _view_changed(self) -> None:
        self._dirty = True  # the fallback timer redraws: curves are cut for the new range or width

    def _reset(self) -> None:
        for key, plot in self.plots.items():
            plot.set_crowded(False)
            plot.clear()
            self.crowds[key].forget()
        self.metric_chooser.forget()
        self._list_metrics()
        self._dirty = True
        self.redraw_if_needed()

    def _comparisons_changed(self) -> None:
        for key, plot in self.plots.items():
            plot.forget_runs(COMPARE_PREFIX)
            self.crowds[key].forget()
        self.clear_compare.setEnabled(bool(self.session.comparisons))
        self._dirty = True
        self.redraw_if_needed()

    def apply_theme(self) -> None:
        """Redraw every plot in the current palette's colours."""
        for plot in self.plots.values():
            plot.apply_theme()

    def stop(self) -> None:
        self.timer.stop()

    def _run_updated(self) -> None:
        if time.monotonic() - self._last_redraw >= MIN_REDRAW_SPACING_S:
            self.redraw_if_needed()

    def redraw_if_needed(self) -> None:
        history = self.session.state.history
        if not self.session.state.replicas:
            self._note_missing_metrics()
        if history.version == self._version and not self._dirty and self._caught_up():
            return
        self._version = history.version
        self._dirty = False
        self._last_redraw = time.monotonic()
        self.redraw()

    def redraw(self) -> None:
        """Push the latest points of every series into its curve."""
        state = self.session.state
        weight, by_time = self.weight, self.by_time
        self._list_metrics()
        for key, plot in self.plots.items():
            spec = plot.spec
            plot.set_x_label(x_label(spec.scope, by_time))
            crowd = self.crowds[key]
            plot.set_crowded(plot.crowded or crowded(plot, state.history))
            if plot.crowded:
                crowd.draw(state, "", weight, by_time, Qt.PenStyle.SolidLine)
            else:
                draw_run(plot, state, "", weight, by_time, Qt.PenStyle.SolidLine)
            if spec.compare:
                for n, (label, other) in enumerate(self.session.comparisons.items()):
                    style = (Qt.PenStyle.DashLine, Qt.PenStyle.DashDotLine, Qt.PenStyle.DotLine)[n % 3]
                    if plot.crowded or crowded(plot, other.history):
                        crowd.draw(other, label, weight, by_time, style)
                    else:
                        draw_run(plot, other, label, weight, by_time, style, shift=COMPARE_SHIFT * (n + 1))
            crowd.prune()
            plot.fit_robust_y()
            plot.follow_data()
            plot.lines.flush()
        self.clear_compare.setEnabled(bool(self.session.comparisons))
        self._show_hint()
        self.redrawn.emit()

    def _caught_up(self) -> bool:
        """Every crowded plot has folded every point it has (else the next frames go on folding)."""
        return all(c.caught_up for c in self.crowds.values())

    def _show_hint(self) -> None:
        """The bar's note: how to get curves while there are none, then what trained (the run's
        ``training`` info: optimizer, loss, compiled metrics)."""
        state = self.session.state
        trained = training_text(state) if state.history.series else ""
        self.bar.show_hint(trained, self._no_metrics, bool(state.history.series))

    def _note_missing_metrics(self) -> None:
        """A program run that reports no steps says so after a few seconds, instead of ``no data yet``."""
        session = self.session
        config = session.config
        missing = session.shows_run and reports_no_metrics(session.state, config.program is not None)
        if missing == self._no_metrics:
            return
        self._no_metrics = missing
        for plot in self.plots.values():
            if plot.spec.scope == "replica":
                plot.set_empty_text(NO_METRICS_NOTE if missing else "no data yet")
        if missing:
            self.bar.say_no_metrics()
        self._show_hint()
