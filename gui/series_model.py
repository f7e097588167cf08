"""The series behind a plot's curves, without Qt: decimation, smoothing, envelopes and x-axis modes.

A :class:`SeriesModel` keeps, per curve, the history's own arrays and a :class:`Summary` of the drawn
(smoothed) points: the min and max of each block of :data:`SUMMARY_BLOCK` points (the envelope) and the
smoothing's state every :data:`CHECKPOINT` points. From these it gives a curve's points for a view
(:meth:`SeriesModel.display`: ~2 points per horizontal pixel, each block's min and max, so peaks
survive; every point in view when fewer) and each frame's new segments (:meth:`SeriesModel.put`).
:class:`gui.metric_plot.MetricPlot` only asks for these arrays and draws them; numpy is enough to test
every rule here (tests/gui/test_series_model.py).

The x axis of a replica plot is the training step or the wall time since the run began
(:func:`series_xy`); a task plot is always by wall time.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from engine.observe.telemetry import History, RunState

#: Screen pixels per block of points drawn as its min and max (2 points per block): with 1, ~2 points
#: per horizontal pixel reach pyqtgraph; fewer points than 2 per pixel in view are drawn exactly.
PIXELS_PER_BLOCK = 1.0
#: A curve keeps the min and max of each block of this many drawn points (float32: 0.25 bytes per
#: point), and no smoothed copy of its points: see :class:`Summary`.
SUMMARY_BLOCK = 32
#: ... and the smoothing's state every this many points (a multiple of SUMMARY_BLOCK).
CHECKPOINT = 1024
#: Points smoothed by one matrix product (see :func:`ema_from`).
EMA_BLOCK = 64
#: The curves (and kept state) of an overlaid run: ``cmp:<label>:<series>``.
COMPARE_PREFIX = "cmp:"

Points = tuple[np.ndarray, np.ndarray]
#: The shown x range (None while x follows the data) and the plot's width in pixels.
View = tuple[tuple[float, float] | None, int]


@dataclass(frozen=True)
class PlotSpec:
    """What one plot shows: ``scope/<id>/<metric>`` series (the second metric drawn dotted)."""

    key: str
    title: str
    scope: str  # "replica" (x = step) or "task" (x = wall time)
    metrics: tuple[str, ...]
    unit: str = ""
    scale: float = 1.0
    smooth: bool = True
    total: bool = False
    compare: bool = True
    skip_first: bool = False  # the first step includes tracing the step function: not drawn
    robust_y: bool = False  # y range from the 99th percentile, so warm-up spikes do not flatten the curve
    validation: bool = False  # also the validation series of the metric (``eval/<metric>``), dashed


PLOTS = (
    PlotSpec("loss", "Loss per replica", "replica", ("loss",), validation=True),
    PlotSpec("throughput", "Examples/s", "replica", ("examples_per_sec",), "examples/s", total=True,
             skip_first=True),
    PlotSpec("step_time", "Step time", "replica", ("step_time",), "ms", scale=1000.0, skip_first=True,
             robust_y=True),
    PlotSpec("utilisation", "CPU / GPU use per task", "task", ("cpu_percent", "gpu_util"), "%",
             smooth=False, compare=False),
    PlotSpec("memory", "Memory per task (RSS / GPU)", "task", ("rss_bytes", "gpu_mem_bytes"), "MiB",
             scale=1 / 2**20, smooth=False, compare=False),
)

# ---------------------------------------------------------------------------- x-axis modes

#: The x-axis modes of the replica plots, as the panel offers them (index 1: wall time).
X_AXES = ("Step", "Wall time")
STEP_LABEL = "step"
WALL_TIME_LABEL = "wall time (s)"


def x_label(scope: str, by_time: bool) -> str:
    """The x axis's label: a task plot is always by wall time, a replica plot by step unless ``by_time``."""
    return WALL_TIME_LABEL if by_time or scope != "replica" else STEP_LABEL


def series_xy(state: RunState, key: str, by_time: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """x as step, or as seconds since the run started (since its first figure when that is unknown):
    the history's own arrays (times as stored: seconds from the series' base) and the offset to
    subtract from x (applied to the drawn points only)."""
    s = state.history.series[key]
    if key.startswith("task/") or by_time:
        t0 = state.started_at if state.started_at is not None else (state.history.t0 or 0.0)
        return s.t_rel, s.y, t0 - s.t_base
    return s.x_rel, s.y, 0.0


# ---------------------------------------------------------------------------- smoothing


def ema(y: np.ndarray, weight: float, start: int = 0, prev: np.ndarray | None = None) -> np.ndarray:
    """Exponential moving average (TensorBoard-style weight in [0, 1)), extending ``prev`` from ``start``.

    A point that is not finite (NaN, +-inf: a diverged loss, a figure out of range) is drawn as a gap
    (NaN) and leaves the smoothing's state as it was: the points after it are smoothed from the last
    finite ones, so one bad value does not erase the rest of the curve."""
    out = np.empty(len(y), dtype=np.float64)
    if start and prev is not None:
        out[:start] = prev[:start]
    last = math.nan
    if start:
        done = out[:start]
        finite = done[np.isfinite(done)]
        last = float(finite[-1]) if len(finite) else math.nan
    w, a = weight, 1.0 - weight
    for i in range(start, len(y)):
        v = float(y[i])
        if v - v != 0.0:
            out[i] = math.nan
            continue
        last = v if last != last else w * last + a * v
        out[i] = last
    return out


def ema_from(y: np.ndarray, weight: float, state: float) -> np.ndarray:
    """EMA of ``y`` (float64) continued from ``state`` (the smoothed value before ``y[0]``; NaN: none yet,
    the first finite point starts it), vectorised: blocks of :data:`EMA_BLOCK` points are smoothed from
    zero by one matrix product, then each block gets what the state before it adds (one step per
    block). Falls back to the plain loop where a point is not finite: such a point is a gap (NaN) and
    the smoothing goes on from the state before it (see :func:`ema`)."""
    n = len(y)
    w, a = weight, 1.0 - weight
    if state != state and n > 32 and np.isfinite(y[0]):
        state = float(y[0])  # the first point starts the smoothing (w * y0 + a * y0 is y0)
    if n <= 32 or state != state or not np.isfinite(y).all():
        out = np.empty(n)
        last = state
        for i, v in enumerate(y.tolist()):
            if v - v != 0.0:
                out[i] = math.nan
                continue
            last = v if last != last else w * last + a * v
            out[i] = last
        return out
    size = EMA_BLOCK
    m = -(-n // size)
    padded = np.zeros(m * size)
    padded[:n] = y
    local = padded.reshape(m, size) @ _ema_matrix(weight).T  # each block smoothed from a zero state
    states = np.empty(m)
    carry = w**size
    last = state
    ends = local[:, -1].tolist()
    for j in range(m):
        states[j] = last
        last = ends[j] + carry * last
    out = local + states[:, None] * (w ** np.arange(1, size + 1))[None, :]
    return out.reshape(-1)[:n]


@functools.lru_cache(maxsize=16)
def _ema_matrix(weight: float) -> np.ndarray:
    """``M[i, k] = (1 - w) * w**(i - k)`` for ``k <= i``, else 0: one block's EMA from a zero state."""
    k = np.arange(EMA_BLOCK)
    lag = k[:, None] - k[None, :]
    return np.where(lag >= 0, (1.0 - weight) * weight ** np.maximum(lag, 0), 0.0)


# ---------------------------------------------------------------------------- small rules


def finite_range(a: np.ndarray) -> tuple[float, float]:
    """Lowest and highest finite value of ``a``; ``(inf, -inf)`` when there is none."""
    if len(a) <= 8:  # the few points of a frame: plain floats beat numpy's per-call cost
        values = [v for v in a.tolist() if math.isfinite(v)]
        return (min(values), max(values)) if values else (math.inf, -math.inf)
    finite = a[np.isfinite(a)]
    return (float(finite.min()), float(finite.max())) if len(finite) else (math.inf, -math.inf)


def natural_key(key: str) -> list[object]:
    """Sort key that puts ``replica/2`` before ``replica/10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def nice_ceiling(value: float) -> float:
    """The next of 1, 1.5, 2, 3, 5, 7.5 x 10^k at or above ``value``."""
    exp = 10.0 ** np.floor(np.log10(value))
    for step in (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0):
        if step * exp >= value:
            return float(step * exp)
    return float(10.0 * exp)


def to_screen(x: np.ndarray, y: np.ndarray, log: tuple[bool, bool]) -> Points:
    """Points in a view's coordinates: log10 on a logarithmic axis (no point where <= 0)."""
    log_x, log_y = log
    if log_x or log_y:
        with np.errstate(divide="ignore", invalid="ignore"):
            if log_x:
                x = np.log10(np.where(x > 0, x, np.nan))
            if log_y:
                y = np.log10(np.where(y > 0, y, np.nan))
    return x, y


#: The largest magnitude a plot's range reaches: values beyond it (finite, but near float64's end, where
#: a span or a pixel's size overflows to inf) are drawn at the edge of the view, never made its range.
RANGE_LIMIT = 1e300


def finite_span(lo: float, hi: float) -> tuple[float, float] | None:
    """``(lo, hi)`` clipped to +-:data:`RANGE_LIMIT`, or None when either is not a number or ``lo > hi``:
    what a view's range may be (pyqtgraph raises "Cannot set range [-inf, inf]" on anything else)."""
    if lo != lo or hi != hi or lo > hi:  # (a NaN, or nothing finite: finite_range's (inf, -inf))
        return None
    return max(-RANGE_LIMIT, min(RANGE_LIMIT, lo)), max(-RANGE_LIMIT, min(RANGE_LIMIT, hi))


def _checked_range(lo: float, hi: float) -> tuple[float, float] | None:
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo < hi else None


def follow_x(lo: float, hi: float, view: tuple[float, float]) -> tuple[float, float] | None:
    """The x range that keeps ``[lo, hi]`` in view, moved only when the data leaves the view or fills
    less than half of it (then x grows by a quarter ahead); None: leave it (or no finite range holds
    the data: the view is never given an infinite or NaN range)."""
    clipped = finite_span(lo, hi)
    if clipped is None:
        return None
    lo, hi = clipped
    x0, x1 = view
    span = max(hi - lo, 1e-9)
    if hi > x1 or lo < x0 or span < 0.5 * (x1 - x0):
        return _checked_range(lo, lo + span * 1.25)
    return None


def follow_y(lo: float, hi: float, view: tuple[float, float]) -> tuple[float, float] | None:
    """As :func:`follow_x` for y: a little room below (5 %) and above (15 %) the data."""
    clipped = finite_span(lo, hi)
    if clipped is None:
        return None
    lo, hi = clipped
    y0, y1 = view
    span = max(hi - lo, abs(hi) * 1e-3, 1e-12)
    if hi > y1 or lo < y0 or span < 0.5 * (y1 - y0):
        return _checked_range(lo - 0.05 * span, hi + 0.15 * span)
    return None


def robust_top(samples: list[np.ndarray], scale: float, current: float) -> float | None:
    """The top of a y range from 0 that holds a little above the 99th percentile of ``samples``
    (scaled), rounded up to a nice number; None when the range ``current`` tops should stay (the data
    is neither above it nor well inside it: a view that changes every frame costs every curve and
    axis their geometry)."""
    if not samples:
        return None
    values = np.concatenate(samples)
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    top = float(np.percentile(values, 99)) * scale * 1.3
    if not (0 < top <= RANGE_LIMIT):
        return None
    if current <= 0 or top > current or top < 0.6 * current:
        return nice_ceiling(top)
    return None


def grown_to(a: np.ndarray, n: int, keep: int) -> np.ndarray:
    """``a`` with room for at least ``n`` items (a quarter more), its first ``keep`` kept."""
    b = np.empty(n + n // 4 + 64, dtype=a.dtype)
    b[:keep] = a[:keep]
    return b


# ---------------------------------------------------------------------------- envelopes


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _fmin(a: float, b: float) -> float:
    """The smaller of two values, a NaN (no value) ignored."""
    return b if a != a else a if b != b else min(a, b)


def _fmax(a: float, b: float) -> float:
    return b if a != a else a if b != b else max(a, b)


def _finite_only(a: np.ndarray) -> np.ndarray:
    """``a`` as float64 with every value that is not finite as NaN (what block extremes skip)."""
    a = np.asarray(a, dtype=np.float64)
    return a if np.isfinite(a).all() else np.where(np.isfinite(a), a, np.nan)


def _carry(values: np.ndarray, state: float) -> float:
    """The smoothing's state after ``values`` (drawn values, NaN at gaps), from ``state`` before them."""
    finite = np.flatnonzero(np.isfinite(values))
    return float(values[finite[-1]]) if len(finite) else state


class Summary:
    """What a curve keeps of its points for drawing, besides the history's own arrays: the min and
    max of each block of :data:`SUMMARY_BLOCK` drawn (smoothed) points, and the smoothing's state
    every :data:`CHECKPOINT` points, from which any stretch of the smoothed curve is made again
    from the history's points at the cost of its length. Extended by each frame's new points only.

    No smoothed copy of the curve is kept: a frame smooths its new points, a full draw smooths
    only the stretches it shows at full resolution (a zoom, the last block). ~0.3 bytes per point.

    Points that are not finite are drawn as gaps and counted (:attr:`bad`: NaN, +inf, -inf), never
    given to a block's extremes; a block with no finite point is NaN (a gap). An unsmoothed curve
    read back from a run's tiers brings its buckets' extremes (``lo``/``hi`` of :meth:`extend`): a
    block's min and max are those of the points it summarises, not of their means.
    """

    __slots__ = ("weight", "n", "last", "carry", "lo", "hi", "marks", "plo", "phi", "bad")

    def __init__(self, weight: float) -> None:
        self.weight = weight  # 0: drawn as recorded
        self.n = 0  # points summarised
        self.last = math.nan  # the drawn value of point n - 1 (NaN: a gap)
        self.carry = math.nan  # the smoothing's state after point n - 1 (its last finite smoothed value)
        self.lo = np.empty(64, dtype=np.float32)  # per full block
        self.hi = np.empty(64, dtype=np.float32)
        self.marks = np.empty(16)  # marks[j]: the smoothing's state before point j * CHECKPOINT
        self.plo = self.phi = math.nan  # min and max of the partial block at the end
        self.bad = [0, 0, 0]  # points summarised that are NaN, +inf, -inf

    @property
    def blocks(self) -> int:
        return self.n // SUMMARY_BLOCK

    @property
    def non_finite(self) -> int:
        """Points summarised that are not finite (drawn as gaps)."""
        return self.bad[0] + self.bad[1] + self.bad[2]

    def values(self, y: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """The drawn (smoothed) values of points ``[i0, i1)`` (``i1 <= n``), float64 (NaN at a point
        that is not finite)."""
        if i1 <= i0:
            return np.empty(0)
        if not self.weight:
            return _finite_only(y[i0:i1])
        j = i0 // CHECKPOINT
        start = j * CHECKPOINT
        return ema_from(y[start:i1], self.weight, float(self.marks[j]))[i0 - start:]

    def _count_bad(self, part: np.ndarray, sign: int) -> None:
        """Add (``sign`` 1) or take back (-1) the non-finite points of ``part``."""
        if len(part) <= 8:
            bad = [v for v in part.tolist() if v - v != 0.0]
            if not bad:
                return
            nan, pos, neg = (sum(1 for v in bad if v != v), bad.count(math.inf), bad.count(-math.inf))
        else:
            if np.isfinite(part).all():
                return
            nan, pos, neg = int(np.isnan(part).sum()), int(np.isposinf(part).sum()), int(np.isneginf(part).sum())
        self.bad = [self.bad[0] + sign * nan, self.bad[1] + sign * pos, self.bad[2] + sign * neg]

    def _store(self, i0: int, lo: np.ndarray | float, hi: np.ndarray | float) -> None:
        """Blocks from ``i0`` on get these extremes (the arrays become float64 at a value beyond float32,
        which would read as inf there)."""
        lo_a, hi_a = np.atleast_1d(lo), np.atleast_1d(hi)
        if self.lo.dtype == np.float32:
            with np.errstate(invalid="ignore"):
                big = bool((np.abs(lo_a) > FLOAT32_MAX).any() or (np.abs(hi_a) > FLOAT32_MAX).any())
            if big:
                self.lo, self.hi = self.lo.astype(np.float64), self.hi.astype(np.float64)
        self.lo[i0: i0 + len(lo_a)], self.hi[i0: i0 + len(hi_a)] = lo_a, hi_a

    def extend(self, y: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> np.ndarray:
        """Summarise the points from ``n`` to ``len(y)``; their drawn values. ``lo``/``hi`` (as long as
        ``y``; NaN where a point stands for itself): the extremes of what each point summarises, taken
        into the blocks' extremes of an unsmoothed curve."""
        n, end = self.n, len(y)
        if end <= n:
            return np.empty(0)
        raw = y[n:end]
        self._count_bad(raw, 1)
        if self.weight:
            new = ema_from(raw, self.weight, self.carry)
            # the states at the checkpoints this stretch passes
            first, last_mark = -(-n // CHECKPOINT), (end - 1) // CHECKPOINT
            if last_mark >= first:
                if last_mark >= len(self.marks):
                    self.marks = grown_to(self.marks, last_mark + 1, first)
                for j in range(first, last_mark + 1):
                    self.marks[j] = _carry(new[: j * CHECKPOINT - n], self.carry)
        else:
            new = _finite_only(raw) if len(raw) > 8 else np.array([v if v - v == 0.0 else math.nan
                                                                   for v in raw.tolist()])
        self.last = float(new[-1])
        self.carry = _carry(new, self.carry) if self.weight else self.last
        blo = bhi = new
        if lo is not None and hi is not None and not self.weight:
            blo, bhi = np.fmin(new, _finite_only(lo[n:end])), np.fmax(new, _finite_only(hi[n:end]))
        # blocks: finish the partial one, add the full ones, start the next
        size = SUMMARY_BLOCK
        done = n // size
        full = end // size
        head = min(end, (done + 1) * size) - n  # points of ``new`` that belong to block ``done``
        if head <= 8:  # a frame's few points: plain floats beat numpy's per-call cost
            a, b = math.nan, math.nan
            for v in blo[:head].tolist():
                a = _fmin(a, v)
            for v in bhi[:head].tolist():
                b = _fmax(b, v)
        else:
            a, b = float(np.fmin.reduce(blo[:head])), float(np.fmax.reduce(bhi[:head]))
        if n % size:  # the block's earlier points
            a, b = _fmin(a, self.plo), _fmax(b, self.phi)
        if full > done:
            if full > len(self.lo):
                self.lo = grown_to(self.lo, full, done)
                self.hi = grown_to(self.hi, full, done)
            self._store(done, a, b)
            stop = head + (full - done - 1) * size
            if stop > head:
                self._store(done + 1, np.fmin.reduce(blo[head:stop].reshape(-1, size), axis=1),
                            np.fmax.reduce(bhi[head:stop].reshape(-1, size), axis=1))
            tail_lo, tail_hi = blo[stop:], bhi[stop:]
            self.plo = float(np.fmin.reduce(tail_lo)) if len(tail_lo) else math.nan
            self.phi = float(np.fmax.reduce(tail_hi)) if len(tail_hi) else math.nan
        else:
            self.plo, self.phi = a, b
        self.n = end
        return new

    def rewind(self, y: np.ndarray, k: int) -> None:
        """Points from ``k`` on changed: forget what was summarised of them (extend redoes it)."""
        if k >= self.n:
            return
        if k <= 0:
            self.__init__(self.weight)  # type: ignore[misc]
            return
        start = (k // SUMMARY_BLOCK) * SUMMARY_BLOCK  # from the start of its block
        self._count_bad(y[start:self.n], -1)
        if start:
            if self.weight:
                j = (start - 1) // CHECKPOINT
                before = self.values(y, j * CHECKPOINT, start)
                self.carry = _carry(before, float(self.marks[j]))
                self.last = float(before[-1])
            else:
                self.last = self.carry = float(self.values(y, start - 1, start)[0])
        else:
            self.last = self.carry = math.nan
        self.n = start
        self.plo = self.phi = math.nan

    def bounds(self) -> tuple[float, float]:
        """Lowest and highest finite drawn value."""
        k, partial = self.blocks, self.n % SUMMARY_BLOCK != 0
        lo = finite_range(np.append(self.lo[:k], self.plo) if partial else self.lo[:k])[0]
        hi = finite_range(np.append(self.hi[:k], self.phi) if partial else self.hi[:k])[1]
        return lo, hi

    def peaks(self, size: int, b0: int, b1: int) -> Points:
        """Min and max of blocks ``[b0, b1)`` of ``size`` points (a multiple of SUMMARY_BLOCK)."""
        g = size // SUMMARY_BLOCK
        lo = np.fmin.reduce(self.lo[b0 * g: b1 * g].reshape(-1, g), axis=1)  # (a gap's NaN skipped)
        hi = np.fmax.reduce(self.hi[b0 * g: b1 * g].reshape(-1, g), axis=1)
        return lo, hi

    def sample(self, most: int = 512) -> np.ndarray:
        """Up to ~``most`` block maxima, evenly spread, and the latest drawn values (a robust y range)."""
        hi = self.hi[: self.blocks]
        return np.concatenate([hi[:: max(1, len(hi) // most)], [self.phi, self.plo, self.last]])


class Source:
    """The points behind one curve: x and y as recorded (the history's arrays), before offset, smoothing
    and scale, and the curve's :class:`Summary`.

    ``signature``: what the points given to :meth:`SeriesModel.put` last were (unchanged: nothing
    to do); ``shape``: what every drawn point depends on (unchanged: new points are appended);
    ``shown``: the view and the points last given for it."""

    __slots__ = ("x", "y", "offset", "summary", "shape", "signature", "shown")

    def __init__(self, x: np.ndarray, y: np.ndarray, offset: float, summary: Summary, shape: tuple[object, ...],
                 signature: tuple[float, ...]) -> None:
        self.x, self.y = x, y
        self.offset, self.summary, self.shape, self.signature = offset, summary, shape, signature
        self.shown: tuple[tuple[object, ...], Points] | None = None


def decimate(src: Source, x_range: tuple[float, float] | None, pixels: int) -> Points:
    """A source's drawn points for a view, before offset and scale: the points in ``x_range`` (and one
    either side), as each block's min and max when there are more than 2 per block of
    :data:`PIXELS_PER_BLOCK` pixels (so every peak stays), else every one of them."""
    x, y, summary = src.x, src.y, src.summary
    n = min(len(x), summary.n)
    i0, i1 = 0, n
    if x_range is not None and n:
        i0 = max(0, int(np.searchsorted(x[:n], x_range[0] + src.offset, side="left")) - 1)
        i1 = min(n, int(np.searchsorted(x[:n], x_range[1] + src.offset, side="right")) + 1)
    blocks = max(1, int(pixels / PIXELS_PER_BLOCK))
    if i1 - i0 <= 2 * blocks:
        return x[i0:i1].astype(np.float64), summary.values(y, i0, i1)
    size = 1 << int(np.ceil(np.log2((i1 - i0) / blocks)))
    b0, b1 = i0 // size, i1 // size
    if size >= SUMMARY_BLOCK:
        lo, hi = summary.peaks(size, b0, b1)
    else:  # zoomed in: few enough points to smooth those in view again
        block = summary.values(y, b0 * size, b1 * size).reshape(-1, size)
        lo, hi = np.fmin.reduce(block, axis=1), np.fmax.reduce(block, axis=1)
    m = b1 - b0
    xd = np.empty(2 * m + (i1 - b1 * size))
    yd = np.empty_like(xd)
    xd[: 2 * m : 2] = xd[1 : 2 * m : 2] = x[b0 * size : b1 * size : size]
    yd[: 2 * m : 2] = lo
    yd[1 : 2 * m : 2] = hi
    xd[2 * m :] = x[b1 * size : i1]
    yd[2 * m :] = summary.values(y, b1 * size, i1)
    return xd, yd


TotalCache = dict[str, tuple[str, int, float, np.ndarray, tuple[str, ...]]]


def total(cache: TotalCache, prefix: str,
          series: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The sum of the series, each interpolated at the x of one of them (the base), extended
    incrementally: ``(base x, total, stable, final)``. A series adds nothing before its first x
    (a replica that started later).

    Series only grow, with increasing x: the sum at an x that every series has already
    reached (the first ``final`` points) never changes, so only the points past the earliest
    series' end are recomputed; the first ``stable`` points are those of the last call (none when
    the set of series changed). The base stays the same series while it keeps up (replicas
    report in turn, and a new base would mean a new sum), else it is the longest.
    """
    keys = tuple(key for key, _, _ in series)
    longest = max(series, key=lambda s: len(s[1]))
    base_key, base_x, _ = longest
    start = 0
    cached = cache.get(prefix)
    if cached is not None and cached[4] == keys:
        for key, x, _ in series:
            if key == cached[0] and 2 * len(x) >= len(longest[1]):
                base_key, base_x = key, x
                break
        key, final, x_at, old, _ = cached
        if key == base_key and 0 < final <= len(base_x) and base_x[final - 1] == x_at and final <= len(old):
            start = final
    summed = np.empty(len(base_x))
    if start:
        summed[:start] = cached[3][:start]  # type: ignore[index]
    tail = base_x[start:]
    summed[start:] = 0.0
    if len(tail):
        for _, x, y in series:
            # only the points around the tail: np.interp copies what it is given to float64
            j = max(0, int(np.searchsorted(x, tail[0], side="left")) - 1)
            summed[start:] += np.interp(tail, x[j:], y[j:], left=0.0)
    final = int(np.searchsorted(base_x, min(float(x[-1]) for _, x, _ in series), side="right"))
    if final:
        cache[prefix] = (base_key, final, float(base_x[final - 1]), summed, keys)
    return base_x, summed, start, final


# ---------------------------------------------------------------------------- one plot's series


class RawCurves:
    """Curve key -> its unsmoothed (x, y) as shown; kept as the history's arrays, offset and scaled on access."""

    def __init__(self) -> None:
        self._d: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}

    def put(self, key: str, x: np.ndarray, y: np.ndarray, x_offset: float, scale: float) -> None:
        self._d[key] = (x, y, x_offset, scale)

    def __getitem__(self, key: str) -> Points:
        x, y, off, scale = self._d[key]
        return (x - off if off else x), (y * scale if scale != 1.0 else y)

    def get(self, key: str, default: object = None) -> object:
        return self[key] if key in self._d else default

    def stored(self, key: str) -> tuple[np.ndarray, np.ndarray, float, float]:
        """The history's arrays of curve ``key``, its x offset and its scale (no copy)."""
        return self._d[key]

    def length(self, key: str) -> int:
        entry = self._d.get(key)
        return 0 if entry is None else len(entry[0])

    def pop(self, key: str, default: object = None) -> object:
        return self._d.pop(key, default)

    def clear(self) -> None:
        self._d.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class Grown(NamedTuple):
    """:meth:`SeriesModel.put`'s answer when a curve grew at its end: its new segments in the view's
    coordinates, from the last point it had (the joint)."""

    x: np.ndarray
    y: np.ndarray


class Reset(NamedTuple):
    """:meth:`SeriesModel.put`'s answer when every point of a curve may have changed: the bounds
    (x lo, x hi, y lo, y hi, in the view's coordinates) of all its points; ask
    :meth:`SeriesModel.display` for them."""

    bounds: list[float]


class SeriesModel:
    """The series of one plot (see the module's docstring): what each curve draws for a view, and what
    a frame adds to it. ``log``: the plot's log x / log y (points are given in log10 there)."""

    def __init__(self, spec: PlotSpec) -> None:
        self.spec = spec
        self.log = (False, False)
        self.sources: dict[str, Source] = {}
        self.summaries: dict[str, Summary] = {}  # curve -> min/max per block of its drawn points
        self.raw = RawCurves()  # curve -> unsmoothed (x, y) as shown (offset and scale applied on access)
        self._owners: dict[str, tuple[History, int, list[str]]] = {}
        self._totals: TotalCache = {}  # run prefix -> (base, final n, x, total, series)

    def clear(self) -> None:
        self.sources.clear()
        self.summaries.clear()
        self.raw.clear()
        self._owners.clear()
        self._totals.clear()

    def remove(self, key: str) -> None:
        self.raw.pop(key, None)
        self.summaries.pop(key, None)
        self.sources.pop(key, None)

    def forget_runs(self, prefix: str) -> None:
        """Forget what was kept for drawing the runs whose prefix starts with ``prefix`` (owners, totals)."""
        for cache in (self._owners, self._totals):
            for run in [k for k in cache if k.startswith(prefix)]:
                del cache[run]

    def owners(self, history: History, run: str = "") -> list[str]:
        """The replicas or tasks with a series the plot shows, in natural order (computed again
        only when the history gained series)."""
        cached = self._owners.get(run)
        if cached is not None and cached[0] is history and cached[1] == len(history.series):
            return cached[2]
        spec = self.spec
        owners = sorted({k.split("/")[1] for k in history.series
                         if k.startswith(spec.scope + "/") and k.rsplit("/", 1)[-1] in spec.metrics},
                        key=natural_key)
        self._owners[run] = (history, len(history.series), owners)
        return owners

    def total(self, run: str, series: list[tuple[str, np.ndarray, np.ndarray]]
              ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The sum of one run's ``series`` (see :func:`total`), extended from its last sum."""
        return total(self._totals, run, series)

    def points(self, key: str) -> int:
        return self.raw.length(key)

    def non_finite(self, key: str) -> tuple[int, int, int]:
        """The points of curve ``key`` that are NaN, +inf and -inf (drawn as gaps)."""
        summary = self.summaries.get(key)
        return (0, 0, 0) if summary is None else (summary.bad[0], summary.bad[1], summary.bad[2])

    def put(self, key: str, x: np.ndarray, y: np.ndarray, smoothing: float, view: View, *,
            x_offset: float = 0.0, stable: int | None = None, revision: int = 0,
            envelope: tuple[np.ndarray, np.ndarray] | None = None) -> Grown | Reset | None:
        """The curve ``key`` now has the points ``(x - x_offset, y * scale)``, smoothed by ``smoothing``
        where the plot smooths; ``stable``: how many leading points are unchanged since the last call
        (default: all that were there; the history only grows); ``revision``: changes whenever points
        before the end changed (so a call is never skipped as unchanged); ``envelope``: per point the min
        and max of what it stands for (a bucket of a run's tiers; NaN where a point is itself), drawn
        as the blocks' extremes of an unsmoothed curve. None: nothing to draw."""
        x_range, pixels = view
        n = len(x)
        # a curve whose points and view did not change is not touched
        signature = (n, float(x[0]) if n else 0.0, float(x[-1]) if n else 0.0, float(y[-1]) if n else 0.0,
                     smoothing, x_offset, pixels, revision, *(x_range or ()))
        src = self.sources.get(key)
        if src is not None and src.signature == signature:
            return None
        spec = self.spec
        scale = spec.scale
        self.raw.put(key, x, y, x_offset, scale)
        if spec.skip_first:  # also while it is the only point: it must not seed the smoothing
            x, y = x[1:], y[1:]
            stable = None if stable is None else max(0, stable - 1)
            envelope = None if envelope is None else (envelope[0][1:], envelope[1][1:])
        m = min(len(x), len(y))
        weight = smoothing if spec.smooth and smoothing > 0 else 0.0
        summary = self.summaries.get(key)
        if summary is None or summary.weight != weight or summary.n > m:
            summary = self.summaries[key] = Summary(weight)
        elif stable is not None:
            summary.rewind(y, stable)  # the points from ``stable`` on changed (the "total" curve)
        old, joint = summary.n, summary.last
        new = summary.extend(y[:m], *(envelope if envelope is not None else (None, None)))
        shape = (float(x[0]) if m else math.nan, x_offset, weight, pixels, x_range)
        if src is not None and src.shape == shape and src.summary is summary and 0 < len(src.x) == old:
            # the curve grew at its end: only its new segments are drawn (from the last point it had)
            src.x, src.y, src.signature = x, y, signature
            if not len(new):
                return None
            xs = x[old - 1:m] - x_offset if x_offset else x[old - 1:m]
            ys = np.empty(len(new) + 1)
            ys[0], ys[1:] = joint, new
            return Grown(*to_screen(xs, ys * scale if scale != 1.0 else ys, self.log))
        src = self.sources[key] = Source(x[:m], y[:m], x_offset, summary, shape, signature)
        return Reset(self.bounds(src))

    def display(self, key: str, view: View) -> Points:
        """What the curve draws for ``view``: ~2 points per horizontal pixel (each block's min and
        max), or every point in view when fewer; offset, scaled, in the view's coordinates."""
        src = self.sources.get(key)
        if src is None:
            return np.empty(0), np.empty(0)
        x_range, pixels = view
        shown = (len(src.x), pixels, x_range)
        if src.shown is not None and src.shown[0] == shown:
            return src.shown[1]
        xd, yd = decimate(src, x_range, pixels)
        if src.offset:
            xd = xd - src.offset
        if self.spec.scale != 1.0:
            yd = yd * self.spec.scale
        points = to_screen(xd, yd, self.log)
        src.shown = (shown, points)
        return points

    def bounds(self, src: Source) -> list[float]:
        """x lo, x hi, y lo, y hi of a source's points in the view's coordinates."""
        x, offset, scale = src.x, src.offset, self.spec.scale
        if any(self.log):
            y = src.summary.values(src.y, 0, len(src.x))
            (x, y), offset, scale = to_screen(x - offset, y * scale, self.log), 0.0, 1.0
            (x_lo, x_hi), (y_lo, y_hi) = finite_range(x), finite_range(y)
        else:
            (x_lo, x_hi), (y_lo, y_hi) = finite_range(x), src.summary.bounds()
        return [x_lo - offset, x_hi - offset, y_lo * scale, y_hi * scale]

    def set_log(self, log: tuple[bool, bool]) -> dict[str, list[float]]:
        """Log x or y was switched: every curve's points are given again in the new coordinates;
        the bounds of each curve's points in them."""
        self.log = log
        out = {}
        for key, src in self.sources.items():
            src.shown = None
            out[key] = self.bounds(src)
        return out

    def robust_top(self, visible: Callable[[str], bool], current: float) -> float | None:
        """The top of a y range from 0 for the visible curves (see :func:`robust_top`), or None: keep
        ``current``. From an even sample of at most ~512 block maxima per curve and each curve's
        latest values: the percentile of hours of points would cost a frame."""
        samples = [src.summary.sample() for key, src in self.sources.items() if src.summary.n and visible(key)]
        return robust_top(samples, self.spec.scale, current)


# ---------------------------------------------------------------------------- crowds (many owners)

#: Bins a :class:`Crowd` keeps at most: past this its bins are merged in pairs (twice as wide).
CROWD_BINS = 1 << 16
#: Points a :class:`Crowd` folds per call at most, and owners it visits: a run of thousands of replicas
#: (or a metric chosen again after hours) is folded over several frames, each a bounded amount of work.
#: 256 owners: ~1 ms of a frame per plot; 1,024 replicas are all visited every 4 frames (their points wait,
#: none is lost: each owner's are folded from where the last visit stopped).
CROWD_BUDGET = 100_000
CROWD_OWNERS = 256
#: How much of an owner's level (its ranking) each batch of its new points moves.
LEVEL_WEIGHT = 0.3
#: An owner whose last point is this many bins behind the newest owner's no longer holds the crowd's
#: last bins open (a stopped task): its late points, if any come, redraw what they change.
STALE_BINS = 64


def nice_width(spacing: float) -> float:
    """A bin width of 1, 2 or 5 x 10^k at or above ``spacing`` (1 for none)."""
    if not (spacing > 0 and math.isfinite(spacing)):
        return 1.0
    exp = 10.0 ** math.floor(math.log10(spacing))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * exp >= spacing * (1 - 1e-9):
            return float(step * exp)
    return float(10.0 * exp)


def envelope_points(x: np.ndarray, base: float, env_x: np.ndarray, env_lo: np.ndarray, env_hi: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A history envelope (its buckets' x, min and max) as per-point arrays of a series whose x (as
    stored, ``x - base`` in its dtype) is ``x``: NaN where a point stands for itself."""
    lo = np.full(len(x), np.nan)
    hi = np.full(len(x), np.nan)
    if len(x) and len(env_x):
        at = np.asarray(np.asarray(env_x, np.float64) - base, dtype=x.dtype)
        i = np.clip(np.searchsorted(x, at), 0, len(x) - 1)
        hit = x[i] == at
        lo[i[hit]] = np.asarray(env_lo, np.float64)[hit]
        hi[i[hit]] = np.asarray(env_hi, np.float64)[hit]
    return lo, hi


class CrowdFigures(NamedTuple):
    """What a crowd draws: per settled bin with points, the mean x, and the mean, min and max of the
    owners' points in it; ``stable``: how many leading bins are as last given; ``revision`` moves
    when bins given before changed (a late owner's points)."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    stable: int
    revision: int


class Crowd:
    """One metric of many owners (replicas or tasks) folded into bins of x, incrementally: per bin the
    count, mean, min and max of the owners' finite points (a point read back from a run's tiers brings
    its bucket's min and max); per owner its level (a moving mean of its latest points, for ranking),
    its last x and how many of its points were not finite.

    :meth:`feed` folds the points each owner gained since the last call, visiting at most
    :data:`CROWD_OWNERS` owners and :data:`CROWD_BUDGET` points (the next call goes on where it
    stopped): a frame's work is bounded whatever the number of owners. A bin is drawn once every
    owner still reporting has passed it (:meth:`figures`), so drawn bins change only when a late
    owner's points fall into them.
    """

    def __init__(self) -> None:
        self.width = 0.0  # bin width in x (0: chosen at the first points)
        self.b0 = 0  # the bin number of index 0
        self.n = 0  # bins in use
        self.count = np.zeros(0)
        self.sum = np.zeros(0)
        self.sumx = np.zeros(0)
        self.lo = np.zeros(0)
        self.hi = np.zeros(0)
        self.keys: list[str] = []
        self._index: dict[str, int] = {}
        self.done: list[int] = []  # points folded of each owner
        self.level = np.zeros(0)  # per owner (NaN: no finite point yet)
        self.last_x = np.zeros(0)
        self.last_bad = np.zeros(0, dtype=bool)  # its latest point is not finite
        self.bad = np.zeros(0, dtype=np.int64)  # its points that were not finite
        self.cursor = 0
        self.folded = 0  # points folded so far
        self._envelopes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # the drawn (settled, non-empty) bins, compressed
        self.settled = 0  # bins [0, settled) are settled and compressed
        self._changed = math.inf  # lowest bin changed since the last figures()
        self.revision = 0
        self._c = [np.zeros(0) for _ in range(5)]  # bin index, x, mean, lo, hi
        self._cn = 0

    # -- owners
    def set_owners(self, keys: list[str]) -> None:
        """The owners' series keys (new ones are appended; a crowd whose owners otherwise changed
        starts again)."""
        if keys == self.keys:
            return
        if keys[: len(self.keys)] != self.keys:
            self.__init__()  # type: ignore[misc]
        new = keys[len(self.keys):]
        self._index.update({k: len(self.keys) + i for i, k in enumerate(new)})
        self.keys = list(keys)
        self.done += [0] * len(new)
        grow = len(new)
        self.level = np.append(self.level, np.full(grow, np.nan))
        self.last_x = np.append(self.last_x, np.full(grow, np.nan))
        self.last_bad = np.append(self.last_bad, np.zeros(grow, dtype=bool))
        self.bad = np.append(self.bad, np.zeros(grow, dtype=np.int64))

    @property
    def caught_up(self) -> bool:
        """The last calls visited every owner in turn and found nothing more to fold."""
        return self._quiet >= len(self.keys)

    _quiet = 0  # owners visited in a row (over calls) that had nothing to fold

    # -- folding
    def feed(self, series: Mapping[str, object], by_time: bool, envelopes: Mapping[str, object] | None = None) -> int:
        """Fold what the owners' series (``series[key]``: the history's :class:`~engine.observe.telemetry.Series`)
        gained since the last call, within the budget; the points folded. ``by_time``: x is the wall time
        (seconds from the series' base), else the step."""
        keys, done = self.keys, self.done
        owners = len(keys)
        if not owners:
            return 0
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        who: list[int] = []
        lens: list[int] = []
        envs: list[tuple[int, int, int]] = []  # (chunk, key index, start) of chunks with an envelope
        budget = CROWD_BUDGET
        i = self.cursor % owners
        quiet = self._quiet
        for _ in range(min(owners, CROWD_OWNERS)):
            s = series.get(keys[i])
            if s is not None:
                n = len(s)  # type: ignore[arg-type]
                d = done[i]
                if n > d:
                    quiet = 0
                    if budget <= 0:
                        break  # (this owner first, at the next call)
                    else:
                        n = min(n, d + budget)
                        xr = s.t_rel if by_time else s.x_rel  # type: ignore[attr-defined]
                        xs.append(xr[d:n])
                        ys.append(s.y[d:n])  # type: ignore[attr-defined]
                        if envelopes and keys[i] in envelopes:
                            envs.append((len(who), i, d))
                        who.append(i)
                        lens.append(n - d)
                        done[i] = n
                        budget -= n - d
                        if budget <= 0 and n < len(s):  # type: ignore[arg-type]
                            break  # (the rest of this owner's points at the next call)
                else:
                    quiet += 1
            else:
                quiet += 1
            i = i + 1 if i + 1 < owners else 0
        self.cursor = i
        self._quiet = quiet
        if not who:
            return 0
        x = np.concatenate(xs).astype(np.float64) if len(xs) > 1 else xs[0].astype(np.float64)
        y = np.concatenate(ys).astype(np.float64) if len(ys) > 1 else ys[0].astype(np.float64)
        lo = hi = y
        if envs:
            lo, hi = y.copy(), y.copy()
            starts = np.cumsum([0, *lens])
            for chunk, k, d in envs:
                env_lo, env_hi = self._envelope(keys[k], series[keys[k]], by_time, envelopes)  # type: ignore[arg-type]
                a, b = int(starts[chunk]), int(starts[chunk + 1])
                m = max(0, min(b - a, len(env_lo) - d))
                if m:
                    lo[a:a + m] = np.fmin(lo[a:a + m], env_lo[d:d + m])
                    hi[a:a + m] = np.fmax(hi[a:a + m], env_hi[d:d + m])
        owner = np.repeat(np.asarray(who, dtype=np.intp), lens)
        ends = np.cumsum(lens) - 1
        self._fold(x, y, lo, hi, owner, np.asarray(who, dtype=np.intp), ends)
        return len(x)

    def _envelope(self, key: str, s: object, by_time: bool, envelopes: dict[str, object]) -> tuple[np.ndarray, np.ndarray]:
        got = self._envelopes.get(key)
        if got is None:
            env = envelopes[key]
            xr = s.t_rel if by_time else s.x_rel  # type: ignore[attr-defined]
            base = s.t_base if by_time else s.x_base  # type: ignore[attr-defined]
            got = self._envelopes[key] = envelope_points(np.asarray(xr), base, env.x, env.lo, env.hi)  # type: ignore[attr-defined]
        return got

    def _fold(self, x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray, owner: np.ndarray,
              who: np.ndarray, ends: np.ndarray) -> None:
        owners = len(self.keys)
        finite = np.isfinite(y)
        all_finite = bool(finite.all())
        if not all_finite:
            self.bad += np.bincount(owner[~finite], minlength=owners)
        self.last_x[who] = x[ends]
        self.last_bad[who] = ~finite[ends]
        if not all_finite:
            x, y, lo, hi, owner = x[finite], y[finite], lo[finite], hi[finite], owner[finite]
        ok = np.isfinite(x)
        if not ok.all():
            x, y, lo, hi, owner = x[ok], y[ok], lo[ok], hi[ok], owner[ok]
        self.folded += len(y)
        if not len(y):
            return
        # each owner's level: a moving mean of its batches
        sums = np.bincount(owner, weights=y, minlength=owners)
        counts = np.bincount(owner, minlength=owners)
        got = counts > 0
        batch = sums[got] / counts[got]
        old = self.level[got]
        self.level[got] = np.where(np.isnan(old), batch, (1 - LEVEL_WEIGHT) * old + LEVEL_WEIGHT * batch)
        if not self.width:
            spacing = np.diff(x[: min(len(x), lens_first(owner))])
            spacing = spacing[spacing > 0]
            self.width = nice_width(float(np.median(spacing)) if len(spacing) else 1.0)
            self.b0 = int(math.floor(float(x.min()) / self.width))
        b = np.floor(x / self.width).astype(np.int64)
        low, high = int(b.min()), int(b.max())
        while max(high, self.b0 + self.n - 1) - min(low, self.b0) + 1 > CROWD_BINS:
            self._coarsen()  # (every point keeps its bin: the bins nest)
            b = np.floor(x / self.width).astype(np.int64)
            low, high = int(b.min()), int(b.max())
        if low < self.b0:
            self._shift(self.b0 - low)
        need = high - self.b0 + 1
        if need > len(self.count):
            self._grow(need)
        self.n = max(self.n, need)
        idx = b - self.b0
        m0 = int(idx.min())
        rel = idx - m0
        span = int(rel.max()) + 1
        self.count[m0:m0 + span] += np.bincount(rel, minlength=span)
        self.sum[m0:m0 + span] += np.bincount(rel, weights=y, minlength=span)
        self.sumx[m0:m0 + span] += np.bincount(rel, weights=x, minlength=span)
        np.minimum.at(self.lo, idx, np.fmin(lo, y))
        np.maximum.at(self.hi, idx, np.fmax(hi, y))
        self._changed = min(self._changed, m0)

    def _grow(self, need: int) -> None:
        size = min(CROWD_BINS, max(need, len(self.count) + len(self.count) // 2, 256))
        for name, fill in (("count", 0.0), ("sum", 0.0), ("sumx", 0.0), ("lo", np.inf), ("hi", -np.inf)):
            old = getattr(self, name)
            new = np.full(size, fill)
            new[: len(old)] = old
            setattr(self, name, new)

    def _shift(self, by: int) -> None:
        """Bins start ``by`` earlier (a point older than any before it)."""
        for name, fill in (("count", 0.0), ("sum", 0.0), ("sumx", 0.0), ("lo", np.inf), ("hi", -np.inf)):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([np.full(by, fill), old]))
        self.b0 -= by
        self.n += by
        self._restart_drawn()

    def _coarsen(self) -> None:
        """Bins twice as wide (pairs merged: every point stays in the bin that holds its x)."""
        first = self.b0 // 2
        pairs = (np.arange(self.n) + self.b0) // 2 - first
        size = int(pairs[-1]) + 1 if self.n else 0
        merged = {}
        for name, ufunc, fill in (("count", np.add, 0.0), ("sum", np.add, 0.0), ("sumx", np.add, 0.0),
                                  ("lo", np.minimum, np.inf), ("hi", np.maximum, -np.inf)):
            out = np.full(max(size, 256), fill)
            ufunc.at(out, pairs, getattr(self, name)[: self.n])
            merged[name] = out
        for name, value in merged.items():
            setattr(self, name, value)
        self.width *= 2
        self.b0 = first
        self.n = size
        self._restart_drawn()

    def _restart_drawn(self) -> None:
        self.settled = 0
        self._cn = 0
        self._changed = 0
        self.revision += 1

    # -- what is drawn
    def figures(self, ended: bool = False) -> CrowdFigures:
        """The settled bins with points (see :class:`CrowdFigures`); ``ended``: no owner gains points any
        more (an ended run): every bin is settled."""
        live = np.isfinite(self.last_x)
        stable = self._cn
        if ended and self.caught_up:
            final = self.n
        elif live.any() and self.width:
            newest = float(self.last_x[live].max())
            live &= self.last_x >= newest - STALE_BINS * self.width
            slowest = float(self.last_x[live].min())
            final = min(self.n, int(math.floor(slowest / self.width)) - self.b0)
        else:
            final = 0
        if self._changed < self.settled:  # points fell into bins already drawn: from there again
            first = int(self._changed)
            k = int(np.searchsorted(self._c[0][: self._cn], first))
            self._cn, self.settled = k, first
            stable = min(stable, k)
            self.revision += 1
        self._changed = math.inf
        if final > self.settled:
            s0 = self.settled
            counts = self.count[s0:final]
            keep = np.flatnonzero(counts > 0)
            m = len(keep)
            if m:
                need = self._cn + m
                if need > len(self._c[0]):
                    self._c = [grown_to(a, need, self._cn) for a in self._c]
                at = keep + s0
                counted = self.count[at]
                k0 = self._cn
                self._c[0][k0:need] = at
                self._c[1][k0:need] = self.sumx[at] / counted
                self._c[2][k0:need] = self.sum[at] / counted
                self._c[3][k0:need] = self.lo[at]
                self._c[4][k0:need] = self.hi[at]
                self._cn = need
            self.settled = final
        n = self._cn
        return CrowdFigures(self._c[1][:n], self._c[2][:n], self._c[3][:n], self._c[4][:n], min(stable, n),
                            self.revision)

    # -- ranking
    def ranked(self, k: int, highest: bool = True) -> list[int]:
        """The ``k`` owners whose level is highest (or lowest); an owner whose latest point is not
        finite (a diverged loss) comes first either way."""
        if not len(self.level) or k <= 0:
            return []
        level = self.level if highest else -self.level
        key = np.where(self.last_bad, np.inf, np.where(np.isnan(level), -np.inf, level))
        order = np.argsort(-key, kind="stable")[: min(k, len(key))]  # (ties: the first owners, every time)
        return [int(i) for i in order if key[i] > -np.inf]


def lens_first(owner: np.ndarray) -> int:
    """How many of the leading points belong to the first owner (its spacing chooses the bins' width)."""
    change = np.flatnonzero(owner[1:] != owner[:-1])
    return int(change[0]) + 1 if len(change) else len(owner)


def owner_matches(query: str, tokens: list[tuple[str, ...]]) -> list[int]:
    """The owners a search names: ``tokens[i]`` are owner i's names (``r17``, ``17``, ``worker:17``,
    ``host-3``). Terms are separated by commas or spaces; a term equal to a name (any case) selects
    its owners, a term naming none selects the owners with a name containing it."""
    terms = [t for t in re.split(r"[,\s]+", query.strip().lower()) if t]
    chosen: dict[int, None] = {}
    for term in terms:
        exact = [i for i, names in enumerate(tokens) if term in names]
        if not exact:
            exact = [i for i, names in enumerate(tokens) if any(term in name for name in names)]
        chosen.update(dict.fromkeys(exact))
    return list(chosen)
