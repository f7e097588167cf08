"""One live plot: a pyqtgraph plot with a title bar, a legend (click an entry to hide its curve) and
exports. It only draws and wires its widgets: which curves it shows, their names and the points behind
them are its :class:`~gui.plot_curves.PlotCurves` to keep, and the points of each curve for the view,
and each frame's new segments, come from its :class:`~gui.series_model.SeriesModel` (decimation,
smoothing, envelopes; no Qt there)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QAction, QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from gui.curves import Curve, CurveSet
from gui.legend_crowd import CrowdControls
from gui.plot_curves import PlotCurves
from gui.plot_export import ask_and_write, raw_series, write_csv, write_png
from gui.plot_hover import PlotHover
from gui.plot_legend import PlotLegend
from gui.plot_view import PlotView
from gui.series_model import PlotSpec, Points, SeriesModel, Source, Summary, to_screen


def plot_widget(unit: str) -> pg.PlotWidget:
    """A pyqtgraph plot with a grid at the labelled ticks, mouse zoom and pan, and a menu of the options
    that apply to these plots."""
    widget = pg.PlotWidget()
    item = widget.getPlotItem()
    # no pyqtgraph clipping or downsampling: set_curve hands each curve only what the view shows
    item.showGrid(x=True, y=True, alpha=0.25)
    for name in ("left", "bottom"):
        # grid lines at the labelled ticks only: the minor levels' lines made painting a plot ~5x slower
        item.getAxis(name).setStyle(maxTickLevel=0)
    item.setMenuEnabled(True)
    # pyqtgraph's "Plot Options" offer transforms and downsampling made for its own data items:
    # only those that apply to these plots stay (log x / log y and the grid)
    ctrl = item.ctrl
    for check in (ctrl.fftCheck, ctrl.derivativeCheck, ctrl.phasemapCheck):
        check.hide()
    for action in item.ctrlMenu.actions():
        if action.text() in ("Downsample", "Average", "Alpha", "Points"):
            item.ctrlMenu.removeAction(action)
    item.getViewBox().setMouseEnabled(x=True, y=True)
    item.setLabel("left", unit or None)
    return widget


class MetricPlot(QWidget):
    """One pyqtgraph plot with a title bar, a legend (click an entry to hide its curve) and exports."""

    viewChanged = Signal()
    exported = Signal(str)  # a file was written: what to tell the user (the status bar)
    crowdChanged = Signal()  # the search or the choice of lines of a crowded plot changed

    def __init__(self, spec: PlotSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = SeriesModel(spec)
        self.export_note = ""  # what the exported PNG's title adds to the plot's (the run shown)
        self.setObjectName(f"plot-{spec.key}")
        self.title = QLabel(f"<b>{spec.title}</b>")
        self.title.setToolTip(f"{spec.title}; click a legend entry to hide or show its curve")
        self.png_button = self._button("PNG", f"Export the “{spec.title}” plot as a PNG image")
        self.csv_button = self._button("CSV", f"Export the data of the “{spec.title}” plot as CSV (curve, x, y)")
        self.log_button = self._button("log", f"Logarithmic y axis for the “{spec.title}” plot")
        self.log_button.setObjectName(f"log-{spec.key}")
        self.log_button.setCheckable(True)
        header = self.header = QHBoxLayout()
        header.setContentsMargins(4, 0, 4, 0)
        header.addWidget(self.title, 1)
        # a plot of many replicas or tasks: search and top-k (shown while crowded, see gui.plots_crowd)
        noun = "replica" if spec.scope == "replica" else "task"
        self.crowd_controls = CrowdControls(spec.key, noun, highest=spec.key not in ("throughput",))
        self.crowd_controls.hide()
        self.crowd_controls.changed.connect(self.crowdChanged)
        header.addWidget(self.crowd_controls)
        header.addWidget(self.log_button)
        header.addWidget(self.png_button)
        header.addWidget(self.csv_button)
        self.widget = plot_widget(spec.unit)
        self.item: pg.PlotItem = self.widget.getPlotItem()
        # every line of the plot is one item, drawn incrementally (see gui.curves)
        self.lines = CurveSet()
        self.item.addItem(self.lines)
        self.curves: dict[str, Curve] = self.lines.curves
        self.labels: dict[str, str] = {}
        self.legends = PlotLegend(self, self.widget, self.item, self.curves, self.labels)
        self.legend, self.compact_legend = self.legends.legend, self.legends.compact_legend
        # which curves the plot draws, their names and points (see gui.plot_curves)
        self.registry = PlotCurves(self.model, self.lines, self.legends, lambda: self.view.current(),
                                   self._empty_axes)
        self.band_model = self.registry.band_model  # (what tests and bench/app_scale.py read)
        self.lines.on_log_mode = self._log_mode_changed
        self.empty_note = pg.TextItem("no data yet", anchor=(0, 0))
        self.empty_note.setColor(self.palette().color(QPalette.ColorRole.PlaceholderText))
        self._shown_empty: bool | None = None
        self._x_label: str | None = None
        self.raw = self.model.raw  # curve -> unsmoothed (x, y) as shown (offset and scale applied on access)
        #: set: what the CSV export writes instead of the drawn curves, ``(curve, x, y)`` per series
        self.csv_source: Callable[[], Iterable[tuple[str, np.ndarray, np.ndarray]]] | None = None
        self._view_key: tuple[float, ...] = ()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.setSpacing(0)
        # the plot follows its data itself, in coarse steps (see gui.plot_view)
        self.view = PlotView(self.item, self.lines, self.model, self._view_moved)
        layout.addLayout(header)
        layout.addWidget(self.widget, 1)
        self.png_button.clicked.connect(self._ask_png)
        self.log_button.toggled.connect(lambda on: self.item.setLogMode(x=self.lines.log[0], y=on))
        self.hover = PlotHover(self)
        # the plot's right-click "Export…" offers these two instead of pyqtgraph's export dialog, whose
        # exporters know only pyqtgraph's own data items
        png_action = QAction("Export as PNG…", self)
        png_action.triggered.connect(self._ask_png)
        csv_action = QAction("Export data as CSV…", self)
        csv_action.triggered.connect(self._ask_csv)
        self.widget.scene().contextMenu = [png_action, csv_action]
        self.csv_button.clicked.connect(self._ask_csv)
        self.apply_theme()

    @staticmethod
    def _button(text: str, tip: str) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        return button

    @property
    def spec(self) -> PlotSpec:
        return self.model.spec

    @spec.setter
    def spec(self, spec: PlotSpec) -> None:
        self.model.spec = spec

    # what tests and bench/gui_scale.py read of the series model
    @property
    def _sources(self) -> dict[str, Source]:
        return self.model.sources

    @property
    def _summaries(self) -> dict[str, Summary]:
        return self.model.summaries

    @property
    def _compact(self) -> bool:
        return self.legends.compact

    @property
    def crowded(self) -> bool:
        """A plot of many replicas or tasks: its search and top-k shown (see :meth:`set_crowded`)."""
        return self.registry.crowded

    @property
    def following(self) -> bool:
        """The view follows the data (until the user zooms or pans)."""
        return self.view.following

    @following.setter
    def following(self, on: bool) -> None:
        self.view.following = on
        self.view.forget()

    def _log_mode_changed(self) -> None:
        """Log x or y was switched: every curve's points are given again in the new coordinates, at
        once (pyqtgraph fits the range to the curves' bounds right after)."""
        self.view.log_changed()
        self.log_button.blockSignals(True)
        self.log_button.setChecked(self.lines.log[1])  # (also when set from the plot's menu)
        self.log_button.blockSignals(False)
        for name in ("left", "bottom"):  # on a log axis the 2..9 ticks too, where a decade is wide
            self.item.getAxis(name).setStyle(maxTickLevel=1 if self.lines.log[name == "left"] else 0)
        self.hover.hide()
        self.registry.log_changed()
        self.viewChanged.emit()

    def screen_points(self, x: np.ndarray, y: np.ndarray) -> Points:
        """Points (as :attr:`raw` holds them) in the view's coordinates."""
        return to_screen(x, y, self.model.log)

    @property
    def x_label(self) -> str | None:
        return self._x_label

    # ------------------------------------------------------------------ theme

    def apply_theme(self) -> None:
        pal = self.palette()
        self.widget.setBackground(pal.color(QPalette.ColorRole.Base))
        text = pal.color(QPalette.ColorRole.Text)
        for name in ("left", "bottom"):
            axis = self.item.getAxis(name)
            axis.setPen(pg.mkPen(pal.color(QPalette.ColorRole.Mid)))
            axis.setTextPen(pg.mkPen(text))
        self.legends.set_text_color(text)
        self._empty_axes()

    def show_spec(self, spec: PlotSpec) -> None:
        """Show another figure (the metric chooser's choice): its curves start again."""
        if spec == self.spec:
            return
        self.spec = spec
        self.band_model.spec = spec
        self.title.setText(f"<b>{spec.title}</b>")
        self.title.setToolTip(f"{spec.title}; click a legend entry to hide or show its curve")
        self.clear()
        self.viewChanged.emit()

    def set_empty_text(self, text: str) -> None:
        """What a plot without curves says (``no data yet``, or why there is none)."""
        if self.empty_note.toPlainText() != text:
            self.empty_note.setText(text)

    def _empty_axes(self) -> None:
        """A plot without curves shows no numbers (no made-up 0-1 range), only a note."""
        empty = not self.curves
        if empty == self._shown_empty:
            return
        self._shown_empty = empty
        for name in ("left", "bottom"):
            self.item.getAxis(name).setStyle(showValues=not empty)
        self.item.showGrid(x=not empty, y=not empty, alpha=0.25)
        if empty:
            self.empty_note.setParentItem(self.item.getViewBox())
            self.empty_note.setPos(12, 8)
        self.empty_note.setVisible(empty)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.apply_theme()
        super().changeEvent(event)

    # ------------------------------------------------------------------ curves

    def clear(self) -> None:
        self.registry.clear()

    def set_crowded(self, crowded: bool) -> None:
        """Show the search and top-k of a plot of many replicas or tasks (or hide them); the curves start again."""
        if crowded != self.crowded:
            self.registry.crowded = crowded
            self.clear()
            self.crowd_controls.setVisible(crowded)

    def set_curve(self, key: str, label: str, color: str, x: np.ndarray, y: np.ndarray, smoothing: float,
                  style: Qt.PenStyle = Qt.PenStyle.SolidLine, width: float = 1.6, *, x_offset: float = 0.0,
                  stable: int | None = None, rank: tuple[object, ...] = (), revision: int = 0,
                  envelope: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Show curve ``key``: see :meth:`PlotCurves.set_curve`."""
        self.registry.set_curve(key, label, color, x, y, smoothing, style, width, x_offset=x_offset, stable=stable,
                                rank=rank, revision=revision, envelope=envelope)

    def set_band(self, key: str, label: str, color: str, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, *,
                 x_offset: float = 0.0, stable: int | None = None, revision: int = 0,
                 rank: tuple[object, ...] = ()) -> None:
        """Show band ``key``, from ``lo`` to ``hi``: see :meth:`PlotCurves.set_band`."""
        self.registry.set_band(key, label, color, x, lo, hi, x_offset=x_offset, stable=stable, revision=revision,
                               rank=rank)

    def remove_curve(self, key: str) -> None:
        self.registry.remove_curve(key)

    def forget_runs(self, prefix: str) -> None:
        """Remove an overlaid run's curves: see :meth:`PlotCurves.forget_runs`."""
        self.registry.forget_runs(prefix)

    def _view_moved(self, *_args: object) -> None:
        """The user's x range or the plot's width changed: curves are cut again at the next redraw."""
        self.view.forget()
        self.legends.resized()  # (a resized plot: its legend fits the new room)
        x_range, pixels = self.view.current()
        key = (pixels, *(x_range or ()))
        if key != self._view_key:
            self._view_key = key
            self.viewChanged.emit()

    def follow_data(self) -> None:
        """Keep every point in view, in coarse steps (see :meth:`PlotView.follow_data`)."""
        self.view.follow_data()

    def fit_robust_y(self) -> None:
        """Y from 0 to a little above the 99th percentile of the shown points."""
        self.view.fit_robust_y()

    def set_x_label(self, text: str) -> None:
        if text != self._x_label:  # a label set again lays the axis out and repaints it
            self._x_label = text
            self.item.setLabel("bottom", text)

    def points(self, key: str) -> int:
        """Points of one curve (tests and the status line use it)."""
        return self.model.points(key)

    # ------------------------------------------------------------------ export

    def export_png(self, path: str | Path, width: int = 1200) -> Path:
        """The plot as a PNG ``width`` pixels wide, titled with what it shows (and the run)."""
        return write_png(self.item, self.spec.title + (f" — {self.export_note}" if self.export_note else ""),
                         path, width)

    def export_csv(self, path: str | Path) -> Path:
        """Every curve's unsmoothed points: ``curve,x,y`` rows (with :attr:`csv_source`, its series)."""
        return write_csv(path, self.csv_source() if self.csv_source is not None else raw_series(self.raw, self.labels))

    def _ask_png(self) -> None:
        self._ask(f"Export {self.spec.title} as PNG", f"{self.spec.key}.png", "PNG images (*.png)", self.export_png)

    def _ask_csv(self) -> None:
        self._ask(f"Export {self.spec.title} data as CSV", f"{self.spec.key}.csv", "CSV files (*.csv)",
                  self.export_csv)

    def _ask(self, caption: str, name: str, filters: str, write: Callable[[str], object]) -> None:
        path = ask_and_write(self, caption, name, filters, write)
        if path:
            self.exported.emit(f"Saved “{self.spec.title}” to {path}")
