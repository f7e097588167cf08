"""Live plots of a run: loss, throughput and step time per replica; CPU, GPU and memory per task.

Curves are created once per series and only ``setData`` afterwards, from one
timer at <= 30 Hz, and only when :attr:`History.version` moved (or a view
setting changed). Other runs can be overlaid (dashed) for comparison.
"""

from __future__ import annotations

import csv
import functools
import html
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QFont, QFontMetricsF, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGraphicsItem,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSlider,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.observe.telemetry import History, RunState
from gui import theme
from gui.curves import Curve, CurveSet, finite_range
from gui.elided_label import ElidedLabel
from gui.legend import CompactLegend, ToggleLegend
from gui.metric_series import (
    LOSS,
    NO_METRICS_NOTE,
    VALIDATION,
    csv_series,
    display_name,
    eval_key,
    metric_names,
    plot_title,
    replica_label,
    reports_no_metrics,
    training_text,
)
from gui.plot_hover import PlotHover
from gui.run_session import RunSession

REDRAW_INTERVAL_MS = 40  # 25 Hz: the fallback timer
#: New events are drawn as soon as the session has folded them, but never more often than this.
MIN_REDRAW_SPACING_S = 0.030
#: Screen pixels per block of points drawn as its min and max (2 points per block): with 1, ~2 points
#: per horizontal pixel reach pyqtgraph; fewer points than 2 per pixel in view are drawn exactly.
PIXELS_PER_BLOCK = 1.0
#: Above this many curves a plot draws 1-pixel lines: Qt strokes wider ones many times slower,
#: and with that many curves wide lines only hide one another.
THIN_ABOVE = 8
#: A curve keeps the min and max of each block of this many drawn points (float32: 0.25 bytes per
#: point), and no smoothed copy of its points: see :class:`_Summary`.
SUMMARY_BLOCK = 32
#: ... and the smoothing's state every this many points (a multiple of SUMMARY_BLOCK).
CHECKPOINT = 1024
#: Points smoothed by one matrix product (see :func:`_ema_from`).
EMA_BLOCK = 64
#: Legend entries per column: more curves than this make more columns.
LEGEND_ROWS = 8
#: Height of one entry of pyqtgraph's legend (8 pt labels, -6 px spacing), in pixels.
LEGEND_ROW_HEIGHT = 17.0
#: Above this many curves a plot's legend is a :class:`~gui.legend.CompactLegend` (one item naming
#: every line) instead of pyqtgraph's, whose two widgets per entry cost ~55 KB each.
COMPACT_LEGEND_ABOVE = 32


@dataclass(frozen=True)
class PlotSpec:
    """What one plot shows: ``scope/<id>/<metric>`` series (the second metric drawn dotted)."""

    key: str
    title: str
    scope: str  # "replica" (x = step) or "task" (x = wall time)
    metrics: tuple[str, ...]
    unit: str = ""
    scale: float = 1.0
    smooth: bool = True
    total: bool = False
    compare: bool = True
    skip_first: bool = False  # the first step includes tracing the step function: not drawn
    robust_y: bool = False  # y range from the 99th percentile, so warm-up spikes do not flatten the curve
    validation: bool = False  # also the validation series of the metric (``eval/<metric>``), dashed


PLOTS = (
    PlotSpec("loss", "Loss per replica", "replica", ("loss",), validation=True),
    PlotSpec("throughput", "Examples/s", "replica", ("examples_per_sec",), "examples/s", total=True,
             skip_first=True),
    PlotSpec("step_time", "Step time", "replica", ("step_time",), "ms", scale=1000.0, skip_first=True,
             robust_y=True),
    PlotSpec("utilisation", "CPU / GPU use per task", "task", ("cpu_percent", "gpu_util"), "%",
             smooth=False, compare=False),
    PlotSpec("memory", "Memory per task (RSS / GPU)", "task", ("rss_bytes", "gpu_mem_bytes"), "MiB",
             scale=1 / 2**20, smooth=False, compare=False),
)

#: How far along the curve palette an overlaid run's colours start (the shown run's replicas keep theirs).
COMPARE_SHIFT = 4
NO_CURVES_HINT = "No curves yet: run the config (F5) or open a run folder."
COMPARE_PREFIX = "cmp:"  # the curves (and kept state) of an overlaid run: cmp:<label>:<series>
SECONDARY_LABEL = {"gpu_util": "GPU", "gpu_mem_bytes": "GPU"}


def ema(y: np.ndarray, weight: float, start: int = 0, prev: np.ndarray | None = None) -> np.ndarray:
    """Exponential moving average (TensorBoard-style weight in [0, 1)), extending ``prev`` from ``start``."""
    out = np.empty_like(y)
    if start and prev is not None:
        out[:start] = prev[:start]
    last = out[start - 1] if start else (y[0] if len(y) else 0.0)
    w, a = weight, 1.0 - weight
    for i in range(start, len(y)):
        last = w * last + a * y[i]
        out[i] = last
    return out


def _natural(key: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _nice_ceiling(value: float) -> float:
    """The next of 1, 1.5, 2, 3, 5, 7.5 x 10^k at or above ``value``."""
    exp = 10.0 ** np.floor(np.log10(value))
    for step in (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0):
        if step * exp >= value:
            return float(step * exp)
    return float(10.0 * exp)


def _ema_from(y: np.ndarray, weight: float, state: float) -> np.ndarray:
    """EMA of ``y`` (float64) continued from ``state`` (the smoothed value before ``y[0]``), vectorised:
    blocks of :data:`EMA_BLOCK` points are smoothed from zero by one matrix product, then each block
    gets what the state before it adds (one step per block). Falls back to the plain loop where a
    point is not finite (a NaN smooths to NaN from there on, as the loop does)."""
    n = len(y)
    w, a = weight, 1.0 - weight
    if n <= 32 or not np.isfinite(y).all():
        out = np.empty(n)
        last = state
        for i, v in enumerate(y.tolist()):
            last = w * last + a * v
            out[i] = last
        return out
    size = EMA_BLOCK
    m = -(-n // size)
    padded = np.zeros(m * size)
    padded[:n] = y
    local = padded.reshape(m, size) @ _ema_matrix(weight).T  # each block smoothed from a zero state
    states = np.empty(m)
    carry = w**size
    last = state
    ends = local[:, -1].tolist()
    for j in range(m):
        states[j] = last
        last = ends[j] + carry * last
    out = local + states[:, None] * (w ** np.arange(1, size + 1))[None, :]
    return out.reshape(-1)[:n]


@functools.lru_cache(maxsize=16)
def _ema_matrix(weight: float) -> np.ndarray:
    """``M[i, k] = (1 - w) * w**(i - k)`` for ``k <= i``, else 0: one block's EMA from a zero state."""
    k = np.arange(EMA_BLOCK)
    lag = k[:, None] - k[None, :]
    return np.where(lag >= 0, (1.0 - weight) * weight ** np.maximum(lag, 0), 0.0)


class _Summary:
    """What a curve keeps of its points for drawing, besides the history's own arrays: the min and
    max of each block of :data:`SUMMARY_BLOCK` drawn (smoothed) points, and the smoothing's state
    every :data:`CHECKPOINT` points, from which any stretch of the smoothed curve is made again
    from the history's points at the cost of its length. Extended by each frame's new points only.

    No smoothed copy of the curve is kept: a frame smooths its new points, a full draw smooths
    only the stretches it shows at full resolution (a zoom, the last block). ~0.3 bytes per point.
    """

    __slots__ = ("weight", "n", "last", "lo", "hi", "marks", "plo", "phi")

    def __init__(self, weight: float) -> None:
        self.weight = weight  # 0: drawn as recorded
        self.n = 0  # points summarised
        self.last = math.nan  # the smoothed value of point n - 1
        self.lo = np.empty(64, dtype=np.float32)  # per full block
        self.hi = np.empty(64, dtype=np.float32)
        self.marks = np.empty(16)  # marks[j]: the smoothed value before point j * CHECKPOINT
        self.plo = self.phi = math.nan  # min and max of the partial block at the end

    @property
    def blocks(self) -> int:
        return self.n // SUMMARY_BLOCK

    def values(self, y: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """The drawn (smoothed) values of points ``[i0, i1)`` (``i1 <= n``), float64."""
        if i1 <= i0:
            return np.empty(0)
        if not self.weight:
            return y[i0:i1].astype(np.float64)
        j = i0 // CHECKPOINT
        start = j * CHECKPOINT
        return _ema_from(y[start:i1], self.weight, float(self.marks[j]))[i0 - start:]

    def extend(self, y: np.ndarray) -> np.ndarray:
        """Summarise the points from ``n`` to ``len(y)``; their drawn values."""
        n, end = self.n, len(y)
        if end <= n:
            return np.empty(0)
        if self.weight:
            if n == 0:
                self.last = float(y[0])  # the EMA starts at the first point
            # the states at the checkpoints this stretch passes
            new = _ema_from(y[n:end], self.weight, self.last)
            first, last_mark = -(-n // CHECKPOINT), (end - 1) // CHECKPOINT
            if last_mark >= first:
                if last_mark >= len(self.marks):
                    self.marks = _grown_to(self.marks, last_mark + 1, first)
                for j in range(first, last_mark + 1):
                    self.marks[j] = self.last if j * CHECKPOINT == n else new[j * CHECKPOINT - n - 1]
        else:
            new = y[n:end].astype(np.float64)
        self.last = float(new[-1])
        # blocks: finish the partial one, add the full ones, start the next
        size = SUMMARY_BLOCK
        done = n // size
        full = end // size
        head = min(end, (done + 1) * size) - n  # points of ``new`` that belong to block ``done``
        part = new[:head]
        if head <= 8:  # a frame's few points: plain floats beat numpy's per-call cost
            values = part.tolist()
            lo = hi = values[0]
            for v in values:
                if v != v:
                    lo = hi = math.nan  # NaN propagates, as a block's min/max do
                    break
                lo, hi = min(lo, v), max(hi, v)
        else:
            lo, hi = float(part.min()), float(part.max())
        if n % size:  # the block's earlier points
            lo = math.nan if lo != lo or self.plo != self.plo else min(lo, self.plo)
            hi = math.nan if hi != hi or self.phi != self.phi else max(hi, self.phi)
        if full > done:
            if full > len(self.lo):
                self.lo = _grown_to(self.lo, full, done)
                self.hi = _grown_to(self.hi, full, done)
            self.lo[done], self.hi[done] = lo, hi
            rest = new[head: head + (full - done - 1) * size].reshape(-1, size)
            if len(rest):
                self.lo[done + 1: full] = rest.min(axis=1)
                self.hi[done + 1: full] = rest.max(axis=1)
            tail = new[head + (full - done - 1) * size:]
            self.plo, self.phi = (float(tail.min()), float(tail.max())) if len(tail) else (math.nan, math.nan)
        else:
            self.plo, self.phi = lo, hi
        self.n = end
        return new

    def rewind(self, y: np.ndarray, k: int) -> None:
        """Points from ``k`` on changed: forget what was summarised of them (extend redoes it)."""
        if k >= self.n:
            return
        if k <= 0:
            self.__init__(self.weight)  # type: ignore[misc]
            return
        start = (k // SUMMARY_BLOCK) * SUMMARY_BLOCK  # from the start of its block
        self.last = float(self.values(y, start - 1, start)[0]) if start else math.nan
        self.n = start
        self.plo = self.phi = math.nan

    def bounds(self) -> tuple[float, float]:
        """Lowest and highest finite drawn value."""
        k, partial = self.blocks, self.n % SUMMARY_BLOCK != 0
        lo = finite_range(np.append(self.lo[:k], self.plo) if partial else self.lo[:k])[0]
        hi = finite_range(np.append(self.hi[:k], self.phi) if partial else self.hi[:k])[1]
        return lo, hi

    def peaks(self, size: int, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
        """Min and max of blocks ``[b0, b1)`` of ``size`` points (a multiple of SUMMARY_BLOCK)."""
        g = size // SUMMARY_BLOCK
        lo = self.lo[b0 * g: b1 * g].reshape(-1, g).min(axis=1)
        hi = self.hi[b0 * g: b1 * g].reshape(-1, g).max(axis=1)
        return lo, hi

    def sample(self, most: int = 512) -> np.ndarray:
        """Up to ~``most`` block maxima, evenly spread, and the latest drawn values (a robust y range)."""
        hi = self.hi[: self.blocks]
        return np.concatenate([hi[:: max(1, len(hi) // most)], [self.phi, self.plo, self.last]])


def _grown_to(a: np.ndarray, n: int, keep: int) -> np.ndarray:
    """``a`` with room for at least ``n`` items (a quarter more), its first ``keep`` kept."""
    b = np.empty(n + n // 4 + 64, dtype=a.dtype)
    b[:keep] = a[:keep]
    return b


class _RawCurves:
    """Curve key -> its unsmoothed (x, y) as shown; kept as the history's arrays, offset and scaled on access."""

    def __init__(self) -> None:
        self._d: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}

    def put(self, key: str, x: np.ndarray, y: np.ndarray, x_offset: float, scale: float) -> None:
        self._d[key] = (x, y, x_offset, scale)

    def __getitem__(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        x, y, off, scale = self._d[key]
        return (x - off if off else x), (y * scale if scale != 1.0 else y)

    def get(self, key: str, default: object = None) -> object:
        return self[key] if key in self._d else default

    def length(self, key: str) -> int:
        entry = self._d.get(key)
        return 0 if entry is None else len(entry[0])

    def pop(self, key: str, default: object = None) -> object:
        return self._d.pop(key, default)

    def clear(self) -> None:
        self._d.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __iter__(self):  # noqa: ANN204
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class _Source:
    """The points behind one curve: x and y as recorded (the history's arrays), before offset, smoothing
    and scale, and the curve's :class:`_Summary`.

    ``signature``: what the points given to :meth:`MetricPlot.set_curve` last were (unchanged: nothing
    to do); ``shape``: what every drawn point depends on (unchanged: new points are appended)."""

    __slots__ = ("x", "y", "offset", "summary", "shape", "signature", "shown")

    def __init__(self, x: np.ndarray, y: np.ndarray, offset: float, summary: _Summary, shape: tuple[object, ...],
                 signature: tuple[float, ...]) -> None:
        self.x, self.y = x, y
        self.offset, self.summary, self.shape, self.signature = offset, summary, shape, signature
        self.shown: tuple[tuple[object, ...], tuple[np.ndarray, np.ndarray]] | None = None


class MetricPlot(QWidget):
    """One pyqtgraph plot with a title bar, a legend (click an entry to hide its curve) and exports."""

    viewChanged = Signal()
    exported = Signal(str)  # a file was written: what to tell the user (the status bar)

    def __init__(self, spec: PlotSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        self.export_note = ""  # what the exported PNG's title adds to the plot's (the run shown)
        self.setObjectName(f"plot-{spec.key}")
        self.title = QLabel(f"<b>{spec.title}</b>")
        self.title.setToolTip(f"{spec.title}; click a legend entry to hide or show its curve")
        self.png_button = QToolButton()
        self.png_button.setText("PNG")
        self.png_button.setToolTip(f"Export the “{spec.title}” plot as a PNG image")
        self.csv_button = QToolButton()
        self.csv_button.setText("CSV")
        self.csv_button.setToolTip(f"Export the data of the “{spec.title}” plot as CSV (curve, x, y)")
        self.log_button = QToolButton()
        self.log_button.setText("log")
        self.log_button.setObjectName(f"log-{spec.key}")
        self.log_button.setCheckable(True)
        self.log_button.setToolTip(f"Logarithmic y axis for the “{spec.title}” plot")
        header = self.header = QHBoxLayout()
        header.setContentsMargins(4, 0, 4, 0)
        header.addWidget(self.title, 1)
        header.addWidget(self.log_button)
        header.addWidget(self.png_button)
        header.addWidget(self.csv_button)
        self.widget = pg.PlotWidget()
        self.item: pg.PlotItem = self.widget.getPlotItem()
        # no pyqtgraph clipping or downsampling: set_curve hands each curve only what the view shows
        self.item.showGrid(x=True, y=True, alpha=0.25)
        for name in ("left", "bottom"):
            # grid lines at the labelled ticks only: the minor levels' lines made painting a plot ~5x slower
            self.item.getAxis(name).setStyle(maxTickLevel=0)
        self.item.setMenuEnabled(True)
        self._trim_menu()
        self.item.getViewBox().setMouseEnabled(x=True, y=True)
        self.item.setLabel("left", spec.unit or None)
        # the legend sits beside the plot, never on its curves
        self.legend = ToggleLegend(labelTextSize="8pt", verSpacing=-6)
        self.legend.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.item.layout.addItem(self.legend, 2, 3)
        self.item.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignTop)
        # the legend and its entries are drawn from a cache: repainted only when they change, not at
        # every frame that draws the lines under them
        self.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        # many curves: one item names them all (in the legend's place while there are that many)
        self.compact_legend = CompactLegend()
        self.compact_legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._compact = False
        self._compact_fit: tuple[float, float] = (0.0, 0.0)
        self._legend_font = QFont()
        self._legend_font.setPointSizeF(8.0)
        self._legend_size = (0, 0)
        self._legend_keys: list[str] = []  # the legend's entries, in order
        self._ranks: dict[str, tuple[object, ...]] = {}  # curve -> its place in the legend
        # every line of the plot is one item, drawn incrementally (see gui.curves)
        self.lines = CurveSet()
        self.item.addItem(self.lines)
        self.curves: dict[str, Curve] = self.lines.curves
        self._sources: dict[str, _Source] = {}
        self.lines.on_log_mode = self._log_mode_changed
        self.empty_note = pg.TextItem("no data yet", anchor=(0, 0))
        self.empty_note.setColor(self.palette().color(QPalette.ColorRole.PlaceholderText))
        self._shown_empty: bool | None = None
        self._short_legend = False
        self._x_label: str | None = None
        self._owners: dict[str, tuple[History, int, list[str]]] = {}
        self.raw = _RawCurves()  # curve -> unsmoothed (x, y) as shown (offset and scale applied on access)
        #: set: what the CSV export writes instead of the drawn curves, ``(curve, x, y)`` per series
        self.csv_source: Callable[[], Iterable[tuple[str, np.ndarray, np.ndarray]]] | None = None
        self._summaries: dict[str, _Summary] = {}  # curve -> min/max per block of its drawn points
        self._view_cache: tuple[tuple[float, float] | None, int] | None = None
        self._view_key: tuple[float, ...] = ()
        self.labels: dict[str, str] = {}
        self._totals: dict[str, tuple[str, int, float, np.ndarray, tuple[str, ...]]] = {}  # run prefix -> (base, final n, x, total)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.setSpacing(0)
        self.robust = spec.robust_y
        # the plot follows its data itself, in coarse steps (see follow_data): pyqtgraph's auto-range
        # moves the view every frame, and a moved view makes every curve and axis redo their geometry
        self.following = True
        self.item.getViewBox().disableAutoRange()
        self.item.getViewBox().sigRangeChangedManually.connect(self._user_range)
        self.item.getViewBox().sigXRangeChanged.connect(self._view_moved)
        self.item.getViewBox().sigResized.connect(self._view_moved)
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

    def _trim_menu(self) -> None:
        """pyqtgraph's "Plot Options" offer transforms and downsampling made for its own data items:
        only those that apply to these plots stay (log x / log y and the grid)."""
        ctrl = self.item.ctrl
        for check in (ctrl.fftCheck, ctrl.derivativeCheck, ctrl.phasemapCheck):
            check.hide()
        for action in self.item.ctrlMenu.actions():
            if action.text() in ("Downsample", "Average", "Alpha", "Points"):
                self.item.ctrlMenu.removeAction(action)

    def _log_mode_changed(self) -> None:
        """Log x or y was switched: every curve's points are given again in the new coordinates, at
        once (pyqtgraph fits the range to the curves' bounds right after)."""
        self.robust = self.spec.robust_y and not self.lines.log[1]
        self.log_button.blockSignals(True)
        self.log_button.setChecked(self.lines.log[1])  # (also when set from the plot's menu)
        self.log_button.blockSignals(False)
        for name in ("left", "bottom"):  # on a log axis the 2..9 ticks too, where a decade is wide
            self.item.getAxis(name).setStyle(maxTickLevel=1 if self.lines.log[name == "left"] else 0)
        self.hover.hide()
        for key, src in self._sources.items():
            curve = self.curves.get(key)
            src.shown = None
            if curve is not None:
                curve.set_source(functools.partial(self._display, key), self._bounds(src))
        self.viewChanged.emit()

    def _bounds(self, src: _Source) -> list[float]:
        """x lo, x hi, y lo, y hi of a source's points in the view's coordinates."""
        x, offset, scale = src.x, src.offset, self.spec.scale
        if any(self.lines.log):
            y = src.summary.values(src.y, 0, len(src.x))
            (x, y), offset, scale = self._screen(x - offset, y * scale), 0.0, 1.0
            (x_lo, x_hi), (y_lo, y_hi) = finite_range(x), finite_range(y)
        else:
            (x_lo, x_hi), (y_lo, y_hi) = finite_range(x), src.summary.bounds()
        return [x_lo - offset, x_hi - offset, y_lo * scale, y_hi * scale]

    def screen_points(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points (as :attr:`raw` holds them) in the view's coordinates."""
        return self._screen(x, y)

    @property
    def x_label(self) -> str | None:
        return self._x_label

    def _screen(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points in the view's coordinates: log10 on a logarithmic axis (no point where <= 0)."""
        log_x, log_y = self.lines.log
        if log_x or log_y:
            with np.errstate(divide="ignore", invalid="ignore"):
                if log_x:
                    x = np.log10(np.where(x > 0, x, np.nan))
                if log_y:
                    y = np.log10(np.where(y > 0, y, np.nan))
        return x, y

    # ------------------------------------------------------------------ theme

    def apply_theme(self) -> None:
        pal = self.palette()
        self.widget.setBackground(pal.color(QPalette.ColorRole.Base))
        text = pal.color(QPalette.ColorRole.Text)
        for name in ("left", "bottom"):
            axis = self.item.getAxis(name)
            axis.setPen(pg.mkPen(pal.color(QPalette.ColorRole.Mid)))
            axis.setTextPen(pg.mkPen(text))
        self.legend.setLabelTextColor(text)
        self.compact_legend.set_text_color(text)
        for _sample, label in self.legend.items:  # entries drawn before the switch take the new colour
            label.setText(label.text, color=text)
            label.update()
        self.legend.update()
        self._empty_axes()

    def show_spec(self, spec: PlotSpec) -> None:
        """Show another figure (the metric chooser's choice): its curves start again."""
        if spec == self.spec:
            return
        self.spec = spec
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
        self.lines.clear()
        self._owners.clear()
        self.legend.clear()
        self.compact_legend.clear()
        self._legend_keys = []
        self._ranks.clear()
        self._choose_legend()
        self._fit_legend()
        self._empty_axes()
        self._sources.clear()
        self.raw.clear()
        self.labels.clear()
        self._totals.clear()
        self._summaries.clear()

    def _curve(self, key: str, label: str, color: str, style: Qt.PenStyle = Qt.PenStyle.SolidLine,
               width: float = 1.6, rank: tuple[object, ...] = ()) -> Curve:
        curve = self.curves.get(key)
        if curve is None:
            thin = len(self.curves) >= THIN_ABOVE
            on_top = key.startswith(COMPARE_PREFIX)  # an overlaid run is drawn over the shown one's lines
            curve = self.lines.add(key, pg.mkPen(color, width=1.0 if thin else width, style=style), label,
                                   on_top=on_top)
            self.labels[key] = label
            self._ranks[key] = (on_top, *rank) if rank else (on_top, len(self._ranks))
            if not self._choose_legend():  # (a legend made again holds every curve already)
                self._legend_add(curve, label)
            self._fit_legend()
            self._empty_axes()
            if len(self.curves) == THIN_ABOVE + 1:
                for other in self.curves.values():
                    pen = pg.mkPen(other.pen())
                    pen.setWidthF(1.0)
                    other.setPen(pen)
        return curve

    def _legend_add(self, curve: Curve, label: str) -> None:
        """An entry for ``curve``: at its place in the run's one order (the shown run's entries
        first, each run's replicas or tasks in order, then its validation and total)."""
        rank = self._ranks.get(curve.key, ())
        if self._legend_keys and rank < self._ranks.get(self._legend_keys[-1], ()):
            self._rebuild_legend()
            return
        self._legend_keys.append(curve.key)
        if self._compact:
            self.compact_legend.add(curve, short_label(label), label)
            return
        self.legend.addItem(curve, short_label(label) if self._short_legend else label)
        sample, text = self.legend.items[-1]
        for entry in (sample, text, text.item):  # drawn from a cache, as the legend itself
            entry.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

    def _rebuild_legend(self) -> None:
        """Every entry again, in rank order."""
        (self.compact_legend if self._compact else self.legend).clear()
        self._legend_keys = []
        for key in sorted(self.curves, key=lambda k: self._ranks.get(k, ())):
            self._legend_add(self.curves[key], self.labels.get(key, key))

    def _choose_legend(self) -> bool:
        """pyqtgraph's legend for up to :data:`COMPACT_LEGEND_ABOVE` curves, the compact one above; True
        when it switched (the legend shown was made again from every curve)."""
        compact = len(self.curves) > COMPACT_LEGEND_ABOVE or not self._legend_fits()
        if compact == self._compact:
            return False
        self._compact = compact
        layout = self.item.layout
        old, new = (self.legend, self.compact_legend) if compact else (self.compact_legend, self.legend)
        old.clear()  # (pyqtgraph's: its entries' widgets go)
        layout.removeItem(old)
        old.hide()
        layout.addItem(new, 2, 3)
        layout.setAlignment(new, Qt.AlignmentFlag.AlignTop)
        new.show()
        self._rebuild_legend()
        self._compact_fit = (0.0, 0.0)
        return True

    def _legend_room(self) -> tuple[float, float]:
        """Width and height the legend may take beside the plot: half the width, and the height of
        the plot area above the x axis (never more: a taller legend pushes the axis out of sight)."""
        axis = self.item.getAxis("bottom")
        height = self.widget.height() - max(axis.height(), 36.0) - 22  # (the legend's own margins)
        return max(60.0, self.width() * 0.5), max(20.0, height)

    def _legend_rows(self) -> int:
        """How many entries of pyqtgraph's legend fit one above the other."""
        return max(1, int(self._legend_room()[1] // LEGEND_ROW_HEIGHT))

    def _legend_fits(self) -> bool:
        """True when pyqtgraph's legend can show every entry in the room it has (in columns); else
        the compact legend, which scrolls, names them."""
        n = len(self.curves)
        if n <= 1 or not self.isVisible():
            return True
        labels = [self.labels.get(k, k) for k in self.curves]
        if n > LEGEND_ROWS:
            labels = [short_label(x) for x in labels]
        metrics = QFontMetricsF(self._legend_font)
        entry = max(metrics.horizontalAdvance(x) for x in labels) + 30
        columns = math.ceil(n / self._legend_rows())
        return columns * entry <= self._legend_room()[0]

    def _fit_legend(self) -> None:
        """Many curves make more columns (a compact block, not a column taller than the plot); the
        legend is sized to its entries (pyqtgraph sizes it from its entries' last geometry, which
        keeps it stretched once it was)."""
        if self._compact:  # the compact legend takes at most half of the plot's width and its height
            size = self._legend_room()
            if size != self._compact_fit:
                self._compact_fit = size
                self.compact_legend.fit(*size)
            return
        short = len(self.curves) > LEGEND_ROWS
        if short != self._short_legend:  # many entries: "r3" for "replica 3", so more columns fit
            self._short_legend = short
            names = {id(curve): self.labels.get(key, "") for key, curve in self.curves.items()}
            for sample, label in self.legend.items:
                full = names.get(id(sample.item), label.text)
                label.setText(short_label(full) if short else full)
        columns = max(1, math.ceil(len(self.curves) / min(LEGEND_ROWS, self._legend_rows())))
        if columns > 1:  # the legend takes at most about half of the plot's width
            entry = max(label.preferredWidth() for _, label in self.legend.items) + 26
            columns = max(1, min(columns, int(max(entry, self.width() * 0.5) // entry)))
        if columns != self.legend.columnCount:
            self.legend.setColumnCount(columns)
        layout = self.legend.layout
        layout.invalidate()
        layout.activate()
        hint = layout.effectiveSizeHint(Qt.SizeHint.PreferredSize)
        if not self.curves:
            hint.setWidth(0)
            hint.setHeight(0)
        self.legend.setMinimumSize(hint)
        self.legend.setMaximumSize(hint)
        self.legend.setPreferredSize(hint)

    def owners(self, history: History, run: str = "") -> list[str]:
        """The replicas or tasks with a series this plot shows, in natural order (computed again
        only when the history gained series)."""
        cached = self._owners.get(run)
        if cached is not None and cached[0] is history and cached[1] == len(history.series):
            return cached[2]
        spec = self.spec
        owners = sorted({k.split("/")[1] for k in history.series
                         if k.startswith(spec.scope + "/") and k.rsplit("/", 1)[-1] in spec.metrics}, key=_natural)
        self._owners[run] = (history, len(history.series), owners)
        return owners

    def forget_runs(self, prefix: str) -> None:
        """Remove the curves whose key starts with ``prefix`` (an overlaid run's) and what was
        kept of those runs for drawing (their owners, their totals)."""
        for key in [k for k in self.curves if k.startswith(prefix)]:
            self.remove_curve(key)
        for cache in (self._owners, self._totals):
            for run in [k for k in cache if k.startswith(prefix)]:
                del cache[run]

    def total(self, run: str, series: list[tuple[str, np.ndarray, np.ndarray]]
              ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The sum of one run's ``series`` (see :func:`_total`), extended from what this plot kept of
        that run's last sum: ``(base x, total, stable, final)``."""
        return _total(self._totals, run, series)

    def remove_curve(self, key: str) -> None:
        curve = self.lines.remove(key)
        self.labels.pop(key, None)
        self._ranks.pop(key, None)
        if key in self._legend_keys:
            self._legend_keys.remove(key)
        if curve is not None:
            if self._compact:
                self.compact_legend.remove(curve)
            else:
                self.legend.removeItem(curve)
            self._choose_legend()
            self._fit_legend()
            self._empty_axes()
        self.raw.pop(key, None)
        self._summaries.pop(key, None)
        self._sources.pop(key, None)

    def set_curve(self, key: str, label: str, color: str, x: np.ndarray, y: np.ndarray, smoothing: float,
                  style: Qt.PenStyle = Qt.PenStyle.SolidLine, width: float = 1.6, *, x_offset: float = 0.0,
                  stable: int | None = None, rank: tuple[object, ...] = ()) -> None:
        """Show ``(x - x_offset, y * scale)``: ~2 points per horizontal pixel of the view (each block's
        min and max, from summaries kept incrementally), or every point in view when fewer.

        ``stable``: how many leading points are unchanged since the last call (default: all that were
        there; the history only grows)."""
        curve = self._curve(key, label, color, style, width, rank)
        n = len(x)
        x_range, pixels = self._view()
        # a curve whose points and view did not change is not touched
        signature = (n, float(x[0]) if n else 0.0, float(x[-1]) if n else 0.0, float(y[-1]) if n else 0.0,
                     smoothing, x_offset, pixels, *(x_range or ()))
        src = self._sources.get(key)
        if src is not None and src.signature == signature:
            return
        scale = self.spec.scale
        self.raw.put(key, x, y, x_offset, scale)
        if self.spec.skip_first:  # also while it is the only point: it must not seed the smoothing
            x, y = x[1:], y[1:]
            stable = None if stable is None else max(0, stable - 1)
        m = min(len(x), len(y))
        weight = smoothing if self.spec.smooth and smoothing > 0 else 0.0
        summary = self._summaries.get(key)
        if summary is None or summary.weight != weight or summary.n > m:
            summary = self._summaries[key] = _Summary(weight)
        elif stable is not None:
            summary.rewind(y, stable)  # the points from ``stable`` on changed (the "total" curve)
        old, joint = summary.n, summary.last
        new = summary.extend(y[:m])
        shape = (float(x[0]) if m else math.nan, x_offset, weight, pixels, x_range)
        if src is not None and src.shape == shape and src.summary is summary and 0 < len(src.x) == old:
            # the curve grew at its end: only its new segments are drawn (from the last point it had)
            src.x, src.y, src.signature = x, y, signature
            if len(new):
                xs = x[old - 1:m] - x_offset if x_offset else x[old - 1:m]
                ys = np.empty(len(new) + 1)
                ys[0], ys[1:] = joint, new
                curve.append(*self._screen(xs, ys * scale if scale != 1.0 else ys))
            return
        src = self._sources[key] = _Source(x[:m], y[:m], x_offset, summary, shape, signature)
        curve.set_source(functools.partial(self._display, key), self._bounds(src))

    def _display(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """What the curve draws for the current view: ~2 points per horizontal pixel (each block's
        min and max), or every point in view when fewer; offset and scaled."""
        src = self._sources.get(key)
        if src is None:
            return np.empty(0), np.empty(0)
        x_range, pixels = self._view()
        view = (len(src.x), pixels, x_range)
        if src.shown is not None and src.shown[0] == view:
            return src.shown[1]
        xd, yd = self._decimate(src, x_range, pixels)
        if src.offset:
            xd = xd - src.offset
        if self.spec.scale != 1.0:
            yd = yd * self.spec.scale
        xd, yd = self._screen(xd, yd)
        src.shown = (view, (xd, yd))
        return xd, yd

    def _view(self) -> tuple[tuple[float, float] | None, int]:
        """The shown x range (None while x follows the data) and the plot's width in pixels (asked of
        the view once, then again after it moved, was resized or given to the user)."""
        if self._view_cache is None:
            self._view_cache = self._ask_view()
        return self._view_cache

    def _ask_view(self) -> tuple[tuple[float, float] | None, int]:
        vb = self.item.getViewBox()
        pixels = int(vb.width()) or 800
        if self.following or vb.autoRangeEnabled()[0]:
            return None, pixels
        lo, hi = vb.viewRange()[0]
        if self.lines.log[0]:  # the view is in log10 of x
            lo, hi = 10.0 ** min(lo, 300.0), 10.0 ** min(hi, 300.0)
        return (float(lo), float(hi)), pixels

    def _view_moved(self, *_args: object) -> None:
        """The user's x range or the plot's width changed: curves are cut again at the next redraw."""
        self._view_cache = None
        size = (self.width(), self.widget.height())
        if size != self._legend_size:  # the plot was resized: its legend fits the new room
            self._legend_size = size
            self._choose_legend()
            self._fit_legend()
        x_range, pixels = self._view()
        key = (pixels, *(x_range or ()))
        if key != self._view_key:
            self._view_key = key
            self.viewChanged.emit()

    def _decimate(self, src: _Source, x_range: tuple[float, float] | None,
                  pixels: int) -> tuple[np.ndarray, np.ndarray]:
        x, y, summary = src.x, src.y, src.summary
        n = min(len(x), summary.n)
        i0, i1 = 0, n
        if x_range is not None and n:
            i0 = max(0, int(np.searchsorted(x[:n], x_range[0] + src.offset, side="left")) - 1)
            i1 = min(n, int(np.searchsorted(x[:n], x_range[1] + src.offset, side="right")) + 1)
        blocks = max(1, int(pixels / PIXELS_PER_BLOCK))
        if i1 - i0 <= 2 * blocks:
            return x[i0:i1].astype(np.float64), summary.values(y, i0, i1)
        size = 1 << int(np.ceil(np.log2((i1 - i0) / blocks)))
        b0, b1 = i0 // size, i1 // size
        if size >= SUMMARY_BLOCK:
            lo, hi = summary.peaks(size, b0, b1)
        else:  # zoomed in: few enough points to smooth those in view again
            block = summary.values(y, b0 * size, b1 * size).reshape(-1, size)
            lo, hi = block.min(axis=1), block.max(axis=1)
        m = b1 - b0
        xd = np.empty(2 * m + (i1 - b1 * size))
        yd = np.empty_like(xd)
        xd[: 2 * m : 2] = xd[1 : 2 * m : 2] = x[b0 * size : b1 * size : size]
        yd[: 2 * m : 2] = lo
        yd[1 : 2 * m : 2] = hi
        xd[2 * m :] = x[b1 * size : i1]
        yd[2 * m :] = summary.values(y, b1 * size, i1)
        return xd, yd

    def _user_range(self, *_args: object) -> None:
        self.robust = False  # the user zoomed: leave the range alone
        self.following = False
        self._view_cache = None

    def follow_data(self) -> None:
        """Keep every point in view, moving the view only when the data leaves it or fills
        less than half of it (x grows by a quarter ahead): most frames leave it alone."""
        vb = self.item.getViewBox()
        if vb.autoRangeEnabled()[0] or vb.autoRangeEnabled()[1]:
            # the user asked for auto-range (the plot's "A" button): follow the data again
            vb.disableAutoRange()
            self.following = True
            self.robust = self.spec.robust_y and not self.lines.log[1]
            self._view_cache = None
            self._view_moved()
        if not self.following:
            return
        bounds = [c.bounds for c in self.curves.values() if c.isVisible() and c.source is not None]
        lo = min((b[0] for b in bounds), default=math.inf)
        hi = max((b[1] for b in bounds), default=-math.inf)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return
        (x0, x1), (y0, y1) = vb.viewRange()
        span = max(hi - lo, 1e-9)
        if hi > x1 or lo < x0 or span < 0.5 * (x1 - x0):
            vb.setXRange(lo, lo + span * 1.25, padding=0)
        if self.robust:
            return  # fit_robust_y keeps y
        ylo = min(b[2] for b in bounds)
        yhi = max(b[3] for b in bounds)
        if not (math.isfinite(ylo) and math.isfinite(yhi)):
            return
        yspan = max(yhi - ylo, abs(yhi) * 1e-3, 1e-12)
        if yhi > y1 or ylo < y0 or yspan < 0.5 * (y1 - y0):
            vb.setYRange(ylo - 0.05 * yspan, yhi + 0.15 * yspan, padding=0)

    def fit_robust_y(self) -> None:
        """Y from 0 to a little above the 99th percentile of the shown points."""
        if not self.robust or self.lines.log[1]:
            return
        samples = [src.summary.sample() for key, src in self._sources.items()
                   if src.summary.n and self.curves[key].isVisible()]
        if not samples:
            return
        # an even sample of at most ~512 block maxima per curve, and each curve's latest values: the
        # percentile of hours of points would cost a frame
        values = np.concatenate(samples)
        values = values[np.isfinite(values)]
        if not len(values):
            return
        top = float(np.percentile(values, 99)) * self.spec.scale * 1.3
        if not (top > 0 and np.isfinite(top)):
            return
        # move the range only when the data leaves it or shrinks well inside it: a view that changes
        # every frame makes every curve recompute its bounds and every axis re-render at each paint
        current = self.item.getViewBox().viewRange()[1][1]
        if current <= 0 or top > current or top < 0.6 * current:
            self.item.setYRange(0.0, _nice_ceiling(top), padding=0)

    def set_x_label(self, text: str) -> None:
        if text != self._x_label:  # a label set again lays the axis out and repaints it
            self._x_label = text
            self.item.setLabel("bottom", text)

    def points(self, key: str) -> int:
        """Points of one curve (tests and the status line use it)."""
        return self.raw.length(key)

    # ------------------------------------------------------------------ export

    def export_png(self, path: str | Path, width: int = 1200) -> Path:
        """The plot as a PNG ``width`` pixels wide, titled with what it shows (and the run)."""
        title = self.spec.title + (f" — {self.export_note}" if self.export_note else "")
        self.item.setTitle(html.escape(title), size="12pt")  # the window's title bar is not part of the item
        try:
            exporter = pyqtgraph.exporters.ImageExporter(self.item)
            exporter.parameters()["width"] = int(width)
            exporter.export(str(path))
        finally:
            self.item.setTitle(None)
        return Path(path)

    def export_csv(self, path: str | Path) -> Path:
        """Every curve's unsmoothed points: ``curve,x,y`` rows (with :attr:`csv_source`, its series)."""
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["curve", "x", "y"])
            if self.csv_source is not None:
                for label, xs, ys in self.csv_source():
                    w.writerows([label, repr(xi), repr(yi)] for xi, yi in zip(xs.tolist(), ys.tolist(), strict=True))
                return Path(path)
            for key in sorted(self.raw, key=_natural):
                x, y = self.raw[key]
                label = self.labels.get(key, key)
                for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
                    w.writerow([label, repr(xi), repr(yi)])
        return Path(path)

    def _ask_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export {self.spec.title} as PNG", f"{self.spec.key}.png",
                                              "PNG images (*.png)")
        if path:
            self._export(self.export_png, path)

    def _ask_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export {self.spec.title} data as CSV", f"{self.spec.key}.csv",
                                              "CSV files (*.csv)")
        if path:
            self._export(self.export_csv, path)

    def _export(self, fn: object, path: str) -> None:
        try:
            fn(path)  # type: ignore[operator]
        except OSError as exc:
            QMessageBox.warning(self, "Export failed", f"{path}: cannot be written: {exc.strerror or exc}")
            return
        if not Path(path).is_file():  # pyqtgraph's exporter says nothing when it cannot write
            QMessageBox.warning(self, "Export failed", f"{path}: was not written")
            return
        self.exported.emit(f"Saved “{self.spec.title}” to {path}")


class PlotsPanel(QWidget):
    """All live plots with shared view settings: x axis (step or wall time) and EMA smoothing."""

    redrawn = Signal()
    compareRequested = Signal()  # the user asked to overlay another run (the window asks which)
    exported = Signal(str)  # a plot was saved as PNG or CSV: what to tell the user

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.x_mode = QComboBox()
        self.x_mode.setObjectName("xAxis")
        self.x_mode.addItems(["Step", "Wall time"])
        self.x_mode.setToolTip("X axis of the replica plots: training step, or seconds since the run began")
        self.smoothing = QSlider(Qt.Orientation.Horizontal)
        self.smoothing.setObjectName("smoothing")
        self.smoothing.setRange(0, 99)
        self.smoothing.setValue(60)
        self.smoothing.setFixedWidth(140)
        self.smoothing.setToolTip("Exponential moving average of the replica curves (0: raw points)")
        self.smoothing_label = QLabel()
        self.smoothing_label.setMinimumWidth(32)
        self.compare_button = QPushButton("Compare with run…")
        self.compare_button.setToolTip("Overlay another run's replica curves, dashed")
        self.clear_compare = QPushButton("Clear comparison")
        self.clear_compare.setToolTip("Remove the overlaid runs")
        self.hint = ElidedLabel(NO_CURVES_HINT)
        self.hint.setObjectName("plotsHint")
        self.hint.setToolTip("Curves appear as soon as the replicas report their first steps")
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(QLabel("X axis"))
        bar.addWidget(self.x_mode)
        bar.addSpacing(12)
        bar.addWidget(QLabel("Smoothing"))
        bar.addWidget(self.smoothing)
        bar.addWidget(self.smoothing_label)
        bar.addSpacing(12)
        bar.addWidget(self.hint, 1)
        bar.addWidget(self.compare_button)
        bar.addWidget(self.clear_compare)
        self.plots: dict[str, MetricPlot] = {spec.key: MetricPlot(spec) for spec in PLOTS}
        # the first plot shows one metric at a time: the loss, or any metric the training reports
        self.metric_chooser = QComboBox()
        self.metric_chooser.setObjectName("metricChooser")
        self.metric_chooser.setToolTip("Which training metric the first plot shows, per replica; its validation "
                               "(held-out examples) is the dashed curve. New metrics are added as the run "
                               "reports them")
        self.metric_chooser.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.metric_chooser.addItem(display_name(LOSS), LOSS)
        self._metric_keys = 0  # history series counted when the chooser's metrics were last listed
        self.loss.header.insertWidget(1, self.metric_chooser)
        self.loss.csv_source = self.csv_series
        self.hint.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
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
        layout.addLayout(bar)
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
        return self.smoothing.value() / 100.0

    @property
    def by_time(self) -> bool:
        return self.x_mode.currentIndex() == 1

    def _settings_changed(self, *_args: object) -> None:
        self.smoothing_label.setText(f"{self.weight:.2f}")
        self._dirty = True
        self.redraw_if_needed()

    @property
    def shown_metric(self) -> str:
        """The metric the first plot shows (a series name: ``loss``, ``accuracy``, ``metric:loss``)."""
        return str(self.metric_chooser.currentData() or LOSS)

    def _metric_chosen(self, *_args: object) -> None:
        metric = self.shown_metric
        self.loss.show_spec(replace(PLOTS[0], title=plot_title(metric), metrics=(metric,)))
        self._dirty = True
        self.redraw_if_needed()

    def _list_metrics(self) -> None:
        """Offer every metric the shown run has reported (checked only when the history gained series)."""
        series = self.session.state.history.series
        if len(series) == self._metric_keys:
            return
        self._metric_keys = len(series)
        names = metric_names(series)
        offered = self._offered()
        if names[: len(offered)] == offered:  # new metrics arrived: added at the end
            for name in names[len(offered):]:
                self.metric_chooser.addItem(display_name(name), name)
        else:  # another run: the list starts again, on the metric shown if that run has it
            shown = self.shown_metric
            self.metric_chooser.blockSignals(True)
            self.metric_chooser.clear()
            for name in names:
                self.metric_chooser.addItem(display_name(name), name)
            self.metric_chooser.setCurrentIndex(max(0, names.index(shown)) if shown in names else 0)
            self.metric_chooser.blockSignals(False)
            self._metric_chosen()

    def _offered(self) -> list[str]:
        return [str(self.metric_chooser.itemData(i)) for i in range(self.metric_chooser.count())]

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
        for plot in self.plots.values():
            plot.clear()
        self._metric_keys = -1
        self._list_metrics()
        self._dirty = True
        self.redraw_if_needed()

    def _comparisons_changed(self) -> None:
        for plot in self.plots.values():
            plot.forget_runs(COMPARE_PREFIX)
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
        if history.version == self._version and not self._dirty:
            return
        self._version = history.version
        self._dirty = False
        self._last_redraw = time.monotonic()
        self.redraw()

    def redraw(self) -> None:
        """Push the latest points of every series into its curve."""
        state = self.session.state
        weight = self.weight
        x_label = "wall time (s)" if self.by_time else "step"
        self._list_metrics()
        for plot in self.plots.values():
            spec = plot.spec
            plot.set_x_label(x_label if spec.scope == "replica" else "wall time (s)")
            self._draw_run(plot, state, "", weight, Qt.PenStyle.SolidLine)
            if spec.compare:
                for n, (label, other) in enumerate(self.session.comparisons.items()):
                    style = (Qt.PenStyle.DashLine, Qt.PenStyle.DashDotLine, Qt.PenStyle.DotLine)[n % 3]
                    self._draw_run(plot, other, label, weight, style, shift=COMPARE_SHIFT * (n + 1))
            plot.fit_robust_y()
            plot.follow_data()
            plot.lines.flush()
        self.clear_compare.setEnabled(bool(self.session.comparisons))
        self._show_hint()
        self.redrawn.emit()

    def _show_hint(self) -> None:
        """The bar's note: how to get curves while there are none, then what trained (the run's
        ``training`` info: optimizer, loss, compiled metrics)."""
        state = self.session.state
        trained = training_text(state) if state.history.series else ""
        if trained:
            self.hint.setText(trained)
            self.hint.setToolTip(f"What trained: {trained}")
        elif not self._no_metrics:
            self.hint.setText(NO_CURVES_HINT)
            self.hint.setToolTip("Curves appear as soon as the replicas report their first steps")
        self.hint.setVisible(bool(trained) or self._no_metrics or not state.history.series)

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
            self.hint.setText("This program reports no metrics (CPU, memory and the log are still shown): "
                              "it sends no step events")
            self.hint.setToolTip("Report steps and metrics from your program through ClusterDeck's reporting "
                                 "API to see them plotted")
        self._show_hint()

    def _xy(self, state: RunState, key: str) -> tuple[np.ndarray, np.ndarray, float]:
        """x as step, or as seconds since the run started (since its first figure when that is unknown):
        the history's own arrays (times as stored: seconds from the series' base) and the offset to
        subtract from x (applied to the drawn points only)."""
        s = state.history.series[key]
        if key.startswith("task/") or self.by_time:
            t0 = state.started_at if state.started_at is not None else (state.history.t0 or 0.0)
            return s.t_rel, s.y, t0 - s.t_base
        return s.x_rel, s.y, 0.0

    def _draw_run(self, plot: MetricPlot, state: RunState, label: str, weight: float, style: Qt.PenStyle,
                  shift: int = 0) -> None:
        """The curves of one run; an overlaid run (``label``) has its own colours (``shift`` along the
        palette) and a short name in the legend."""
        spec = plot.spec
        history = state.history
        prefix = f"{COMPARE_PREFIX}{label}:" if label else ""
        suffix = f" · {short_run_label(label)}" if label else ""
        order = {name: i for i, name in enumerate(state.tasks)}
        owners = plot.owners(history, prefix)
        if spec.scope == "task":  # tasks in the run's order (as the task table lists them), every plot alike
            owners = sorted(owners, key=lambda o: order.get(o, len(order)))
        totals: list[tuple[str, np.ndarray, np.ndarray]] = []
        offset = 0.0
        for n, owner in enumerate(owners):
            for m, metric in enumerate(spec.metrics):
                key = f"{spec.scope}/{owner}/{metric}"
                if key not in history.series or len(history.series[key]) == 0:
                    continue
                x, y, offset = self._xy(state, key)
                if spec.scope != "replica":
                    name = owner
                else:  # the shown run's replicas name their task; an overlaid run's, the run
                    name = f"replica {owner}" if label else replica_label(state, owner)
                if m:
                    name += f" {SECONDARY_LABEL.get(metric, metric)}"
                color = theme.curve_color((int(owner) if owner.isdigit() else order.get(owner, n)) + shift)
                pen_style = Qt.PenStyle.DotLine if m and not label else style
                plot.set_curve(prefix + key, name + suffix, color, x, y, weight, pen_style, x_offset=offset,
                               rank=(label, 0, n, m))
                if spec.total and m == 0:
                    totals.append((key, x, y))
        if spec.validation:
            self._draw_validation(plot, state, prefix, suffix, shift)
        if spec.total and len(totals) > 1:
            # drawn where every replica has reported: past that the sum would still change
            base_x, total, stable, final = plot.total(prefix, totals)
            plot.set_curve(prefix + "total", "total" + suffix, "#888888" if not label else "#aaaaaa",
                           base_x[:final], total[:final], weight, style, width=2.2, x_offset=offset,
                           stable=stable, rank=(label, 2, 0, 0))


    def _draw_validation(self, plot: MetricPlot, state: RunState, prefix: str, suffix: str, shift: int) -> None:
        """The metric's validation (held-out examples, every N steps), dashed and unsmoothed: its
        points are few and each is already a mean over many examples."""
        key = eval_key(plot.spec.metrics[0])
        series = state.history.series.get(key)
        if series is None or not len(series):
            return
        x, y, offset = self._xy(state, key)
        color = theme.VALIDATION_COLOR if not shift else theme.curve_color(shift + 7)
        plot.set_curve(prefix + key, VALIDATION + suffix, color, x, y, 0.0, Qt.PenStyle.DashLine, width=2.4,
                       x_offset=offset, rank=(prefix[len(COMPARE_PREFIX):-1], 1, 0, 0))


def short_label(label: str) -> str:
    """A legend entry's short form: ``replica 3 · run`` -> ``r3 · run``."""
    return re.sub(r"^replica (\d+)", r"r\1", label)


def short_run_label(name: str, limit: int = 14) -> str:
    """A run folder's name for a legend: its config's name (at most ``limit`` characters) and the time it
    started, so two runs of one preset read apart (``data-2workers 14:03:22``)."""
    match = re.match(r"^\d{8}-(\d{2})(\d{2})(\d{2})-(.*)$", name)
    short = match.group(4) if match else name
    short = short if len(short) <= limit else short[:limit - 1] + "…"
    return f"{short} {match.group(1)}:{match.group(2)}:{match.group(3)}" if match else short


def _total(cache: dict[str, tuple[str, int, float, np.ndarray, tuple[str, ...]]], prefix: str,
           series: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The sum of the series, each interpolated at the x of one of them (the base), extended
    incrementally: ``(base x, total, stable, final)``. A series adds nothing before its first x
    (a replica that started later).

    Series only grow, with increasing x: the sum at an x that every series has already
    reached (the first ``final`` points) never changes, so only the points past the earliest
    series' end are recomputed; the first ``stable`` points are those of the last call (none when
    the set of series changed). The base stays the same series while it keeps up (replicas
    report in turn, and a new base would mean a new sum), else it is the longest.
    """
    keys = tuple(key for key, _, _ in series)
    longest = max(series, key=lambda s: len(s[1]))
    base_key, base_x, _ = longest
    start = 0
    cached = cache.get(prefix)
    if cached is not None and cached[4] == keys:
        for key, x, _ in series:
            if key == cached[0] and 2 * len(x) >= len(longest[1]):
                base_key, base_x = key, x
                break
        key, final, x_at, old, _ = cached
        if key == base_key and 0 < final <= len(base_x) and base_x[final - 1] == x_at and final <= len(old):
            start = final
    total = np.empty(len(base_x))
    if start:
        total[:start] = cached[3][:start]  # type: ignore[index]
    tail = base_x[start:]
    total[start:] = 0.0
    if len(tail):
        for _, x, y in series:
            # only the points around the tail: np.interp copies what it is given to float64
            j = max(0, int(np.searchsorted(x, tail[0], side="left")) - 1)
            total[start:] += np.interp(tail, x[j:], y[j:], left=0.0)
    final = int(np.searchsorted(base_x, min(float(x[-1]) for _, x, _ in series), side="right"))
    if final:
        cache[prefix] = (base_key, final, float(base_x[final - 1]), total, keys)
    return base_x, total, start, final
