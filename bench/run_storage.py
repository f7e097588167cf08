"""A long run's folder: how large it grows, how fast it reopens, and what the record costs per event.

A simulated run of ``--replicas`` replicas (one task each) is written through the launcher's own
:class:`engine.control.run_record.RunRecord` (so through :class:`engine.contract.series_store.SeriesWriter`):
per replica and tick one ``step`` event with loss, examples/s, step time and one training metric
(``metrics: {"accuracy": …}``: 4 curves) at ``--hz``, per task one ``device`` event (CPU %, RSS) at
``--device-hz``, lifecycle events as a run has them (status, run, an eval every 10 minutes), for
``--hours`` simulated hours; the record is flushed every 0.5 simulated seconds (its live cadence:
``SERIES_FLUSH_S``). The writer process is pinned to one core.

Figures: the folder's size (every file, by level); the writer's CPU per event and events/s (one core);
then the reopen, in ``--rounds`` rounds, each in a fresh process: ``read_run_folder`` (lifecycle lines,
the tiers a first frame needs at ``--points`` points per curve, replicas' figures), timed from the call
and from the process start (imports included), with the process's peak RSS; the sides (each
``--points`` value) interleaved, order rotating; medians with bootstrap 95 % intervals (``bench/_stats.py``).

    python bench/run_storage.py [--hours 24] [--replicas 128] [--rounds 10] [--folder DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, verdict, want_doc, write_section  # noqa: E402
from _stats import Ratio, bootstrap_median, goal_verdict, rotated, rounds_note  # noqa: E402

from engine.contract.config import default_config  # noqa: E402
from engine.contract.run_folder import RunFolder  # noqa: E402
from engine.control.run_record import RunRecord  # noqa: E402

GOAL_BYTES = 2e9
GOAL_OPEN_S = 3.0
GOAL_RSS = 1e9
T0 = 1_700_000_000.0

#: One reopen in a fresh process: prints seconds from start and from the call, peak RSS, points loaded.
REOPEN = r'''
import json, resource, sys, time
start = time.perf_counter()
sys.path.insert(0, sys.argv[3])
from engine.observe.run_reader import read_run_folder
called = time.perf_counter()
config, state, reader = read_run_folder(sys.argv[1], max_points_per_series=int(sys.argv[2]))
done = time.perf_counter()
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"total_s": done - start, "open_s": done - called, "cpu_s": use.ru_utime + use.ru_stime,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "points": state.history.total_points(), "series": len(state.history.series),
                  "replicas": len(state.replicas), "state": state.state, "events": state.events}))
'''


def simulate(path: Path, hours: float, replicas: int, hz: float, device_hz: float, early_hz: float | None = None,
             full_hours: float = 1.0) -> dict[str, Any]:
    """Write the run; the writer's CPU seconds and the events it took. ``early_hz``: steps at that rate
    before the last ``full_hours`` (see the module docstring: a fraction of the events, the same files)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    folder = RunFolder.create(path, "long")
    folder.write_config(default_config())
    record = RunRecord(folder, describe=lambda: {"state": "running"}, on_failure=print)
    tasks = [f"worker:{r}" for r in range(replicas)]
    count = 0
    cpu0 = time.process_time()
    record.write_event({"v": 1, "kind": "run", "task": "", "t": T0 - 5, "state": "running"})
    for i, name in enumerate(tasks):
        record.write_event({"v": 1, "kind": "status", "task": name, "t": T0 - 4, "state": "running", "pid": 100 + i})
    ticks = int(hours * 3600 * hz)
    device_every = max(1, round(hz / device_hz))
    flush_every = max(1, round(hz * 0.5))
    eval_every = int(600 * hz)
    # before the last full_hours, only every skip-th tick is written: steps at early_hz, every device sample
    skip = max(1, round(hz / early_hz)) if early_hz else 1
    full_from = int(max(0.0, hours - full_hours) * 3600 * hz) if early_hz else 0
    for tick in range(ticks):
        if tick < full_from and tick % skip and tick % device_every:
            continue
        t = T0 + tick / hz
        if tick < full_from and tick % skip:  # a device tick between early steps
            for r in range(replicas):
                record.write_event({"v": 1, "kind": "device", "task": tasks[r], "t": t, "pid": 100 + r,
                                    "cpu_percent": 80.0 + (tick % 17), "rss_bytes": 2_000_000_000 + tick})
            count += replicas
            continue
        decay = 2.0 / (1.0 + tick / 1000.0)
        for r in range(replicas):
            noise = ((tick * 7919 + r * 104729) % 1000) / 1000.0
            record.write_event({"v": 1, "kind": "step", "task": tasks[r], "t": t, "replica": r, "step": tick,
                                "loss": decay + 0.05 * noise, "examples_per_sec": 600.0 + 40 * noise,
                                "step_time": 0.04 + 0.01 * noise, "metrics": {"accuracy": 1.0 - decay / 2.5}})
        count += replicas
        if tick % device_every == 0:
            for r in range(replicas):
                record.write_event({"v": 1, "kind": "device", "task": tasks[r], "t": t, "pid": 100 + r,
                                    "cpu_percent": 80.0 + (tick % 17), "rss_bytes": 2_000_000_000 + tick})
            count += replicas
        if tick % eval_every == eval_every - 1:
            record.write_event({"v": 1, "kind": "eval", "task": "worker:0", "t": t, "step": tick, "loss": decay})
        if tick % flush_every == 0:
            record.flush()
    record.write_event({"v": 1, "kind": "run", "task": "", "t": T0 + ticks / hz, "state": "finished"})
    record.close()
    cpu = time.process_time() - cpu0
    return {"events": count, "cpu_s": cpu, "run_dir": str(folder.path)}


def sizes(run_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _, files in os.walk(run_dir):
        rel = Path(dirpath).relative_to(run_dir)
        key = str(rel) if rel.parts and rel.parts[0] == "series" else "lifecycle and config"
        for f in files:
            out[key] = out.get(key, 0) + (Path(dirpath) / f).stat().st_size
    return out


def reopen(run_dir: Path, points: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", REOPEN, str(run_dir), str(points), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--replicas", type=int, default=128)
    parser.add_argument("--hz", type=float, default=20.0)
    parser.add_argument("--device-hz", type=float, default=2.0)
    parser.add_argument("--early-hz", type=float, help="steps at this rate but in the last --full-hours (a fraction "
                        "of the events that leaves the same files: tiers hold a row per bucket whatever the rate)")
    parser.add_argument("--full-hours", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--points", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--folder", type=Path, help="where the run is written (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="reopen the run already in --folder")
    add_doc_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.hours, args.replicas, args.rounds = min(args.hours, 0.02), min(args.replicas, 4), min(args.rounds, 2)
    root = args.folder or Path(tempfile.mkdtemp(prefix="cd-storage-"))
    try:
        if args.reuse:
            info = json.loads((root / "simulated.json").read_text())
        else:
            info = {**simulate(root, args.hours, args.replicas, args.hz, args.device_hz, args.early_hz,
                               args.full_hours), "hours": args.hours, "replicas": args.replicas, "hz": args.hz,
                    "device_hz": args.device_hz, "early_hz": args.early_hz, "full_hours": args.full_hours}
            (root / "simulated.json").write_text(json.dumps(info))
        run_dir = Path(info["run_dir"])
        by_part = sizes(run_dir)
        total = sum(by_part.values())
        print(f"simulated {info['hours']} h x {info['replicas']} replicas: {info['events']:,} events; "
              f"writer {info['cpu_s'] / info['events'] * 1e6:.2f} us/event; folder {total / 1e6:.1f} MB", flush=True)
        results: dict[int, list[dict[str, Any]]] = {p: [] for p in args.points}
        for i in range(args.rounds):
            for side in rotated([str(p) for p in args.points], i):
                got = reopen(run_dir, int(side))
                results[int(side)].append(got)
                print(f"round {i + 1} points {side}: open {got['open_s']:.2f} s (process {got['total_s']:.2f} s), "
                      f"RSS {got['rss'] / 1e6:.0f} MB, {got['points']:,} points", flush=True)
        body = report(info, by_part, total, results, args)
        print(body)
        if want_doc(args):
            write_section("run_storage", body, args.doc)
    finally:
        if args.folder is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def fraction_note(info: dict[str, Any]) -> list[str]:
    """How a run simulated with fewer events stands for the full one (``--early-hz``)."""
    if not info.get("early_hz"):
        return []
    full = int(info["replicas"] * (info["hz"] + info["device_hz"]) * info["hours"] * 3600)
    early = info["hours"] - info["full_hours"]
    return [f"Simulated as a fraction of the events: steps at {info['early_hz']:g} Hz for the first {early:g} h and at "
            f"{info['hz']:g} Hz for the last {info['full_hours']:g} h, device samples at {info['device_hz']:g} Hz "
            f"throughout: {info['events']:,} events written instead of {full:,}. The folder is that of the full "
            f"run but for values: `raw` keeps only the last hour (written at the full rate here), and a tier holds "
            "one row per owner and bucket whatever the rate (the same columns and widths; only the compressed "
            "size of the `count` columns can differ). The reopen reads the same levels and rows as it would "
            "there. The record's CPU per event below is over this mix (half of the early events are device "
            "samples).", ""]


def report(info: dict[str, Any], by_part: dict[str, int], total: int, results: dict[int, list[dict[str, Any]]],
           args: argparse.Namespace) -> str:
    rounds = len(next(iter(results.values())))
    events = info["events"]
    lines = [
        "## 3d. A long run's folder: size, reopen, the record's cost",
        "",
        f"`python bench/run_storage.py --hours {info['hours']:g} --replicas {info['replicas']}"
        + (f" --early-hz {info['early_hz']:g} --full-hours {info['full_hours']:g}" if info.get("early_hz") else "")
        + f" --rounds {rounds}` — a simulated run "
        f"written through the launcher's own `RunRecord` (step and device samples into the tiered store "
        f"`series/`, lifecycle into `events.jsonl`): {info['replicas']} replicas (one task each), 4 curves per "
        f"replica (loss, examples/s, step time, accuracy) at {info['hz']:g} Hz, device samples (CPU %, RSS) at "
        f"{info['device_hz']:g} Hz per task, {info['hours']:g} simulated hours: {events:,} events, flushed every "
        f"0.5 simulated seconds (the record's live cadence); the writer pinned to one core. Reopen: "
        f"`read_run_folder` in a fresh process per round, {rounds} rounds, sides interleaved (order rotating); "
        f"medians with bootstrap 95 % intervals{rounds_note(rounds)}; {machine_line()}.",
        "",
        *fraction_note(info),
        "| part of the run folder | size |",
        "| --- | ---: |",
        *(f"| `{k}` | {v / 1e6:,.1f} MB |" for k, v in sorted(by_part.items())),
        f"| **all** | **{total / 1e6:,.1f} MB** |",
        "",
        f"- Folder size: **{total / 1e9:.3f} GB**, goal <= {GOAL_BYTES / 1e9:g} GB: {verdict(total <= GOAL_BYTES)} "
        "(tasks' own `tasks/<task>/events.jsonl` not included: see the note below).",
        f"- The record's CPU on one core: **{info['cpu_s'] / events * 1e6:.2f} us per event** "
        f"({events / info['cpu_s']:,.0f} events per CPU second; event dicts made by the simulation included).",
        "",
        "| reopen, first frame | points loaded | open (the call) | process (imports too) | process CPU | peak RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts = []
    for points, got in results.items():
        o = bootstrap_median([g["open_s"] for g in got])
        p = bootstrap_median([g["total_s"] for g in got])
        r = bootstrap_median([g["rss"] / 1e6 for g in got])
        c = bootstrap_median([g["cpu_s"] for g in got])
        lines.append(f"| at most ~{points:,} points per curve | {got[0]['points']:,} in {got[0]['series']} curves | "
                     f"{o[0]:.2f} s [{o[1]:.2f}, {o[2]:.2f}] | {p[0]:.2f} s [{p[1]:.2f}, {p[2]:.2f}] | "
                     f"{c[0]:.2f} s [{c[1]:.2f}, {c[2]:.2f}] | "
                     f"{r[0]:.0f} MB [{r[1]:.0f}, {r[2]:.0f}] |")
        verdicts.append((points, goal_verdict(Ratio(*p, ()), GOAL_OPEN_S, at_most=True),
                         goal_verdict(Ratio(*r, ()), GOAL_RSS / 1e6, at_most=True), c))
    lines.append("")
    for points, fast, small, cpu in verdicts:
        lines.append(f"- Reopen at ~{points:,} points per curve, whole process within {GOAL_OPEN_S:g} s: "
                     f"{fast}; RSS <= {GOAL_RSS / 1e9:g} GB: {small}. "
                     f"Its CPU time, {cpu[0]:.2f} s [{cpu[1]:.2f}, {cpu[2]:.2f}], is what the wall time would be "
                     "on an idle core.")
    lines.append(f"- Load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
