"""NaN and infinite losses: found where the per-replica losses are read, and by default the run fails.

Like Keras' ``TerminateOnNaN``, but naming the replica and the step: a loss that is NaN or infinite
means the weights are lost (a learning rate far too high, bad data), and every later step trains on
garbage. ``training.on_nan`` (read with a default while the config model has no such field yet):

- ``"fail"`` (the default): raise :class:`NonFiniteLoss`; the task fails with its message;
- ``"warn"``: go on, and say so once (an ``info`` event with ``warning="nan"``).

The three places that read losses call :func:`check_loss`: ``engine.runtime.context.StepReporter``
(data and model mode) and ``engine.runtime.async_ps.WorkerReporter`` (async).
"""

from __future__ import annotations

import math
from typing import Any

POLICIES = ("fail", "warn")


class NonFiniteLoss(RuntimeError):
    """A replica's loss is NaN or infinite (``training.on_nan: fail``)."""


class _Guard:
    def __init__(self) -> None:
        self.policy = "fail"
        self.emitter: Any = None
        self.warned = False


_guard = _Guard()


def configure(config: Any, emitter: Any = None) -> None:
    """Read the policy of this task's run (``training.on_nan``, default ``"fail"``) and where a warning goes."""
    policy = str(getattr(getattr(config, "training", None), "on_nan", "fail") or "fail")
    _guard.policy = policy if policy in POLICIES else "fail"
    _guard.emitter = emitter
    _guard.warned = False


def describe(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def check_loss(replica: int | str, step: int, loss: Any, *, who: str = "replica") -> None:
    """Raise :class:`NonFiniteLoss` (or warn once, with ``training.on_nan: warn``) when ``loss`` is NaN or
    infinite; ``who``: what ``replica`` numbers (``"replica"``, ``"worker"``)."""
    if loss is None:
        return
    try:
        value = float(loss)
    except (TypeError, ValueError):
        return
    if math.isfinite(value):
        return
    message = (f"the loss of {who} {replica} is {describe(value)} at step {step}: training diverged (a learning "
               f"rate too high, or inputs or labels that are NaN, infinite or out of range)")
    if _guard.policy == "warn":
        if not _guard.warned and _guard.emitter is not None:
            _guard.warned = True
            _guard.emitter.info(f"{message}; training goes on (training.on_nan: warn)", warning="nan",
                                replica=replica, step=step)
        return
    raise NonFiniteLoss(f"{message} (training.on_nan: fail; 'warn' goes on)")
