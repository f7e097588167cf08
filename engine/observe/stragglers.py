"""Straggler detection: which replica stays slower than its peers, live, from the step events.

A replica is *flagged* when its step time stays above the median step time of the other fresh
replicas by more than ``margin`` (0.25: 25 % slower) for ``window_s`` seconds, and *un-flagged* when
it comes back within ``recover_margin`` of that median (hysteresis, so a replica on the edge does
not flap), or when it stops reporting.

Choices, and why:

- The clock is the events' own ``t`` (the latest seen), never the wall clock: a recorded run replays
  exactly as it ran, and tests are deterministic.
- A replica's step time is the median of its samples of the ``smooth_s`` seconds up to its latest
  sample, so one slow step (a GC pause, a checkpoint) neither starts nor breaks a streak.
- The reference is the median of the *other* replicas: with two replicas, a median that included the
  straggler would hide half of its excess (1.0 and 1.5 s give a median of 1.25 s, only 20 % less).
- A replica is fresh while it reported a usable step time within ``stale_s`` seconds, or within three
  of its own step times where those are longer; a stale replica leaves the median, and if it was
  flagged it is un-flagged (``reason="stale"``). Fewer than ``min_replicas`` fresh replicas: no
  comparison is possible, so no streak grows and a flagged replica stays flagged.
- Missing, non-numeric, non-finite or non-positive step times are ignored.

In synchronous modes every replica waits for the slowest at each step, so their step times agree
and a straggler shows only where a task reports its own compute time; in ``async`` mode each worker
runs at its own pace and a slow one shows directly.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StragglerChange", "StragglerDetector"]


@dataclass(frozen=True)
class StragglerChange:
    """A replica became a straggler (``flagged``) or stopped being one, with the figures that decided it."""

    replica: int
    task: str
    flagged: bool
    step_time: float  # the replica's smoothed step time, seconds
    median: float  # median step time of the other fresh replicas, seconds (nan when none)
    ratio: float  # step_time / median (nan when there is no median)
    since: float  # flagged: when it first exceeded the threshold in this streak; un-flagged: when it ended
    reason: str = "slow"  # "slow" (flagged), "recovered" or "stale" (un-flagged)


@dataclass
class _Replica:
    task: str = ""
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (t, step_time)
    last_t: float = -math.inf
    level: float = math.nan  # smoothed step time, as of its latest sample
    above_since: float | None = None
    flagged: StragglerChange | None = None

    def add(self, t: float, step_time: float, smooth_s: float) -> None:
        self.samples.append((t, step_time))
        self.last_t = max(self.last_t, t)
        while len(self.samples) > 1 and self.samples[0][0] < self.last_t - smooth_s:
            self.samples.popleft()
        self.level = statistics.median(s for _, s in self.samples)

    def fresh(self, now: float, stale_s: float) -> bool:
        if not self.samples:
            return False
        return now - self.last_t <= max(stale_s, 3.0 * self.samples[-1][1])


def _median_without(ordered: list[float], value: float) -> float:
    """The median of sorted ``ordered`` with one occurrence of ``value`` left out, in O(log n)."""
    i = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1

    def at(p: int) -> float:
        return ordered[p] if p < i else ordered[p + 1]

    return (at((m - 1) // 2) + at(m // 2)) / 2


def _number(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class StragglerDetector:
    """Feed step events in order with :meth:`update`; read the current stragglers with :meth:`flagged`.

    Feed it from one thread (the one folding events into the run state); :meth:`flagged` returns an
    immutable-by-convention snapshot replaced whole on each change, so another thread (a view's
    refresh timer) may read it without a lock.
    """

    def __init__(self, margin: float = 0.25, window_s: float = 5.0, min_replicas: int = 2, *,
                 recover_margin: float | None = None, smooth_s: float | None = None,
                 stale_s: float | None = None) -> None:
        if not (math.isfinite(margin) and margin > 0):
            raise ValueError(f"margin: expected a number > 0 (0.25 means 25 % slower), received: margin={margin!r}")
        if not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"window_s: expected a number of seconds >= 0, received: window_s={window_s!r}")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 2:
            raise ValueError(f"min_replicas: expected an integer >= 2, received: min_replicas={min_replicas!r}")
        recover = margin / 2 if recover_margin is None else recover_margin
        if not (math.isfinite(recover) and 0 <= recover <= margin):
            raise ValueError(f"recover_margin: expected a number from 0 to margin ({margin:g}), "
                             f"received: recover_margin={recover_margin!r}")
        smooth = window_s / 5 if smooth_s is None else smooth_s
        if not (math.isfinite(smooth) and smooth >= 0):
            raise ValueError(f"smooth_s: expected a number of seconds >= 0, received: smooth_s={smooth_s!r}")
        stale = max(10.0, 2 * window_s) if stale_s is None else stale_s
        if not (math.isfinite(stale) and stale > 0):
            raise ValueError(f"stale_s: expected a number of seconds > 0, received: stale_s={stale_s!r}")
        self.margin = float(margin)
        self.window_s = float(window_s)
        self.min_replicas = min_replicas
        self.recover_margin = float(recover)
        self.smooth_s = float(smooth)
        self.stale_s = float(stale)
        self.now = -math.inf
        self._replicas: dict[int, _Replica] = {}
        self._flagged: dict[int, StragglerChange] = {}

    def update(self, event: dict[str, Any]) -> list[StragglerChange]:
        """Take one event (anything but a usable ``step`` event is ignored); return what changed."""
        if not isinstance(event, dict) or event.get("kind") != "step":
            return []
        t = _number(event.get("t"))
        replica = event.get("replica")
        if t is None or isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
            return []
        # synchronous modes: every replica's step lasts as long as the slowest one's, so its own
        # share (the step less the time it waited in the all-reduce) is what tells a straggler
        step_time = _number(event.get("own_time"))
        if step_time is None:
            step_time = _number(event.get("step_time"))
        if step_time is None or step_time <= 0:
            return []
        self.now = max(self.now, t)
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _Replica()
        task = event.get("task")
        if isinstance(task, str):
            r.task = task
        r.add(t, step_time, self.smooth_s)
        changes = self._evaluate()
        if changes:  # a new snapshot, never one changed in place (see the class docstring)
            self._flagged = {rid: r.flagged for rid, r in sorted(self._replicas.items()) if r.flagged is not None}
        return changes

    def flagged(self) -> dict[int, StragglerChange]:
        """The replicas flagged now, each with the change that flagged it (a copy: safe to keep)."""
        return dict(self._flagged)

    def reset(self) -> None:
        """Forget everything (a new run, or a restart of the whole run)."""
        self.now = -math.inf
        self._replicas = {}
        self._flagged = {}

    # -- internals

    def _evaluate(self) -> list[StragglerChange]:
        now = self.now
        changes: list[StragglerChange] = []
        levels: dict[int, float] = {}
        for rid, r in sorted(self._replicas.items()):
            if r.fresh(now, self.stale_s):
                levels[rid] = r.level
                continue
            r.above_since = None
            if r.flagged is not None:
                last = r.flagged
                changes.append(StragglerChange(rid, r.task, False, last.step_time, last.median, last.ratio,
                                               since=r.last_t, reason="stale"))
                r.flagged = None
        if len(levels) < self.min_replicas:
            for rid in levels:
                self._replicas[rid].above_since = None
            return changes
        ordered = sorted(levels.values())
        for rid, level in levels.items():
            r = self._replicas[rid]
            median = _median_without(ordered, level)
            ratio = level / median
            if r.flagged is None:
                if ratio > 1 + self.margin:
                    if r.above_since is None:
                        r.above_since = now
                    if now - r.above_since >= self.window_s:
                        r.flagged = StragglerChange(rid, r.task, True, level, median, ratio, since=r.above_since)
                        changes.append(r.flagged)
                else:
                    r.above_since = None
            elif ratio <= 1 + self.recover_margin:
                changes.append(StragglerChange(rid, r.task, False, level, median, ratio, since=now,
                                               reason="recovered"))
                r.flagged = None
                r.above_since = None
        return changes
