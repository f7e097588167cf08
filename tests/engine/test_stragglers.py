"""Straggler detection on synthetic and recorded-style step event streams (the events' clock, no sleeping)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from engine.observe.stragglers import StragglerChange, StragglerDetector

HZ = 10.0  # step events per replica per second


def step(replica: int, t: float, step_time: Any, k: int = 0) -> dict[str, Any]:
    event = {"v": 1, "kind": "step", "task": f"worker:{replica}", "replica": replica, "step": k, "loss": 1.0,
             "examples_per_sec": 64 / step_time if isinstance(step_time, float) and step_time > 0 else None,
             "t": t}
    if step_time is not ...:
        event["step_time"] = step_time
    return event


def stream(step_time: Callable[[int, float], Any], *, replicas: int = 4, until: float = 30.0,
           reports: Callable[[int, float], bool] = lambda r, t: True) -> list[dict[str, Any]]:
    """Every replica reports at :data:`HZ`, a millisecond apart, while ``reports`` says so."""
    events = []
    for k in range(int(until * HZ)):
        for rid in range(replicas):
            t = k / HZ + rid * 0.001
            if reports(rid, t):
                events.append(step(rid, t, step_time(rid, t), k))
    return events


def feed(detector: StragglerDetector, events: Iterable[dict[str, Any]]) -> list[tuple[float, StragglerChange]]:
    """Every change, with the time of the event that caused it."""
    return [(e["t"], c) for e in events for c in detector.update(e)]


def slow_between(replica: int, start: float, end: float, factor: float = 1.5) -> Callable[[int, float], float]:
    return lambda rid, t: 0.1 * factor if rid == replica and start <= t < end else 0.1


# --------------------------------------------------------------------------- synthetic streams


def test_a_replica_50_percent_slower_for_6_s_is_flagged_once_with_its_figures_then_unflagged() -> None:
    det = StragglerDetector(margin=0.25, window_s=5.0)
    changes = feed(det, stream(slow_between(2, 10.0, 16.0)))
    flags = [(t, c) for t, c in changes if c.flagged]
    assert len(flags) == 1
    t, c = flags[0]
    assert (c.replica, c.task) == (2, "worker:2")
    assert c.step_time == pytest.approx(0.15)
    assert c.median == pytest.approx(0.1)
    assert c.ratio == pytest.approx(1.5)
    # half a second of smoothing (1 s window) before the streak starts, then window_s of it
    assert c.since == pytest.approx(10.5, abs=0.05)
    assert t == pytest.approx(c.since + 5.0, abs=0.05)
    # back to normal speed at 16 s: un-flagged once the smoothing sees it
    (t_back, back), = [(t, c) for t, c in changes if not c.flagged]
    assert (back.replica, back.reason) == (2, "recovered")
    assert back.ratio == pytest.approx(1.0)
    assert t_back == pytest.approx(16.5, abs=0.05) and back.since == t_back
    assert len(changes) == 2
    assert det.flagged() == {}


def test_flagged_lists_the_current_straggler_while_it_is_slow() -> None:
    det = StragglerDetector()
    feed(det, stream(slow_between(1, 0.0, 100.0, factor=2.0), until=8.0))
    current = det.flagged()
    assert list(current) == [1]
    assert current[1].flagged and current[1].ratio == pytest.approx(2.0)
    current.clear()  # a copy: the detector's own view is untouched
    assert list(det.flagged()) == [1]


def test_a_flagged_replica_is_unflagged_only_once_clearly_back_near_the_median() -> None:
    # 50 % slower until 8 s, then 20 % slower (inside the margin, but not back) until 20 s, then 10 %
    def step_time(rid: int, t: float) -> float:
        if rid != 0:
            return 0.1
        return 0.15 if t < 8.0 else 0.12 if t < 20.0 else 0.11

    changes = feed(StragglerDetector(margin=0.25), stream(step_time))
    assert [(c.replica, c.flagged) for _, c in changes] == [(0, True), (0, False)]
    t_back, back = changes[1]
    assert t_back == pytest.approx(20.5, abs=0.05)  # not at 8.5 s: 20 % slower is no recovery
    assert back.ratio == pytest.approx(1.1)


def test_slower_for_only_2_s_is_not_flagged() -> None:
    assert feed(StragglerDetector(), stream(slow_between(2, 10.0, 12.0))) == []


def test_slower_than_the_margin_allows_but_not_for_long_enough_or_not_by_enough() -> None:
    # 20 % slower for 20 s: within a 25 % margin
    assert feed(StragglerDetector(margin=0.25), stream(slow_between(0, 5.0, 25.0, factor=1.2))) == []
    # the same replica with a 10 % margin is flagged
    changes = feed(StragglerDetector(margin=0.10), stream(slow_between(0, 5.0, 25.0, factor=1.2)))
    assert [c.replica for _, c in changes if c.flagged] == [0]


def test_a_streak_broken_by_recovery_starts_over() -> None:
    # slow 4 s, normal 2 s, slow 4 s: never 5 s in a row
    def step_time(rid: int, t: float) -> float:
        slow = rid == 3 and (10.0 <= t < 14.0 or 16.0 <= t < 20.0)
        return 0.15 if slow else 0.1

    assert feed(StragglerDetector(window_s=5.0), stream(step_time)) == []


def test_one_of_two_replicas_slower_is_flagged() -> None:
    changes = feed(StragglerDetector(), stream(slow_between(1, 5.0, 15.0), replicas=2))
    flags = [c for _, c in changes if c.flagged]
    assert [c.replica for c in flags] == [1]
    assert flags[0].median == pytest.approx(0.1)  # the other replica, not the mean of both
    assert flags[0].ratio == pytest.approx(1.5)
    assert [c.replica for _, c in changes if not c.flagged] == [1]


def test_a_single_replica_is_never_compared() -> None:
    det = StragglerDetector()
    assert feed(det, stream(lambda r, t: 0.1 if t < 5 else 0.5, replicas=1)) == []
    with pytest.raises(ValueError, match="min_replicas: expected an integer >= 2, received: min_replicas=1"):
        StragglerDetector(min_replicas=1)


def test_min_replicas_needs_that_many_fresh_replicas() -> None:
    events = stream(slow_between(1, 2.0, 30.0))
    assert feed(StragglerDetector(min_replicas=5), events) == []
    assert [c.replica for _, c in feed(StragglerDetector(min_replicas=4), events) if c.flagged] == [1]


def test_nan_missing_and_nonsense_step_times_are_ignored() -> None:
    bad_values: list[Any] = [math.nan, math.inf, -math.inf, None, ..., "0.1", True, -0.1, 0.0]

    def step_time(rid: int, t: float) -> Any:
        k = round(t * HZ)
        if rid == 3:  # a replica that never reports a usable figure
            return bad_values[k % len(bad_values)]
        if k % 3 == 0:  # and the others now and then
            return bad_values[(k // 3) % len(bad_values)]
        return 0.15 if rid == 2 and t >= 5.0 else 0.1

    det = StragglerDetector()
    changes = feed(det, stream(step_time))
    assert [(c.replica, c.flagged) for _, c in changes] == [(2, True)]
    assert all(math.isfinite(x) for x in (changes[0][1].step_time, changes[0][1].median, changes[0][1].ratio))
    # with replica 3 ignored, only replica 0 is left beside a slow replica 1: still 2 fresh replicas
    two = feed(StragglerDetector(), stream(lambda r, t: math.nan if r >= 2 else 0.1 + 0.1 * (r == 1), until=10))
    assert [(c.replica, c.flagged) for _, c in two] == [(1, True)]
    # only NaN beside one healthy replica: nothing to compare with
    assert feed(StragglerDetector(), stream(lambda r, t: math.nan if r else 0.1, replicas=2)) == []


def test_events_that_are_not_usable_step_events_are_ignored() -> None:
    det = StragglerDetector()
    for event in ({"kind": "device", "task": "worker:0", "t": 1.0, "step_time": 5.0},
                  {"kind": "step", "replica": True, "t": 1.0, "step_time": 0.1},
                  {"kind": "step", "replica": -1, "t": 1.0, "step_time": 0.1},
                  {"kind": "step", "replica": 0, "t": math.nan, "step_time": 0.1},
                  {"kind": "step", "replica": 0, "step_time": 0.1},
                  "not an event"):
        assert det.update(event) == []  # type: ignore[arg-type]
    assert det.now == -math.inf


def test_a_replica_that_stops_reporting_leaves_the_median() -> None:
    # replicas 2 and 3 ran very fast, then stopped at 1 s; 0 and 1 go on at the same speed
    def step_time(rid: int, t: float) -> float:
        return 0.02 if rid >= 2 else 0.1

    def reports(rid: int, t: float) -> bool:
        return rid < 2 or t < 1.0

    assert feed(StragglerDetector(stale_s=2.0), stream(step_time, reports=reports)) == []
    # the same stream where they never go stale: 0 and 1 look five times slower than the "median"
    never_stale = feed(StragglerDetector(stale_s=1000.0), stream(step_time, reports=reports))
    assert sorted(c.replica for _, c in never_stale if c.flagged) == [0, 1]


def test_a_flagged_replica_that_goes_silent_is_unflagged_as_stale() -> None:
    events = stream(slow_between(1, 0.0, 100.0), reports=lambda rid, t: rid != 1 or t < 10.0)
    det = StragglerDetector(stale_s=3.0)
    changes = feed(det, events)
    assert [(c.replica, c.flagged, c.reason) for _, c in changes] == [(1, True, "slow"), (1, False, "stale")]
    assert det.flagged() == {}
    t_stale, stale = changes[1]
    assert stale.since == pytest.approx(9.901)  # its last report
    assert t_stale == pytest.approx(9.901 + 3.0, abs=0.11)


def test_a_very_slow_replica_reporting_seldom_stays_fresh_and_is_flagged() -> None:
    # replica 1 takes 3 s a step (and so reports every 3 s), beyond a 2 s staleness timeout
    events = [e for e in stream(lambda r, t: 3.0 if r == 1 else 0.1, until=30.0)
              if e["replica"] != 1 or round(e["t"] * HZ) % 30 == 0]
    changes = feed(StragglerDetector(stale_s=2.0), events)
    assert [(c.replica, c.flagged) for _, c in changes] == [(1, True)]
    assert changes[0][1].ratio == pytest.approx(30.0)


def test_reset_forgets_every_replica() -> None:
    det = StragglerDetector()
    feed(det, stream(slow_between(0, 0.0, 100.0), until=8.0))
    assert det.flagged()
    det.reset()
    assert det.flagged() == {} and det.now == -math.inf


@pytest.mark.parametrize(("kwargs", "field"), [({"margin": 0}, "margin"), ({"margin": math.nan}, "margin"),
                                               ({"window_s": -1}, "window_s"), ({"stale_s": 0}, "stale_s"),
                                               ({"recover_margin": 0.5}, "recover_margin"),
                                               ({"smooth_s": -1}, "smooth_s")])
def test_settings_are_checked_and_named(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        StragglerDetector(**kwargs)


# --------------------------------------------------------------------------- recorded-style streams


def noisy_stream(seed: int, slow_replica: int | None, *, replicas: int = 4, seconds: float = 600.0
                 ) -> list[dict[str, Any]]:
    """Like a real run: a common pace that drifts, ±10 % per-step noise, rare slow steps (GC, checkpoints),
    reports jittered in time and interleaved across replicas."""
    rng = random.Random(seed)
    events = []
    for k in range(int(seconds * HZ)):
        pace = 0.1 * (1.0 + 0.5 * math.sin(k / (HZ * 60)))  # the whole cluster slows and speeds up together
        for rid in range(replicas):
            t = k / HZ + rng.uniform(0.0, 0.05)
            st = pace * rng.uniform(0.9, 1.1)
            if rng.random() < 0.01:
                st *= 3.0
            if rid == slow_replica:
                st *= 1.5
            events.append(step(rid, t, st, k))
    events.sort(key=lambda e: e["t"])
    return events


@pytest.mark.parametrize("seed", [1, 2])
def test_noise_alone_raises_no_flag_over_a_long_stream(seed: int) -> None:
    assert feed(StragglerDetector(), noisy_stream(seed, slow_replica=None)) == []


@pytest.mark.parametrize("seed", [3, 4])
def test_a_slow_replica_among_noisy_ones_is_flagged_once_and_no_other_is(seed: int) -> None:
    det = StragglerDetector()
    changes = feed(det, noisy_stream(seed, slow_replica=2))
    assert [(c.replica, c.flagged) for _, c in changes] == [(2, True)]
    t, c = changes[0]
    assert c.ratio == pytest.approx(1.5, rel=0.1)
    assert t < 7.0  # found within the window and the smoothing
    assert list(det.flagged()) == [2]


# --------------------------------------------------------------------------- the same decisions at any scale


class _Reference:
    """The detector as first written: every fresh replica compared at every event (O(replicas) per event).
    The detector keeps its replicas sorted instead; its decisions must be exactly these."""

    def __init__(self, margin: float = 0.25, window_s: float = 5.0, min_replicas: int = 2, *,
                 recover_margin: float | None = None, smooth_s: float | None = None,
                 stale_s: float | None = None) -> None:
        self.margin, self.window_s, self.min_replicas = margin, window_s, min_replicas
        self.recover = margin / 2 if recover_margin is None else recover_margin
        self.smooth = window_s / 5 if smooth_s is None else smooth_s
        self.stale = max(10.0, 2 * window_s) if stale_s is None else stale_s
        self.now = -math.inf
        self.replicas: dict[int, dict[str, Any]] = {}

    def update(self, event: Any) -> list[StragglerChange]:
        if not isinstance(event, dict) or event.get("kind") != "step":
            return []
        t, rid = event.get("t"), event.get("replica")
        if (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t)
                or isinstance(rid, bool) or not isinstance(rid, int) or rid < 0):
            return []
        st = event.get("own_time")
        if not isinstance(st, (int, float)) or isinstance(st, bool) or not math.isfinite(st):
            st = event.get("step_time")
            if not isinstance(st, (int, float)) or isinstance(st, bool) or not math.isfinite(st):
                return []
        if st <= 0:
            return []
        t, st = float(t), float(st)
        self.now = max(self.now, t)
        r = self.replicas.setdefault(rid, {"task": "", "samples": [], "last_t": -math.inf, "level": math.nan,
                                           "above": None, "flagged": None})
        if isinstance(event.get("task"), str):
            r["task"] = event["task"]
        r["samples"].append((t, st))
        r["last_t"] = max(r["last_t"], t)
        while len(r["samples"]) > 1 and r["samples"][0][0] < r["last_t"] - self.smooth:
            r["samples"].pop(0)
        r["level"] = statistics.median(s for _, s in r["samples"])
        return self._evaluate()

    def _evaluate(self) -> list[StragglerChange]:
        now, changes, levels = self.now, [], {}
        for rid, r in sorted(self.replicas.items()):
            if now - r["last_t"] <= max(self.stale, 3.0 * r["samples"][-1][1]):
                levels[rid] = r["level"]
                continue
            r["above"] = None
            if r["flagged"] is not None:
                last = r["flagged"]
                changes.append(StragglerChange(rid, r["task"], False, last.step_time, last.median, last.ratio,
                                               since=r["last_t"], reason="stale"))
                r["flagged"] = None
        if len(levels) < self.min_replicas:
            for rid in levels:
                self.replicas[rid]["above"] = None
            return changes
        for rid, level in levels.items():
            r = self.replicas[rid]
            others = sorted(v for k, v in levels.items() if k != rid)
            median = statistics.median(others)
            ratio = level / median
            if r["flagged"] is None:
                if ratio > 1 + self.margin:
                    if r["above"] is None:
                        r["above"] = now
                    if now - r["above"] >= self.window_s:
                        r["flagged"] = StragglerChange(rid, r["task"], True, level, median, ratio, since=r["above"])
                        changes.append(r["flagged"])
                else:
                    r["above"] = None
            elif ratio <= 1 + self.recover:
                changes.append(StragglerChange(rid, r["task"], False, level, median, ratio, since=now,
                                               reason="recovered"))
                r["flagged"] = None
                r["above"] = None
        return changes


def busy_stream(seed: int, replicas: int, seconds: float) -> list[dict[str, Any]]:
    """A crowd that gives the detector every kind of decision: replicas slowing down and recovering at
    random (several at once), pauses long enough to go stale, late and out-of-order reports, step times
    shared by many replicas (ties), own times beside step times, and bad figures now and then."""
    rng = random.Random(seed)
    slow: dict[int, tuple[float, float, float]] = {}  # replica -> (from, to, factor)
    silent: dict[int, tuple[float, float]] = {}
    events = []
    for k in range(int(seconds * HZ)):
        now = k / HZ
        if rng.random() < 0.2:
            rid = rng.randrange(replicas)
            slow[rid] = (now, now + rng.uniform(1.0, 15.0), rng.choice([1.1, 1.2, 1.3, 1.5, 2.0, 4.0]))
        if rng.random() < 0.05:
            rid = rng.randrange(replicas)
            silent[rid] = (now, now + rng.uniform(1.0, 20.0))
        pace = 0.1 * (1.0 + 0.3 * math.sin(k / 300))
        for rid in range(replicas):
            lo, hi = silent.get(rid, (0.0, -1.0))
            if lo <= now < hi:
                continue
            st = round(pace * rng.choice([1.0, 1.0, 1.05, 0.95, rng.uniform(0.9, 1.1)]), 4)  # ties
            a, b, f = slow.get(rid, (0.0, -1.0, 1.0))
            if a <= now < b:
                st *= f
            t = now + rng.uniform(0.0, 0.05) - (rng.uniform(0.5, 15.0) if rng.random() < 0.002 else 0.0)
            e = step(rid, t, st, k)
            if rng.random() < 0.1:
                e["own_time"] = st * 0.8
            if rng.random() < 0.01:
                e["step_time"] = rng.choice([math.nan, -1.0, 0.0, None, "x"])
            events.append(e)
    events.sort(key=lambda e: e["t"] + (rng.uniform(-0.03, 0.03) if rng.random() < 0.05 else 0.0))
    return events


@pytest.mark.parametrize(("seed", "replicas", "kwargs"), [
    (1, 24, {}),
    (2, 7, {"window_s": 2.0, "stale_s": 3.0}),
    (3, 40, {"window_s": 0.0, "margin": 0.1, "recover_margin": 0.0}),
    (4, 12, {"min_replicas": 9, "stale_s": 2.5, "smooth_s": 0.0, "window_s": 1.0}),
    (5, 2, {"window_s": 1.0, "stale_s": 1.5}),
])
def test_decisions_are_those_of_comparing_every_replica_at_every_event(seed: int, replicas: int,
                                                                        kwargs: dict[str, Any]) -> None:
    events = busy_stream(seed, replicas, seconds=120.0)
    det, ref = StragglerDetector(**kwargs), _Reference(**kwargs)
    got, want = [], []
    for e in events:
        got.append(det.update(e))
        want.append(ref.update(e))
        assert got[-1] == want[-1], f"at t={e['t']}"
    kinds = {(c.flagged, c.reason) for cs in want for c in cs}
    # the stream exercised every decision (or the comparison above proves little)
    every = {(True, "slow"), (False, "recovered"), (False, "stale")}
    assert kinds == (every if replicas > 2 else {(True, "slow"), (False, "stale")})
    assert det.flagged() == {r: c for r, c in sorted(
        (rid, r["flagged"]) for rid, r in ref.replicas.items() if r["flagged"] is not None)}


def test_the_work_per_event_does_not_grow_with_the_number_of_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.observe import stragglers

    calls = [0]
    original = stragglers._median_without

    def counted(ordered: list[float], value: float) -> float:
        calls[0] += 1
        return original(ordered, value)

    monkeypatch.setattr(stragglers, "_median_without", counted)
    per_event = {}
    for replicas in (8, 256):
        events = stream(slow_between(1, 5.0, 15.0), replicas=replicas, until=20.0)
        calls[0] = 0
        changes = feed(StragglerDetector(), events)
        assert [(c.replica, c.flagged) for _, c in changes] == [(1, True), (1, False)]
        per_event[replicas] = calls[0] / len(events)
    # a comparison of every replica at every event would make 32 times as many at 256 replicas
    assert per_event[256] <= 1.5 * per_event[8] and per_event[256] < 5, per_event
