"""ClusterDeck's own work on a host runs as background work: its wake-ups never preempt a training task.

Beside a run's training tasks, ClusterDeck keeps a few threads busy for short moments: the supervisor
relays each task's events and samples its processes, and the launcher reads the supervisors' streams,
writes the run's files and folds the events into the run's state. Each of these wakes tens of times a
second. Where a synchronous run's workers have the cores to themselves (``share_cores``), a wake-up on
a worker's core preempts it under the normal policy, and its peers then wait for it at the next
all-reduce: a few hundred microseconds of ClusterDeck's work cost every replica the same. (On the
2-core benchmark machine the effect of this module did not separate from the noise of the data-mode
series: ``docs/benchmarks.md``, 1d.)

Linux's ``SCHED_BATCH`` policy is made for this: a thread under it keeps its fair share of the CPU
(nothing starves; a stop is handled as quickly when the tasks are idle), but its wake-up never
preempts a running thread of the normal policy. It runs when a core is free (a worker waiting for
its peer, between steps) or at the next scheduler tick. Any user may lower a thread to it, and go back.

The policy belongs to a thread and is inherited by the threads and processes it starts; the
supervisor gives its tasks the normal policy back before they start (:func:`restore_in_child`), and
the launcher starts its event path in threads of their own (:func:`thread`). Elsewhere (not Linux) this
does nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

_BATCH = getattr(os, "SCHED_BATCH", None)
_NORMAL = getattr(os, "SCHED_OTHER", None)


def yield_to_training() -> bool:
    """Put the calling thread under ``SCHED_BATCH``; False where the platform has no such policy or the
    kernel refused it (the thread then keeps its policy: nothing depends on this)."""
    if _BATCH is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, _BATCH, os.sched_param(0))
    except OSError:
        return False
    return True


def thread(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """A daemon thread (not started) that runs ``target(*args)`` as background work."""
    def run() -> None:
        yield_to_training()
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)


def restore_in_child() -> None:
    """Between fork and exec of a task: the normal policy back (a task is training, not background work)."""
    if _NORMAL is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        if os.sched_getscheduler(0) != _NORMAL:
            os.sched_setscheduler(0, _NORMAL, os.sched_param(0))
    except OSError:
        pass
