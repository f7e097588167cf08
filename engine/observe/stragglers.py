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
- An event costs the same whatever the number of replicas (the app folds 128 replicas' events on
  its GUI thread): the fresh replicas are kept sorted, and an event looks only at those whose
  state it changes. Its decisions are exactly those of comparing every fresh replica at every
  event (``tests/engine/test_stragglers.py`` checks it against that comparison).

In synchronous modes every replica waits for the slowest at each step, so their step times agree
and a straggler shows only where a task reports its own compute time; in ``async`` mode each worker
runs at its own pace and a slow one shows directly.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StragglerChange", "StragglerDetector", "cause_of"]


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
    cause: str = field(default="", compare=False)  # flagged: why, from its step breakdown ("waiting for input 41 % of its step: ...")


#: A straggler waiting for its batch this share of its step or more is named input-bound, where that wait is at least
#: half of its excess over the others.
INPUT_BOUND_SHARE = 0.25


def cause_of(input_share: float, ratio: float, input_of_excess: float = math.nan) -> str:
    """Why a replica is slow, from its step breakdown: its input pipeline, or its own compute.

    ``input_of_excess``: its wait for the batch over its excess over the others (its step less theirs; nan: not
    known). Input-bound where it waits for its batch ``INPUT_BOUND_SHARE`` of its step or more and that wait is at
    least half its excess. A host short of CPU is slow at both (its input pipeline runs on the same cores), but its
    compute makes most of its excess: it is named a slower or busier host."""
    input_bound = input_share == input_share and input_share >= INPUT_BOUND_SHARE
    if input_bound and not input_of_excess < 0.5:
        return (f"waiting for input {100 * input_share:.0f} % of its step: its data pipeline is the "
                "bottleneck")
    return f"compute {ratio:.1f}× the others: a slower or busier host"


@dataclass(eq=False)
class _Replica:
    rid: int
    task: str = ""
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (t, step_time)
    input_share: float = math.nan  # its latest step's share spent waiting for its batch
    input_wait: float = math.nan  # and those seconds
    last_t: float = -math.inf
    level: float = math.nan  # smoothed step time, as of its latest sample
    above_since: float | None = None
    flagged: StragglerChange | None = None
    # where the detector keeps it: the list of its state it sits in (None while stale), under which key
    listed: list[tuple[float, int]] | None = None
    key: tuple[float, int] = (math.nan, 0)
    expires: float = math.inf  # about when it goes stale without a new sample (exactly: see fresh)
    heap_key: float = math.inf  # the key of its entry in the detector's expiry heap
    version: int = 0  # of that entry (older entries are left in the heap and skipped)

    def add(self, t: float, step_time: float, smooth_s: float, stale_s: float) -> None:
        self.samples.append((t, step_time))
        self.last_t = max(self.last_t, t)
        while len(self.samples) > 1 and self.samples[0][0] < self.last_t - smooth_s:
            self.samples.popleft()
        self.level = statistics.median(s for _, s in self.samples)
        self.expires = self.last_t + max(stale_s, 3.0 * self.samples[-1][1])

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
        self._levels: list[float] = []
        self._calm: list[tuple[float, int]] = []
        self._above: list[tuple[float, int]] = []
        self._slow: list[tuple[float, int]] = []
        self._streaks: list[tuple[float, int]] = []
        self._expiry: list[tuple[float, int, int]] = []
        self.reset()

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
            r = self._replicas[replica] = _Replica(replica)
        task = event.get("task")
        if isinstance(task, str):
            r.task = task
        input_wait, whole = _number(event.get("input_wait")), _number(event.get("step_time"))
        if input_wait is not None and whole:
            r.input_share = min(1.0, max(0.0, input_wait / whole))
            r.input_wait = max(0.0, input_wait)
        was_listed = r.listed is not None
        if was_listed:
            self._unlist(r)
        r.add(t, step_time, self.smooth_s, self.stale_s)
        stale: list[StragglerChange] = []
        if r.fresh(self.now, self.stale_s):
            self._list(r)
            if not was_listed or r.expires < r.heap_key:
                self._watch_expiry(r)
        else:  # a late sample of a replica already out of date
            self._went_stale(r, stale)
        self._expire(stale)
        changes = self._evaluate()
        if stale:
            changes = sorted(stale, key=lambda c: c.replica) + changes
        if changes:  # a new snapshot, never one changed in place (see the class docstring)
            slow = sorted(rid for _, rid in self._slow)  # every flagged replica is fresh, so listed there
            self._flagged = {rid: self._replicas[rid].flagged for rid in slow}  # type: ignore[misc]
        return changes

    def flagged(self) -> dict[int, StragglerChange]:
        """The replicas flagged now, each with the change that flagged it (a copy: safe to keep)."""
        return dict(self._flagged)

    def reset(self) -> None:
        """Forget everything (a new run, or a restart of the whole run)."""
        self.now = -math.inf
        self._replicas = {}
        self._flagged = {}
        # The fresh replicas, kept sorted so that an event costs the same whatever the number of
        # replicas: every fresh level (the medians read it), and the replicas by state, each list
        # by (level, replica). A replica's ratio to the median of the others never decreases with
        # its level (a higher level sits higher and leaves a lower median), so the replicas past a
        # threshold are the top of each list: an event looks only at the ends of the lists, and at
        # as many replicas as change state.
        self._levels = []
        self._calm = []  # not flagged, not above the margin
        self._above = []  # not flagged, above the margin since above_since
        self._slow = []  # flagged
        self._streaks = []  # heap of (above_since, replica); outdated entries skipped
        self._expiry = []  # heap of (expires, version, replica)

    # -- internals

    def _list(self, r: _Replica) -> None:
        """Put a fresh replica in the lists, in the one of its state."""
        target = self._slow if r.flagged is not None else self._above if r.above_since is not None else self._calm
        r.key = (r.level, r.rid)
        bisect.insort(self._levels, r.level)
        bisect.insort(target, r.key)
        r.listed = target

    def _unlist(self, r: _Replica) -> None:
        listed = r.listed
        if listed is None:
            return
        del self._levels[bisect.bisect_left(self._levels, r.key[0])]
        del listed[bisect.bisect_left(listed, r.key)]
        r.listed = None

    def _move(self, r: _Replica, target: list[tuple[float, int]]) -> None:
        listed = r.listed
        assert listed is not None
        del listed[bisect.bisect_left(listed, r.key)]
        bisect.insort(target, r.key)
        r.listed = target

    def _watch_expiry(self, r: _Replica) -> None:
        r.version += 1
        r.heap_key = r.expires
        heapq.heappush(self._expiry, (r.expires, r.version, r.rid))

    def _went_stale(self, r: _Replica, changes: list[StragglerChange]) -> None:
        self._unlist(r)
        r.above_since = None
        if r.flagged is not None:
            last = r.flagged
            changes.append(StragglerChange(r.rid, r.task, False, last.step_time, last.median, last.ratio,
                                           since=r.last_t, reason="stale"))
            r.flagged = None

    def _expire(self, changes: list[StragglerChange]) -> None:
        """Every listed replica that is no longer fresh leaves the lists (un-flagged as stale)."""
        now, heap = self.now, self._expiry
        # the heap's keys are the sums that fresh() compares as differences: a key within rounding
        # of now is decided by fresh() itself
        horizon = now + 1e-12 * (1.0 + abs(now))
        near: list[tuple[float, int, int]] = []
        while heap and heap[0][0] <= horizon:
            entry = heapq.heappop(heap)
            key, version, rid = entry
            r = self._replicas[rid]
            if version != r.version or r.listed is None:
                continue  # replaced by a newer entry, or the replica already went stale
            if r.expires > key:  # it reported since: its entry moves to its new time
                r.heap_key = r.expires
                heapq.heappush(heap, (r.expires, version, rid))
            elif r.fresh(now, self.stale_s):
                near.append(entry)
            else:
                self._went_stale(r, changes)
        for entry in near:
            heapq.heappush(heap, entry)

    def _compare(self, level: float) -> tuple[float, float]:
        """The median of the other fresh replicas and the ratio to it, for a replica at ``level``."""
        median = _median_without(self._levels, level)
        return median, level / median

    @staticmethod
    def _input_of_excess(r: _Replica, median: float) -> float:
        """A replica's latest wait for its batch over its excess over ``median`` (nan where either is not known)."""
        excess = r.level - median
        if not (r.input_wait == r.input_wait and median == median and excess > 0):
            return math.nan
        return r.input_wait / excess

    def _evaluate(self) -> list[StragglerChange]:
        """Flag, un-flag, start and end streaks as a comparison of every fresh replica would."""
        now = self.now
        if len(self._levels) < self.min_replicas:
            while self._above:  # no comparison: no streak grows
                r = self._replicas[self._above[-1][1]]
                r.above_since = None
                self._move(r, self._calm)
            return []
        up, back = 1 + self.margin, 1 + self.recover_margin
        changes: list[StragglerChange] = []
        while self._slow:  # flagged and back near the median: the lowest first
            level, rid = self._slow[0]
            median, ratio = self._compare(level)
            if not ratio <= back:
                break
            r = self._replicas[rid]
            changes.append(StragglerChange(rid, r.task, False, level, median, ratio, since=now, reason="recovered"))
            r.flagged = None
            r.above_since = None
            self._move(r, self._calm)
        while self._above:  # a streak that ends
            level, rid = self._above[0]
            if self._compare(level)[1] > up:
                break
            r = self._replicas[rid]
            r.above_since = None
            self._move(r, self._calm)
        while self._calm:  # a streak that starts
            level, rid = self._calm[-1]
            if not self._compare(level)[1] > up:
                break
            r = self._replicas[rid]
            r.above_since = now
            self._move(r, self._above)
            heapq.heappush(self._streaks, (now, rid))
        streaks = self._streaks
        while streaks and now - streaks[0][0] >= self.window_s:  # a streak long enough: flagged
            since, rid = heapq.heappop(streaks)
            r = self._replicas[rid]
            if r.listed is not self._above or r.above_since != since:
                continue  # that streak ended
            median, ratio = self._compare(r.level)
            r.flagged = StragglerChange(rid, r.task, True, r.level, median, ratio, since=since,
                                        cause=cause_of(r.input_share, ratio, self._input_of_excess(r, median)))
            changes.append(r.flagged)
            self._move(r, self._slow)
        if len(changes) > 1:
            changes.sort(key=lambda c: c.replica)
        return changes
