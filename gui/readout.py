"""What the hover readout of a plot says, without Qt: the point of the visible curves nearest the
pointer (by x, then by y on screen), as TensorBoard's and W&B's tooltips do, and what the gaps near
the pointer stand for (points that are not finite are not drawn, so only the readout can say)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Reading:
    """One curve's point under the pointer: its key, x and y as the plot shows them."""

    key: str
    x: float
    y: float


def nearest(series: Mapping[str, tuple[np.ndarray, np.ndarray]], x: float, y: float,
            y_per_pixel: float = 1.0, x_per_pixel: float = 1.0) -> Reading | None:
    """The point of ``series`` (key -> sorted x, y) closest to ``(x, y)`` on screen: per series the
    point nearest in x, then the series whose point is nearest the pointer (pixels per axis given
    by ``*_per_pixel``); None when no series has a finite point."""
    best: tuple[float, Reading] | None = None
    for key, (xs, ys) in series.items():
        n = min(len(xs), len(ys))
        if not n:
            continue
        i = int(np.searchsorted(xs[:n], x))
        candidates = [j for j in (i - 1, i) if 0 <= j < n]
        j = min(candidates, key=lambda k: abs(float(xs[k]) - x))
        px, py = float(xs[j]), float(ys[j])
        if not (np.isfinite(px) and np.isfinite(py)):
            continue
        distance = ((px - x) / max(x_per_pixel, 1e-300)) ** 2 + ((py - y) / max(y_per_pixel, 1e-300)) ** 2
        if best is None or distance < best[0]:
            best = (distance, Reading(key, px, py))
    return best[1] if best is not None else None


def format_value(value: float) -> str:
    """A value as a readout shows it: 4 significant digits, exponent for the very small or large."""
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def describe(reading: Reading, label: str, x_label: str, unit: str = "") -> str:
    """``step 812 · replica 3 · worker:3: 0.2345 ms``."""
    x = f"{reading.x:.0f}" if x_label == "step" else f"{reading.x:.1f}"
    return f"{x_label} {x} · {label}: {format_value(reading.y)}{(' ' + unit) if unit else ''}"


def gap_notes(series: Iterable[tuple[str, np.ndarray, np.ndarray, float]], at: float, within: float,
              log_x: bool = False, x_label: str = "step") -> list[str]:
    """``step 11 · replica 0: +inf (not drawn)`` for each of ``series`` (its name, its sorted x and y as
    stored, the offset its x is shown less) whose point nearest ``at`` is not finite and within ``within``
    of it; ``at`` and ``within`` in the view's x (log10 of x with ``log_x``)."""
    if log_x:
        at, within = 10.0 ** min(at, 300.0), 10.0 ** min(at, 300.0) * (10.0 ** min(within, 300.0) - 1)
    notes = []
    for name, x, y, offset in series:
        n = min(len(x), len(y))
        i = int(np.searchsorted(x[:n], at + offset))
        near = [j for j in (i - 1, i) if 0 <= j < n]
        if not near:
            continue
        j = min(near, key=lambda k: abs(float(x[k]) - offset - at))
        v, xj = float(y[j]), float(x[j]) - offset
        if v - v != 0.0 and abs(xj - at) <= within:
            where = f"{xj:.0f}" if x_label == "step" else f"{xj:.1f}"
            value = "NaN" if v != v else "+inf" if v > 0 else "−inf"
            notes.append(f"{x_label} {where} · {name}: {value} (not drawn)")
    return notes
