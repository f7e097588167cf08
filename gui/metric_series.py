"""Which training metrics a run reports, how their curves are named, and their rows for a CSV file.

No Qt here: the plots ask these functions which series to draw and what to call them.
A replica's training metric ``m`` is the series ``replica/<id>/<m>`` (``metric:<m>`` when ``m`` is
one of the built-in figures, see :func:`engine.observe.telemetry.metric_key`); validation of the
same metric is ``eval/<m>`` (the loss: ``eval/loss``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from engine.observe.telemetry import METRIC_PREFIX, RunState, training_metrics

#: The metric a run always has; the plot of metrics starts on it.
LOSS = "loss"
#: Seconds a running program may go without a step before the plots say it reports no metrics.
NO_METRICS_AFTER_S = 5.0
NO_METRICS_NOTE = "this program reports no metrics (CPU, memory and the log are still shown)"
VALIDATION = "validation"


def metric_names(keys: Iterable[str]) -> list[str]:
    """The metrics a history's series can be plotted by: ``loss`` first, then each training metric
    (its series name, e.g. ``accuracy`` or ``metric:loss``) in the order they first arrived."""
    replica = [k for k in keys if k.startswith("replica/")]
    return [LOSS, *training_metrics(replica)]


def display_name(metric: str) -> str:
    """What the user reads for a metric's series name: ``metric:loss`` -> ``loss (reported)``."""
    return f"{metric.removeprefix(METRIC_PREFIX)} (reported)" if metric.startswith(METRIC_PREFIX) else metric


def plot_title(metric: str) -> str:
    name = display_name(metric)
    return f"{name[:1].upper()}{name[1:]} per replica"


def eval_key(metric: str) -> str:
    """The validation series of a metric (a program's own ``loss`` metric is validated as the loss)."""
    return "eval/" + metric.removeprefix(METRIC_PREFIX)


def replica_task(state: RunState, replica: str) -> str:
    """The task that runs replica ``replica`` (``worker:1``; an async step names its worker), or ''."""
    rep = state.replicas.get(int(replica)) if replica.isdigit() else None
    if rep is None:
        return ""
    if rep.worker is not None:
        return f"worker:{rep.worker}"
    return rep.task


def replica_label(state: RunState, replica: str) -> str:
    """A replica's legend entry: ``replica 0 · worker:0`` (``replica 0`` while its task is unknown)."""
    task = replica_task(state, replica)
    return f"replica {replica} · {task}" if task else f"replica {replica}"


def _natural(key: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def csv_series(state: RunState, by_time: bool = False) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Every metric of every replica (``replica 0 · worker:0 · accuracy``), then every validation
    series (``validation · loss``): ``(curve, x, y)`` unsmoothed, x the step (or seconds since the run
    started with ``by_time``)."""
    history = state.history
    metrics = metric_names(history.series)
    owners = sorted({k.split("/")[1] for k in history.series if k.startswith("replica/")}, key=_natural)
    t0 = state.started_at if state.started_at is not None else (history.t0 or 0.0)

    def xy(key: str) -> tuple[np.ndarray, np.ndarray]:
        s = history.series[key]
        return (s.t - t0 if by_time else s.x), s.y

    for owner in owners:
        for metric in metrics:
            key = f"replica/{owner}/{metric}"
            if key in history.series and len(history.series[key]):
                yield (f"{replica_label(state, owner)} · {display_name(metric)}", *xy(key))
    for key in sorted((k for k in history.series if k.startswith("eval/")), key=_natural):
        if len(history.series[key]):
            yield (f"{VALIDATION} · {key.split('/', 1)[1]}", *xy(key))


def reports_no_metrics(state: RunState, program: bool, now: float | None = None) -> bool:
    """A program's run that has run :data:`NO_METRICS_AFTER_S` seconds (or ended) without a step."""
    if not program or state.started_at is None or state.replicas:
        return False
    end = state.ended_at if state.ended_at is not None else (time.time() if now is None else now)
    return end - state.started_at >= NO_METRICS_AFTER_S or state.ended_at is not None


def describe_training(training: Any) -> str:
    """The ``training`` field of a run's info event in words: what trained, and how.

    ``{"source": "compile", "optimizer": "SGD", "learning_rate": 0.001, "loss": "...", "metrics": [...],
    "train_step": "keras"}`` -> ``Trained as compiled: SGD (learning rate 0.001), loss ..., metrics accuracy``.
    """
    if not isinstance(training, dict):
        return ""
    optimizer = str(training.get("optimizer") or "?")
    rate = training.get("learning_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        rate_text = f"{rate:g}"
    else:
        rate_text = str(rate) if rate not in (None, "") else ""
    if training.get("source") == "compile":
        text = f"Trained as compiled: {optimizer}" + (f" (learning rate {rate_text})" if rate_text else "")
    else:
        text = f"Optimizer from the preset: {optimizer}" + (f" {rate_text}" if rate_text else "") + \
               " (the model was not compiled)"
    if training.get("loss"):
        text += f", loss {training['loss']}"
    metrics = training.get("metrics")
    if isinstance(metrics, (list, tuple)) and metrics:
        text += ", metrics " + ", ".join(str(m) for m in metrics)
    if training.get("train_step") == "custom":
        text += "; custom train_step"
    return text


def training_text(state: RunState) -> str:
    """What the run says it trained (the last info event with a ``training`` field), in words."""
    for event in reversed(state.infos):
        if isinstance(event.get("training"), dict):
            return describe_training(event["training"])
    return ""
