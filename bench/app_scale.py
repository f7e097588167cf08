"""The desktop app at 1,024 replicas, at 24 hours, and on a folder of 50,000 replicas.

Three scenarios, each in the real main window (offscreen Qt, 1600x1000) of a fresh process:

``live``: 1,024 replicas on 64 hosts (16 tasks each) x 4 metrics (loss, examples/s, step time per step
event; CPU per device event) at ``--hz`` per replica, fast-forwarded for ``--minutes`` simulated minutes
through the real fold path (the events go into the session's queue as a launched run's do, are folded
into its ``RunState`` by its drain timer and drawn by the plots panel's timer: ``RunSession.watch`` with a
replay, as ``bench/gui_scale.py``), then ``--live`` seconds at real speed: frame time (redraw + paint, as
gui_scale measures it), RSS, and every point of the history checked against what was sent.

``folder``: a run of 128 replicas (one task each) written through the launcher's own ``RunRecord`` into
the tiered store (``bench/run_storage.py``'s simulation: 24 simulated hours, steps at 2 Hz for the first
23 h and 20 Hz for the last, device samples at 2 Hz) is opened in the window (``read_run_folder``: the
tiers at ~2,000 points per curve, with their buckets' min/max envelopes), then ``--live`` seconds of
events at 10 Hz per replica are folded into the shown ``RunState`` as a followed folder's are (the
session's follow tick: ``state.apply`` and ``runUpdated``): frame time and RSS, and whether the band drawn
holds the extremes of every sample written (no point lost from the tiers).

``many``: a folder of ``--replicas`` (50,000) replicas on 64 tasks, written through ``RunRecord``, opened
in the window: the time to open it and the longest event-loop turns after (the UI must answer), and the
number of curves drawn.

Frame p95 is given with a bootstrap 95 % interval (frames resampled, seeded; with ``--rounds`` > 1 the
rounds' p95s are resampled instead). ``--code DIR`` runs the same scenario against another checkout
(the "before" figures).

    python bench/app_scale.py live [--minutes 60] [--live 20]
    python bench/app_scale.py folder [--folder DIR] [--reuse]
    python bench/app_scale.py many
    python bench/app_scale.py all --write-doc
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile, remove_scratch, scratch_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "app_scale"
GOAL_FRAME_MS = 16.0
GOAL_RSS_LIVE_MB = 1000.0
GOAL_RSS_FOLDER_MB = 600.0
T0 = 1_700_000_000.0
SEED = 20_240_601


# ---------------------------------------------------------------------------- statistics


def bootstrap(values: list[float], stat: Any, resamples: int = 2000) -> tuple[float, float, float]:
    """``stat(values)`` and its percentile bootstrap 95 % interval (seeded)."""
    import numpy as np

    data = np.asarray(values, dtype=np.float64)
    if not len(data):
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(SEED)
    got = [stat(data[rng.integers(0, len(data), len(data))]) for _ in range(resamples)]
    return float(stat(data)), float(np.percentile(got, 2.5)), float(np.percentile(got, 97.5))


def p95(a: Any) -> float:
    import numpy as np

    return float(np.percentile(a, 95))


def med(a: Any) -> float:
    import numpy as np

    return float(np.median(a))


# ---------------------------------------------------------------------------- run folders (engine writers, no TF)


def scale_config(tasks: int, hosts: int, name: str = "app-scale") -> Any:
    """A config of ``tasks`` worker tasks spread over ``hosts`` hosts (``worker:0`` … in order)."""
    from engine.contract import config as config_mod

    cfg = config_mod.default_config()
    host = cfg.cluster.hosts[0]
    per = -(-tasks // hosts)
    out = []
    for h in range(hosts):
        n = min(per, tasks - h * per)
        if n <= 0:
            break
        members = tuple(config_mod.replace(host.tasks[0], index=h * per + i) for i in range(n))
        out.append(config_mod.replace(host, name=f"host-{h}", address=f"10.0.{h // 250}.{h % 250 + 1}",
                                      tasks=members))
    cluster = config_mod.replace(cfg.cluster, hosts=tuple(out))
    return config_mod.replace(cfg, name=name, cluster=cluster,
                              training=config_mod.replace(cfg.training, steps=10_000_000, epochs=None))


def write_run_folder(root: Path, replicas: int, tasks: int, hosts: int, ticks: int, hz: float = 1.0,
                     value: Any = None, finished: bool = True) -> Path:
    """A run folder written through the launcher's own ``RunRecord`` (lifecycle to ``events.jsonl``, samples
    to the tiered store): ``replicas`` replicas on ``tasks`` tasks over ``hosts`` hosts, a step event per
    replica and a device event per task each tick. ``value(replica, tick, loss)`` may change a loss (NaN,
    inf, anything); the first tick's values are written as given (the store keeps them in its owners' list)."""
    from engine.contract.run_folder import RunFolder
    from engine.control.run_record import RunRecord

    cfg = scale_config(tasks, hosts)
    folder = RunFolder.create(Path(root), cfg.name)
    folder.write_config(cfg)
    record = RunRecord(folder, describe=lambda: {"state": "finished" if finished else "running"}, on_failure=print)
    names = [t.name for _, t in cfg.cluster.tasks()]
    host_of = {t.name: h.name for h, t in cfg.cluster.tasks()}
    record.write_event({"v": 1, "kind": "run", "task": "", "t": T0 - 5, "state": "running"})
    for i, name in enumerate(names):
        record.write_event({"v": 1, "kind": "status", "task": name, "t": T0 - 4, "state": "running",
                            "pid": 100 + i, "host": host_of[name], "role": "worker"})
    for tick in range(ticks):
        t = T0 + tick / hz
        for r in range(replicas):
            loss = 2.0 / (1.0 + tick / 50.0) + 1e-4 * r
            if value is not None:
                loss = value(r, tick, loss)
            record.write_event({"v": 1, "kind": "step", "task": names[r % len(names)], "t": t + r * 1e-6,
                                "replica": r, "step": tick, "loss": loss, "examples_per_sec": 600.0 + r % 37,
                                "step_time": 0.04 + (r % 11) * 1e-3})
        for i, name in enumerate(names):
            record.write_event({"v": 1, "kind": "device", "task": name, "t": t + 1e-3, "pid": 100 + i,
                                "cpu_percent": 80.0 + i % 13})
        record.flush()
    if finished:
        record.write_event({"v": 1, "kind": "run", "task": "", "t": T0 + ticks / hz, "state": "finished"})
    record.close()
    return folder.path


# ---------------------------------------------------------------------------- the window


def _window(code: Path) -> tuple[Any, Any, Any]:
    """The app (offscreen), a controller and its shown main window; frames are timed from then on."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(code))
    import gui  # noqa: F401, I001 - first: guards the Qt binding
    from PySide6.QtCore import QSettings

    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch_dir("cd-app-")))
    from gui.app import application
    from gui.controller import Controller
    from gui.main_window import MainWindow

    app = application()
    from PySide6.QtWidgets import QMessageBox

    QMessageBox.critical = staticmethod(lambda *a, **k: print("error box:", a[1:3], file=sys.stderr))  # type: ignore[method-assign]
    controller = Controller(runs_root=scratch_dir("cd-app-runs-"))
    window = MainWindow(controller)
    window.resize(1600, 1000)
    window.show()
    return app, controller, window


class Frames:
    """Times each frame: the plots panel's redraw and pyqtgraph's painting until the next redraw, in wall
    time and in the GUI thread's CPU time (what the frame costs whatever else the machine runs)."""

    def __init__(self) -> None:
        import pyqtgraph as pg

        from gui.plots import PlotsPanel

        self.frames: list[tuple[str, float, float, float, float]] = []  # phase, redraw, paint (wall; CPU)
        self.phase = "setup"
        self._cur = {"redraw": 0.0, "paint": 0.0, "redraw_cpu": 0.0, "paint_cpu": 0.0, "open": False}
        redraw, paint = PlotsPanel.redraw, pg.GraphicsView.paintEvent
        frames = self

        def timed_redraw(panel: Any) -> None:
            frames.close()
            start, cpu = time.perf_counter(), time.thread_time()
            redraw(panel)
            frames._cur.update(open=True, redraw=time.perf_counter() - start, redraw_cpu=time.thread_time() - cpu)

        def timed_paint(view: Any, ev: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return paint(view, ev)
            finally:
                frames._cur["paint"] += time.perf_counter() - start
                frames._cur["paint_cpu"] += time.thread_time() - cpu

        PlotsPanel.redraw = timed_redraw  # type: ignore[method-assign]
        pg.GraphicsView.paintEvent = timed_paint  # type: ignore[method-assign]

    def close(self) -> None:
        c = self._cur
        if c["open"]:
            self.frames.append((self.phase, c["redraw"], c["paint"], c["redraw_cpu"], c["paint_cpu"]))
        c.update(open=False, redraw=0.0, paint=0.0, redraw_cpu=0.0, paint_cpu=0.0)

    def ms(self, phase: str) -> list[float]:
        return [(f[1] + f[2]) * 1e3 for f in self.frames if f[0] == phase]

    def cpu_ms(self, phase: str) -> list[float]:
        return [(f[3] + f[4]) * 1e3 for f in self.frames if f[0] == phase]

    def part_ms(self, phase: str, part: int) -> list[float]:
        return [f[part] * 1e3 for f in self.frames if f[0] == phase]


def _rss_mb() -> tuple[float, float]:
    import resource

    import psutil

    return psutil.Process().memory_info().rss / 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _full_draws(window: Any) -> int:
    """How many times a plot drew every line again (a moved view, a line added or gone, a reset curve)."""
    return sum(getattr(p.lines, "full_draws", 0) for p in window.plots.plots.values())


def _curves(window: Any) -> int:
    return sum(len(p.curves) for p in window.plots.plots.values())


def _grab(window: Any, path: str | None) -> None:
    if path:
        from PySide6.QtCore import QCoreApplication

        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:  # (pending layouts and paints first)
            QCoreApplication.processEvents()
            time.sleep(0.01)
        window.plots.grab().save(path)


def _queue(session: Any) -> Any:
    """The session's queue of events not folded yet (where this checkout keeps it)."""
    feed = getattr(session, "_feed", None)
    return feed._events if feed is not None and hasattr(feed, "_events") else session._events


def _run_loop(app: Any, step: Any, interval_ms: int = 10) -> None:
    """Call ``step()`` every ``interval_ms`` in a local event loop until it returns False (or raises)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    timer = QTimer()
    timer.setInterval(interval_ms)
    failed: list[BaseException] = []

    def tick() -> None:
        try:
            more = step()
        except BaseException as exc:  # noqa: BLE001 - ends the loop; raised below
            failed.append(exc)
            more = False
        if not more:
            timer.stop()
            loop.quit()

    timer.timeout.connect(tick)
    timer.start()
    loop.exec()
    if failed:
        raise failed[0]


# ---------------------------------------------------------------------------- scenario: live


def scenario_live(args: argparse.Namespace) -> dict[str, Any]:
    app, controller, window = _window(args.code)
    import gui_scale  # (its synthetic values and point-by-point check)

    frames = Frames()
    rss0, _ = _rss_mb()
    replicas, hz = args.replicas, args.hz
    gui_scale.HZ = hz
    ticks = int(args.minutes * 60 * hz)
    replay = gui_scale.Replay(replicas, ticks)
    run = gui_scale._ReplayRun()
    session = controller.session
    cfg = scale_config(replicas, args.hosts)
    session.watch(run, cfg, state="starting")  # as a launch does (the window takes its watch layout)
    run.deliver([{"v": 1, "kind": "run", "task": "", "t": gui_scale.T0, "state": "running"}])
    per_tick = max(1, int(19_200 / (2 * replicas)))  # ticks queued at once in the fast-forward (as gui_scale)
    marks: dict[str, float] = {"ff_start": time.perf_counter()}
    cpu: dict[str, Any] = {}
    import psutil

    proc = psutil.Process()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()

    def step() -> bool:
        if frames.phase in ("setup", "fast-forward"):
            frames.phase = "fast-forward"
            if _queue(session).qsize() > per_tick * replicas * 4:
                return True
            upto = min(ticks, replay.next_tick + per_tick)
            run.deliver(replay.events(upto))
            if upto >= ticks and _queue(session).empty():
                frames.close()
                frames.phase = "live"
                marks["live_start"] = time.perf_counter()
                cpu["start"] = proc.cpu_times()
                cpu["draws"] = _full_draws(window)
                if profiler is not None:
                    profiler.enable()
            return True
        due = ticks + int((time.perf_counter() - marks["live_start"]) * hz)
        if due > replay.next_tick:
            run.deliver(replay.events(due))
        if time.perf_counter() - marks["live_start"] >= args.live:
            if profiler is not None:
                profiler.disable()
            frames.close()
            frames.phase = "done"
            marks["live_end"] = time.perf_counter()
            cpu["end"] = proc.cpu_times()
            cpu["draws"] = _full_draws(window) - cpu["draws"]
            return False
        return True

    _run_loop(app, step)
    while not _queue(session).empty():  # (what the last frames left queued)
        session._drain()
    if profiler is not None:
        import pstats

        pstats.Stats(profiler).sort_stats(os.environ.get("PSORT", "cumulative")).print_stats(45)
    rss, peak = _rss_mb()
    lost = gui_scale.check_history(controller.state.history, replicas, replay.next_tick)
    _grab(window, args.png)
    curves = _curves(window)
    wall = marks["live_end"] - marks["live_start"]
    c0, c1 = cpu["start"], cpu["end"]
    run.done = True
    session._drain()
    live = frames.ms("live")
    return {
        "scenario": "live", "replicas": replicas, "hosts": args.hosts, "hz": hz, "minutes": args.minutes,
        "events": replay.sent, "points": controller.state.history.total_points(), "frames": live,
        "frames_cpu": frames.cpu_ms("live"), "redraw": frames.part_ms("live", 1), "paint": frames.part_ms("live", 2),
        "ff_s": marks["live_start"] - marks["ff_start"], "ff_p95_ms": percentile(frames.ms("fast-forward"), 95),
        "cpu_pct": ((c1.user + c1.system) - (c0.user + c0.system)) / wall * 100, "rss_mb": rss, "peak_mb": peak,
        "rss_start_mb": rss0, "lost": lost, "curves": curves, "load": os.getloadavg()[0],
        "full_draws": cpu["draws"],
    }


# ---------------------------------------------------------------------------- scenario: folder (24 h)


def _simulate(folder: Path, hours: float, replicas: int) -> Path:
    """The 24 h run written by bench/run_storage.py's simulation, in a process of its own (it pins itself)."""
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import run_storage; "
            f"print(json.dumps(run_storage.simulate(__import__('pathlib').Path({str(folder)!r}), {hours}, {replicas}, "
            f"20.0, 2.0, 2.0, 1.0)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return Path(json.loads(out.stdout.strip().splitlines()[-1])["run_dir"])


def _expected_extremes(hours: float, replicas: int) -> tuple[float, float]:
    """The lowest and highest loss run_storage's simulation writes (its formula, over every tick written)."""
    import numpy as np

    hz, early = 20.0, 2.0
    ticks = int(hours * 3600 * hz)
    full_from = int(max(0.0, hours - 1.0) * 3600 * hz)
    skip = max(1, round(hz / early))
    tick = np.arange(ticks)
    written = tick[(tick >= full_from) | (tick % skip == 0)]
    decay = 2.0 / (1.0 + written / 1000.0)
    lo = hi = None
    for r in range(replicas):
        noise = ((written * 7919 + r * 104729) % 1000) / 1000.0
        loss = (decay + 0.05 * noise).astype(np.float32)
        lo = loss.min() if lo is None else min(lo, loss.min())
        hi = loss.max() if hi is None else max(hi, loss.max())
    return float(lo), float(hi)


def scenario_folder(args: argparse.Namespace) -> dict[str, Any]:
    folder = args.folder or scratch_dir("cd-app-24h-")
    found = sorted(p for p in Path(folder).glob("*") if (p / "config.yaml").is_file()) if folder.exists() else []
    write_s = math.nan
    if args.reuse and found:
        run_dir = found[-1]
    else:
        start = time.perf_counter()
        run_dir = _simulate(Path(folder), args.hours, args.replicas)
        write_s = time.perf_counter() - start
    app, controller, window = _window(args.code)
    frames = Frames()
    rss0, _ = _rss_mb()
    start = time.perf_counter()
    frames.phase = "open"
    window.open_run_folder(run_dir)
    session = controller.session
    session.release() if hasattr(session, "release") else None  # (a run shown as ended: not followed)
    state = session.state
    # the first frames fold the tiers into the plots (bounded per frame): until every plot caught up
    panel = window.plots

    def caught_up() -> bool:
        crowds = getattr(panel, "crowds", {})
        return all(getattr(c, "caught_up", True) for c in crowds.values())

    opened = {"t": math.nan}
    first_s = time.perf_counter()
    call_s = first_s - start  # open_run_folder itself: the folder read, the window's first fold

    def settle() -> bool:
        """Until every plot caught up: the open's time is when they first did (one turn of the loop after the
        call at least: a frame was painted), provided they stay caught up for a second after."""
        now = time.perf_counter()
        if not caught_up():
            opened["t"] = math.nan
            return now - first_s < 120
        if math.isnan(opened["t"]):
            opened["t"] = now - start
        return now - start - opened["t"] < 1.0

    _run_loop(app, settle)
    frames.close()
    drawn_lo, drawn_hi = _band_extremes(window)  # before the live events add their own
    frames.phase = "live"
    # live: 10 Hz per replica from where the run stopped, folded as a followed folder's events are (a run
    # that goes on: running, as an attached folder's state is)
    state.state = "running"
    replicas = len(state.replicas)
    last_t = max((s.t_base + float(s.t_rel[-1])) for s in state.history.series.values() if len(s))
    last_step = state.step
    tick = {"n": 0}
    live_start = time.perf_counter()
    import psutil

    proc = psutil.Process()
    cpu0 = proc.cpu_times()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()

    def step() -> bool:
        due = int((time.perf_counter() - live_start) * 10)
        batch = []
        while tick["n"] < due:
            tick["n"] += 1
            t = last_t + tick["n"] / 10
            for r in range(replicas):
                batch.append({"v": 1, "kind": "step", "task": f"worker:{r}", "t": t, "replica": r,
                              "step": last_step + tick["n"] * 2, "loss": 0.1 + 1e-4 * r,
                              "examples_per_sec": 600.0, "step_time": 0.04, "metrics": {"accuracy": 0.9}})
                if tick["n"] % 5 == 0:
                    batch.append({"v": 1, "kind": "device", "task": f"worker:{r}", "t": t, "pid": 100 + r,
                                  "cpu_percent": 85.0, "rss_bytes": 2_000_000_000})
        if batch:  # as RunSession._follow_tick folds a followed folder's new events
            for event in batch:
                state.apply(event)
            session.runUpdated.emit()
        return time.perf_counter() - live_start < args.live

    draws0 = _full_draws(window)
    _run_loop(app, step, 25)
    frames.close()
    draws = _full_draws(window) - draws0
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats(os.environ.get("PSORT", "cumulative")).print_stats(45)
    cpu1 = proc.cpu_times()
    wall = time.perf_counter() - live_start
    rss, peak = _rss_mb()
    _grab(window, args.png)
    lo, hi = _expected_extremes(args.hours, args.replicas)
    return {
        "scenario": "folder", "replicas": args.replicas, "hours": args.hours, "write_s": write_s,
        "open_s": opened["t"], "open_call_s": call_s, "frames": frames.ms("live"), "open_frames": frames.ms("open"),
        "frames_cpu": frames.cpu_ms("live"), "redraw": frames.part_ms("live", 1), "paint": frames.part_ms("live", 2),
        "rss_mb": rss, "peak_mb": peak, "rss_start_mb": rss0, "cpu_pct": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall * 100,
        "represented": state.events, "points": state.history.total_points(), "curves": _curves(window),
        "full_draws": draws,
        "loss_min": lo, "loss_max": hi, "band_min": drawn_lo, "band_max": drawn_hi, "load": os.getloadavg()[0],
        "folder": str(run_dir),
    }


def _band_extremes(window: Any) -> tuple[float, float]:
    """The lowest and highest value of the loss plot's band (NaN: no band, as before the crowds)."""
    band = getattr(window.plots.loss, "band_model", None)
    lo = hi = math.nan
    if band is not None:
        for key, src in band.sources.items():
            if key.endswith("#lo"):
                lo = float(src.summary.bounds()[0])
            if key.endswith("#hi"):
                hi = float(src.summary.bounds()[1])
    return lo, hi


# ---------------------------------------------------------------------------- scenario: many (50,000)


def scenario_many(args: argparse.Namespace) -> dict[str, Any]:
    folder = args.folder or scratch_dir("cd-app-many-")
    found = sorted(p for p in Path(folder).glob("*") if (p / "config.yaml").is_file()) if folder.exists() else []
    if args.reuse and found:
        run_dir = found[-1]
    else:
        run_dir = write_run_folder(Path(folder), args.replicas, 64, 4, args.ticks)
    app, controller, window = _window(args.code)
    frames = Frames()
    from PySide6.QtCore import QCoreApplication

    start = time.perf_counter()
    window.open_run_folder(run_dir)
    open_s = time.perf_counter() - start
    turns: list[float] = []
    end = time.perf_counter() + args.live
    frames.phase = "after"
    while time.perf_counter() < end:  # the event loop's turns, timed one by one (a person's clicks wait for these)
        t = time.perf_counter()
        QCoreApplication.processEvents()
        turns.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.005)
    # a resize: every plot cut again for its new width
    t = time.perf_counter()
    window.resize(1400, 900)
    for _ in range(20):
        QCoreApplication.processEvents()
    resize_ms = (time.perf_counter() - t) * 1e3
    rss, peak = _rss_mb()
    _grab(window, args.png)
    return {"scenario": "many", "replicas": args.replicas, "open_s": open_s, "turns": turns,
            "curves": _curves(window), "resize_ms": resize_ms, "rss_mb": rss, "peak_mb": peak,
            "frames": frames.ms("after"), "load": os.getloadavg()[0]}


# ---------------------------------------------------------------------------- the document


def _doc(results: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]], note: str) -> str:
    def frame_cell(r: dict[str, Any] | None, field: str = "frames") -> str:
        if not r or not r.get(field):
            return "—"
        p, lo, hi = bootstrap(r[field], p95)
        return f"{p:.1f} ms [{lo:.1f}, {hi:.1f}]"

    def cpu_met(r: dict[str, Any]) -> str:
        return "met" if r.get("frames_cpu") and bootstrap(r["frames_cpu"], p95)[2] <= GOAL_FRAME_MS else "**not met**"

    lines = ["## 3e. The app at 1,024 replicas, at 24 hours, and on 50,000 replicas", "",
             "`python bench/app_scale.py all` — each scenario in the real main window (offscreen Qt, 1600x1000) "
             "of a fresh process; frame = the plots panel's redraw plus pyqtgraph's painting until the next "
             "(as section 3); p95 with a bootstrap 95 % interval (frames resampled, 2,000 times, seeded). "
             + note, ""]
    live, folder, many = results.get("live"), results.get("folder"), results.get("many")
    if live:
        b = before.get("live")
        lines += [f"**live**: {live['replicas']:,} replicas on {live['hosts']} hosts x 4 metrics at {live['hz']:g} Hz, "
                  f"{live['minutes']:g} simulated minutes fast-forwarded through `RunSession.watch` (the session's queue, "
                  f"`RunState`, the plots' timer), then {len(live['frames'])} frames live: {live['events']:,} events, "
                  f"{live['points']:,} points.", "",
                  "| figure | before | now | goal |", "| --- | ---: | ---: | --- |",
                  f"| frame p95, live | {frame_cell(b)} | **{frame_cell(live)}** | <= {GOAL_FRAME_MS:g} ms "
                  f"({'met' if bootstrap(live['frames'], p95)[2] <= GOAL_FRAME_MS else '**not met**'}) |",
                  f"| — the GUI thread's CPU time per frame, p95 | {frame_cell(b, 'frames_cpu')} | "
                  f"**{frame_cell(live, 'frames_cpu')}** | <= {GOAL_FRAME_MS:g} ms ({cpu_met(live)}) |",
                  f"| frame median, live | {med(b['frames']) if b else math.nan:.1f} ms | {med(live['frames']):.1f} ms | |",
                  f"| curves drawn (5 plots) | {b['curves'] if b else '—'} | {live['curves']} | |",
                  f"| GUI CPU, live | {b['cpu_pct'] if b else math.nan:.0f} % | {live['cpu_pct']:.0f} % of one core | |",
                  f"| RSS at the end | {b['rss_mb'] if b else math.nan:.0f} MB | **{live['rss_mb']:.0f} MB** (peak "
                  f"{live['peak_mb']:.0f}; {live['rss_start_mb']:.0f} before the run) | <= {GOAL_RSS_LIVE_MB:g} MB "
                  f"({'met' if live['rss_mb'] <= GOAL_RSS_LIVE_MB else '**not met**'}) |",
                  f"| points lost or changed in the history | {b['lost'] if b else '—'} | **{live['lost']}** of "
                  f"{live['points']:,} | 0 |",
                  f"| fast-forward (fold + draw) | {b['ff_s'] if b else math.nan:.0f} s | {live['ff_s']:.0f} s, frame p95 "
                  f"{live['ff_p95_ms']:.0f} ms | |", ""]
        if b and b["minutes"] != live["minutes"]:
            lines += [f"*Before* is the same scenario at {b['minutes']:g} simulated minutes (one line per replica: its "
                      "fast-forward of an hour would take hours here); a frame's cost does not grow with the hours "
                      "behind it in either (each frame draws the new points only).", ""]
    if folder:
        b = before.get("folder")
        lines += [f"**folder**: {folder['replicas']} replicas x {folder['hours']:g} h written through `RunRecord` "
                  f"(bench/run_storage.py's simulation), opened in the window, then {len(folder['frames'])} frames of "
                  f"10 Hz per replica folded as a followed folder's events.", "",
                  "| figure | before | now | goal |", "| --- | ---: | ---: | --- |",
                  f"| open, until every plot drew its tiers (first full frame) | {b['open_s'] if b else math.nan:.2f} s | "
                  f"**{folder['open_s']:.2f} s** | <= 3 s ({'met' if folder['open_s'] <= 3.0 else '**not met**'}) |",
                  f"| — of which `open_run_folder` itself | {b.get('open_call_s', math.nan) if b else math.nan:.2f} s | "
                  f"{folder.get('open_call_s', math.nan):.2f} s | |",
                  f"| frame p95, live at 24 h | {frame_cell(b)} | **{frame_cell(folder)}** | <= {GOAL_FRAME_MS:g} ms "
                  f"({'met' if bootstrap(folder['frames'], p95)[2] <= GOAL_FRAME_MS else '**not met**'}) |",
                  f"| — the GUI thread's CPU time per frame, p95 | {frame_cell(b, 'frames_cpu')} | "
                  f"**{frame_cell(folder, 'frames_cpu')}** | <= {GOAL_FRAME_MS:g} ms ({cpu_met(folder)}) |",
                  f"| RSS | {b['rss_mb'] if b else math.nan:.0f} MB | **{folder['rss_mb']:.0f} MB** (peak "
                  f"{folder['peak_mb']:.0f}) | <= {GOAL_RSS_FOLDER_MB:g} MB "
                  f"({'met' if folder['rss_mb'] <= GOAL_RSS_FOLDER_MB else '**not met**'}) |",
                  f"| samples the tiers stand for (read back) | | {folder['represented']:,} | every one written |",
                  f"| loss band drawn vs every loss written (min / max) | | {folder['band_min']:.4f} / "
                  f"{folder['band_max']:.4f} vs {folder['loss_min']:.4f} / {folder['loss_max']:.4f} | equal |",
                  f"| curves drawn | {b['curves'] if b else '—'} | {folder['curves']} | |", ""]
    if many:
        b = before.get("many")
        lines += [f"**many**: a folder of {many['replicas']:,} replicas on 64 tasks (written through `RunRecord`), "
                  "opened in the window; then its event-loop turns for a few seconds, and a resize.", "",
                  "| figure | before | now |", "| --- | ---: | ---: |",
                  f"| open (`open_run_folder`) | {b['open_s'] if b else math.nan:.1f} s | {many['open_s']:.1f} s |",
                  f"| longest event-loop turn after | {max(b['turns']) if b else math.nan:.0f} ms | "
                  f"{max(many['turns']):.0f} ms |",
                  f"| turns p95 after | {percentile(b['turns'], 95) if b else math.nan:.1f} ms | "
                  f"{percentile(many['turns'], 95):.1f} ms |",
                  f"| a resize (every plot cut again) | {b['resize_ms'] if b else math.nan:.0f} ms | "
                  f"{many['resize_ms']:.0f} ms |",
                  f"| curves drawn | {b['curves'] if b else '—'} | {many['curves']} |", ""]
    return "\n".join(lines)


def write_doc(body: str, path: Path = DOC) -> None:
    """Replace (or append) this benchmark's section of the results document."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    begin, end = f"<!-- bench:{SECTION} -->", f"<!-- /bench:{SECTION} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def _load(files: str) -> dict[str, dict[str, Any]]:
    """Scenario figures (``--json`` of single scenarios) by scenario."""
    out = {}
    for name in files.split(","):
        r = json.loads(Path(name).read_text(encoding="utf-8"))
        out[r["scenario"]] = r
    return out


def summary(r: dict[str, Any]) -> str:
    parts = [f"{r['scenario']}:"]
    if r.get("frames"):
        p, lo, hi = bootstrap(r["frames"], p95)
        parts.append(f"frame p95 {p:.1f} ms [{lo:.1f}, {hi:.1f}] median {med(r['frames']):.1f} ms "
                     f"({len(r['frames'])} frames)")
    if r.get("frames_cpu"):
        p, lo, hi = bootstrap(r["frames_cpu"], p95)
        parts.append(f"frame CPU p95 {p:.1f} ms [{lo:.1f}, {hi:.1f}]; redraw p95 {percentile(r['redraw'], 95):.1f}, "
                     f"paint p95 {percentile(r['paint'], 95):.1f} ms (wall)")
    for key in ("open_s", "ff_s", "rss_mb", "peak_mb", "curves", "lost", "cpu_pct", "resize_ms", "full_draws"):
        if key in r and r[key] == r[key]:
            parts.append(f"{key} {r[key]:.2f}" if isinstance(r[key], float) else f"{key} {r[key]}")
    if r.get("turns"):
        parts.append(f"turns max {max(r['turns']):.0f} ms p95 {percentile(r['turns'], 95):.1f} ms")
    if "band_min" in r:
        parts.append(f"band {r['band_min']:.4f}..{r['band_max']:.4f} vs written {r['loss_min']:.4f}..{r['loss_max']:.4f}; "
                     f"samples represented {r['represented']:,}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("live", "folder", "many", "all"))
    parser.add_argument("--replicas", type=int, help="live 1024, folder 128, many 50000")
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--hz", type=float, default=10.0, help="reports per second per replica (live)")
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes (live)")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (folder)")
    parser.add_argument("--ticks", type=int, default=20, help="ticks of the many-replica folder")
    parser.add_argument("--live", type=float, default=20.0, help="seconds at real speed")
    parser.add_argument("--folder", type=Path, help="where a scenario's run folder is written")
    parser.add_argument("--reuse", action="store_true", help="open the run already in --folder")
    parser.add_argument("--png", help="grab the plots to this PNG at the end")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the live phase")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose app is measured")
    parser.add_argument("--json", type=Path, help="write the figures here (one scenario)")
    parser.add_argument("--before", help="figures of the same scenarios from another checkout: JSON files of "
                        "scenarios (comma-separated; each from --json of one scenario)")
    parser.add_argument("--results", help="write the document from these scenarios' JSON files (comma-separated) "
                        "instead of running them")
    parser.add_argument("--quick", action="store_true", help="a smoke run: minutes, not hours (figures mean nothing)")
    parser.add_argument("--write-doc", action="store_true")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.hours, args.live, args.ticks = min(args.minutes, 0.2), min(args.hours, 0.05), min(args.live, 2.0), 3
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.scenario != "all":
        args.replicas = args.replicas or {"live": 1024, "folder": 128, "many": 50_000}[args.scenario]
        if args.quick:
            args.replicas = min(args.replicas, {"live": 64, "folder": 40, "many": 300}[args.scenario])
        r = {"live": scenario_live, "folder": scenario_folder, "many": scenario_many}[args.scenario](args)
        print(summary(r), flush=True)
        if args.json:
            args.json.write_text(json.dumps(r), encoding="utf-8")
        remove_scratch()  # its settings, runs and folders (os._exit runs no atexit handler)
        os._exit(0)  # (the window's teardown is no part of the figures)
    results: dict[str, dict[str, Any]] = _load(args.results) if args.results else {}
    for name in () if args.results else ("live", "folder", "many"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [sys.executable, __file__, name, "--json", str(out), "--live", str(args.live), "--code", str(args.code)]
            if args.quick:
                cmd.append("--quick")
            if name == "live":
                cmd += ["--minutes", str(args.minutes), "--hz", str(args.hz)]
            if name == "folder":
                cmd += ["--hours", str(args.hours)]
            proc = subprocess.run(cmd, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"), capture_output=True,
                                  text=True, timeout=7200)
            print(proc.stdout.strip(), flush=True)
            if proc.returncode != 0 or not out.exists():
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            results[name] = json.loads(out.read_text(encoding="utf-8"))
    before = _load(args.before) if args.before else {}
    note = ("A smoke run at reduced scale: figures mean nothing." if args.quick else
            "Load average (1 min) at the end of each: " + ", ".join(f"{k} {v['load']:.1f}" for k, v in results.items())
            + " "
            "on 2 cores shared with other work (frame times are wall times).")
    if args.write_doc or not args.quick:
        write_doc(_doc(results, before, note), args.doc)
    if args.json:
        args.json.write_text(json.dumps(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
