"""Telemetry overhead: ClusterDeck's full telemetry against the bare loop and against Keras + TensorBoard.

Four sides train the same model on the same data with the same global batch and
devices (the preset's, by default one task with ``MirroredStrategy`` over 2 logical
CPU devices), each in fresh processes:

- *engine*: launched by :class:`engine.control.launcher.Run`: supervisor, per-replica step
  events at ``training.metrics_hz``, device sampling, events persisted and streamed,
  TensorBoard summaries of the same scalars;
- *bare*: the same task code alone with ``--bare``: no events, no files, no supervisor;
- *fit*: Keras ``model.fit`` with no callback (``bench/keras_fit.py``);
- *fit+TB*: the same ``model.fit`` with ``keras.callbacks.TensorBoard(update_freq=1)``,
  the per-batch live curves users get from TensorBoard today.

Each side measures steady-state examples/s inside its process (after the same
warm-up, to the end of the last step). Rounds rotate the order of the sides so
drift on a shared machine hits all of them; the figures that matter are the
ratios of each round's paired runs (median over rounds, with a bootstrap 95 %
interval: ``bench/_stats.py``; a goal is met only when the whole interval clears it):

- ``engine / bare``: what ClusterDeck's telemetry costs its own loop (goal >= 0.97);
- ``fit+TB / fit``: what TensorBoard's per-batch callback costs ``model.fit``
  (the same question asked of the tool users have today).

    python bench/telemetry_overhead.py [--rounds 10] [--steps 1500] [--preset data-1worker-2gpus] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, median, want_doc, write_section  # noqa: E402
from _stats import MIN_ROUNDS, Ratio, goal_verdict, paired_ratio, rounds_note  # noqa: E402

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.plan import plan_tasks, resolve_ports  # noqa: E402
from engine.contract.presets import resolve_preset  # noqa: E402
from engine.control.launcher import Run  # noqa: E402

SIDES = ("engine", "bare", "fit", "fit+TB")
GOAL = 0.97


def engine_round(cfg: config_mod.RunConfig, root: Path) -> float:
    run = Run(cfg, runs_root=root)
    finished: list[dict] = []
    run.add_listener(lambda e: finished.append(e) if e["kind"] == "status" and e.get("state") == "finished" else None)
    run.start()
    state = run.wait(600)
    if state != "finished":
        raise SystemExit(f"engine run ended {state}: {run.state.reason}")
    rates = [e["window_examples_per_sec"] for e in finished if e.get("window_examples_per_sec")]
    return sum(rates)


def _task_env(plan_env: dict[str, str]) -> dict[str, str]:
    return dict(os.environ, **plan_env, TF_CPU_ALLOCATOR_USE_BFC="1", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=str(ROOT))


def bare_round(cfg: config_mod.RunConfig, root: Path) -> float:
    cfg = config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))
    run_dir = Path(tempfile.mkdtemp(dir=root, prefix="bare-"))
    config_mod.save(cfg, run_dir / "config.yaml")
    procs = []
    for plan in plan_tasks(cfg):
        out = run_dir / f"{plan.name.replace(':', '-')}.json"
        procs.append((out, subprocess.Popen([sys.executable, "-m", "engine.runtime.task", "--run-dir", str(run_dir),
                                             "--bare", "--summary-out", str(out)], env=_task_env(plan.env),
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    total = 0.0
    for out, proc in procs:
        if proc.wait(600) != 0:
            raise SystemExit(f"bare task failed with code {proc.returncode}")
        total += json.loads(out.read_text())["window_examples_per_sec"]
    return total


def fit_round(cfg: config_mod.RunConfig, root: Path, tensorboard: bool) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=root, prefix="fit-tb-" if tensorboard else "fit-"))
    config_mod.save(cfg, run_dir / "config.yaml")
    out = run_dir / "summary.json"
    cmd = [sys.executable, str(ROOT / "bench" / "keras_fit.py"), "--run-dir", str(run_dir), "--summary-out", str(out)]
    if tensorboard:
        cmd += ["--tensorboard", str(run_dir / "tensorboard")]
    proc = subprocess.run(cmd, env=_task_env({}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"keras fit failed with code {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return float(json.loads(out.read_text())["window_examples_per_sec"])


def measure(side: str, cfg: config_mod.RunConfig, root: Path) -> float:
    if side == "engine":
        return engine_round(cfg, root)
    if side == "bare":
        return bare_round(cfg, root)
    return fit_round(cfg, root, tensorboard=side == "fit+TB")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds of all sides (default {MIN_ROUNDS}, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1500, quick 400)")
    parser.add_argument("--preset", default="data-1worker-2gpus")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else MIN_ROUNDS)
    steps = args.steps or (400 if args.quick else 1500)
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"--sides: expected some of {', '.join(SIDES)}, received: {', '.join(unknown)}")
    cfg = config_mod.load(resolve_preset(args.preset))
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=steps, epochs=None,
                                                              checkpoint_every=0))
    rates: dict[str, list[float]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="cd-bench-") as tmp:
        root = Path(tmp)
        print(f"preset {args.preset}: {cfg.num_replicas()} replicas, global batch {cfg.training.global_batch_size}, "
              f"{steps} steps, {rounds} round(s), order rotates; {machine_line()}")
        print(f"{'round':>5} " + " ".join(f"{s + ' ex/s':>14}" for s in sides), flush=True)
        for i in range(rounds):
            order = sides[i % len(sides):] + sides[: i % len(sides)]
            got = {side: measure(side, cfg, root) for side in order}
            for side in sides:
                rates[side].append(got[side])
            print(f"{i + 1:>5} " + " ".join(f"{got[s]:>14.0f}" for s in sides), flush=True)

    def paired(a: str, b: str) -> Ratio | None:
        if a not in rates or b not in rates:
            return None
        return paired_ratio(rates[a], rates[b])

    figures = {f"median_{s}": median(v) for s, v in rates.items()}
    ratios = {"engine/bare": paired("engine", "bare"), "fit+TB/fit": paired("fit+TB", "fit"),
              "fit/bare": paired("fit", "bare"), "fit+TB/bare": paired("fit+TB", "bare")}
    print("medians: " + ", ".join(f"{s} {median(v):.0f} ex/s" for s, v in rates.items()))
    for name, value in ratios.items():
        if value is not None:
            figures[name] = value.median
            note = f"  (goal >= {GOAL}: {goal_verdict(value, GOAL, at_most=False)})" if name == "engine/bare" else ""
            print(f"ratio {name:<12} {value.text()}{note}")
    eng, tb = ratios["engine/bare"], ratios["fit+TB/fit"]
    if eng is not None and tb is not None:
        print(f"engine/bare {'>' if eng.low > tb.high else 'not clearly >'} fit+TB/fit: ClusterDeck's telemetry costs "
              f"{(1 - eng.median) * 100:.1f} % of its loop, TensorBoard's callback {(1 - tb.median) * 100:.1f} % of fit")
    if want_doc(args) and eng is not None:
        write_section("telemetry_overhead", _doc(args.preset, cfg, steps, rounds, rates, ratios), args.doc)
    return figures


def _doc(preset: str, cfg: config_mod.RunConfig, steps: int, rounds: int, rates: dict[str, list[float]],
         ratios: dict[str, Ratio | None]) -> str:
    eng, tb = ratios["engine/bare"], ratios["fit+TB/fit"]
    assert eng is not None
    rows = "\n".join(f"| {s} | {median(v):.0f} | {' · '.join(f'{x:.0f}' for x in v)} |" for s, v in rates.items())
    lines = [
        "## 1. Telemetry overhead",
        "",
        f"`python bench/telemetry_overhead.py` — preset `{preset}` ({cfg.num_replicas()} replicas, global batch "
        f"{cfg.training.global_batch_size}, {steps} steps per run, {rounds} rounds, order "
        f"rotating{rounds_note(rounds)}; {machine_line()}). Steady-state examples/s measured inside each training "
        "process after the same warm-up.",
        "",
        "| side | reporting | writing | median examples/s | per round |",
        "| --- | --- | --- | ---: | --- |",
    ]
    settings = {
        "engine": (f"a `step` event per replica at most {cfg.training.metrics_hz:g} Hz (each report fetches the "
                   "losses); `device` events every 0.5 s (supervisor) and TF allocator figures at most every 0.5 s",
                   "each event to the task's `events.jsonl` (one write per event) and its pipe; the launcher "
                   "writes it again; TensorBoard summaries on a background thread, `flush_millis` 2000"),
        "bare": ("none", "none"),
        "fit": ("none (no callback)", "none"),
        "fit+TB": ("`TensorBoard(update_freq=1)`: the batch's logs every batch",
                   "on the training thread (the callback's `on_train_batch_end`), TensorFlow's default writer "
                   "(queue of 10, `flush_millis` 120000)"),
    }
    for line in rows.splitlines():
        side = line.split(" | ")[0].lstrip("| ").strip()
        rep, wr = settings.get(side, ("", ""))
        cells = line.strip("|").split(" | ")
        lines.append(f"| {cells[0].strip()} | {rep} | {wr} | {cells[1].strip()} | {cells[2].strip()} |")
    lines += [
        "",
        "| ratio (median of paired rounds [bootstrap 95 % CI]) | value | goal |",
        "| --- | ---: | --- |",
        f"| **engine / bare**: ClusterDeck's full telemetry vs the same loop bare | **{eng.text()}** | >= {GOAL} "
        f"({goal_verdict(eng, GOAL, at_most=False)}) |",
    ]
    if tb is not None:
        above = "met" if eng.low > tb.high else "**not shown**"
        lines.append(f"| **fit+TB / fit**: `keras.callbacks.TensorBoard(update_freq=1)` vs the same `model.fit` "
                     f"without callback | **{tb.text()}** | engine/bare above it, intervals apart ({above}) |")
    for name in ("fit/bare", "fit+TB/bare"):
        r = ratios.get(name)
        if r is not None:
            lines.append(f"| {name} (for scale: Keras `fit` against ClusterDeck's bare loop) | {r.text()} | |")
    lines += ["", "Each side's cost is read against its own baseline (engine against its bare loop, fit+TB against "
              "plain fit): the two loops differ (Keras `fit` splits global batches, ClusterDeck feeds each replica "
              "its own pipeline), so only like-for-like ratios say what the telemetry costs."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
