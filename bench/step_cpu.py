"""Where the CPU of a training step goes: every process's CPU time per step while it trains.

Wall-clock ratios on this shared 2-core machine spread +-10-20 % between runs of the same command,
so a few per cent of telemetry cannot be told from the machine's noise in them (sections 1b and
1d). This benchmark measures what that cost is made of instead: the CPU time each process of a run
spends per training step, over the training phase only (start-up and exit left out), with
ClusterDeck (``clusterdeck run PRESET``, as in section 1b) and the hand-written loop grouping its
steps as the preset does (``bench/_handwritten.py``) interleaved, order rotating.

- The CPU time of every process of the run (the command and all its descendants) is sampled every
  50 ms (psutil) and read at the window's ends by linear interpolation.
- The window: ClusterDeck's first and last ``step`` (data) or ``progress`` (async) event, with the
  steps between them (from the events); the hand-written loop's ``first_step`` and ``last_step``
  stamps (``CD_BENCH_STAMPS=1``), with ``steps - 1`` steps between them.
- Processes are grouped by what they are: the training tasks by role (chief, worker, ps), the
  CLI (launcher, live view), the supervisor, the namespace helper, the shell.

What ClusterDeck adds is read two ways: the processes only ClusterDeck has (CLI, supervisor), in
milliseconds per step and as a share of the step's CPU; and the tasks' own CPU per step against
the hand-written tasks' (their events, summaries and device figures, with every other difference
of the two loops). The paired ratio of the total CPU per step comes with its bootstrap interval;
steps per second over the same window is given for reference.

    python bench/step_cpu.py [--modes data,async] [--steps 1500] [--rounds 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_doc_flags, machine_line, median, want_doc, write_section  # noqa: E402
from _stats import MIN_ROUNDS, paired_ratio, rotated, rounds_note  # noqa: E402
from whole_run import GROUPED, MODES, PRESETS, Bench, CpuSampler, classify, stamps_of  # noqa: E402

from engine.observe.run_reader import read_events  # noqa: E402

SIDES = ("clusterdeck", GROUPED)
#: processes that only ClusterDeck runs
OWN = ("CLI (launcher)", "supervisor", "namespace helper")


def label_of(proc: Any) -> str:
    """What a process is: a training task by role, else :func:`whole_run.classify`'s name."""
    label = classify(proc.cmdline())
    if label != "tasks":
        return label
    try:
        env = proc.environ()
    except Exception:  # noqa: BLE001 - a process gone or unreadable: its kind is enough
        return label
    task = env.get("CLUSTERDECK_TASK")
    if not task and env.get("TF_CONFIG"):
        try:
            task = json.loads(env["TF_CONFIG"])["task"]["type"]
        except (ValueError, KeyError, TypeError):
            task = None
    return f"task: {task.split(':')[0]}" if task else label


def cd_window(run_dir: str, mode: str) -> tuple[float, float, int]:
    """(first, last, steps between) of a ClusterDeck run's training, from its events."""
    evs = read_events(run_dir)  # the lifecycle and the samples' store
    if mode == "async":
        points = [(e["t"], e["completed"]) for e in evs if e["kind"] == "progress" and isinstance(e.get("completed"), int)]
    else:
        points = [(e["t"], e["step"]) for e in evs if e["kind"] == "step" and isinstance(e.get("step"), int)]
    points = [p for p in points if p[1] >= 1]
    if len(points) < 2:
        raise SystemExit(f"clusterdeck {mode}: too few step events to measure ({len(points)})")
    first = min(points, key=lambda p: (p[0], p[1]))
    last = max(points, key=lambda p: (p[1], p[0]))
    if last[0] <= first[0] or last[1] <= first[1]:
        raise SystemExit(f"clusterdeck {mode}: its step events span no time")
    return first[0], last[0], last[1] - first[1]


def hand_window(err_text: str, steps: int) -> tuple[float, float, int]:
    """(first, last, steps between) of a hand-written launch's training, from its stamps: from its first
    step, or where it has run its first group (``grouped_N``, the async chief: its step 1 runs alone, so
    the group function is traced in the first group, as ClusterDeck's are before its first progress event)."""
    stamps = stamps_of(err_text)
    if not stamps.get("first_step") or not stamps.get("last_step"):
        raise SystemExit("the hand-written launch printed no step stamps")
    grouped = sorted((int(name.split("_")[1]), min(ts)) for name, ts in stamps.items() if name.startswith("grouped_"))
    if grouped:
        step, t = grouped[0]
        return t, max(stamps["last_step"]), steps - step
    return min(stamps["first_step"]), max(stamps["last_step"]), steps - 1


def measure(bench: Bench, side: str, mode: str, steps: int) -> dict[str, Any]:
    series = CpuSampler(label=label_of)
    env = dict(bench.env, CD_BENCH_STAMPS="1")
    try:
        sample = bench.run(side, mode, steps, env=env, watch=series.start)
    finally:
        series.stop()
    if side == "clusterdeck":
        t0, t1, n = cd_window(sample.run_dir, mode)
        series.relabel({e["pid"]: f"task: {e['task'].split(':')[0]}"
                        for e in read_events(sample.run_dir)
                        if e["kind"] == "status" and isinstance(e.get("pid"), int)})
        shutil.rmtree(sample.run_dir, ignore_errors=True)
    else:
        t0, t1, n = hand_window((bench.work / f"err-{side}-{mode}-{steps}.txt").read_text(errors="replace"), steps)
    cpu = series.between(t0, t1)
    return {"ms_per_step": {k: 1000.0 * v / n for k, v in cpu.items() if v > 0},
            "steps_per_sec": n / (t1 - t0), "steps": n, "seconds": t1 - t0}


def report_costs(reports: int = 2000) -> dict[str, float]:
    """CPU microseconds of one report of a data task, in this process (``time.process_time``: every
    thread, the summaries' writer included): its figures read from two tensors, its ``step`` event
    encoded and written to an ``events.jsonl`` and a pipe (drained by a thread here, as the supervisor
    drains it); then the same with a TensorBoard point written for every report (a task writes at most
    two per second per replica) and with TensorFlow's allocator figures read for every report (at
    most every 0.5 s in a task)."""
    import tensorflow as tf

    from engine.runtime.context import StepReporter
    from engine.runtime.devices import memory_info
    from engine.runtime.emitter import Emitter
    from engine.runtime.summaries import Summaries

    folder = Path(tempfile.mkdtemp(prefix="cd-report-cost-"))
    read_end, write_end = os.pipe()

    def drain() -> None:
        while os.read(read_end, 1 << 16):
            pass
        os.close(read_end)

    threading.Thread(target=drain, daemon=True).start()
    result = [tf.constant([1.5], tf.float64), tf.constant([0.01], tf.float64)]

    def fetch() -> list[tuple[float, float]]:
        losses, waits = (r.numpy() for r in result)
        return [(float(a), float(b)) for a, b in zip(losses, waits, strict=True)]

    def per_report(name: str, summaries: bool, memory: bool) -> float:
        emitter = Emitter("worker:0", folder / f"{name}.jsonl", write_end)
        summ = Summaries(folder / f"tb-{name}", interval_s=0.0) if summaries else None
        reporter = StepReporter(emitter, [0], 64, 1e9, ["CPU:0"], memory_info if memory else None, summ)
        if summ is not None:  # the writer's first point (file creation) is not a report's cost
            reporter.step_done(0, fetch, force=True)
            summ._queue.join()
        start = time.process_time()
        for i in range(reports):
            if memory:
                reporter.last_memory = -float("inf")
            reporter.step_done(16 * (i + 1), fetch, force=True, steps=16)
        if summ is not None:
            summ._queue.join()
        cost = (time.process_time() - start) / reports
        if summ is not None:
            summ.close()
        emitter._fd = None  # the pipe is shared by the three measurements
        emitter.close()
        return 1e6 * cost

    try:
        event = per_report("event", False, False)
        return {"event": event, "event + TensorBoard point": per_report("summaries", True, False),
                "event + allocator figures": per_report("memory", False, True)}
    finally:
        os.close(write_end)  # the drain thread reads its end, then closes it
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of data,async")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1500; quick 200)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {MIN_ROUNDS}, quick 1)")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    steps = args.steps or (200 if args.quick else 1500)
    rounds = args.rounds or (1 if args.quick else MIN_ROUNDS)
    work = Path(tempfile.mkdtemp(prefix="cd-step-cpu-"))
    try:
        bench = Bench.create(work)
        reports = 200 if args.quick else 2000
        costs = report_costs(reports)
        print("task side, CPU per report: " + ", ".join(f"{k} {v:.1f} us" for k, v in costs.items()), flush=True)
        got: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in SIDES} for m in modes}
        print(f"CPU per training step by process: {', '.join(modes)}; {steps} steps, {rounds} round(s)", flush=True)
        for r in range(rounds):
            for mode in modes:
                for side in rotated(SIDES, r):
                    x = measure(bench, side, mode, steps)
                    got[mode][side].append(x)
                    print(f"round {r + 1:>2} {mode:<5} {side:<12}: {x['steps_per_sec']:6.1f} steps/s, CPU ms/step "
                          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(x["ms_per_step"].items()))
                          + f"; total {sum(x['ms_per_step'].values()):.3f}", flush=True)
        results = {mode: summarise(got[mode]) for mode in modes}
        for mode in modes:
            for line in result_lines(mode, results[mode]):
                print(line)
        if want_doc(args):
            write_section("step_cpu", doc_section(results, steps, rounds, bench, costs, reports), args.doc)
        return {"steps": steps, "rounds": rounds, "results": results, "report_costs": costs}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    labels = sorted({k for side in SIDES for x in runs[side] for k in x["ms_per_step"]})
    out: dict[str, Any] = {"labels": {}, "rounds": len(runs["clusterdeck"])}
    for label in labels:
        out["labels"][label] = {side: median([x["ms_per_step"].get(label, 0.0) for x in runs[side]]) for side in SIDES}
    total = {side: [sum(x["ms_per_step"].values()) for x in runs[side]] for side in SIDES}
    own = [sum(x["ms_per_step"].get(k, 0.0) for k in OWN) for x in runs["clusterdeck"]]
    tasks = {side: [sum(v for k, v in x["ms_per_step"].items() if k.startswith("task")) for x in runs[side]]
             for side in SIDES}
    out["total"] = {side: median(total[side]) for side in SIDES}
    out["total_ratio"] = paired_ratio(total["clusterdeck"], total[GROUPED])
    out["tasks_ratio"] = paired_ratio(tasks["clusterdeck"], tasks[GROUPED])
    out["own_ms"] = median(own)
    out["own_share"] = median([o / t for o, t in zip(own, total["clusterdeck"], strict=True)])
    out["rate_ratio"] = paired_ratio([x["steps_per_sec"] for x in runs["clusterdeck"]],
                                     [x["steps_per_sec"] for x in runs[GROUPED]])
    return out


def result_lines(mode: str, x: dict[str, Any]) -> list[str]:
    lines = [f"{mode}: CPU per step, clusterdeck / hand-written grouped: total {x['total_ratio'].text()}, "
             f"tasks {x['tasks_ratio'].text()}; ClusterDeck's own processes {x['own_ms']:.3f} ms/step "
             f"({100 * x['own_share']:.1f} % of its step's CPU); steps/s {x['rate_ratio'].text()}"]
    for label, v in x["labels"].items():
        lines.append(f"  {label:<20} clusterdeck {v['clusterdeck']:7.3f} ms/step   hand-written {v[GROUPED]:7.3f}")
    return lines


def doc_section(results: dict[str, dict[str, Any]], steps: int, rounds: int, bench: Bench,
                costs: dict[str, float], reports: int) -> str:
    lines = [
        "## 1e. Where the CPU of a training step goes",
        "",
        f"`python bench/step_cpu.py` — {machine_line()}. {rounds} rounds{rounds_note(rounds)}. Each round runs `clusterdeck run "
        f"PRESET --steps {steps}` (as in 1b) and the hand-written loop grouping its steps as the preset does, "
        "order rotating; the CPU time of every process of each run is sampled every 50 ms and read over the "
        "training phase only: ClusterDeck's first to last step (data) or progress (async) event, the "
        "hand-written loop's first to last step stamp. Figures are medians of milliseconds of CPU per "
        "training step; the ratios are paired, with bootstrap 95 % intervals.",
        "",
        "| mode | process | ClusterDeck ms/step | hand-written ms/step |",
        "| --- | --- | ---: | ---: |",
    ]
    for mode, x in results.items():
        for label, v in x["labels"].items():
            lines.append(f"| {mode} (`{PRESETS[mode]}`, {bench.per_execution[mode]} steps per function) | {label} | "
                         f"{v['clusterdeck']:.3f} | {v[GROUPED]:.3f} |")
        lines.append(f"| {mode} | **total** | **{x['total']['clusterdeck']:.3f}** | **{x['total'][GROUPED]:.3f}** |")
    lines += ["", "| mode | total CPU per step, ClusterDeck / hand-written | tasks' CPU per step | ClusterDeck's own "
              "processes (CLI, supervisor) | steps/s over the window, ClusterDeck / hand-written |",
              "| --- | --- | --- | --- | --- |"]
    for mode, x in results.items():
        lines.append(f"| {mode} | {x['total_ratio'].text()} | {x['tasks_ratio'].text()} | {x['own_ms']:.3f} ms/step "
                     f"({100 * x['own_share']:.1f} %) | {x['rate_ratio'].text()} |")
    lines += ["", "A data task's telemetry alone, in one process (`report_costs`: CPU time of every thread per report, "
              f"{reports:,} reports; a task reports at most 20 times a second, writes a TensorBoard point at most twice a "
              "second and reads the allocator's figures at most twice a second):", "",
              "| per report | CPU µs |", "| --- | ---: |"]
    lines += [f"| {name} | {us:.1f} |" for name, us in costs.items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
