"""Telemetry overhead: an engine run with full telemetry against the same loop bare.

Both sides run the same task code (``engine.runtime.task``) on the same config:

- *engine*: launched by :class:`engine.launcher.Run`: supervisor, per-replica step
  events at ``training.metrics_hz``, device sampling, events persisted and streamed;
- *bare*: the task process alone with ``--bare``: no events, no files, no supervisor.

Each side measures steady-state examples/s inside the task (after a warm-up,
with a device sync at both ends of the window). Rounds alternate the order of
the two sides so drift on a shared machine hits both; the figure that matters
is the ratio of medians, printed last.

    python bench/telemetry_overhead.py [--rounds 5] [--steps 1500] [--preset data-1worker-2gpus]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import config as config_mod  # noqa: E402
from engine.cli import resolve_preset  # noqa: E402
from engine.cluster import plan_tasks, resolve_ports  # noqa: E402
from engine.launcher import Run  # noqa: E402


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


def bare_round(cfg: config_mod.RunConfig, root: Path) -> float:
    cfg = config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))
    run_dir = Path(tempfile.mkdtemp(dir=root, prefix="bare-"))
    config_mod.save(cfg, run_dir / "config.yaml")
    plans = plan_tasks(cfg)
    procs = []
    for plan in plans:
        env = dict(os.environ, **plan.env, TF_CPU_ALLOCATOR_USE_BFC="1", PYTHONPATH=str(ROOT))
        out = run_dir / f"{plan.name.replace(':', '-')}.json"
        procs.append((out, subprocess.Popen([sys.executable, "-m", "engine.runtime.task", "--run-dir", str(run_dir),
                                             "--bare", "--summary-out", str(out)], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    total = 0.0
    for out, proc in procs:
        if proc.wait(600) != 0:
            raise SystemExit(f"bare task failed with code {proc.returncode}")
        total += json.loads(out.read_text())["window_examples_per_sec"]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--preset", default="data-1worker-2gpus")
    args = parser.parse_args()
    cfg = config_mod.load(resolve_preset(args.preset))
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=args.steps, epochs=None,
                                                              checkpoint_every=0))
    engine_rates: list[float] = []
    bare_rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cd-bench-") as tmp:
        root = Path(tmp)
        print(f"preset {args.preset}: {cfg.num_replicas()} replicas, global batch {cfg.training.global_batch_size}, "
              f"{args.steps} steps, {args.rounds} rounds (order alternates)")
        print(f"{'round':>5} {'engine ex/s':>12} {'bare ex/s':>12} {'ratio':>7}")
        for i in range(args.rounds):
            order = ("engine", "bare") if i % 2 == 0 else ("bare", "engine")
            got = {}
            for side in order:
                got[side] = engine_round(cfg, root) if side == "engine" else bare_round(cfg, root)
            engine_rates.append(got["engine"])
            bare_rates.append(got["bare"])
            print(f"{i + 1:>5} {got['engine']:>12.0f} {got['bare']:>12.0f} {got['engine'] / got['bare']:>7.3f}",
                  flush=True)
    e, b = statistics.median(engine_rates), statistics.median(bare_rates)
    print(f"median engine {e:.0f} ex/s, bare {b:.0f} ex/s")
    print(f"telemetry overhead ratio (engine/bare, medians): {e / b:.3f}  (goal >= 0.97)")


if __name__ == "__main__":
    main()
