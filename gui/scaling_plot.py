"""The scaling report's figure: throughput and scaling efficiency against worker count.

Left: measured examples/s with the ideal ``n * tp(1)`` line. Right: efficiency ``tp(n) / (n * tp(1))``
with the 100 % ideal and Horovod's published 90 % as references. The subtitle says what was measured
and on what (``engine.control.scaling.describe``).

Run as ``python -m gui.scaling_plot REPORT.csv OUT.png`` (offscreen by default), which is how the
command line draws it without Qt entering the engine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget

from engine.control.scaling import HOROVOD_EFFICIENCY, ScalingReport, describe

EXPORT_SIZE = (1200, 560)
MEASURED = "#2f7fc1"
IDEAL = "#7a7f88"
HOROVOD = "#e07b00"
BACKGROUND = "#ffffff"
FOREGROUND = "#1f2328"


class ScalingPlot(QWidget):
    """Two plots and a title; :meth:`set_report` draws a report, :meth:`export_png` saves it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("scalingPlot")
        self.setToolTip("Throughput and scaling efficiency against the number of workers")
        self.canvas = pg.GraphicsLayoutWidget()
        self.canvas.setBackground(BACKGROUND)  # a report figure: the same on light and dark desktops
        self.canvas.ci.setContentsMargins(10, 8, 10, 8)
        self.title = self.canvas.addLabel("Scaling report", row=0, col=0, colspan=2, size="13pt", color=FOREGROUND)
        self.subtitle = self.canvas.addLabel("", row=1, col=0, colspan=2, size="9pt", color="#57606a")
        self.throughput: pg.PlotItem = self.canvas.addPlot(row=2, col=0)
        self.efficiency: pg.PlotItem = self.canvas.addPlot(row=2, col=1)
        for item, title, unit in ((self.throughput, "Throughput", "examples/s"),
                                  (self.efficiency, "Scaling efficiency", "% of ideal")):
            item.setTitle(title, color=FOREGROUND, size="11pt")
            item.setLabel("left", unit, color=FOREGROUND)
            item.setLabel("bottom", "workers", color=FOREGROUND)
            item.showGrid(x=True, y=True, alpha=0.2)
            item.setMenuEnabled(False)
            item.getViewBox().setMouseEnabled(x=False, y=False)
            item.getAxis("left").setWidth(72)  # room for five-digit ticks beside the unit label
            for name in ("left", "bottom"):
                axis = item.getAxis(name)
                axis.setPen(pg.mkPen("#9aa0a6"))
                axis.setTextPen(pg.mkPen(FOREGROUND))
        # the legends sit under the plots, never over a point (the last worker count's efficiency is low
        # and right, where a legend inside the plot would hide it)
        self.throughput_legend = pg.LegendItem(labelTextColor=FOREGROUND, colCount=2)
        self.efficiency_legend = pg.LegendItem(labelTextColor=FOREGROUND, colCount=3)
        self.canvas.addItem(self.throughput_legend, row=3, col=0)
        self.canvas.addItem(self.efficiency_legend, row=3, col=1)
        # curves are created once; a new report only sets their data
        self.tp_ideal = self.throughput.plot([], [], pen=pg.mkPen(IDEAL, width=2, style=Qt.PenStyle.DashLine),
                                             name="ideal (n × 1 worker)")
        self.tp_measured = self.throughput.plot([], [], pen=pg.mkPen(MEASURED, width=2.5), symbol="o",
                                                symbolSize=9, symbolBrush=MEASURED, symbolPen=None, name="measured")
        self.eff_ideal = self.efficiency.plot([], [], pen=pg.mkPen(IDEAL, width=2, style=Qt.PenStyle.DashLine),
                                              name="ideal (100 %)")
        self.eff_horovod = self.efficiency.plot(
            [], [], pen=pg.mkPen(HOROVOD, width=2, style=Qt.PenStyle.DotLine),
            name=f"Horovod, published ({HOROVOD_EFFICIENCY:.0%})".replace("%", " %"))
        self.eff_measured = self.efficiency.plot([], [], pen=pg.mkPen(MEASURED, width=2.5), symbol="o",
                                                 symbolSize=9, symbolBrush=MEASURED, symbolPen=None, name="measured")
        for legend, curves in ((self.throughput_legend, (self.tp_ideal, self.tp_measured)),
                               (self.efficiency_legend, (self.eff_ideal, self.eff_horovod, self.eff_measured))):
            for curve in curves:
                legend.addItem(curve, curve.name())
        self._labels: list[tuple[pg.PlotItem, pg.TextItem]] = []
        self.report: ScalingReport | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.canvas)

    def set_report(self, report: ScalingReport) -> None:
        self.report = report
        self.title.setText(f"Scaling report — {report.preset}", color=FOREGROUND, size="13pt")
        self.subtitle.setText(describe(report), color="#57606a", size="9pt")
        for item, label in self._labels:
            item.removeItem(label)
        self._labels = []
        measured = [p for p in report.points if p.examples_per_sec is not None]
        workers = np.array(sorted({p.workers for p in report.points}), dtype=np.float64)
        x = np.array([p.workers for p in measured], dtype=np.float64)
        tp = np.array([p.examples_per_sec or 0.0 for p in measured], dtype=np.float64)
        ideal = np.array([report.ideal(p) or np.nan for p in report.points], dtype=np.float64)
        eff = np.array([100.0 * (report.efficiency(p) or 0.0) for p in measured], dtype=np.float64)
        all_x = np.array([p.workers for p in report.points], dtype=np.float64)
        order = np.argsort(all_x)
        ok = np.isfinite(ideal[order])
        self.tp_ideal.setData(all_x[order][ok], ideal[order][ok])
        self.tp_measured.setData(x, tp)
        span = np.array([workers.min(), workers.max()]) if len(workers) else np.array([1.0, 1.0])
        self.eff_ideal.setData(span, np.array([100.0, 100.0]))
        self.eff_horovod.setData(span, np.array([100.0 * HOROVOD_EFFICIENCY] * 2))
        self.eff_measured.setData(x, eff)
        for xi, yi, ti in zip(x, eff, tp, strict=True):
            self._label(self.efficiency, xi, yi, f"{yi:.0f} %")
            self._label(self.throughput, xi, ti, f"{ti:,.0f}")
        ticks = [[(float(w), str(int(w))) for w in workers]]
        for item in (self.throughput, self.efficiency):
            item.getAxis("bottom").setTicks(ticks)
            pad = 0.35 if len(workers) < 2 else 0.08 * float(workers.max() - workers.min())
            item.setXRange(float(span[0]) - pad, float(span[1]) + pad, padding=0)
        top_tp = max([*tp.tolist(), *[v for v in ideal.tolist() if np.isfinite(v)], 1.0])
        self.throughput.setYRange(0.0, top_tp * 1.12, padding=0)
        self.efficiency.setYRange(0.0, max(110.0, float(eff.max()) * 1.1 if len(eff) else 110.0), padding=0)

    def _label(self, item: pg.PlotItem, x: float, y: float, text: str) -> None:
        label = pg.TextItem(text, color=MEASURED, anchor=(0.5, 1.3))
        label.setPos(float(x), float(y))
        item.addItem(label)
        self._labels.append((item, label))

    def export_png(self, path: str | os.PathLike[str], size: tuple[int, int] = EXPORT_SIZE) -> Path:
        """Save the figure at ``size`` pixels (whatever size the widget shows at)."""
        return render_png(self.report, path, size) if self.report is not None else Path(path)


def render_png(report: ScalingReport, path: str | os.PathLike[str], size: tuple[int, int] = EXPORT_SIZE) -> Path:
    """Draw ``report`` into a PNG of exactly ``size`` pixels (needs a QApplication)."""
    plot = ScalingPlot()
    plot.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
    plot.resize(*size)
    plot.set_report(report)
    plot.show()  # lays the canvas out at its size; never on screen
    image = plot.canvas.grab().toImage()
    plot.close()
    plot.deleteLater()
    if image.width() != size[0] or image.height() != size[1]:
        image = image.scaled(size[0], size[1], Qt.AspectRatioMode.IgnoreAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(path), "PNG"):
        raise OSError(f"cannot write the PNG to {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m gui.scaling_plot REPORT.csv OUT.png [WIDTHxHEIGHT]``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3):
        print("usage: python -m gui.scaling_plot REPORT.csv OUT.png [WIDTHxHEIGHT]", file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from engine.contract.config import ConfigError
    from engine.control.scaling import read_csv

    size = EXPORT_SIZE
    if len(argv) == 3:
        try:
            w, h = (int(v) for v in argv[2].lower().split("x"))
            if w < 100 or h < 100:
                raise ValueError
            size = (w, h)
        except ValueError:
            print(f"size: expected WIDTHxHEIGHT of at least 100x100 pixels, got {argv[2]!r}", file=sys.stderr)
            return 2
    try:
        report = read_csv(argv[0])
    except (OSError, ConfigError) as exc:
        print(f"cannot read the scaling report: {exc}", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(["clusterdeck-scaling-plot"])
    try:
        out = render_png(report, argv[1], size)
    except OSError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        app.processEvents()  # let deleteLater run before the app goes
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
