"""Whole-run cost: ``clusterdeck run`` against a hand-written launch of the same training loop.

What a user compares: the same loop started by a ~10-line shell script that writes
``TF_CONFIG`` by hand (``bench/_handwritten.py`` writes it, with the plain TensorFlow
script it starts), against ``clusterdeck run PRESET --steps N``. Whole processes, from
the moment the command starts to the moment it has exited, interleaved (order rotating
every round), at several step counts:

- *data*: 2 local workers, ``MultiWorkerMirroredStrategy`` (784-256-10 MLP, global batch
  128, SGD) against ``clusterdeck run data-2workers`` (the preset as shipped);
- *async*: ``ParameterServerStrategy`` (chief + 2 workers + 1 ps, every step
  ``ClusterCoordinator.schedule``d, one fetch at the end) against ``clusterdeck run
  async-1ps`` with ``checkpoint_every: 0``.

Both presets run ``training.steps_per_execution`` steps per function, so each mode is compared
twice in the same rounds: against the hand-written loop with every step its own call (the loop
as users write it) and against the same loop grouping its steps as the preset does (ClusterDeck's
own cost, the grouping's gain taken out).

Figures: wall time and CPU time (``wait4``: the command and every descendant it reaped)
of each side; the median paired ratio ClusterDeck / hand-written with its bootstrap 95 %
interval (``bench/_stats.py``). Goals at 1,500 steps: wall and CPU <= 1.03 (data),
<= 1.05 (async), the whole interval below the goal.

``--profile`` runs each side once more with stamps and per-process CPU sampling and
breaks ClusterDeck's extra time down (process starts, namespace, pre-flight, supervisor,
TensorFlow start, training, final checkpoint and summaries, the CLI's own work), plus a
cProfile of the CLI process and the start-up costs measured alone.

    python bench/whole_run.py [--modes data,async] [--steps 300,1500] [--rounds 10] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _handwritten  # noqa: E402
from _common import (  # noqa: E402
    ROOT,
    add_doc_flags,
    config_core_shares,
    cores_json,
    free_port,
    machine_line,
    median,
    task_threads,
    timed_process,
    want_doc,
    write_section,
)
from _stats import MIN_ROUNDS, Ratio, goal_verdict, paired_difference, paired_ratio, rotated, rounds_note  # noqa: E402

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.presets import load_preset  # noqa: E402
from engine.contract.task_plan import INTRA_OP_ENV  # noqa: E402

SIDES = ("clusterdeck", "hand")
#: also against the hand-written loop with ClusterDeck's settings: its steps grouped as the preset groups them
#: (``steps_per_execution``), the machine's cores shared evenly by its tasks as the supervisor shares them
GROUPED = "hand_grouped"


def sides_of(mode: str) -> tuple[str, ...]:
    return SIDES + (GROUPED,)
MODES = ("data", "async")
PRESETS = {"data": "data-2workers", "async": "async-1ps"}
GOALS = {"data": 1.03, "async": 1.05}
GOAL_STEPS = 1500
LAUNCHERS = {"data": "launch_data.sh", "async": "launch_async.sh"}


@dataclass
class Sample:
    wall: float
    cpu: float
    stdout: str = ""
    run_dir: str = ""


@dataclass
class Bench:
    work: Path
    python: str
    env: dict[str, str]
    presets: dict[str, Path] = field(default_factory=dict)
    #: steps per function of each mode's preset (read once, from the preset as written)
    per_execution: dict[str, int] = field(default_factory=dict)
    #: intra-op threads per task that ClusterDeck's supervisor gives each mode's tasks on this machine
    threads: dict[str, str] = field(default_factory=dict)
    #: the cores it gives them (``CD_BENCH_CORES`` of the hand-written loops; '' where it pins none)
    cores: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def create(work: Path) -> Bench:
        _handwritten.write_all(work)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CD_BENCH_")}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        bench = Bench(work, sys.executable, _handwritten.shell_env(sys.executable, env))
        for mode, name in PRESETS.items():
            cfg = load_preset(name)
            if mode == "async":  # the comparison the issue asks for: no periodic checkpoint
                cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, checkpoint_every=0))
            path = work / f"{name}.yaml"
            config_mod.save(cfg, path)
            bench.presets[mode] = path
            bench.per_execution[mode] = cfg.training.steps_per_execution
            bench.threads[mode] = task_threads(len(cfg.cluster.tasks()), env)
            shares = config_core_shares(cfg)
            bench.cores[mode] = cores_json(shares) if shares else ""
        (work / "runs").mkdir(exist_ok=True)
        return bench

    def cd_command(self, mode: str, steps: int, profile_out: Path | None = None) -> list[str]:
        head = [self.python] + (["-m", "cProfile", "-o", str(profile_out)] if profile_out else [])
        return head + ["-m", "engine.cli", "run", str(self.presets[mode]), "--steps", str(steps),
                       "--out", str(self.work / "runs")]

    def hand_command(self, mode: str, steps: int, grouped: bool = False) -> list[str]:
        ports = [free_port() for _ in range(2 if mode == "data" else 4)]
        return (["sh", LAUNCHERS[mode], str(steps), *map(str, ports)]
                + ([str(self.per_execution[mode])] if grouped else []))

    def run(self, side: str, mode: str, steps: int, *, env: dict[str, str] | None = None,
            profile_out: Path | None = None, watch: Any = None) -> Sample:
        cmd = (self.cd_command(mode, steps, profile_out) if side == "clusterdeck"
               else self.hand_command(mode, steps, grouped=side == GROUPED))
        out_path = self.work / f"out-{side}-{mode}-{steps}.txt"
        with open(out_path, "wb") as out, open(self.work / f"err-{side}-{mode}-{steps}.txt", "wb") as err:
            env = dict(env or self.env)
            if side == GROUPED:
                env[INTRA_OP_ENV] = self.threads[mode]
                if self.cores.get(mode):
                    env["CD_BENCH_CORES"] = self.cores[mode]
            wall, cpu, code = timed_process(cmd, cwd=self.work, env=env, stdout=out, stderr=err,
                                            watch=watch)
        text = out_path.read_text(encoding="utf-8", errors="replace")
        if code != 0:
            err_text = (self.work / f"err-{side}-{mode}-{steps}.txt").read_text(errors="replace")
            raise SystemExit(f"{side} {mode} {steps} steps failed (exit {code}):\n{text[-2000:]}\n{err_text[-3000:]}")
        if side == "clusterdeck":
            if f"finished[/] after {steps}" not in text and f"finished after {steps} of {steps}" not in text:
                raise SystemExit(f"clusterdeck {mode} did not report {steps} finished steps:\n{text[-2000:]}")
            found = re.findall(r"run folder: (\S+)", text)
            return Sample(wall, cpu, text, found[-1] if found else "")
        if f"steps={steps} " not in text:
            raise SystemExit(f"the hand-written {mode} launch did not report {steps} steps:\n{text[-2000:]}")
        return Sample(wall, cpu, text)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of data,async")
    parser.add_argument("--steps", default=None, help="comma-separated step counts (default 300,1500; quick 40)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {MIN_ROUNDS}, quick 1)")
    parser.add_argument("--profile", action="store_true", help="also break ClusterDeck's extra time down (one run "
                                                               "per side with stamps, a cProfile of the CLI)")
    parser.add_argument("--profile-steps", type=int, default=None, help="steps of the profiled runs (default 300)")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a "
                                                               "temporary folder)")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: expected some of {', '.join(MODES)}, received: {args.modes}")
    steps_list = [int(s) for s in (args.steps or ("40" if args.quick else "300,1500")).split(",") if s]
    rounds = args.rounds or (1 if args.quick else MIN_ROUNDS)
    work = args.keep or Path(tempfile.mkdtemp(prefix="cd-whole-run-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench.create(work)
    print(f"whole run: clusterdeck run vs a hand-written launch; modes {', '.join(modes)}; steps "
          f"{', '.join(map(str, steps_list))}; {rounds} round(s), order rotating{rounds_note(rounds)}; "
          f"{machine_line()}", flush=True)
    samples: dict[tuple[str, int, str], list[Sample]] = {}
    try:
        for r in range(rounds):
            for mode in modes:
                for steps in steps_list:
                    got = {}
                    for side in rotated(sides_of(mode), r):
                        got[side] = bench.run(side, mode, steps)
                        samples.setdefault((mode, steps, side), []).append(got[side])
                    cd, hand = got["clusterdeck"], got["hand"]
                    grouped = got.get(GROUPED)
                    print(f"round {r + 1:>2} {mode:<5} {steps:>5} steps: clusterdeck {cd.wall:6.2f} s wall "
                          f"{cd.cpu:6.2f} s CPU | hand-written {hand.wall:6.2f} s wall {hand.cpu:6.2f} s CPU | "
                          f"ratio wall {cd.wall / hand.wall:.3f} CPU {cd.cpu / hand.cpu:.3f}"
                          + (f" | grouped {grouped.wall:6.2f} s wall {grouped.cpu:6.2f} s CPU, ratio wall "
                             f"{cd.wall / grouped.wall:.3f} CPU {cd.cpu / grouped.cpu:.3f}" if grouped else ""),
                          flush=True)
                    if cd.run_dir and not args.keep:
                        shutil.rmtree(cd.run_dir, ignore_errors=True)
        results = summarise(samples, modes, steps_list)
        for line in result_lines(results):
            print(line)
        profile = None
        if args.profile:
            profile = run_profile(bench, modes, args.profile_steps or (60 if args.quick else 300))
            for line in profile["lines"]:
                print(line)
        if want_doc(args):
            write_section("whole_run", doc_section(results, rounds, steps_list, bench), args.doc)
            if profile is not None:
                write_section("whole_run_profile", profile_doc(profile), args.doc)
        return {"results": results, "profile": profile}
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def summarise(samples: dict[tuple[str, int, str], list[Sample]], modes: list[str],
              steps_list: list[int]) -> list[dict[str, Any]]:
    out = []
    for mode in modes:
        for steps in steps_list:
            for against in sides_of(mode)[1:]:
                cd, hand = samples[(mode, steps, "clusterdeck")], samples[(mode, steps, against)]
                wall = paired_ratio([s.wall for s in cd], [s.wall for s in hand])
                cpu = paired_ratio([s.cpu for s in cd], [s.cpu for s in hand])
                extra = paired_difference([s.wall for s in cd], [s.wall for s in hand])
                extra_cpu = paired_difference([s.cpu for s in cd], [s.cpu for s in hand])
                goal = GOALS[mode] if steps == GOAL_STEPS else None
                out.append({"mode": mode, "steps": steps, "against": against, "wall": wall, "cpu": cpu,
                            "extra_wall": extra, "extra_cpu": extra_cpu, "goal": goal, "rounds": len(cd),
                            "cd_wall": median([s.wall for s in cd]), "hand_wall": median([s.wall for s in hand]),
                            "cd_cpu": median([s.cpu for s in cd]), "hand_cpu": median([s.cpu for s in hand])})
    return out


def _against(x: dict[str, Any], per_execution: int | None = None) -> str:
    if x.get("against") != GROUPED:
        return "every step scheduled" if x["mode"] == "async" else "every step its own call"
    return (f"{per_execution} steps per function" if per_execution else "grouped as the preset") + ", cores shared"


def _verdict(r: Ratio, goal: float | None) -> str:
    return "" if goal is None else f"<= {goal} ({goal_verdict(r, goal, at_most=True)})"


def result_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for x in results:
        against = f" vs hand-written, {_against(x)}"
        lines.append(f"{x['mode']} {x['steps']} steps{against} ({x['rounds']} rounds): wall ratio {x['wall'].text()} "
                     f"{_verdict(x['wall'], x['goal'])}; CPU ratio {x['cpu'].text()} {_verdict(x['cpu'], x['goal'])}; "
                     f"extra wall {x['extra_wall'].text(2)} s, extra CPU {x['extra_cpu'].text(2)} s "
                     f"(medians: clusterdeck {x['cd_wall']:.2f} s / {x['cd_cpu']:.2f} s CPU, hand-written "
                     f"{x['hand_wall']:.2f} s / {x['hand_cpu']:.2f} s CPU)")
    return lines


# --------------------------------------------------------------------------- the document


def settings_text(bench: Bench) -> list[str]:
    data_cfg = config_mod.load(bench.presets["data"])
    async_cfg = config_mod.load(bench.presets["async"])
    t = data_cfg.training
    return [
        "Settings of each side:",
        "",
        "| | hand-written launch | `clusterdeck run` |",
        "| --- | --- | --- |",
        "| processes | `sh` + one `python` per task | the CLI, the supervisor started by `unshare -rn` in a "
        "private network namespace (where user namespaces are allowed; it brings the loopback up itself), one `python -m engine.runtime.task` per task |",
        "| reporting | none (one line printed at the end) | a `step` event per replica at most "
        f"{t.metrics_hz:g} Hz (data: one function runs a group of {t.steps_per_execution} steps, a report reads "
        "the last group's mean losses; async: the chief "
        f"schedules groups of {async_cfg.training.steps_per_execution} steps and waits for every group; a sample, about one per worker and "
        "report interval, returns the figures the chief copies, the other groups only their loss); a `device` event per "
        "task every 0.5 s (supervisor, psutil; NVML where GPUs exist); a live progress view in the terminal (8 Hz) |",
        "| writing | nothing | each task appends its events to `tasks/<task>/events.jsonl` (line-buffered: one "
        "write per event) and to its pipe; the launcher appends every event again to the run's `events.jsonl` "
        "(one write per burst); TensorBoard summaries of the same scalars on a background thread of each task "
        "(at most 2 points per second per replica, `flush_millis` 2000); `run.json` at the start and the end; task logs |",
        "| threads and cores | TensorFlow's defaults: every task an intra-op pool of a thread per core of the machine, "
        "placed by the kernel (the grouped side: the machine's cores shared evenly by the tasks and each training "
        "task on cores of its own, as ClusterDeck does) | the supervisor shares the machine's cores evenly between "
        "the tasks on it (`TF_NUM_INTRAOP_THREADS`) and, where there are enough, runs each training task on cores "
        "of its own (its CPU affinity; the ps and the async chief stay free), unless the environment sets the "
        "threads |",
        f"| checkpoints | none | data: `checkpoint_every: {t.checkpoint_every}` as the preset ships it, plus the "
        f"final one; async: `checkpoint_every: {async_cfg.training.checkpoint_every}`, the final one only |",
        "| end of a task | `os._exit(0)` after the last fetch (as ClusterDeck's tasks do: TensorFlow's own teardown "
        "after `MultiWorkerMirroredStrategy` takes seconds) | the same; ps and worker servers of the async mode "
        "are ended by the launcher once the chief has finished (SIGTERM and SIGKILL at once) and by `kill` in the "
        "shell script |",
    ]


def doc_section(results: list[dict[str, Any]], rounds: int, steps_list: list[int], bench: Bench) -> str:
    launcher = _handwritten.FILES["launch_data.sh"].strip()
    lines = [
        "## 1b. Whole-run cost against a hand-written launch",
        "",
        f"`python bench/whole_run.py` — the same training loop started two ways, whole processes, {rounds} rounds "
        f"per figure, order rotating{rounds_note(rounds)}; {machine_line()}. *Hand-written*: a plain TensorFlow "
        "script (`bench/_handwritten.py`: 784-256-10 MLP, SGD 0.05, global batch 128, the presets' synthetic "
        "data) started by a shell script that sets `TF_CONFIG` by hand; for the data mode:",
        "",
        "```sh",
        launcher,
        "```",
        "",
        "(the async launcher starts a ps and two workers as `tf.distribute.Server`s, runs the chief's "
        "`ParameterServerStrategy` loop — every step `ClusterCoordinator.schedule`d, one `join` and one fetch at "
        "the end — and `kill`s the servers). *ClusterDeck*: `clusterdeck run data-2workers --steps N` and "
        "`clusterdeck run async-1ps --steps N` with `checkpoint_every: 0`, output to a file. Wall time from the "
        "command's start to its exit; CPU time of the command and every process it reaped (`wait4`).",
        "",
        f"The presets run {bench.per_execution.get('data', 1)} (data) and {bench.per_execution.get('async', 1)} "
        "(async) steps per function (`training.steps_per_execution`, Keras' `steps_per_execution`: one "
        "`tf.function` runs the group in a `tf.range` loop, every step still all-reducing or updating the ps): the "
        "Python dispatch of a step (async: the chief's `schedule`) is paid once per group, not once per step. So "
        "each mode is compared twice, in the same rounds: against the hand-written loop as a user writes it from "
        "TensorFlow's tutorials (every step its own call: the comparison the goals were set for) and against the "
        "same hand-written loop grouping its steps as the preset does (the launchers' last argument) and sharing "
        "the machine's cores between its tasks as ClusterDeck's supervisor does (`TF_NUM_INTRAOP_THREADS`: "
        f"{bench.threads.get('data', '?')} per task in data mode, {bench.threads.get('async', '?')} in async mode "
        "here; TensorFlow otherwise gives every task a thread per core of the machine) and running each training "
        "task on cores of its own as the supervisor does (`CD_BENCH_CORES`, where the supervisor pins): "
        "ClusterDeck's own cost, with its gains taken out.",
        "",
        "| mode | steps | hand-written wall / CPU (median) | ClusterDeck wall / CPU (median) | wall ratio [95 % CI] "
        "| CPU ratio [95 % CI] | extra wall s [95 % CI] | goal |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for x in results:
        goal = ""
        if x["goal"] is not None:
            goal = (f"wall {_verdict(x['wall'], x['goal'])}; CPU {_verdict(x['cpu'], x['goal'])}")
        against = _against(x, bench.per_execution.get(x["mode"]))
        mode = f"{x['mode']} ({against})" if against else x["mode"]
        lines.append(f"| {mode} | {x['steps']:,} | {x['hand_wall']:.2f} s / {x['hand_cpu']:.2f} s | "
                     f"{x['cd_wall']:.2f} s / {x['cd_cpu']:.2f} s | **{x['wall'].text()}** | **{x['cpu'].text()}** | "
                     f"{x['extra_wall'].text(2)} | {goal} |")
    lines += ["", *settings_text(bench), "",
              "A goal is met only when the whole interval lies below it. `--profile` breaks the extra time down "
              "(section 1c)."]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the profile


class CpuSampler:
    """Samples the CPU time (user + system) of every process of a tree every ``interval`` s, with the
    time of each sample. A process is named ``label(process)`` at each sample while it has a command
    line (one exiting, or a zombie, reads as nameless: it keeps its last name); the default label is
    :func:`classify`'s."""

    def __init__(self, interval: float = 0.05, label: Any = None) -> None:
        self.interval = interval
        self.label = label or (lambda proc: classify(proc.cmdline()))
        self.series: dict[int, list[Any]] = {}  # pid -> [label, times, CPU seconds]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pid: int) -> None:
        self._thread = threading.Thread(target=self._loop, args=(pid,), daemon=True)
        self._thread.start()

    def _loop(self, pid: int) -> None:
        import psutil

        try:
            root = psutil.Process(pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    with p.oneshot():
                        times = p.cpu_times()
                        entry = self.series.get(p.pid)
                        if entry is None:
                            entry = self.series[p.pid] = [self.label(p), [], []]
                        elif p.status() != psutil.STATUS_ZOMBIE and p.cmdline():
                            entry[0] = self.label(p)  # one caught before its exec is named again after it
                    entry[1].append(time.time())
                    entry[2].append(times.user + times.system)
                except psutil.Error:
                    continue
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, float]:
        """Stop sampling; the last CPU seconds seen of each kind of process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        out: dict[str, float] = {}
        for label, _, cpu in self.series.values():
            if cpu:
                out[label] = out.get(label, 0.0) + cpu[-1]
        return out

    def relabel(self, names: dict[int, str]) -> None:
        """Name these pids so (a task forked from the warm-start template has the template's command line
        and environment: only the run's events say which task it is)."""
        for pid, name in names.items():
            if pid in self.series:
                self.series[pid][0] = name

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each kind of process spent between ``t0`` and ``t1`` (linear between samples)."""
        out: dict[str, float] = {}
        for label, ts, cpu in self.series.values():
            if not ts or ts[-1] < t0 or ts[0] > t1:
                continue
            out[label] = out.get(label, 0.0) + _at(ts, cpu, t1) - _at(ts, cpu, t0)
        return out


def _at(ts: list[float], values: list[float], t: float) -> float:
    """``values`` at time ``t``, linearly between samples (the first or last sample outside them)."""
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return values[0]
    if i == len(ts):
        return values[-1]
    a, b = ts[i - 1], ts[i]
    return values[i - 1] + (values[i] - values[i - 1]) * ((t - a) / (b - a) if b > a else 1.0)


def classify(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    if "engine.cli" in text:
        return "CLI (launcher)"
    if "engine.control.supervisor" in text and "engine.control.netns" not in text and "unshare" not in text:
        return "supervisor"
    if "engine.control.netns" in text or text.startswith("unshare") or "/unshare " in text:
        return "namespace helper"
    if "--template-fd" in text:  # the warm-start template, and the tasks forked from it (same command line)
        return "warm-start template"
    if "engine.runtime.task" in text or "pss_chief" in text or "pss_server" in text or "mwms_loop" in text:
        return "tasks"
    if cmdline and cmdline[0].endswith("sh"):
        return "shell"
    return "other: " + (os.path.basename(cmdline[0]) if cmdline else "?")


def stamps_of(text: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, t in re.findall(r"STAMP (\w+) ([0-9.]+)", text):
        out.setdefault(name, []).append(float(t))
    return out


def cd_phases(run_dir: str, t_start: float, t_end: float) -> list[tuple[str, float]]:
    """(phase, seconds) of a ClusterDeck run from its events (wall-clock stamps of launcher, supervisor, tasks)."""
    from engine.observe.run_reader import read_events

    evs = read_events(run_dir)  # the lifecycle (events.jsonl) and the samples (the tiered store)

    def first(pred: Any) -> float | None:
        ts = [e["t"] for e in evs if pred(e)]
        return min(ts) if ts else None

    def last(pred: Any) -> float | None:
        ts = [e["t"] for e in evs if pred(e)]
        return max(ts) if ts else None

    run_starting = first(lambda e: e["kind"] == "run" and e.get("state") == "starting")
    isolation = first(lambda e: e["kind"] == "info" and e["task"] == "launcher")
    run_running = first(lambda e: e["kind"] == "run" and e.get("state") == "running")
    task_starting = first(lambda e: e["kind"] == "status" and e.get("state") == "starting")
    task_running = last(lambda e: e["kind"] == "status" and e.get("state") == "running" and e["task"] != "launcher")
    first_step = first(lambda e: e["kind"] in ("step", "progress"))
    last_step = last(lambda e: e["kind"] in ("step", "progress"))
    finished = last(lambda e: e["kind"] == "status" and e.get("state") == "finished")
    run_end = last(lambda e: e["kind"] == "run" and e.get("state") in ("finished", "failed", "stopped"))
    marks = [("CLI start: interpreter, imports, preset, pre-flight, run folder", t_start, run_starting),
             ("namespace probe (netns.available)", run_starting, isolation),
             ("supervisor spawned", isolation, run_running),
             ("supervisor start (namespace, interpreter, imports) to its first task started",
              run_running, task_starting),
             ("tasks: interpreter, TensorFlow import, strategy and model (last task)", task_starting, task_running),
             ("first step (tracing) to its event", task_running, first_step),
             ("training: first to last step event", first_step, last_step),
             ("after the last step: final checkpoint, summaries closed, task exit", last_step, finished),
             ("supervisor and launcher notice the end", finished, run_end),
             ("CLI end: final view, summary, interpreter exit", run_end, t_end)]
    return [(name, (b - a) if a is not None and b is not None else float("nan")) for name, a, b in marks]


def hand_phases(stamps: dict[str, list[float]], t_start: float, t_end: float) -> list[tuple[str, float]]:
    def mx(name: str) -> float | None:
        return max(stamps[name]) if stamps.get(name) else None

    marks = [("shell and interpreters started", t_start, mx("process")),
             ("TensorFlow import (last task)", mx("process"), mx("imported")),
             ("strategy and model", mx("imported"), mx("built")),
             ("first step", mx("built"), mx("first_step")),
             ("training: first to last step", mx("first_step"), mx("last_step")),
             ("after the last step to exit", mx("last_step"), t_end)]
    return [(name, (b - a) if a is not None and b is not None else float("nan")) for name, a, b in marks]


def alone(cmd: list[str], repeats: int = 3, env: dict[str, str] | None = None) -> float:
    """Median wall seconds of a short command, run ``repeats`` times."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return median(times)


def start_costs(env: dict[str, str]) -> list[tuple[str, float]]:
    """Start-up costs of the launcher's pieces, each measured alone (median of 3)."""
    from engine.control import netns

    py = sys.executable
    bare = alone([py, "-c", "pass"], env=env)
    rows = [("`python -c pass`", bare),
            ("CLI imports (`engine.cli.main`, the launcher, rich's live view)",
             alone([py, "-c", "import engine.cli.main, engine.control.launcher, rich.live, rich.progress, "
                          "rich.table"], env=env) - bare),
            ("supervisor imports (`engine.control.supervisor`)",
             alone([py, "-c", "import engine.control.supervisor"], env=env) - bare),
            ("task entry imports before TensorFlow (`engine.runtime.task`)",
             alone([py, "-c", "import engine.runtime.task"], env=env) - bare)]
    ok, _ = netns.available()
    if ok:
        rows.append(("`unshare -rn` before the supervisor's interpreter (`netns.wrap_supervisor`; it brings the "
                     "loopback up itself)", alone(netns.wrap_supervisor([py, "-c", "pass"]), env=env) - bare))
        rows.append(("namespace probe (`netns.available()`: `unshare -rn true`, once per launcher process)",
                     alone(["unshare", "-rn", "true"], env=env)))
    rows.append(("`import tensorflow` (for scale)", alone([py, "-c", "import tensorflow"], repeats=1, env=env) - bare))
    return rows


def run_profile(bench: Bench, modes: list[str], steps: int) -> dict[str, Any]:
    lines = [f"-- profile: one run per side at {steps} steps, stamps and per-process CPU sampled every 50 ms"]
    out: dict[str, Any] = {"steps": steps, "modes": {}, "lines": lines}
    stamp_env = dict(bench.env, CD_BENCH_STAMPS="1")
    for mode in modes:
        record: dict[str, Any] = {}
        for side in SIDES:
            sampler = CpuSampler()
            t0 = time.time()
            sample = bench.run(side, mode, steps, env=stamp_env, watch=sampler.start)
            t1 = time.time()
            record[side] = {"wall": sample.wall, "cpu": sample.cpu, "by_process": sampler.stop()}
            if side == "clusterdeck":
                record[side]["phases"] = cd_phases(sample.run_dir, t0, t1)
            else:
                err = (bench.work / f"err-hand-{mode}-{steps}.txt").read_text(errors="replace")
                record[side]["phases"] = hand_phases(stamps_of(err), t0, t1)
        prof_path = bench.work / f"cli-{mode}.prof"
        bench.run("clusterdeck", mode, steps, profile_out=prof_path)
        record["cli_profile"] = cli_profile_rows(prof_path)
        out["modes"][mode] = record
        cd, hand = record["clusterdeck"], record["hand"]
        lines.append(f"{mode}: clusterdeck {cd['wall']:.2f} s wall {cd['cpu']:.2f} s CPU; hand-written "
                     f"{hand['wall']:.2f} s wall {hand['cpu']:.2f} s CPU")
        for side in SIDES:
            lines.append(f"  {side} phases:")
            for name, secs in record[side]["phases"]:
                lines.append(f"    {secs:7.3f} s  {name}")
            lines.append("  CPU by process: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                          sorted(record[side]["by_process"].items())))
        lines.append("  CLI process, cProfile (main thread), top by cumulative time:")
        for row in record["cli_profile"][:12]:
            lines.append(f"    {row['cum']:7.3f} s cum {row['own']:7.3f} s own  {row['name']}")
    out["start_costs"] = start_costs(bench.env)
    lines.append("start-up costs measured alone:")
    for name, secs in out["start_costs"]:
        lines.append(f"  {secs:7.3f} s  {name}")
    return out


def cli_profile_rows(path: Path, limit: int = 25) -> list[dict[str, Any]]:
    import pstats

    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_, _, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        short = file.replace(str(ROOT) + "/", "")
        if "site-packages/" in short:
            short = short.split("site-packages/", 1)[1]
        rows.append({"name": f"{short}:{line}({func})", "own": own, "cum": cum})
    rows.sort(key=lambda r: -r["cum"])
    keep = [r for r in rows if "engine/" in r["name"] or "rich/" in r["name"] or "importlib" in r["name"]
            or "{built-in" in r["name"] or "<frozen" in r["name"]]
    return keep[:limit]


def profile_doc(profile: dict[str, Any]) -> str:
    lines = ["## 1c. Where ClusterDeck's extra time goes (profile)", "",
             f"`python bench/whole_run.py --profile` — one run per side at {profile['steps']} steps with wall-clock "
             "stamps (ClusterDeck: the `t` of its own events — launcher, supervisor and tasks; hand-written: "
             "stamps the script prints when `CD_BENCH_STAMPS=1`), the CPU time of every process of the run sampled "
             f"every 50 ms (psutil), a cProfile of the CLI's main thread, and start-up costs measured alone; "
             f"{machine_line()}. One run per side: indicative, not a measurement with an interval.", ""]
    for mode, rec in profile["modes"].items():
        cd, hand = rec["clusterdeck"], rec["hand"]
        lines += [f"**{mode}** — ClusterDeck {cd['wall']:.2f} s wall / {cd['cpu']:.2f} s CPU, hand-written "
                  f"{hand['wall']:.2f} s / {hand['cpu']:.2f} s.", "",
                  "| ClusterDeck phase | s | | hand-written phase | s |", "| --- | ---: | --- | --- | ---: |"]
        a, b = cd["phases"], hand["phases"]
        for i in range(max(len(a), len(b))):
            left = f"{a[i][0]} | {a[i][1]:.3f}" if i < len(a) else " | "
            right = f"{b[i][0]} | {b[i][1]:.3f}" if i < len(b) else " | "
            lines.append(f"| {left} | | {right} |")
        lines += ["", "CPU seconds by process: ClusterDeck " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(cd["by_process"].items())) + "; hand-written " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(hand["by_process"].items())) + ".", ""]
        lines += ["CLI main thread (cProfile, cumulative s): " + "; ".join(
            f"`{r['name']}` {r['cum']:.2f}" for r in rec["cli_profile"][:8]) + ".", ""]
    lines += ["Start-up costs measured alone (median of 3, beyond `python -c pass` where marked):", "",
              "| piece | s |", "| --- | ---: |"]
    lines += [f"| {name} | {secs:.3f} |" for name, secs in profile["start_costs"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
