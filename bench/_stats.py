"""The statistics every ratio of the benchmarks goes through (numpy only, seeded).

Method (docs/benchmarks.md, "Method"):

- sides are measured in *rounds*; each round runs every side once, in an order that
  rotates from round to round (``A B``, ``B A``, ... or ``A B C``, ``B C A``, ...), so a
  drift of the shared machine falls on every side alike;
- a figure is the **median of the paired ratios** (side / baseline within the same
  round), never a ratio of medians;
- its uncertainty is a **bootstrap 95 % interval** of that median (the rounds resampled
  with replacement, :data:`BOOTSTRAP` times, with a fixed seed, so the same figures give
  the same interval);
- a goal counts as **met only when the whole interval clears it**; an interval that
  straddles the goal is reported as *not shown* (and counts as not met).

At least :data:`MIN_ROUNDS` rounds are asked of every full run; fewer (``--quick``) still
print an interval, marked as a smoke run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

MIN_ROUNDS = 10
BOOTSTRAP = 10_000
SEED = 20_240_601
CONFIDENCE = 0.95

T = TypeVar("T")


def rotated(sides: Sequence[str], round_index: int) -> list[str]:
    """The order of ``sides`` in round ``round_index`` (0-based): rotated by one each round."""
    k = round_index % max(1, len(sides))
    return list(sides[k:]) + list(sides[:k])


def interleaved(sides: Sequence[str], rounds: int, measure: Callable[[str, int], T],
                on_round: Callable[[int, dict[str, T]], None] | None = None) -> dict[str, list[T]]:
    """Run ``measure(side, round)`` for every side in every round, order rotating; results per side."""
    out: dict[str, list[T]] = {s: [] for s in sides}
    for r in range(rounds):
        got: dict[str, T] = {}
        for side in rotated(sides, r):
            got[side] = measure(side, r)
        for side in sides:
            out[side].append(got[side])
        if on_round is not None:
            on_round(r, got)
    return out


@dataclass(frozen=True)
class Ratio:
    """The median of paired ratios with its bootstrap interval."""

    median: float
    low: float
    high: float
    values: tuple[float, ...] = field(default=())

    @property
    def n(self) -> int:
        return len(self.values)

    def text(self, digits: int = 3) -> str:
        """``1.012 [0.998, 1.025]``."""
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def bootstrap_median(values: Sequence[float], *, resamples: int = BOOTSTRAP, seed: int = SEED,
                     confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` and its percentile bootstrap interval."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(data))
    if data.size == 1:
        return med, med, med
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    meds = np.median(data[picks], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(meds, [tail, 1.0 - tail])
    return med, float(low), float(high)


def paired_ratio(sides: Sequence[float], baselines: Sequence[float], **kwargs: float) -> Ratio:
    """The median of ``side[i] / baseline[i]`` over rounds, with its bootstrap interval."""
    if len(sides) != len(baselines):
        raise ValueError(f"paired ratios need as many baselines as sides: {len(sides)} against {len(baselines)}")
    ratios = tuple(float(a) / float(b) for a, b in zip(sides, baselines, strict=True)
                   if a is not None and b is not None and float(b) != 0.0)
    med, low, high = bootstrap_median(ratios, **kwargs)  # type: ignore[arg-type]
    return Ratio(med, low, high, ratios)


def paired_difference(sides: Sequence[float], baselines: Sequence[float], **kwargs: float) -> Ratio:
    """The median of ``side[i] - baseline[i]`` over rounds, with its bootstrap interval (same shape as a ratio)."""
    diffs = tuple(float(a) - float(b) for a, b in zip(sides, baselines, strict=True))
    med, low, high = bootstrap_median(diffs, **kwargs)  # type: ignore[arg-type]
    return Ratio(med, low, high, diffs)


def goal_verdict(r: Ratio, goal: float, at_most: bool) -> str:
    """``met`` only when the whole interval clears ``goal``; ``not met`` when it lies wholly on the
    wrong side; ``not shown`` when it straddles the goal (which counts as not met)."""
    if not math.isfinite(r.median):
        return "**not measured**"
    if at_most:
        if r.high <= goal:
            return "met"
        return "**not met**" if r.low > goal else "**not shown** (interval straddles the goal)"
    if r.low >= goal:
        return "met"
    return "**not met**" if r.high < goal else "**not shown** (interval straddles the goal)"


def goal_met(r: Ratio, goal: float, at_most: bool) -> bool:
    return goal_verdict(r, goal, at_most) == "met"


def rounds_note(rounds: int) -> str:
    """A warning for runs with fewer rounds than the method asks."""
    if rounds >= MIN_ROUNDS:
        return ""
    return f" (smoke run: {rounds} round(s), fewer than the {MIN_ROUNDS} the method asks; figures mean nothing)"
