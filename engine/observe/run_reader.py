"""Opening a run folder into (config, RunState) outside any front end, and following its events.

A run folder keeps its lifecycle (status, info, run, eval, progress, placement) as JSON lines in
``events.jsonl`` and its step and device samples in tiers under ``series/``
(:mod:`engine.contract.series_store`). Opening one reads the lifecycle lines and only the tiers a first
view needs (:func:`load_history`): about ``max_points_per_series`` points per curve, older parts as
bucket means with their min/max envelope (``History.envelopes``). A folder written before the tiers
(every step in ``events.jsonl``) opens as it always did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.contract import events
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.contract.run_folder import INTERRUPTED, RunFolder
from engine.contract.series_store import Block, Owner, SeriesFollower, SeriesStore
from engine.observe.telemetry import (
    REPLICA_METRICS,
    TASK_METRICS,
    TERMINAL,
    Envelope,
    History,
    ReplicaState,
    RunState,
    metric_key,
)

#: States after which a run folder gains no events: ``interrupted`` is a run whose launcher died.
ENDED = (*TERMINAL, INTERRUPTED)
#: Points per curve a first view asks for: about one per pixel of a wide plot (the envelope draws the rest).
MAX_POINTS = 2000
SERIES = "series"


def run_state_for(config: RunConfig) -> RunState:
    """A RunState listing the config's tasks, nothing run yet."""
    return RunState(total_steps=config.total_steps(),
                    tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()])


def _series_name(group: str, col: str) -> str | None:
    """The history's name of a stored sample field (None: a field no curve shows)."""
    if group == "step":
        if col in REPLICA_METRICS:
            return col
        return metric_key(col[8:]) if col.startswith("metrics.") else None
    return col if col in TASK_METRICS else None


def rows_to_events(group: str, block: Block, owners: dict[int, Owner]) -> list[dict[str, Any]]:
    """Raw rows back as the events they were (a follower's new rows, for ``RunState.apply``)."""
    out: list[dict[str, Any]] = []
    values = {c: (block.last[c], block.count[c]) for c in block.cols}
    for i in range(len(block)):
        owner = owners.get(int(block.owner[i]))
        if owner is None:
            continue
        event: dict[str, Any] = {"v": events.EVENT_VERSION, "kind": group, "task": owner.task,
                                 "t": float(block.t_first[i])}
        if group == "step":
            event["replica"] = owner.replica
            event["step"] = int(block.x_first[i])
        elif owner.device:
            event["device"] = owner.device
        for c, (v, n) in values.items():
            if n[i]:
                if c.startswith("metrics."):
                    event.setdefault("metrics", {})[c[8:]] = float(v[i])
                else:
                    event[c] = int(v[i]) if c == "worker" else float(v[i])
        out.append(event)
    return out


class EventFileReader:
    """Reads a run's new events incrementally: complete new lines of ``events.jsonl`` (bad lines
    skipped) and, where the folder has tiers, the new raw rows as step and device events (made without
    a follower: from the newest raw file on, the last minutes of samples, not the whole raw hour)."""

    def __init__(self, path: Path, series: SeriesFollower | None = None) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.stats = events.ReadStats()
        self.series = series
        if series is None and (path.parent / SERIES / "owners.jsonl").is_file():
            self.series = SeriesFollower(path.parent / SERIES, recent=True)

    def read_new(self, limit: int = 64 * 1024 * 1024) -> list[dict[str, Any]]:
        lines = self._read_lines(limit)
        if self.series is None:
            return lines
        new = self.series.read_new()
        if not new:
            return lines
        owners = {o.id: o for o in self.series.store.owners()}
        samples = [e for group, block in new.items() for e in rows_to_events(group, block, owners)]
        merged = lines + samples
        merged.sort(key=lambda e: float(e.get("t", 0.0)))  # stable: a task's order kept
        return merged

    def _read_lines(self, limit: int) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > events.MAX_LINE_BYTES:
            self.partial = b""
        return list(events.parse_lines(lines, self.stats))


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every event a run folder holds, lifecycle lines and samples from the tiers' raw level (the last
    hour by default), in time order: what ``events.jsonl`` alone held before the tiers (tests, exports)."""
    folder = Path(run_dir)
    store = folder / SERIES
    follower = SeriesFollower(store) if (store / "owners.jsonl").is_file() else None
    reader = EventFileReader(folder / "events.jsonl", follower)
    out: list[dict[str, Any]] = []
    while batch := reader.read_new():
        out += batch
        if reader.series is not None:
            reader.series = None  # the rows are read once; more lines of a big events.jsonl may follow
    return sorted(out, key=lambda e: float(e.get("t", 0.0)))


def load_history(store: SeriesStore, history: History, state: RunState | None = None,
                 max_points_per_series: int = MAX_POINTS) -> int:
    """Fill ``history`` from the tiers at about ``max_points_per_series`` per curve (and ``state``'s
    replicas and task figures from the newest rows); the events the rows stand for."""
    span = store.span()
    if span is None:
        return 0
    view = {group: store.view(group, max_points_per_series, span) for group in ("step", "device")}
    return load_view(view, {o.id: o for o in store.owners()}, history, state, t0=span[0])


def load_view(view: dict[str, Block], owners: dict[int, Owner], history: History, state: RunState | None = None,
              t0: float | None = None) -> int:
    """Fill ``history`` (and ``state``'s replicas and task figures) from a view of the tiers already read, by group
    (``SeriesStore.view``; a remote follower sends it over the wire); the events its rows stand for."""
    if history.t0 is None:
        firsts = [float(b.t_first.min()) for b in view.values() if len(b)]
        history.t0 = t0 if t0 is not None else (min(firsts) if firsts else None)
    represented = 0
    for group in ("step", "device"):
        block = view.get(group)
        if block is None or not len(block):
            continue
        represented += int(block.n.sum())
        bounds = np.flatnonzero(block.owner[1:] != block.owner[:-1]) + 1
        starts = np.concatenate(([0], bounds))
        stops = np.concatenate((bounds, [len(block)]))
        summary = block.t_last > block.t_first
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            owner = owners.get(int(block.owner[a]))
            if owner is None:
                continue
            part = block.take(slice(a, b))
            _load_owner(history, group, owner, part, summary[a:b])
            if state is not None:
                _restore(state, group, owner, part)
    return represented


def _load_owner(history: History, group: str, owner: Owner, part: Block, summary: np.ndarray) -> None:
    t = (part.t_first + part.t_last) / 2
    x = (part.x_first + part.x_last) / 2 if group == "step" else t
    width = np.where(summary, part.width, 0.0)
    for col in part.cols:
        name = _series_name(group, col)
        if name is None:
            continue
        has = part.count[col] > 0
        if not has.any():
            continue
        mean = part.mean(col)
        y = np.where(summary, mean, part.last[col])[has]
        envelope = None
        if (summary & has).any():
            envelope = Envelope(x[has & summary], part.min[col][has & summary], part.max[col][has & summary],
                                width[has & summary])
        history.load(f"{owner.key}/{name}", x[has], y, t[has], envelope)


def _restore(state: RunState, group: str, owner: Owner, part: Block) -> None:
    """The latest figures of an owner (its newest row's last values), as the fold of its events left them."""
    def latest(col: str) -> float | None:
        if col not in part.cols:
            return None
        has = np.flatnonzero(part.count[col] > 0)
        return float(part.last[col][has[-1]]) if len(has) else None

    if group == "step" and owner.replica is not None:
        rep = state.replicas.get(owner.replica)
        if rep is None:
            rep = state.replicas[owner.replica] = ReplicaState(replica=owner.replica, task=owner.task)
        rep.step = max(rep.step, int(part.x_last.max()))
        rep.loss, rep.examples_per_sec, rep.step_time = latest("loss"), latest("examples_per_sec"), latest("step_time")
        first = owner.first.get("loss")
        rep.first_loss = float(first) if first is not None else rep.loss
        worker = latest("worker")
        rep.worker = int(worker) if worker is not None else None
        rep.metrics.update({c[8:]: latest(c) for c in part.cols if c.startswith("metrics.")})
        if state.first_step_at is None or part.t_first[0] < state.first_step_at:
            state.first_step_at, state.first_step = float(part.t_first[0]), int(part.x_first[0])
        task = state._task(owner.task)
        if task.state in ("pending", "starting"):
            task.state = "running"
    elif group == "device" and not owner.device:
        task = state._task(owner.task)
        for col in ("cpu_percent", "rss_bytes", "gpu_util", "gpu_mem_bytes"):
            value = latest(col)
            if value is not None:
                setattr(task, col, int(value) if col.endswith("bytes") else value)


def read_run_folder(path: str | Path, max_points_per_series: int = MAX_POINTS,
                    ) -> tuple[RunConfig, RunState, EventFileReader]:
    """The config and the folded events of a run folder; the reader goes on from where this stopped.

    The lifecycle comes from ``events.jsonl``, the curves from the tiers (about
    ``max_points_per_series`` points each; a folder without tiers folds every event as before). A run
    whose events do not end it takes its state from the folder (``run.json``, or the folder's own
    judgement of a launcher that died, where :class:`RunFolder` offers one).
    """
    folder = RunFolder(path)
    if not folder.is_run_folder():
        raise ConfigError([Problem("", "not a run folder: it has no config.yaml")], str(folder.path))
    config = folder.read_config(check=False)
    state = run_state_for(config)
    store = SeriesStore(folder.path / SERIES)
    follower = SeriesFollower(store.root, at_end=True) if store.exists() else None
    reader = EventFileReader(folder.events, follower)
    if follower is not None:
        reader.series = None  # lifecycle lines first; the tiers stand for every sample up to now
        state.events += load_history(store, state.history, state, max_points_per_series)
        for event in reader.read_new():
            state.apply(event)
        reader.series = follower
    else:
        for event in reader.read_new():
            state.apply(event)
    if state.state not in TERMINAL:
        effective = getattr(folder, "effective_state", None)
        end = effective() if callable(effective) else folder.read_meta().get("state")
        if isinstance(end, str) and end in ENDED:
            state.state = end
    return config, state, reader

