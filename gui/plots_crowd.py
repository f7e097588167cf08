"""The curves of a run with more replicas (or tasks) than lines a person can read: their mean, the band
from the lowest to the highest of them, and a few of them as lines.

Past :data:`CROWD_ABOVE` replicas a plot no longer draws a line per replica (1,024 lines, and a legend
of 1,024 names, say nothing and cost every frame): it draws the mean of all of them, the band of
their min and max (every point inside it, peaks included: the band of a run read back from its tiers
holds each bucket's extremes) and, as lines, the *k* highest or lowest of them (by their latest
values, ranked again every :data:`RANK_INTERVAL_S` seconds, a line staying while its replica is still
among the 2k highest, so lines do not flicker in and out), one
mean line per host, or the replicas the plot's search box names (:mod:`gui.legend_crowd`). The
legend names only what is drawn. The folding of every replica's points into the mean and the band is
:class:`gui.series_model.Crowd`: incremental and bounded per frame, so a frame costs the same with
50,000 replicas as with 1,000 once the crowd has caught up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from PySide6.QtCore import Qt

from engine.observe.run_reader import ENDED
from engine.observe.telemetry import History, RunState
from gui import theme
from gui.legend_crowd import MAX_MATCHES
from gui.metric_plot import MetricPlot
from gui.metric_series import replica_label, replica_task
from gui.plot_legend import COMPACT_LEGEND_ABOVE
from gui.run_curves import SECONDARY_LABEL, draw_validation, short_run_label
from gui.series_model import COMPARE_PREFIX, Crowd, CrowdFigures, envelope_points, owner_matches, series_xy

#: Above this many replicas (or tasks) a plot draws their mean, band and a few lines instead of one each.
CROWD_ABOVE = COMPACT_LEGEND_ABOVE
#: Seconds between two rankings of the highest or lowest (a line stays at least this long).
RANK_INTERVAL_S = 2.0
#: The colour of the mean and the band (readable on light and dark backgrounds; no replica has it).
CROWD_COLOR = "#64748b"
#: The colours of the lines drawn besides them (the curve palette without its grey).
LINE_COLORS = tuple(c for c in theme.CURVE_COLORS if c != CROWD_COLOR)


@dataclass
class _Names:
    """What the search reads of the owners: per owner its names, and the hosts' owners."""

    tokens: list[tuple[str, ...]] = field(default_factory=list)
    hosts: dict[str, list[int]] = field(default_factory=dict)
    completions: list[str] = field(default_factory=list)


def crowded(plot: MetricPlot, history: History) -> bool:
    """The plot shows more replicas or tasks than :data:`CROWD_ABOVE` (its mean, band and a few lines)."""
    return len(plot.model.owners(history)) > CROWD_ABOVE


class CrowdDraw:
    """Draws one plot of a crowded run (see the module's docstring) and keeps what that needs between
    frames: a :class:`Crowd` per run, metric and x axis (and per host while lines per host are asked),
    the ranking and the names the search reads."""

    def __init__(self, plot: MetricPlot) -> None:
        self.plot = plot
        self.crowds: dict[tuple[str, str, bool, str], Crowd] = {}
        self._fed: dict[tuple[str, str, bool, str], tuple[tuple[int, bool], CrowdFigures]] = {}
        self._keys: dict[tuple[str, str], tuple[list[str], list[str]]] = {}  # (run, metric) -> (owners, keys)
        self._present: dict[tuple[str, str], tuple[int, bool]] = {}
        self._envelopes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._names: tuple[tuple[int, int], _Names] | None = None
        self._ranked: list[int] = []
        self._ranked_at = -math.inf
        self._asked: tuple[object, ...] = ()
        self._lines: set[str] = set()  # curve keys of the lines drawn besides the mean and band
        self._joined = 0  # lines drawn so far (a new line's place in the legend)
        self.used: set[tuple[str, str, bool, str]] = set()

    def forget(self) -> None:
        """Start again (another run, figure or x axis)."""
        self.__init__(self.plot)  # type: ignore[misc]

    # ------------------------------------------------------------------ drawing

    def draw(self, state: RunState, label: str, weight: float, by_time: bool, style: Qt.PenStyle) -> None:
        """The curves of one run: ``label`` '' for the shown run (mean, band, lines), else an overlaid
        run's (its mean, dashed, named after it)."""
        plot, spec, history = self.plot, self.plot.spec, state.history
        prefix = f"{COMPARE_PREFIX}{label}:" if label else ""
        suffix = f" · {short_run_label(label)}" if label else ""
        owners = plot.model.owners(history, prefix)
        if not owners:
            return
        x_by_time = by_time or spec.scope != "replica"
        first: tuple[Crowd, list[str], float] | None = None
        for m, metric in enumerate(spec.metrics):
            keys = self._owner_keys(prefix, metric, owners)
            if not self._has(history, prefix, metric, keys):
                continue
            crowd, fig = self._crowd(history, (prefix, metric, x_by_time, ""), keys, state.state in ENDED)
            if not len(fig.x):
                continue
            offset = series_xy(state, next(k for k in keys if k in history.series), by_time)[2]
            if m == 0:
                first = (crowd, keys, offset)
            extra = f" {SECONDARY_LABEL.get(metric, metric)}" if m else ""
            bad = int(np.count_nonzero(crowd.bad))
            note = f" ⚠ {bad:,} with NaN/inf left out" if bad else ""
            mean_style = Qt.PenStyle.DotLine if m and not label else style
            count = len(owners)
            plot.set_curve(f"{prefix}crowd/{metric}/mean", f"mean of {count:,}{extra}{suffix}{note}",
                           CROWD_COLOR, fig.x, fig.mean, weight, mean_style, width=2.4, x_offset=offset,
                           stable=fig.stable, revision=fig.revision, rank=(label, 0, 0, m))
            if m == 0 and not label:
                plot.set_band(f"crowd/{metric}/band", f"min–max of {count:,}", CROWD_COLOR, fig.x, fig.lo,
                              fig.hi, x_offset=offset, stable=fig.stable, revision=fig.revision, rank=(label, 0, 1, m))
            if spec.total and m == 0:
                plot.set_curve(f"{prefix}total", f"total ≈ mean × {count:,}{suffix}",
                               "#888888" if not label else "#aaaaaa", fig.x, fig.mean * count, weight, style,
                               width=2.2, x_offset=offset, stable=fig.stable, revision=fig.revision,
                               rank=(label, 2, 0, 0))
        if label:
            return
        if first is not None:
            self._draw_lines(state, first[0], first[1], owners, weight, by_time, x_by_time, style)
        if spec.validation:
            draw_validation(plot, state, "", "", 0, by_time)

    def _draw_lines(self, state: RunState, crowd: Crowd, keys: list[str], owners: list[str], weight: float,
                    by_time: bool, x_by_time: bool, style: Qt.PenStyle) -> None:
        """The lines besides the mean and the band: what the search names, the k highest or lowest, or
        a mean per host."""
        plot, history = self.plot, state.history
        controls = plot.crowd_controls
        asked = (controls.query, controls.k, controls.highest, controls.per_host)
        now = time.monotonic()
        drawn: set[str] = set()
        if controls.search.hasFocus() and len(owners) <= 20_000:
            self._search_names(state, owners)  # what the search box completes, while a person types
        if controls.query:
            names = self._search_names(state, owners)
            matched = owner_matches(controls.query, names.tokens)
            chosen = matched[:MAX_MATCHES]
            controls.say(len(matched), len(chosen))
        elif controls.per_host:
            controls.say(0, 0)
            chosen = []
            names = self._search_names(state, owners)
            metric = plot.spec.metrics[0]
            for h, (host, members) in enumerate(sorted(names.hosts.items())):
                host_keys = [keys[i] for i in members]
                _crowd, fig = self._crowd(history, ("", metric, x_by_time, host), host_keys, state.state in ENDED)
                if not len(fig.x):
                    continue
                key = f"crowd/{metric}/host/{host}"
                offset = series_xy(state, next(k for k in host_keys if k in history.series), by_time)[2]
                plot.set_curve(key, f"{host} (mean of {len(members):,})", LINE_COLORS[h % len(LINE_COLORS)],
                               fig.x, fig.mean, weight, style, x_offset=offset, stable=fig.stable,
                               revision=fig.revision, rank=("", 1, h, 0))
                drawn.add(key)
        else:
            controls.say(0, 0)
            if asked != self._asked or not self._ranked:
                self._ranked = crowd.ranked(controls.k, controls.highest)
                self._ranked_at = now
            elif now - self._ranked_at >= RANK_INTERVAL_S:
                # a line drawn stays while its replica is still among the 2k highest (or lowest): lines do
                # not come and go with every small change of order
                wide = crowd.ranked(2 * controls.k, controls.highest)
                kept = [i for i in wide if i in set(self._ranked)]
                self._ranked = sorted(kept + [i for i in wide if i not in kept][: controls.k - len(kept)],
                                      key=wide.index)[: controls.k]
                self._ranked_at = now
            chosen = self._ranked
        self._asked = asked
        staying = {keys[i] for i in chosen} & self._lines
        taken = {plot.curves[k].pen().color().name() for k in staying if k in plot.curves}
        free = [c for c in LINE_COLORS if c not in taken]
        for pos, i in enumerate(chosen):
            key = keys[i]
            series = history.series.get(key)
            if series is None or not len(series):
                continue
            x, y, offset = series_xy(state, key, by_time)
            owner = owners[i]
            name = replica_label(state, owner) if plot.spec.scope == "replica" else owner
            color = LINE_COLORS[0]
            if key not in plot.curves:  # a new line takes a colour no line drawn beside it has
                color = free.pop(0) if free else LINE_COLORS[pos % len(LINE_COLORS)]
            if key not in plot.curves:
                self._joined += 1  # (a new line's legend entry goes last: the others' entries stay as they are)
            plot.set_curve(key, name, color, x, y, weight, style, x_offset=offset, rank=("", 1, self._joined, 0),
                           envelope=self._envelope(history, key, x_by_time))
            drawn.add(key)
        for key in self._lines - drawn:
            plot.remove_curve(key)
        self._lines = drawn

    # ------------------------------------------------------------------ the crowds

    def _crowd(self, history: History, key: tuple[str, str, bool, str], keys: list[str], ended: bool
               ) -> tuple[Crowd, CrowdFigures]:
        """The crowd of ``key`` fed with what its owners gained since the last frame (within its budget);
        ``ended``: the run gains no more points (its last bins are drawn too)."""
        crowd = self.crowds.get(key)
        if crowd is None:
            crowd = self.crowds[key] = Crowd()
        self.used.add(key)
        crowd.set_owners(keys)
        fed = self._fed.get(key)
        stamp = (history.version, ended)
        if fed is not None and fed[0] == stamp and crowd.caught_up:
            return crowd, fed[1]
        crowd.feed(history.series, key[2], history.envelopes)
        fig = crowd.figures(ended)
        self._fed[key] = (stamp, fig)
        return crowd, fig

    def prune(self) -> None:
        """Forget the crowds no frame used since the last prune (another x axis, hosts no longer drawn)."""
        for key in [k for k in self.crowds if k not in self.used]:
            del self.crowds[key]
            self._fed.pop(key, None)
        self.used = set()

    @property
    def caught_up(self) -> bool:
        """Every crowd has folded every point it has (else the next frames go on)."""
        return all(c.caught_up for c in self.crowds.values())

    def _owner_keys(self, prefix: str, metric: str, owners: list[str]) -> list[str]:
        cached = self._keys.get((prefix, metric))
        if cached is not None and cached[0] is owners:
            return cached[1]
        scope = self.plot.spec.scope
        keys = [f"{scope}/{o}/{metric}" for o in owners]
        self._keys[(prefix, metric)] = (owners, keys)
        return keys

    def _has(self, history: History, prefix: str, metric: str, keys: list[str]) -> bool:
        """Some owner has a series of ``metric`` (checked again only when the history gained series)."""
        cached = self._present.get((prefix, metric))
        if cached is not None and cached[0] == len(history.series):
            return cached[1]
        present = any(k in history.series for k in keys)
        self._present[(prefix, metric)] = (len(history.series), present)
        return present

    def _envelope(self, history: History, key: str, by_time: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """Per point the min and max of a series read back from a run's tiers (None: every point is itself)."""
        env = history.envelopes.get(key)
        if env is None:
            return None
        got = self._envelopes.get(key)
        series = history.series[key]
        if got is None or len(got[0]) > len(series):
            x = series.t_rel if by_time else series.x_rel
            base = series.t_base if by_time else series.x_base
            got = self._envelopes[key] = envelope_points(np.asarray(x), base, env.x, env.lo, env.hi)
        if len(got[0]) < len(series):  # points appended since: each is itself
            pad = len(series) - len(got[0])
            got = self._envelopes[key] = (np.append(got[0], np.full(pad, np.nan)), np.append(got[1], np.full(pad, np.nan)))
        return got

    # ------------------------------------------------------------------ names

    def _search_names(self, state: RunState, owners: list[str]) -> _Names:
        """Each owner's names (``r17``, ``17``, its task, its host) and the hosts' owners (made again when
        owners or tasks were added)."""
        stamp = (len(owners), len(state.tasks))
        if self._names is not None and self._names[0] == stamp:
            return self._names[1]
        names = _Names()
        tasks = state.tasks
        replica = self.plot.spec.scope == "replica"
        for i, owner in enumerate(owners):
            task = replica_task(state, owner) if replica else owner
            info = tasks.get(task)
            host = info.host if info is not None and info.host else ""
            tokens = (f"r{owner}", owner, task, host) if replica else (owner, host)
            names.tokens.append(tuple(t.lower() for t in tokens if t))
            if host:
                names.hosts.setdefault(host, []).append(i)
        first = [f"r{o}" for o in owners] if replica else list(owners)
        names.completions = sorted(names.hosts) + first
        self.plot.crowd_controls.offer(names.completions)
        self._names = (stamp, names)
        return names
