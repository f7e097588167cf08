"""A plot's exports: a PNG of its plot item titled with what it shows, a CSV of its series
(``curve,x,y`` rows), and asking the user where (saying so when a file could not be written)."""

from __future__ import annotations

import csv
import html
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from gui.series_model import RawCurves, natural_key

Rows = Iterable[tuple[str, np.ndarray, np.ndarray]]


def write_png(item: pg.PlotItem, title: str, path: str | Path, width: int = 1200) -> Path:
    """``item`` as a PNG ``width`` pixels wide, titled ``title`` (the window's title bar is not part of it)."""
    item.setTitle(html.escape(title), size="12pt")
    try:
        exporter = pyqtgraph.exporters.ImageExporter(item)
        exporter.parameters()["width"] = int(width)
        exporter.export(str(path))
    finally:
        item.setTitle(None)
    return Path(path)


def write_csv(path: str | Path, series: Rows) -> Path:
    """``curve,x,y`` rows, one per point of each ``(curve, x, y)`` series (values as Python writes them)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["curve", "x", "y"])
        for label, xs, ys in series:
            w.writerows([label, repr(xi), repr(yi)] for xi, yi in zip(xs.tolist(), ys.tolist(), strict=True))
    return Path(path)


def raw_series(raw: RawCurves, labels: dict[str, str]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Every curve's unsmoothed points as shown, named as in the legend, in natural order."""
    for key in sorted(raw, key=natural_key):
        x, y = raw[key]
        yield labels.get(key, key), x, y


def ask_and_write(parent: QWidget, caption: str, name: str, filters: str, write: Callable[[str], object]) -> str:
    """Ask where to save (``name`` offered), then ``write`` there; the path written, or '' when the user
    cancelled or it failed (a message box said why)."""
    path, _ = QFileDialog.getSaveFileName(parent, caption, name, filters)
    if not path:
        return ""
    try:
        write(path)
    except OSError as exc:
        QMessageBox.warning(parent, "Export failed", f"{path}: cannot be written: {exc.strerror or exc}")
        return ""
    if not Path(path).is_file():  # pyqtgraph's exporter says nothing when it cannot write
        QMessageBox.warning(parent, "Export failed", f"{path}: was not written")
        return ""
    return path
