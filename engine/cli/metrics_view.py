"""What the ``clusterdeck run`` view says about a run's training figures, as plain text (no rich, no TF).

Each replica's training metrics (``ReplicaState.metrics``: accuracy etc.), the last validation figures
(``RunState.evals``), the run's ``training`` info (optimizer, learning rate, loss, metrics, train step), and
the total steps a user's program says it will run (``progress`` events with ``total``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: Metric columns the live table shows at most (the summary lists them all).
MAX_COLUMNS = 4


def metric_names(replicas: Iterable[Any], limit: int | None = MAX_COLUMNS) -> list[str]:
    """The metric names the replicas report, in first-seen order."""
    names: list[str] = []
    for r in replicas:
        for name in getattr(r, "metrics", None) or {}:
            if name not in names:
                names.append(name)
    return names if limit is None else names[:limit]


def fmt_metric(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.4g}"


def metrics_text(metrics: Mapping[str, Any]) -> str:
    """``accuracy 0.91, auc 0.8``."""
    return ", ".join(f"{name} {fmt_metric(value)}" for name, value in metrics.items())


def training_info(infos: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's ``training`` info (the first one said), or None."""
    for info in infos:
        training = info.get("training")
        if isinstance(training, Mapping):
            return dict(training)
    return None


def training_line(training: Mapping[str, Any]) -> str:
    """``trained with SGD (learning rate 0.001), loss sparse_categorical_crossentropy, metrics accuracy;
    Keras' train step, from compile``."""
    rate = training.get("learning_rate")
    rate_text = f"{rate:.4g}" if isinstance(rate, (int, float)) and not isinstance(rate, bool) else str(rate)
    metrics = [str(m) for m in training.get("metrics") or [] if m]
    step = {"keras": "Keras' train step", "custom": "the model's own train_step"}.get(
        str(training.get("train_step")), str(training.get("train_step") or "?"))
    return (f"trained with {training.get('optimizer') or '?'} (learning rate {rate_text}), loss "
            f"{training.get('loss') or '?'}, metrics {', '.join(metrics) or 'none'}; {step}, "
            f"from {training.get('source') or '?'}")


def validation_line(summary: Mapping[str, Any]) -> str | None:
    """``validation at step 200: loss 0.41, accuracy 0.88`` from ``RunState.summary()``, or None."""
    v = summary.get("validation")
    if not isinstance(v, Mapping):
        return None
    extra = {k: x for k, x in v.items() if k not in ("step", "loss")}
    text = f"validation at step {v.get('step')}: loss {fmt_metric(v.get('loss'))}"
    return text + (f", {metrics_text(extra)}" if extra else "")


def program_total(event: Mapping[str, Any]) -> int | None:
    """The total steps a ``progress`` event announces (a user's program says how far it will go)."""
    total = event.get("total")
    if event.get("kind") == "progress" and isinstance(total, int) and not isinstance(total, bool) and total > 0:
        return total
    return None
