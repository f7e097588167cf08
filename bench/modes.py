"""Every parallelism mode against its own bare loop: steady-state examples/s, ClusterDeck / bare.

For each mode the same model (784-256-10 MLP), data and global batch (128) train twice per
round, order rotating, and the steady-state throughput is measured inside the training
process the same way on both sides (after ``min(50, steps // 5)`` warm-up steps, to the last
step):

- *data* (preset ``data-2workers``: 2 workers, ``MultiWorkerMirroredStrategy``): ClusterDeck
  (:class:`engine.control.launcher.Run`: supervisor, events, device sampling, summaries) against
  the runtime's own loop without telemetry (``python -m engine.runtime.task --bare``, one per
  task with the same ``TF_CONFIG``; the same steps per function as the preset);
- *async* (preset ``async-1ps``: chief + 2 workers + 1 ps, ``ParameterServerStrategy``):
  ClusterDeck against the hand-written ``ParameterServerStrategy`` loop of
  ``bench/_handwritten.py`` grouping its steps as the preset does (``steps_per_execution`` steps
  per scheduled function), one fetch at the end; the runtime has no bare path for this mode.
  ClusterDeck's figure: the chief's own, over the same window as the bare loop's (from the end of the
  warm-up, every step so far done, to the last step done), one worker batch per step;
- *model* (preset ``model-2x2``: one worker, DTensor mesh batch 2 x model 2): ClusterDeck against
  the hand-written DTensor loop of ``bench/_handwritten.py`` (the same Megatron-style split and
  plain SGD; no bare path in the runtime for this mode either).

Periodic checkpoints are off on the ClusterDeck side (``checkpoint_every: 0``): the figure is
what telemetry and supervision cost a training loop. Goal: ClusterDeck / bare >= 0.97 for every
mode, the whole bootstrap 95 % interval above it.

With ``--direct`` the data and async modes run a third side, ``direct``: ClusterDeck's runtime with its
telemetry on (events to each task's own ``events.jsonl``; data: TensorBoard summaries, allocator figures),
every task started by hand with its ``TF_CONFIG``, with no launcher, no supervisor and no network
namespace (async: the chief, the workers and the ps; measured by the chief, as ClusterDeck's side is); ``direct / bare`` is what the tasks' own runtime costs against the
bare loop, ``clusterdeck / direct`` what the supervision around the tasks does (printed only; the page's
table keeps two sides).
With ``--tf-threads`` it runs the bare side a second time with TensorFlow's own thread pools (side
``tf_threads``: every task a thread per core of the machine) instead of ClusterDeck's share of the cores:
``bare / tf_threads`` is what the sharing gains (printed only).

    python bench/modes.py [--modes data,async,model] [--steps 1500] [--rounds 10] [--direct] [--tf-threads] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _handwritten  # noqa: E402
from _common import (  # noqa: E402
    ROOT,
    add_doc_flags,
    config_core_shares,
    core_shares,
    cores_json,
    free_port,
    machine_line,
    median,
    task_threads,
    want_doc,
    write_section,
)
from _stats import MIN_ROUNDS, goal_verdict, paired_ratio, rotated, rounds_note  # noqa: E402

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.plan import plan_tasks, resolve_ports  # noqa: E402
from engine.contract.presets import load_preset  # noqa: E402
from engine.contract.task_plan import INTRA_OP_ENV
from engine.control.launcher import Run  # noqa: E402

MODES = ("data", "async", "model")
PRESETS = {"data": "data-2workers", "async": "async-1ps", "model": "model-2x2"}
BARE = {"data": "`python -m engine.runtime.task --bare` (the runtime's own loop, no telemetry)",
        "async": "hand-written `ParameterServerStrategy` loop (`bench/_handwritten.py`), the preset's steps per "
                 "scheduled function",
        "model": "hand-written DTensor 2 x 2 loop (`bench/_handwritten.py`)"}
GOAL = 0.97
SIDES = ("clusterdeck", "bare")
#: data mode, with ``--direct``: the runtime with its telemetry, started as the bare side is
DIRECT = "direct"
#: data mode, with ``--tf-threads``: the bare side with TensorFlow's own thread pools (a thread per core per task)
TF_THREADS = "tf_threads"
#: data and async modes, with ``--unpinned``: the bare side with the cores shared but every task placed by the
#: kernel (no task on cores of its own)
UNPINNED = "unpinned"


def warm_steps(total: int) -> int:
    return max(1, min(50, total // 5))


def load(mode: str, steps: int) -> config_mod.RunConfig:
    cfg = load_preset(PRESETS[mode])
    return config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=steps, epochs=None,
                                                              checkpoint_every=0))


def bare_env(tasks: int) -> dict[str, str]:
    """The bare sides' environment: the TensorFlow settings ClusterDeck's supervisor gives its ``tasks`` tasks
    (the allocator; this machine's cores shared evenly by the tasks, unless the environment sets it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CD_BENCH_")}
    env.update(TF_CPU_ALLOCATOR_USE_BFC="1", TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONUNBUFFERED="1")
    env[INTRA_OP_ENV] = task_threads(tasks, env)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def clusterdeck_rate(mode: str, cfg: config_mod.RunConfig, root: Path) -> float:
    """Steady-state examples/s of a ClusterDeck run (mean over the tasks that measure it)."""
    run = Run(cfg, runs_root=root)
    finished: list[dict[str, Any]] = []

    def listen(e: dict[str, Any]) -> None:
        if e["kind"] == "status" and e.get("state") == "finished":
            finished.append(e)

    run.add_listener(listen)
    run.start()
    state = run.wait(900)
    if state != "finished":
        raise SystemExit(f"clusterdeck {mode} run ended {state}: {run.state.reason}")
    shutil.rmtree(run.run_dir, ignore_errors=True)
    rates = [e["window_examples_per_sec"] for e in finished if e.get("window_examples_per_sec")]
    if not rates:
        raise SystemExit(f"clusterdeck {mode}: no task reported its steady-state throughput")
    # every synchronous task measures the global batch: the mean, not the sum (async: the chief alone measures)
    return sum(rates) / len(rates)


@contextlib.contextmanager
def tasks_by_hand(cfg: config_mod.RunConfig, env: dict[str, str], root: Path, prefix: str, *,
                  bare: bool = False, pinned: bool = True) -> Iterator[tuple[Path, dict[str, subprocess.Popen[bytes]]]]:
    """Every task of ``cfg`` started by hand in a scratch run folder, as the hand-written launches start
    theirs: ``python -m engine.runtime.task`` with its ``TF_CONFIG`` and no launcher or supervisor (``bare``:
    the runtime's loop without telemetry), on the cores ClusterDeck's supervisor gives it (``pinned``; else
    wherever the kernel places it). Each task writes its summary to ``TASK.json`` and its stderr to
    ``TASK.err`` (``TASK``: :func:`task_file`). On leaving, a task still running (an async worker or ps
    serves until ended) is killed and the folder removed."""
    work = Path(tempfile.mkdtemp(dir=root, prefix=prefix))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        cfg = config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))
        config_mod.save(cfg, work / "config.yaml")
        plans = plan_tasks(cfg)
        shares = core_shares(plans) if pinned else {}
        for plan in plans:
            name = task_file(plan.name)
            share = shares.get(plan.name)
            with open(work / f"{name}.err", "wb") as err:
                procs[plan.name] = subprocess.Popen(
                    [sys.executable, "-m", "engine.runtime.task", "--run-dir", str(work),
                     "--summary-out", str(work / f"{name}.json")] + (["--bare"] if bare else []),
                    env=dict(env, **plan.env, **(share.env if share else {})), cwd=work, stdout=subprocess.DEVNULL,
                    stderr=err,
                    preexec_fn=functools.partial(os.sched_setaffinity, 0, share.cores) if share and share.cores else None)
        yield work, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def task_file(task: str) -> str:
    return task.replace(":", "-")


def task_summary(work: Path, task: str, proc: subprocess.Popen[bytes], side: str) -> dict[str, Any]:
    """Wait for a task of :func:`tasks_by_hand` to finish and read its summary; a failed one ends the
    benchmark with its stderr."""
    proc.wait(900)
    if proc.returncode != 0:
        err = (work / f"{task_file(task)}.err").read_text(encoding="utf-8", errors="replace")
        raise SystemExit(f"{side} task {task} failed ({proc.returncode}): {err[-2000:]}")
    summary: dict[str, Any] = json.loads((work / f"{task_file(task)}.json").read_text(encoding="utf-8"))
    return summary


def async_direct_rate(cfg: config_mod.RunConfig, root: Path) -> float:
    """Steady-state examples/s of the async runtime started by hand (chief, workers and ps; the chief's
    events to its own file only), as the chief measured it."""
    with tasks_by_hand(cfg, bare_env(len(cfg.cluster.tasks())), root, "direct-async-") as (work, procs):
        summary = task_summary(work, "chief:0", procs["chief:0"], DIRECT)
    if not summary.get("window_examples_per_sec"):
        raise SystemExit(f"{DIRECT} async: the chief measured no steady-state throughput")
    return float(summary["window_examples_per_sec"])


def runtime_rate(cfg: config_mod.RunConfig, root: Path, *, telemetry: bool, tf_threads: bool = False,
                 pinned: bool = True) -> float:
    """Steady-state examples/s of the data-parallel runtime started by hand, one process per task with its
    ``TF_CONFIG`` and no launcher or supervisor: bare (``--bare``), or with its telemetry (events to its own
    ``events.jsonl``, TensorBoard summaries, allocator figures; no event pipe). ``tf_threads``: with
    TensorFlow's own intra-op pools instead of ClusterDeck's share of the cores; ``pinned``: each task on
    the cores ClusterDeck gives it."""
    env = bare_env(len(cfg.cluster.tasks()))
    if tf_threads:
        env.pop(INTRA_OP_ENV)
    side = DIRECT if telemetry else "bare"
    with tasks_by_hand(cfg, env, root, f"{side}-data-", bare=not telemetry,
                       pinned=pinned and not tf_threads) as (work, procs):
        rates = [float(task_summary(work, task, proc, f"{side} data")["window_examples_per_sec"])
                 for task, proc in procs.items()]
    return sum(rates) / len(rates)


def bare_rate(mode: str, cfg: config_mod.RunConfig, root: Path, *, pinned: bool = True) -> float:
    """The bare loop's steady-state examples/s, its tasks on the cores ClusterDeck's supervisor gives them
    (``pinned``; else placed by the kernel)."""
    if mode == "data":
        return runtime_rate(cfg, root, telemetry=False, pinned=pinned)
    env = bare_env(len(cfg.cluster.tasks()))
    shares = config_core_shares(cfg) if pinned else {}
    if shares:  # the hand-written tasks carry the same names (chief:0, worker:0, ...)
        env["CD_BENCH_CORES"] = cores_json(shares)
    work = Path(tempfile.mkdtemp(dir=root, prefix=f"bare-{mode}-"))
    try:
        _handwritten.write_all(work)
        summary = work / "summary.json"
        env = _handwritten.shell_env(sys.executable, dict(env, CD_BENCH_SUMMARY=str(summary)))
        steps = str(cfg.total_steps())
        if mode == "async":
            cmd = ["sh", "launch_async.sh", steps, *(str(free_port()) for _ in range(4)),
                   str(cfg.training.steps_per_execution)]
        else:
            cmd = [sys.executable, "dtensor_loop.py", steps]
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, timeout=900)
        if done.returncode != 0 or not summary.exists():
            raise SystemExit(f"bare {mode} loop failed ({done.returncode}): {done.stderr.decode()[-3000:]}")
        return float(json.loads(summary.read_text())["window_examples_per_sec"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of data,async,model")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1500, quick 60)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {MIN_ROUNDS}, quick 1)")
    parser.add_argument("--direct", action="store_true",
                        help="data and async modes: also run ClusterDeck's runtime with its telemetry, every task "
                             f"started by hand without launcher and supervisor (side '{DIRECT}'), to tell the tasks' "
                             "own runtime from the supervision around them")
    parser.add_argument("--unpinned", action="store_true",
                        help="data and async modes: also run the bare side with every task placed by the kernel "
                             f"instead of on the cores ClusterDeck gives it (side '{UNPINNED}'): what the pinning "
                             "gains")
    parser.add_argument("--tf-threads", action="store_true",
                        help="data mode: also run the bare side with TensorFlow's own thread pools instead of the "
                             f"machine's cores shared by the tasks (side '{TF_THREADS}'): what the sharing gains")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: expected some of {', '.join(MODES)}, received: {args.modes}")
    steps = args.steps or (60 if args.quick else 1500)
    rounds = args.rounds or (1 if args.quick else MIN_ROUNDS)
    print(f"every mode against its bare loop: {', '.join(modes)}; {steps} steps, {rounds} round(s), order "
          f"rotating{rounds_note(rounds)}; {machine_line()}", flush=True)
    sides_of = {m: SIDES + ((DIRECT,) if args.direct and m in ("data", "async") else ())
                + ((TF_THREADS,) if args.tf_threads and m == "data" else ())
                + ((UNPINNED,) if args.unpinned and m in ("data", "async") else ()) for m in modes}
    rates: dict[str, dict[str, list[float]]] = {m: {s: [] for s in sides_of[m]} for m in modes}
    with tempfile.TemporaryDirectory(prefix="cd-modes-") as tmp:
        root = Path(tmp)
        for r in range(rounds):
            for mode in modes:
                cfg = load(mode, steps)
                got = {}
                for side in rotated(sides_of[mode], r):
                    if side == "clusterdeck":
                        got[side] = clusterdeck_rate(mode, cfg, root)
                    elif side == DIRECT:
                        got[side] = (runtime_rate(cfg, root, telemetry=True) if mode == "data"
                                     else async_direct_rate(cfg, root))
                    elif side == TF_THREADS:
                        got[side] = runtime_rate(cfg, root, telemetry=False, tf_threads=True)
                    elif side == UNPINNED:
                        got[side] = bare_rate(mode, cfg, root, pinned=False)
                    else:
                        got[side] = bare_rate(mode, cfg, root)
                    rates[mode][side].append(got[side])
                print(f"round {r + 1:>2} {mode:<5}: clusterdeck {got['clusterdeck']:8.0f} ex/s, bare "
                      f"{got['bare']:8.0f} ex/s, ratio {got['clusterdeck'] / got['bare']:.3f}"
                      + (f"; {DIRECT} {got[DIRECT]:8.0f} ex/s" if DIRECT in got else "")
                      + (f"; {TF_THREADS} {got[TF_THREADS]:8.0f} ex/s" if TF_THREADS in got else "")
                      + (f"; {UNPINNED} {got[UNPINNED]:8.0f} ex/s" if UNPINNED in got else ""), flush=True)
    results = {}
    for mode in modes:
        ratio = paired_ratio(rates[mode]["clusterdeck"], rates[mode]["bare"])
        results[mode] = {"ratio": ratio, "clusterdeck": median(rates[mode]["clusterdeck"]),
                         "bare": median(rates[mode]["bare"]), "verdict": goal_verdict(ratio, GOAL, at_most=False)}
        print(f"{mode}: clusterdeck / bare {ratio.text()} (goal >= {GOAL}: {results[mode]['verdict']}); medians "
              f"clusterdeck {results[mode]['clusterdeck']:.0f} ex/s, bare {results[mode]['bare']:.0f} ex/s")
        if DIRECT in rates[mode]:
            print(f"{mode}: {DIRECT} / bare {paired_ratio(rates[mode][DIRECT], rates[mode]['bare']).text()} (the tasks' "
                  f"own runtime); clusterdeck / {DIRECT} "
                  f"{paired_ratio(rates[mode]['clusterdeck'], rates[mode][DIRECT]).text()} (the supervision around it)")
        if UNPINNED in rates[mode]:
            results[mode]["pinning"] = paired_ratio(rates[mode]["bare"], rates[mode][UNPINNED])
            print(f"{mode}: bare / {UNPINNED} {results[mode]['pinning'].text()} (the training tasks on cores of their "
                  f"own against placed by the kernel); clusterdeck / {UNPINNED} "
                  f"{paired_ratio(rates[mode]['clusterdeck'], rates[mode][UNPINNED]).text()}")
        if TF_THREADS in rates[mode]:
            print(f"{mode}: bare / {TF_THREADS} {paired_ratio(rates[mode]['bare'], rates[mode][TF_THREADS]).text()} "
                  f"(the cores shared against TensorFlow's own pools); clusterdeck / {TF_THREADS} "
                  f"{paired_ratio(rates[mode]['clusterdeck'], rates[mode][TF_THREADS]).text()}")
    if want_doc(args):
        write_section("modes", doc_section(results, steps, rounds), args.doc)
    return results


def doc_section(results: dict[str, dict[str, Any]], steps: int, rounds: int) -> str:
    cfg = load("data", steps)
    per_execution = load("async", steps).training.steps_per_execution
    lines = [
        "## 1d. Every mode against its own bare loop",
        "",
        f"`python bench/modes.py` — {steps} steps per run, {rounds} rounds, order rotating{rounds_note(rounds)}; "
        f"{machine_line()}. Steady-state examples/s measured inside the training process on both sides (after "
        "`min(50, steps // 5)` warm-up steps, to the last step; async: by the chief on both sides, steps x "
        "per-worker batch, from the end of the warm-up to the last step done). ClusterDeck runs with `checkpoint_every: 0`; both "
        "sides run with the TensorFlow settings ClusterDeck gives its tasks (`TF_CPU_ALLOCATOR_USE_BFC=1`; the "
        "machine's cores shared evenly by the tasks, `TF_NUM_INTRAOP_THREADS`) and on the cores it gives them (the "
        "training tasks, where there are enough cores, each on cores of its own; `share_cores` in "
        "`engine/contract/task_plan.py`).",
        "",
        "| mode (preset) | bare side | bare ex/s (median) | ClusterDeck ex/s (median) | ClusterDeck / bare "
        "[95 % CI] | goal |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for mode, x in results.items():
        lines.append(f"| {mode} (`{PRESETS[mode]}`) | {BARE[mode]} | {x['bare']:.0f} | {x['clusterdeck']:.0f} | "
                     f"**{x['ratio'].text()}** | >= {GOAL} ({x['verdict']}) |")
    lines += [
        "",
        "Settings of each side. *Bare*: no events, no files, no supervisor; one sync at the end of the warm-up "
        "and one at the end. *ClusterDeck*: a `step` event per replica (async: per worker) at most "
        f"{cfg.training.metrics_hz:g} Hz, each report reading the losses (data: groups of "
        f"{cfg.training.steps_per_execution} steps per function on both sides, a report reads the last group's mean "
        f"losses; async: groups of {per_execution} steps per scheduled function on both sides, every group waited "
        "for oldest first from a window of 4 groups per worker (each group's result copied to the chief as it "
        "ends; the hand-written loop keeps none, so none is copied), the figures of about one per worker and "
        "report interval read); events written by each task to its "
        "`events.jsonl` (one write per event) and its pipe, relayed by the supervisor and written again by the "
        "launcher; TensorBoard summaries on a background thread (at most 2 points per second per replica, `flush_millis` 2000); a `device` event per task "
        "every 0.5 s from the supervisor (psutil) and, in the task, TensorFlow's allocator figures at most every "
        "0.5 s; the final checkpoint after the measured window.",
    ]
    pinning = {m: x["pinning"] for m, x in results.items() if x.get("pinning") is not None}
    if pinning:
        lines += ["", "What the cores of their own gain (`--unpinned`: the bare side again, every task placed by the "
                  "kernel, in the same rounds): bare pinned / bare unpinned " + ", ".join(
                      f"{m} **{r.text()}**" for m, r in pinning.items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
