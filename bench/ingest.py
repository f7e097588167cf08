"""The launcher's ingest path at scale: how many events per second it takes, on one core, losing none.

A real :class:`engine.control.launcher.Run` is started with a stand-in for the supervisor (its
``python`` is a small feeder program): the feeder reads the run's spec like a supervisor, then
writes synthetic events on its stdout as fast as the pipe takes them — per replica and tick one
``step`` event (loss, examples/s, step time, sync wait, own time) and one ``device`` event (CPU %,
RSS, pid), the lines a supervisor relays. The launcher's own code does the rest: its reader thread
(``engine.control.supervisor_links.read_supervisor``: reads of up to 64 KiB split into lines and decoded by
``engine.contract.events.StreamDecoder``, one list per read on the queue), its dispatcher (the fold,
``engine.observe.telemetry.RunState.apply``; the lifecycle policy, ``engine.control.lifecycle.feed_sample``; the
run record: samples into the tiered store ``series/``, lifecycle events into ``events.jsonl``; the listeners). The
launcher process is pinned to one core, the feeder to another (where there are two).

Figures: events/s from the feeder's first bulk event to the end of the run (every event
folded and written), the events folded and written against those sent (none may be lost), and
the cost of each stage alone (bytes/event, µs/event for splitting reads into lines, decoding, the hand-off,
folding, the lifecycle policy, the tiered store), the memory per history point, and (``--profile``) a cProfile
of the same stages in one thread. Goal: >= 100,000 events/s on one core (256 replicas x 2 events x 50 Hz is
25,600 events/s: the goal leaves room for four times that), nothing lost.

A second section of docs/benchmarks.md (``scale_design``) takes the per-event figures to what
limits the next factor of ten (1,000+ replicas) and the design that would lift it.

With ``--against REV`` the same feed goes, in ``--rounds`` interleaved rounds (order rotating, each
run in a fresh process pinned the same way), through this tree's launcher and through the launcher of
git revision ``REV`` (exported with ``git archive``): events/s of each side with a bootstrap 95 %
interval of its median, and the median paired ratio now / REV with its interval (``bench/_stats.py``).

    python bench/ingest.py [--replicas 256] [--hz 50] [--seconds 20] [--profile] [--quick]
    python bench/ingest.py --against REV [--rounds 10] [--seconds 4]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, verdict, want_doc, write_section  # noqa: E402
from _stats import MIN_ROUNDS, bootstrap_median, paired_ratio, rotated  # noqa: E402

#: A child run of ``--against`` imports the engine from this tree (an exported revision), not this checkout.
TREE_ENV = "CD_INGEST_TREE"
if os.environ.get(TREE_ENV):
    sys.path.insert(0, os.environ[TREE_ENV])

from engine.contract import config as config_mod  # noqa: E402
from engine.contract import events as events_mod  # noqa: E402
from engine.contract.series_store import SeriesWriter  # noqa: E402
from engine.control.launcher import Run  # noqa: E402
from engine.control.run_record import SERIES_FLUSH_EVENTS  # noqa: E402
from engine.control.supervisor_links import READ_CHUNK  # noqa: E402
from engine.observe.telemetry import RunState  # noqa: E402

GOAL_EVENTS_PER_S = 100_000.0
#: ``1``: the launcher keeps the curves too (``--curves``; children of ``--against`` inherit it)
CURVES_ENV = "CD_INGEST_CURVES"
T0 = 1_700_000_000.0

#: The stand-in supervisor: reads the spec line, then writes the events (see the module docstring).
FEEDER = r'''
import json, os, sys, time
params = json.load(open(sys.argv[1]))
if params.get("cpu") is not None and hasattr(os, "sched_setaffinity"):
    try:
        os.sched_setaffinity(0, {params["cpu"]})
    except OSError:
        pass
spec = json.loads(sys.stdin.buffer.readline())
out = sys.stdout.buffer
tasks = [t["name"] for t in spec["tasks"]]
def line(d):
    return (json.dumps(d, separators=(",", ":")) + "\n").encode()
for i, name in enumerate(tasks):
    out.write(line({"v": 1, "kind": "status", "task": name, "t": time.time(), "state": "starting", "pid": 1000 + i}))
    out.write(line({"v": 1, "kind": "status", "task": name, "t": time.time(), "state": "running", "pid": 1000 + i}))
out.flush()
R, TICKS, HZ, T0 = params["replicas"], params["ticks"], params["hz"], params["t0"]
ntasks = len(tasks)
STEP = ('{"v":1,"kind":"step","task":"%s","t":%.6f,"replica":%d,"step":%d,"loss":%.6f,"examples_per_sec":%.3f,'
        '"step_time":%.6f,"sync_wait":%.6f,"own_time":%.6f}\n')
DEVICE = '{"v":1,"kind":"device","task":"%s","t":%.6f,"cpu_percent":%.1f,"rss_bytes":%d,"pid":%d}\n'
out.write(line({"v": 1, "kind": "info", "task": "feeder", "t": time.time(), "message": "bulk starts",
                "bulk_start": time.time()}))
out.flush()
buf = []
size = 0
for tick in range(TICKS):
    t = T0 + tick / HZ
    for r in range(R):
        task = tasks[r % ntasks]
        loss = 2.3 / (1.0 + tick * 1e-3) + r * 1e-4
        buf.append(STEP % (task, t + r * 1e-6, r, tick + 1, loss, 800.0 + r, 0.02, 0.004, 0.016))
        buf.append(DEVICE % (task, t + r * 1e-6 + 5e-7, 90.0 + (tick % 10), 500_000_000 + tick, 1000 + r % ntasks))
    if len(buf) >= 2048 or tick == TICKS - 1:
        out.write("".join(buf).encode())
        buf.clear()
for i, name in enumerate(tasks):
    out.write(line({"v": 1, "kind": "status", "task": name, "t": time.time(), "state": "finished", "pid": 1000 + i}))
out.flush()
'''


def make_config(replicas: int, tasks: int) -> config_mod.RunConfig:
    cfg = config_mod.default_config()
    host = cfg.cluster.hosts[0]
    workers = tuple(config_mod.replace(host.tasks[0], index=i, role="worker", port=None) for i in range(tasks))
    cluster = config_mod.replace(cfg.cluster, hosts=(config_mod.replace(host, tasks=workers, gpus=0),))
    batch = 4 * max(replicas, tasks)
    return config_mod.replace(cfg, name="ingest", cluster=cluster,
                              parallelism=config_mod.replace(cfg.parallelism, mode="data"),
                              training=config_mod.replace(cfg.training, global_batch_size=batch, steps=10_000_000,
                                                          epochs=None, checkpoint_every=0))


def pin(cpu: int) -> bool:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        try:
            os.sched_setaffinity(0, {cpu})
            return True
        except OSError:
            return False
    return False


def stored_rows(series: Path) -> dict[str, int]:
    """Rows of the tiered store's raw level by group (read with pyarrow alone: a revision before the store
    has no reader to import)."""
    rows = {"step": 0, "device": 0}
    if not (series / "raw").is_dir():
        return rows
    import pyarrow as pa
    import pyarrow.ipc as ipc

    for path in sorted((series / "raw").glob("*.arrows")):
        group = path.name.split("-")[0]
        rows[group] = rows.get(group, 0) + ipc.open_stream(pa.memory_map(str(path))).read_all().num_rows
    return rows


def folder_bytes(run_dir: Path) -> int:
    """What the run wrote for its events: ``events.jsonl`` and the tiered store."""
    total = os.path.getsize(run_dir / "events.jsonl")
    for dirpath, _, files in os.walk(run_dir / "series"):
        total += sum(os.path.getsize(Path(dirpath) / f) for f in files)
    return total


def run_ingest(work: Path, replicas: int, ticks: int, hz: float, tasks: int) -> dict[str, Any]:
    """The real launcher fed by the feeder; returns the figures."""
    feeder = work / "feeder.py"
    feeder.write_text(FEEDER, encoding="utf-8")
    params = work / "params.json"
    params.write_text(json.dumps({"replicas": replicas, "ticks": ticks, "hz": hz, "t0": T0,
                                  "cpu": 1 if (os.cpu_count() or 1) > 1 else None}), encoding="utf-8")
    wrapper = work / "supervisor-stand-in"
    wrapper.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{feeder}' '{params}'\n", encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    cfg = make_config(replicas, tasks)
    # a launcher keeps no curves (the app, attached, folds them in its own process); CURVES_ENV=1 adds them, as
    # this benchmark measured before the launcher ran apart from the app
    curves = os.environ.get(CURVES_ENV) == "1"
    run = Run(cfg, runs_root=work / "runs", python=str(wrapper), isolate=False, checked=True, keep_history=curves)
    marks: dict[str, float] = {}

    def on_event(e: dict[str, Any]) -> None:  # one cheap check per event: the bulk's start mark
        if e["kind"] == "info" and "bulk_start" in e:
            marks["bulk_start"] = float(e["bulk_start"])

    run.add_listener(on_event)
    cpu0 = time.process_time()
    run.start()
    state = run.wait(3600)
    end = time.time()
    cpu = time.process_time() - cpu0
    sent_step = sent_device = replicas * ticks
    sent = sent_step + sent_device
    history = run.state.history
    written = {"step": 0, "device": 0}
    lifecycle = 0
    with open(run.folder.events, "rb") as fh:
        for line in fh:
            if b'"kind":"step"' in line:
                written["step"] += 1
            elif b'"kind":"device"' in line:
                written["device"] += 1
            else:
                lifecycle += 1
    if curves:  # every sample's points in the curves
        folded_step = sum(len(history.series.get(f"replica/{r}/loss", ())) for r in range(replicas))
        folded_device = sum(len(history.series.get(f"task/worker:{i}/cpu_percent", ())) for i in range(tasks))
    else:  # every event the run's state took, less its lifecycle events (each of them in events.jsonl)
        folded_step, folded_device = run.state.events - lifecycle, 0
    written_store = stored_rows(run.run_dir / "series")  # the tiered store's raw rows (none before it)
    written["step"] += written_store["step"]
    written["device"] += written_store["device"]
    last_steps_ok = all(run.state.replicas[r].step == ticks for r in range(replicas) if r in run.state.replicas)
    seconds = end - marks.get("bulk_start", end)
    out = {"state": state, "sent": sent, "seconds": seconds, "events_per_s": sent / seconds if seconds > 0 else 0.0,
           "points_per_s": (sent_step * 3 + sent_device * 2) / seconds if seconds > 0 else 0.0,
           "folded": folded_step + folded_device, "written": written["step"] + written["device"],
           "lost_folded": sent - (folded_step + folded_device), "lost_written": sent - written["step"] - written["device"],
           "last_steps_ok": last_steps_ok and len(run.state.replicas) == replicas, "launcher_cpu_s": cpu,
           "bytes": folder_bytes(run.run_dir)}
    shutil.rmtree(run.run_dir, ignore_errors=True)
    return out


def sample_lines(replicas: int, ticks: int, hz: float = 50.0) -> list[bytes]:
    """The feeder's lines for ``ticks`` ticks, made here (for the per-stage figures)."""
    ns: dict[str, Any] = {}
    step_fmt = FEEDER.split("STEP = (")[1].split(")\nDEVICE")[0]
    device_fmt = FEEDER.split("DEVICE = ")[1].split("\n")[0]
    exec(f"STEP = ({step_fmt})\nDEVICE = {device_fmt}", ns)  # noqa: S102 - our own format strings
    lines = []
    for tick in range(ticks):
        t = T0 + tick / hz
        for r in range(replicas):
            task = f"worker:{r}"
            lines.append((ns["STEP"] % (task, t, r, tick + 1, 2.3 / (1 + tick * 1e-3), 800.0 + r, 0.02, 0.004,
                                        0.016)).encode())
            lines.append((ns["DEVICE"] % (task, t + 5e-7, 90.0, 500_000_000 + tick, 1000 + r)).encode())
    return lines


def policy_cost(evs: list[dict[str, Any]], replicas: int) -> float:
    """µs per event the run's lifecycle policy takes of the samples (``feed_sample``, as the dispatcher calls it)."""
    from engine.control import lifecycle as lc

    policy = lc.Lifecycle([lc.TaskInfo(f"worker:{r}", "worker", "local") for r in range(replicas)], mode="data")
    start = time.perf_counter()
    now = time.monotonic()
    for e in evs:
        lc.feed_sample(policy, e, now)
    return (time.perf_counter() - start) / len(evs) * 1e6


def stage_costs(replicas: int, ticks: int) -> dict[str, float]:
    """µs per event of each stage of the launcher's path alone (one thread), as the launcher runs it, bytes per
    event and memory per history point: the reader's (its pipe's reads split into lines, each decoded), the
    hand-off (one list per read), the dispatcher's (the fold, the lifecycle policy, the tiered store; a sample
    goes to no ``events.jsonl``)."""
    from engine.contract.run_folder import LineSplitter

    lines = sample_lines(replicas, ticks)
    n = len(lines)
    data = b"".join(lines)
    chunks = [data[i:i + READ_CHUNK] for i in range(0, len(data), READ_CHUNK)]
    out: dict[str, float] = {"events": n, "bytes_per_event": len(data) / n}

    splitter = LineSplitter()
    start = time.perf_counter()
    got = [line for chunk in chunks for line in splitter.feed(chunk)]
    out["read_us"] = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    evs = [events_mod.decode(line) for line in got]
    out["decode_us"] = (time.perf_counter() - start) / n * 1e6
    assert all(e is not None for e in evs)
    import orjson

    start = time.perf_counter()
    parsed = [orjson.loads(line) for line in got]
    out["json_loads_us"] = (time.perf_counter() - start) / n * 1e6
    del parsed
    per_read = max(1, n * READ_CHUNK // len(data))  # the events of one read: one hand-off
    batches = [list(zip(evs[i:i + per_read], got[i:i + per_read], strict=True)) for i in range(0, n, per_read)]
    q: queue.Queue[Any] = queue.Queue()
    start = time.perf_counter()
    for b in batches:
        q.put(b)
    for _ in batches:
        q.get()
    out["queue_us"] = (time.perf_counter() - start) / n * 1e6
    state = RunState(total_steps=ticks, tasks=[(f"worker:{r}", "worker", "local") for r in range(replicas)])
    start = time.perf_counter()
    for e in evs:
        state.apply(e)  # type: ignore[arg-type]
    out["fold_us"] = (time.perf_counter() - start) / n * 1e6
    out["policy_us"] = policy_cost(evs, replicas)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp:
        series = SeriesWriter(Path(tmp) / "series")
        start = time.perf_counter()
        for e in evs:
            series.add(e)  # type: ignore[arg-type]
            if series.held >= SERIES_FLUSH_EVENTS:
                series.flush()
        series.flush()
        out["store_us"] = (time.perf_counter() - start) / n * 1e6
        series.close()
    out["path_us"] = (out["read_us"] + out["decode_us"] + out["queue_us"] + out["fold_us"] + out["policy_us"]
                      + out["store_us"])
    # memory of the history: every distinct array's bytes over the points it holds
    history = state.history
    arrays: dict[int, int] = {}
    filled: dict[int, int] = {}
    for s in history.series.values():
        ax = s._axis
        steps = ax.x.a if ax.x is not None else None
        for a in (steps, ax.t, s._y):
            if a is not None:
                arrays[id(a)] = a.nbytes
        filled[id(s._y)] = len(s) * s._y.itemsize
        filled[id(ax.t)] = ax.n * ax.t.itemsize
        if ax.x is not None:  # a column of steps read by several axes counts once, at its longest
            filled[id(ax.x.a)] = ax.x.n * ax.x.a.itemsize
    points = history.total_points()
    out["points"] = points
    out["bytes_per_point"] = sum(arrays.values()) / points
    out["filled_bytes_per_point"] = sum(filled.values()) / points
    return out


def profile_path(replicas: int, ticks: int, top: int = 18) -> list[str]:
    """cProfile of the ingest stages in one thread (the reader's and the dispatcher's work, in order)."""
    import cProfile
    import pstats

    from engine.contract.run_folder import LineSplitter
    from engine.control import lifecycle as lc

    data = b"".join(sample_lines(replicas, ticks))
    state = RunState(total_steps=ticks, tasks=[(f"worker:{r}", "worker", "local") for r in range(replicas)])
    policy = lc.Lifecycle([lc.TaskInfo(f"worker:{r}", "worker", "local") for r in range(replicas)], mode="data")
    with tempfile.TemporaryDirectory() as tmp:
        series = SeriesWriter(Path(tmp) / "series")
        splitter = LineSplitter()
        prof = cProfile.Profile()
        prof.enable()
        for i in range(0, len(data), READ_CHUNK):
            for line in splitter.feed(data[i:i + READ_CHUNK]):
                event = events_mod.decode(line)
                if event is not None:
                    state.apply(event)
                    lc.feed_sample(policy, event, time.monotonic())
                    series.add(event)
        series.flush()
        prof.disable()
        series.close()
    stream = io.StringIO()
    pstats.Stats(prof, stream=stream).sort_stats("tottime").print_stats(top)
    return [ln for ln in stream.getvalue().splitlines() if ln.strip()]


def against(rev: str, rounds: int, replicas: int, tasks: int, hz: float, seconds: float) -> dict[str, Any]:
    """This tree's launcher and revision ``rev``'s, the same feed, ``rounds`` interleaved rounds."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    sides = ("now", sha)
    out: dict[str, Any] = {"rev": sha, "rounds": rounds, "replicas": replicas, "tasks": tasks, "hz": hz,
                           "seconds": seconds, "sent": 0, "runs": {s: [] for s in sides}}
    with tempfile.TemporaryDirectory(prefix="cd-ingest-rev-") as tree:
        archive = subprocess.run(["git", "archive", "--format=tar", sha, "engine"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        trees = {"now": str(ROOT), sha: tree}
        print(f"ingest, interleaved: this tree against {sha}, {rounds} rounds of {replicas} replicas x 2 events x "
              f"{hz:g} Hz x {seconds:g} s; {machine_line()}")
        for r in range(rounds):
            for side in rotated(sides, r):
                env = dict(os.environ, **{TREE_ENV: trees[side]})
                cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--replicas", str(replicas),
                       "--tasks", str(tasks), "--hz", str(hz), "--seconds", str(seconds), "--no-doc"]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
                got = [ln for ln in done.stdout.splitlines() if ln.startswith("INGEST_JSON ")]
                if done.returncode != 0 or not got:
                    raise RuntimeError(f"the {side} run failed: {done.stderr[-2000:]}")
                f = json.loads(got[-1][len("INGEST_JSON "):])
                if Path(f["engine"]) != Path(trees[side]).resolve():
                    raise RuntimeError(f"the {side} run imported the engine from {f['engine']}")
                out["runs"][side].append(f)
                out["sent"] = f["sent"]
                print(f"  round {r + 1:2d} {side:>8}: {f['events_per_s']:9,.0f} events/s, lost "
                      f"{f['lost_folded']}/{f['lost_written']}, launcher CPU {f['launcher_cpu_s']:.2f} s", flush=True)
    for side in sides:
        rates = [f["events_per_s"] for f in out["runs"][side]]
        out[side] = {"events_per_s": bootstrap_median(rates),
                     "cpu_us_per_event": bootstrap_median([f["launcher_cpu_s"] / f["sent"] * 1e6
                                                           for f in out["runs"][side]]),
                     "lost": sum(f["lost_folded"] + f["lost_written"] for f in out["runs"][side])}
    out["ratio"] = paired_ratio([f["events_per_s"] for f in out["runs"]["now"]],
                                [f["events_per_s"] for f in out["runs"][sha]])
    out["pinned"] = all(f["pinned"] for s in sides for f in out["runs"][s])
    now, before = out["now"], out[sha]
    for side in sides:
        m, lo, hi = out[side]["events_per_s"]
        c = out[side]["cpu_us_per_event"]
        print(f"  {side:>8}: {m:,.0f} events/s [{lo:,.0f}, {hi:,.0f}], launcher CPU {c[0]:.1f} µs/event "
              f"[{c[1]:.1f}, {c[2]:.1f}], lost {out[side]['lost']}")
    met = now["events_per_s"][1] >= GOAL_EVENTS_PER_S and now["lost"] == 0
    print(f"  now / {sha}: {out['ratio'].text(2)} (median paired ratio, bootstrap 95 % interval); goal >= "
          f"{GOAL_EVENTS_PER_S:,.0f} events/s with nothing lost: {'met' if met else 'not met'} (whole interval)")
    del before
    return out


def doc_section_against(ab: dict[str, Any]) -> str:
    sha = ab["rev"]
    now, before = ab["now"], ab[sha]

    def ci(x: tuple[float, float, float], fmt: str = ",.0f") -> str:
        return f"{x[0]:{fmt}} [{x[1]:{fmt}}, {x[2]:{fmt}}]"

    met = now["events_per_s"][1] >= GOAL_EVENTS_PER_S and now["lost"] == 0
    return "\n".join([
        "## 3b. The launcher's ingest path at scale",
        "",
        f"`python bench/ingest.py --against {sha} --rounds {ab['rounds']} --seconds {ab['seconds']:g}` — a real "
        f"`engine.control.launcher.Run` whose supervisor is a feeder program: {ab['replicas']} replicas "
        f"({ab['tasks']} tasks), per replica and tick one `step` and one `device` event, {ab['hz']:g} ticks per "
        f"simulated second for {ab['seconds']:g} s: {ab['sent']:,} events per run written to the launcher's pipe "
        "as fast as it takes them, the launcher pinned to one core (the feeder on the other), "
        + ("keeping every curve as well (`--curves`: the app's fold, which no launcher does since runs start apart "
           "from the app). " if os.environ.get(CURVES_ENV) == "1" else
           "as a launcher runs (no curves: the app, attached, folds them in its own process). ")
        + "Each run in a fresh "
        f"process; this tree's launcher and that of commit {sha} (before the ingest cuts) in {ab['rounds']} "
        f"interleaved rounds, order rotating; medians with bootstrap 95 % intervals; {machine_line()}.",
        "",
        "| launcher | events/s sustained (bulk start to every event folded and written) | launcher CPU, µs per "
        "event | events per launcher CPU second | events lost (not folded or not written), all rounds |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| now | **{ci(now['events_per_s'])}** | {ci(now['cpu_us_per_event'], '.1f')} | "
        f"{1e6 / now['cpu_us_per_event'][0]:,.0f} | {now['lost']} |",
        f"| {sha} | {ci(before['events_per_s'])} | {ci(before['cpu_us_per_event'], '.1f')} | "
        f"{1e6 / before['cpu_us_per_event'][0]:,.0f} | {before['lost']} |",
        "",
        f"Now / {sha}: **{ab['ratio'].text(2)}x** (median paired ratio). Goal >= {GOAL_EVENTS_PER_S:,.0f} "
        f"events/s on one core with nothing lost, the whole interval above it: {verdict(met)}. The wall-clock "
        "rate also carries whatever else the shared machine ran on that core meanwhile; the launcher's own CPU "
        "time per event is the steadier figure.",
        "",
        f"What this measures, and what changed since {sha}: the launcher's dispatcher takes a row of samples "
        "(`step`, `device`: nearly every event) with one hold of the run's lock for their record and fold and one "
        "for the lifecycle policy, the listeners after them in order (`RunDriver._samples`), instead of two holds, "
        "a copy of the listener list and four calls per event. The checks are the same: a malformed or ill-typed "
        "line is still refused and counted, every sample folded into the run's state and written to the store "
        "(the table's losses column). The earlier cuts (since e7f94d6: lines split in C, a decoded event checked "
        "against a table made once per shape, the lifecycle fed samples without input objects) are in both sides. "
        "Per-stage costs: `python bench/ingest.py`; with `--curves` the launcher also keeps every curve, as the "
        "app's fold does (no launcher does: runs start apart from the app and the app, attached, folds in its own "
        "process).",
    ])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=None, help="replicas (default 256, quick 32)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks the replicas belong to (default: one each)")
    parser.add_argument("--hz", type=float, default=50.0, help="reports per replica per second (simulated)")
    parser.add_argument("--seconds", type=float, default=None, help="simulated seconds (default 20, quick 2)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the stages in one thread")
    parser.add_argument("--against", metavar="REV", help="also run the launcher of git revision REV, interleaved")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds of --against (default {MIN_ROUNDS}, "
                        "quick 3)")
    parser.add_argument("--curves", action="store_true", help="the launcher keeps every curve too (the app's fold; "
                        "no launcher does since runs start apart from the app)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run: print its figures
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    replicas = args.replicas or (32 if args.quick else 256)
    tasks = args.tasks or replicas
    seconds = args.seconds or (2.0 if args.quick else 20.0)
    ticks = max(1, int(seconds * args.hz))
    if args.curves:
        os.environ[CURVES_ENV] = "1"
    if args.one:
        pinned = pin(0)
        with tempfile.TemporaryDirectory(prefix="cd-ingest-") as tmp:
            f = run_ingest(Path(tmp), replicas, ticks, args.hz, tasks)
        import engine

        f.update(pinned=pinned, engine=str(Path(engine.__file__).resolve().parent.parent))
        print("INGEST_JSON " + json.dumps(f))
        return f
    if args.against:
        rounds = args.rounds or (3 if args.quick else MIN_ROUNDS)
        ab = against(args.against, rounds, replicas, tasks, args.hz, seconds)
        if want_doc(args):
            write_section("ingest", doc_section_against(ab), args.doc)
        return ab
    pinned = pin(0)
    with tempfile.TemporaryDirectory(prefix="cd-ingest-") as tmp:
        f = run_ingest(Path(tmp), replicas, ticks, args.hz, tasks)
    stages = stage_costs(min(replicas, 256), max(1, min(ticks, 200)))
    f.update({"replicas": replicas, "tasks": tasks, "hz": args.hz, "ticks": ticks, "pinned": pinned,
              "stages": stages})
    ok = f["events_per_s"] >= GOAL_EVENTS_PER_S and f["lost_folded"] == 0 and f["lost_written"] == 0
    print(f"ingest: {replicas} replicas ({tasks} tasks) x 2 events x {args.hz:g} Hz x {seconds:g} s = "
          f"{f['sent']:,} events through a real Run (launcher {'pinned to one core' if pinned else 'not pinned'}); "
          f"{machine_line()}")
    print(f"  run ended {f['state']}; {f['events_per_s']:,.0f} events/s ({f['points_per_s']:,.0f} points/s) over "
          f"{f['seconds']:.2f} s; launcher CPU {f['launcher_cpu_s']:.2f} s  (goal >= {GOAL_EVENTS_PER_S:,.0f} "
          f"events/s: {'met' if f['events_per_s'] >= GOAL_EVENTS_PER_S else 'not met'})")
    print(f"  lost: {f['lost_folded']} not folded, {f['lost_written']} not written of {f['sent']:,}; every replica "
          f"at its last step: {f['last_steps_ok']}")
    s = stages
    print(f"  per event alone: {s['bytes_per_event']:.0f} bytes; split reads into lines {s['read_us']:.2f} µs, "
          f"decode {s['decode_us']:.2f} µs (orjson.loads alone {s['json_loads_us']:.2f}), hand-off (a list per "
          f"read) {s['queue_us']:.2f} µs, fold {s['fold_us']:.2f} µs, lifecycle policy {s['policy_us']:.2f} µs, "
          f"tiered store {s['store_us']:.2f} µs; sum {s['path_us']:.2f} µs = {1e6 / s['path_us']:,.0f} events/s "
          "on one core (the launcher's own threads add their calls, locks and listeners)")
    print(f"  history memory: {s['bytes_per_point']:.1f} bytes per point allocated ({s['filled_bytes_per_point']:.1f} "
          "filled)")
    if args.profile or not ok:
        f["profile"] = profile_path(min(replicas, 256), max(1, min(ticks, 200)))
        print("  cProfile of the stages in one thread (by own time):")
        for line in f["profile"]:
            print("   " + line)
    if want_doc(args):
        write_section("ingest", doc_section(f, seconds), args.doc)
        write_section("scale_design", design_section(f), args.doc)
    return f


def doc_section(f: dict[str, Any], seconds: float) -> str:
    s = f["stages"]
    met = f["events_per_s"] >= GOAL_EVENTS_PER_S
    return "\n".join([
        "## 3b. The launcher's ingest path at scale",
        "",
        f"`python bench/ingest.py` — a real `engine.control.launcher.Run` whose supervisor is a feeder program: "
        f"{f['replicas']} replicas ({f['tasks']} tasks), per replica and tick one `step` and one `device` event, "
        f"{f['hz']:g} ticks per simulated second for {seconds:g} s: {f['sent']:,} events written to the "
        "launcher's pipe as fast as it takes them. The launcher's reader thread (`read_supervisor`: reads of up "
        "to 64 KiB split into lines, `events.decode`, one list per read on the queue) and dispatcher "
        "(`RunState.apply`, the lifecycle policy, the samples into the tiered store `series/`) do the rest, the "
        "process "
        f"{'pinned to one core (the feeder on the other)' if f['pinned'] else 'not pinned'}; {machine_line()}.",
        "",
        "| figure | value | goal |",
        "| --- | ---: | --- |",
        f"| events/s sustained (bulk start to every event folded and written) | **{f['events_per_s']:,.0f}** | "
        f">= {GOAL_EVENTS_PER_S:,.0f} ({verdict(met)}) |",
        f"| points/s into the history | {f['points_per_s']:,.0f} | |",
        f"| events not folded / not written | **{f['lost_folded']} / {f['lost_written']}** of {f['sent']:,} | 0 "
        f"({verdict(f['lost_folded'] == 0 and f['lost_written'] == 0)}) |",
        f"| launcher CPU for the bulk | {f['launcher_cpu_s']:.2f} s | |",
        "",
        "Each stage alone, one thread (µs per event): "
        f"split the reads into lines {s['read_us']:.2f}, decode {s['decode_us']:.2f} (of which `orjson.loads` "
        f"{s['json_loads_us']:.2f}), hand-off (one list per read) {s['queue_us']:.2f}, fold {s['fold_us']:.2f}, "
        f"lifecycle policy (`feed_sample`) {s['policy_us']:.2f}, tiered store (`SeriesWriter.add`, a flush per "
        f"{SERIES_FLUSH_EVENTS:,} events) {s['store_us']:.2f}; sum {s['path_us']:.2f} µs, a ceiling of "
        f"{1e6 / s['path_us']:,.0f} events/s on one core. The launcher itself spends more per event than the "
        "sum (its thread hand-offs, locks, calls and listeners): the sustained rate above is the figure. A "
        f"sample is written to no `events.jsonl` (the store holds it). {s['bytes_per_event']:.0f} bytes per "
        "event.",
    ])


def design_section(f: dict[str, Any]) -> str:
    s = f["stages"]
    per_event = s["path_us"]
    bpp = s["bytes_per_point"]
    rate_1k = 1000 * 2 * 10  # 1,000 replicas, step + device event, 10 Hz
    points_1k_hour = 1000 * 5 * 10 * 3600
    return "\n".join([
        "## 3c. What limits the next factor of ten (1,000+ replicas), and the design that would lift it",
        "",
        f"Figures from `python bench/ingest.py` (one thread, {machine_line()}): {s['bytes_per_event']:.0f} bytes "
        f"per event on the wire; {per_event:.1f} µs of launcher CPU per event in its stages alone (decode "
        f"{s['decode_us']:.1f}, fold {s['fold_us']:.1f}, lifecycle policy {s['policy_us']:.1f}, tiered store "
        f"{s['store_us']:.1f}, lines and hand-off {s['read_us'] + s['queue_us']:.1f}); {bpp:.1f} bytes of "
        "history per point allocated "
        f"({s['filled_bytes_per_point']:.1f} filled; float32 values, steps and time offsets, a replica's metrics "
        "sharing one axis and replicas one column of steps, arrays grown by half).",
        "",
        f"- **CPU of the launcher.** 1,000 replicas reporting a step and a device event at 10 Hz are "
        f"{rate_1k:,} events/s: {rate_1k * per_event / 1e6:.0%} of one core at {per_event:.1f} µs each, all of it "
        "under one GIL shared with the app's drawing; at 50 Hz, 100,000 events/s, about a core. Every event is "
        "parsed from JSON into a dict, checked, folded field by field and gathered into columns for the store.",
        f"- **Memory of the history.** 1,000 replicas x 5 points per tick x 10 Hz is {points_1k_hour / 1e6:,.0f} M "
        f"points an hour: {points_1k_hour * bpp / 2**30:.1f} GiB at {bpp:.1f} bytes per point, where the app's "
        "budget is 0.4 GB. Full resolution of every series cannot stay in memory.",
        "- **The app's 400 MB at 128 replicas x 2 hours (section 3a).** 128 replicas x 4 metrics x 10 Hz x "
        "7,200 s is 36.9 M points; a replica's step event stores a time offset and 3 values (16 bytes for 3 "
        "points, its step read from a column shared by every replica), its task's CPU point a time offset and a "
        f"value (8 bytes): 6 bytes per point filled, {36_864_000 * 6 / 2**20:,.0f} MiB, on top of the ~110 MB the "
        "app holds before its window opens; what the app holds in all is measured in section 3a.",
        "- **Bytes on the pipe and on disk.** "
        f"{s['bytes_per_event']:.0f} bytes per event: {rate_1k * s['bytes_per_event'] / 1e6:.1f} MB/s at 1,000 "
        f"replicas and 10 Hz, written twice (each task's file, then the run's), {rate_1k * s['bytes_per_event'] * 3600 / 2**30:.1f} "
        "GiB per hour per copy; over SSH the relay crosses the network too.",
        "- **Drawing.** One line per replica per plot: at 1,000 lines a legend, a colour per line and a full "
        "redraw when the view moves stop being readable or cheap, whatever the data path.",
        "",
        "The design that lifts these, in order of payoff:",
        "",
        "1. **Done: the raw line, flushed when the queue runs dry, handed over a read at a time.** A lifecycle "
        "event's line goes to `events.jsonl` as received, held and written with one system call; a sample to "
        "the tiered store, no line at all; the reader hands the dispatcher one list per read of the pipe.",
        "2. **Done: the checks and the policy without per-event objects.** A decoded event is checked against a "
        "table made once per shape (its field names); a sample reaches the lifecycle without an input object "
        f"(`feed_sample`, {s['policy_us']:.1f} µs).",
        "3. **Next: gather samples into columns as they come.** The store reads a held event's fields a column "
        f"at a time at each flush ({s['store_us']:.1f} µs per event alone); taking them as they come, while "
        "the event is fresh, may cost less.",
        "4. **Per-supervisor pre-aggregation.** The supervisor already sees every event of its host: at more "
        "than ~64 replicas per host it can fold a host's step events into one `steps` event per tick (arrays "
        "of replica ids, steps, losses, rates), keeping every value but one JSON object, one decode and one "
        "fold call per host instead of per replica; stragglers and per-replica plots read the same arrays.",
        "5. **Binary framing for that batch.** A length-prefixed record with float32/float64 columns "
        "(`numpy.frombuffer`, no JSON) decodes a host's tick in microseconds; the JSON lines stay the format "
        "of each task's own `events.jsonl` (durable, readable).",
        "6. **History in tiers.** Keep the last N minutes at full resolution in memory; older points as "
        "min/max/mean per block (the plots already draw ~2 points per pixel), with every point still in "
        "`events.jsonl` for export and zoom-in (read back on demand). float32 values with float64 time "
        "halves y's memory. Memory then grows with replicas, not with hours.",
        "7. **Plots for many replicas.** Beyond ~64 lines: a band (min/median/max over replicas) plus the "
        "outliers the straggler detector names, lines on demand.",
    ])


if __name__ == "__main__":
    main()
