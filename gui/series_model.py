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
from collections.abc import Callable, Iterator
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
    """Exponential moving average (TensorBoard-style weight in [0, 1)), extending ``prev`` from ``start``."""
    out = np.empty_like(y)
    if start and prev is not None:
        out[:start] = prev[:start]
    last = out[start - 1] if start else (y[0] if len(y) else 0.0)
    w, a = weight, 1.0 - weight
    for i in range(start, len(y)):
        last = w * last + a * y[i]
        out[i] = last
    return out


def ema_from(y: np.ndarray, weight: float, state: float) -> np.ndarray:
    """EMA of ``y`` (float64) continued from ``state`` (the smoothed value before ``y[0]``), vectorised:
    blocks of :data:`EMA_BLOCK` points are smoothed from zero by one matrix product, then each block
    gets what the state before it adds (one step per block). Falls back to the plain loop where a
    point is not finite (a NaN smooths to NaN from there on, as the loop does)."""
    n = len(y)
    w, a = weight, 1.0 - weight
    if n <= 32 or not np.isfinite(y).all():
        out = np.empty(n)
        last = state
        for i, v in enumerate(y.tolist()):
            last = w * last + a * v
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


def follow_x(lo: float, hi: float, view: tuple[float, float]) -> tuple[float, float] | None:
    """The x range that keeps ``[lo, hi]`` in view, moved only when the data leaves the view or fills
    less than half of it (then x grows by a quarter ahead); None: leave it."""
    x0, x1 = view
    span = max(hi - lo, 1e-9)
    if hi > x1 or lo < x0 or span < 0.5 * (x1 - x0):
        return lo, lo + span * 1.25
    return None


def follow_y(lo: float, hi: float, view: tuple[float, float]) -> tuple[float, float] | None:
    """As :func:`follow_x` for y: a little room below (5 %) and above (15 %) the data."""
    y0, y1 = view
    span = max(hi - lo, abs(hi) * 1e-3, 1e-12)
    if hi > y1 or lo < y0 or span < 0.5 * (y1 - y0):
        return lo - 0.05 * span, hi + 0.15 * span
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
    if not (top > 0 and np.isfinite(top)):
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


class Summary:
    """What a curve keeps of its points for drawing, besides the history's own arrays: the min and
    max of each block of :data:`SUMMARY_BLOCK` drawn (smoothed) points, and the smoothing's state
    every :data:`CHECKPOINT` points, from which any stretch of the smoothed curve is made again
    from the history's points at the cost of its length. Extended by each frame's new points only.

    No smoothed copy of the curve is kept: a frame smooths its new points, a full draw smooths
    only the stretches it shows at full resolution (a zoom, the last block). ~0.3 bytes per point.
    """

    __slots__ = ("weight", "n", "last", "lo", "hi", "marks", "plo", "phi")

    def __init__(self, weight: float) -> None:
        self.weight = weight  # 0: drawn as recorded
        self.n = 0  # points summarised
        self.last = math.nan  # the smoothed value of point n - 1
        self.lo = np.empty(64, dtype=np.float32)  # per full block
        self.hi = np.empty(64, dtype=np.float32)
        self.marks = np.empty(16)  # marks[j]: the smoothed value before point j * CHECKPOINT
        self.plo = self.phi = math.nan  # min and max of the partial block at the end

    @property
    def blocks(self) -> int:
        return self.n // SUMMARY_BLOCK

    def values(self, y: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """The drawn (smoothed) values of points ``[i0, i1)`` (``i1 <= n``), float64."""
        if i1 <= i0:
            return np.empty(0)
        if not self.weight:
            return y[i0:i1].astype(np.float64)
        j = i0 // CHECKPOINT
        start = j * CHECKPOINT
        return ema_from(y[start:i1], self.weight, float(self.marks[j]))[i0 - start:]

    def extend(self, y: np.ndarray) -> np.ndarray:
        """Summarise the points from ``n`` to ``len(y)``; their drawn values."""
        n, end = self.n, len(y)
        if end <= n:
            return np.empty(0)
        if self.weight:
            if n == 0:
                self.last = float(y[0])  # the EMA starts at the first point
            # the states at the checkpoints this stretch passes
            new = ema_from(y[n:end], self.weight, self.last)
            first, last_mark = -(-n // CHECKPOINT), (end - 1) // CHECKPOINT
            if last_mark >= first:
                if last_mark >= len(self.marks):
                    self.marks = grown_to(self.marks, last_mark + 1, first)
                for j in range(first, last_mark + 1):
                    self.marks[j] = self.last if j * CHECKPOINT == n else new[j * CHECKPOINT - n - 1]
        else:
            new = y[n:end].astype(np.float64)
        self.last = float(new[-1])
        # blocks: finish the partial one, add the full ones, start the next
        size = SUMMARY_BLOCK
        done = n // size
        full = end // size
        head = min(end, (done + 1) * size) - n  # points of ``new`` that belong to block ``done``
        part = new[:head]
        if head <= 8:  # a frame's few points: plain floats beat numpy's per-call cost
            values = part.tolist()
            lo = hi = values[0]
            for v in values:
                if v != v:
                    lo = hi = math.nan  # NaN propagates, as a block's min/max do
                    break
                lo, hi = min(lo, v), max(hi, v)
        else:
            lo, hi = float(part.min()), float(part.max())
        if n % size:  # the block's earlier points
            lo = math.nan if lo != lo or self.plo != self.plo else min(lo, self.plo)
            hi = math.nan if hi != hi or self.phi != self.phi else max(hi, self.phi)
        if full > done:
            if full > len(self.lo):
                self.lo = grown_to(self.lo, full, done)
                self.hi = grown_to(self.hi, full, done)
            self.lo[done], self.hi[done] = lo, hi
            rest = new[head: head + (full - done - 1) * size].reshape(-1, size)
            if len(rest):
                self.lo[done + 1: full] = rest.min(axis=1)
                self.hi[done + 1: full] = rest.max(axis=1)
            tail = new[head + (full - done - 1) * size:]
            self.plo, self.phi = (float(tail.min()), float(tail.max())) if len(tail) else (math.nan, math.nan)
        else:
            self.plo, self.phi = lo, hi
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
        self.last = float(self.values(y, start - 1, start)[0]) if start else math.nan
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
        lo = self.lo[b0 * g: b1 * g].reshape(-1, g).min(axis=1)
        hi = self.hi[b0 * g: b1 * g].reshape(-1, g).max(axis=1)
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
        lo, hi = block.min(axis=1), block.max(axis=1)
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

    def put(self, key: str, x: np.ndarray, y: np.ndarray, smoothing: float, view: View, *,
            x_offset: float = 0.0, stable: int | None = None) -> Grown | Reset | None:
        """The curve ``key`` now has the points ``(x - x_offset, y * scale)``, smoothed by ``smoothing``
        where the plot smooths; ``stable``: how many leading points are unchanged since the last call
        (default: all that were there; the history only grows). None: nothing to draw."""
        x_range, pixels = view
        n = len(x)
        # a curve whose points and view did not change is not touched
        signature = (n, float(x[0]) if n else 0.0, float(x[-1]) if n else 0.0, float(y[-1]) if n else 0.0,
                     smoothing, x_offset, pixels, *(x_range or ()))
        src = self.sources.get(key)
        if src is not None and src.signature == signature:
            return None
        spec = self.spec
        scale = spec.scale
        self.raw.put(key, x, y, x_offset, scale)
        if spec.skip_first:  # also while it is the only point: it must not seed the smoothing
            x, y = x[1:], y[1:]
            stable = None if stable is None else max(0, stable - 1)
        m = min(len(x), len(y))
        weight = smoothing if spec.smooth and smoothing > 0 else 0.0
        summary = self.summaries.get(key)
        if summary is None or summary.weight != weight or summary.n > m:
            summary = self.summaries[key] = Summary(weight)
        elif stable is not None:
            summary.rewind(y, stable)  # the points from ``stable`` on changed (the "total" curve)
        old, joint = summary.n, summary.last
        new = summary.extend(y[:m])
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
