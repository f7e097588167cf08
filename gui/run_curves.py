"""The curves one run gives a plot: a line per replica or task (and per metric of the plot), the
validation of the shown metric, and the total of the replicas; an overlaid run's dashed, in its own
colours and named after the run."""

from __future__ import annotations

import re

import numpy as np
from PySide6.QtCore import Qt

from engine.observe.telemetry import RunState
from gui import theme
from gui.metric_plot import MetricPlot
from gui.metric_series import VALIDATION, eval_key, replica_label
from gui.series_model import COMPARE_PREFIX, series_xy

#: How far along the curve palette an overlaid run's colours start (the shown run's replicas keep theirs).
COMPARE_SHIFT = 4
SECONDARY_LABEL = {"gpu_util": "GPU", "gpu_mem_bytes": "GPU"}


def short_run_label(name: str, limit: int = 14) -> str:
    """A run folder's name for a legend: its config's name (at most ``limit`` characters) and the time it
    started, so two runs of one preset read apart (``data-2workers 14:03:22``)."""
    match = re.match(r"^\d{8}-(\d{2})(\d{2})(\d{2})-(.*)$", name)
    short = match.group(4) if match else name
    short = short if len(short) <= limit else short[:limit - 1] + "…"
    return f"{short} {match.group(1)}:{match.group(2)}:{match.group(3)}" if match else short


def draw_run(plot: MetricPlot, state: RunState, label: str, weight: float, by_time: bool, style: Qt.PenStyle,
             shift: int = 0) -> None:
    """The curves of one run; an overlaid run (``label``) has its own colours (``shift`` along the
    palette) and a short name in the legend."""
    spec = plot.spec
    history = state.history
    prefix = f"{COMPARE_PREFIX}{label}:" if label else ""
    suffix = f" · {short_run_label(label)}" if label else ""
    order = {name: i for i, name in enumerate(state.tasks)}
    owners = plot.model.owners(history, prefix)
    if spec.scope == "task":  # tasks in the run's order (as the task table lists them), every plot alike
        owners = sorted(owners, key=lambda o: order.get(o, len(order)))
    totals: list[tuple[str, np.ndarray, np.ndarray]] = []
    offset = 0.0
    for n, owner in enumerate(owners):
        for m, metric in enumerate(spec.metrics):
            key = f"{spec.scope}/{owner}/{metric}"
            if key not in history.series or len(history.series[key]) == 0:
                continue
            x, y, offset = series_xy(state, key, by_time)
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
        draw_validation(plot, state, prefix, suffix, shift, by_time)
    if spec.total and len(totals) > 1:
        # drawn where every replica has reported: past that the sum would still change
        base_x, total, stable, final = plot.model.total(prefix, totals)
        plot.set_curve(prefix + "total", "total" + suffix, "#888888" if not label else "#aaaaaa",
                       base_x[:final], total[:final], weight, style, width=2.2, x_offset=offset,
                       stable=stable, rank=(label, 2, 0, 0))


def draw_validation(plot: MetricPlot, state: RunState, prefix: str, suffix: str, shift: int, by_time: bool) -> None:
    """The metric's validation (held-out examples, every N steps), dashed and unsmoothed: its
    points are few and each is already a mean over many examples."""
    key = eval_key(plot.spec.metrics[0])
    series = state.history.series.get(key)
    if series is None or not len(series):
        return
    x, y, offset = series_xy(state, key, by_time)
    color = theme.VALIDATION_COLOR if not shift else theme.curve_color(shift + 7)
    plot.set_curve(prefix + key, VALIDATION + suffix, color, x, y, 0.0, Qt.PenStyle.DashLine, width=2.4,
                   x_offset=offset, rank=(prefix[len(COMPARE_PREFIX):-1], 1, 0, 0))
