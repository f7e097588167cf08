"""What the "Why slow" panel shows, without Qt: the replicas' step breakdowns as bars and curves, the
texts that explain them, and a stack dump as lines with the frame to look at.

The figures come from :attr:`engine.observe.telemetry.RunState.breakdowns` (each replica's latest and
recent :class:`~engine.observe.telemetry.StepBreakdown`); the views only draw what this module returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.control.doctor import Dump
from engine.observe.telemetry import BREAKDOWN_LABELS, BREAKDOWN_PARTS, StepBreakdown

#: The parts' colours: mid tones that read on light and dark backgrounds, told apart by hue and lightness.
PART_COLORS = {"compute": "#3b82f6", "collective": "#a855f7", "input": "#f59e0b", "dispatch": "#14b8a6"}
#: What each part means, for tooltips.
PART_TIPS = {
    "compute": "The replica's own work: the forward and backward pass, the optimizer, Python around the step",
    "collective": "Waiting in the gradient all-reduce for the other replicas (data mode): long on a fast replica "
                  "that waits for a slow one",
    "input": "Waiting for the next batch: the input pipeline is not keeping up",
    "dispatch": "Async mode: the worker waiting for the chief's next function (the chief dispatches too slowly)",
}
#: At most this many points on the breakdown's curves (a mean of replicas is bucketed to it).
MAX_POINTS = 400


def part_label(part: str, mode: str = "") -> str:
    """What a legend calls ``part``: in ``model`` mode compute holds DTensor's collectives."""
    if part == "compute" and mode == "model":
        return "compute + collectives"
    return BREAKDOWN_LABELS[part]


def part_tip(part: str, mode: str = "") -> str:
    if part == "compute" and mode == "model":
        return (PART_TIPS["compute"] + ". In model mode the DTensor step's collectives run inside the one step "
                "function and are counted here; a profile tells them apart")
    return PART_TIPS[part]


def ms(seconds: float) -> str:
    """``48.2 ms`` (``1.25 s`` from a second on)."""
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def breakdown_tip(replica: int, task: str, b: StepBreakdown, mode: str = "") -> str:
    """A replica's bar as words: its step time and each measured part's time and share."""
    shares = b.shares()
    lines = [f"replica {replica} ({task}): {ms(b.step_time)} per step"]
    for part in BREAKDOWN_PARTS:
        if getattr(b, part) is not None:
            lines.append(f"  {part_label(part, mode)}: {ms(b.part(part))} ({100 * shares[part]:.0f} %)")
    missing = [part_label(p, mode) for p in BREAKDOWN_PARTS if getattr(b, p) is None]
    if missing:
        lines.append(f"  not measured in this mode: {', '.join(missing)}")
    return "\n".join(lines)


def summary_text(latest: dict[int, StepBreakdown], mode: str = "") -> str:
    """One sentence on where the replicas' steps go (their mean), or why there is nothing to say."""
    if not latest:
        return "No step breakdown yet: the replicas report one with their step figures."
    n = len(latest)
    step = sum(b.step_time for b in latest.values()) / n
    parts = [p for p in BREAKDOWN_PARTS if any(getattr(b, p) is not None for b in latest.values())]
    totals = {p: sum(b.part(p) for b in latest.values()) / n for p in parts}
    whole = sum(totals.values()) or 1.0
    words = ", ".join(f"{part_label(p, mode)} {100 * totals[p] / whole:.0f} %" for p in parts)
    waits = [(totals[p] / whole, p) for p in parts if p != "compute"]
    top = max(waits) if waits else (0.0, "")
    hint = ""
    if top[0] >= 0.25:
        hint = {"collective": ": the replicas wait for each other; look for a straggler",
                "input": ": the input pipeline is the bottleneck",
                "dispatch": ": the chief dispatches too slowly for its workers"}.get(top[1], "")
    return f"Mean step {ms(step)} over {n} replica{'s' if n != 1 else ''}: {words}{hint}."


@dataclass(frozen=True)
class Stack:
    """Curves of a breakdown over time: x (seconds from ``t0``) and, per part, its bottom and top (seconds
    per step: the parts stacked in :data:`BREAKDOWN_PARTS` order)."""

    x: np.ndarray
    bottoms: dict[str, np.ndarray]
    tops: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.x)

    def at(self, x: float) -> tuple[float, dict[str, float]] | None:
        """The point nearest ``x``: its x and each part's seconds per step."""
        if not len(self.x):
            return None
        i = int(np.clip(np.searchsorted(self.x, x), 0, len(self.x) - 1))
        if i > 0 and abs(self.x[i - 1] - x) < abs(self.x[i] - x):
            i -= 1
        return float(self.x[i]), {p: float(self.tops[p][i] - self.bottoms[p][i]) for p in self.tops}


def _stacked(x: np.ndarray, values: dict[str, np.ndarray], parts: Sequence[str]) -> Stack:
    bottom = np.zeros(len(x))
    bottoms, tops = {}, {}
    for part in parts:
        bottoms[part] = bottom
        bottom = bottom + values[part]
        tops[part] = bottom
    return Stack(x, bottoms, tops)


def replica_stack(samples: Sequence[StepBreakdown], t0: float, parts: Sequence[str]) -> Stack:
    """One replica's recent breakdowns, stacked (at most :data:`MAX_POINTS`: the newest)."""
    samples = samples[-MAX_POINTS:]
    x = np.fromiter((b.t - t0 for b in samples), np.float64, len(samples))
    values = {p: np.fromiter((b.part(p) for b in samples), np.float64, len(samples)) for p in parts}
    return _stacked(x, values, parts)


def mean_stack(per_replica: Iterable[Sequence[StepBreakdown]], t0: float, parts: Sequence[str],
               points: int = MAX_POINTS) -> Stack:
    """The replicas' breakdowns averaged in time buckets (every replica's samples in a bucket count alike)."""
    samples = [b for recent in per_replica for b in recent]
    if not samples:
        return _stacked(np.zeros(0), {p: np.zeros(0) for p in parts}, parts)
    t = np.fromiter((b.t - t0 for b in samples), np.float64, len(samples))
    lo, hi = float(t.min()), float(t.max())
    width = max((hi - lo) / points, 1e-9)
    bucket = np.minimum(((t - lo) / width).astype(np.int64), points - 1)
    used, inverse, counts = np.unique(bucket, return_inverse=True, return_counts=True)
    x = np.bincount(inverse, weights=t) / counts
    values = {}
    for part in parts:
        v = np.fromiter((b.part(part) for b in samples), np.float64, len(samples))
        values[part] = np.bincount(inverse, weights=v) / counts
    return _stacked(x, values, parts)


def stack_point_text(x: float, parts: dict[str, float], mode: str = "") -> str:
    """``at 12.3 s: compute 19.2 ms, input wait 28.8 ms (step 48.0 ms)``."""
    total = sum(parts.values())
    words = ", ".join(f"{part_label(p, mode)} {ms(v)}" for p, v in parts.items())
    return f"at {x:.1f} s: {words} (step {ms(total)})"


@dataclass(frozen=True)
class StackLine:
    """A line of a dump as shown: its text, and whether it is the frame to look at (the innermost frame of
    the user's or ClusterDeck's own code in the main thread)."""

    text: str
    own: bool = False
    header: bool = False


def dump_lines(dump: Dump) -> list[StackLine]:
    """The main thread's frames, innermost first, then the other threads' innermost frames."""
    frames = dump.main_frames
    own = dump.own_frame()
    lines = [StackLine("main thread (innermost first)", header=True)]
    lines += [StackLine(f"{f.function}  {f.file}:{f.line}", own=f is own) for f in frames]
    others = [(name, fs) for name, fs in dump.threads.items() if name != dump.main_thread and fs]
    if others:
        lines.append(StackLine(f"{len(others)} other thread{'s' if len(others) != 1 else ''} (innermost frame)",
                               header=True))
        lines += [StackLine(f"{name}: {fs[0].short()}") for name, fs in others]
    return lines
