"""Warm start against cold start: whole ``clusterdeck run`` processes, each side interleaved.

*Warm*: ClusterDeck as shipped. Each host's tasks are forked from one template process that
imported TensorFlow once (``engine/contract/warm_start.py``). *Cold*: the same command with
``CLUSTERDECK_WARM_START=0``, where every task is a process of its own that imports TensorFlow
itself. Both sides run ``clusterdeck run PRESET --steps N --json``, from the command's start to
its exit, in a fresh output folder, order rotating every round.

The figures are the wall time and the CPU time (``wait4``: the command and every process it
reaped, the tasks included) of each side, each as the median paired ratio warm / cold with its
bootstrap 95 % interval. There is no goal: the figure is what warm start saves a run, and whether it
costs anything where it cannot save (two tasks on two cores import in parallel when cold).

    python bench/warm_start.py [--presets data-2workers,async-1ps] [--steps 300] [--rounds 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, median, timed_process, want_doc, write_section  # noqa: E402
from _stats import MIN_ROUNDS, interleaved, paired_ratio, rounds_note  # noqa: E402

from engine.contract.warm_start import WARM_START_ENV  # noqa: E402

SIDES = ("warm", "cold")
PRESETS = ("data-2workers", "async-1ps")


def run_once(preset: str, steps: int, side: str, work: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one whole ``clusterdeck run``; fails loudly if the run did not finish."""
    out = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=work))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{WARM_START_ENV: "1" if side == "warm" else "0"})
    cmd = [sys.executable, "-m", "engine.cli", "run", preset, "--steps", str(steps), "--json", "--out", str(out)]
    log = work / f"{side}-{preset}.txt"
    with open(log, "wb") as sink:
        wall, cpu, code = timed_process(cmd, cwd=work, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"{preset} ({side}) exited with {code}: see {log}")
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 300, quick 40)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {MIN_ROUNDS}, quick 1)")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    steps = args.steps or (40 if args.quick else 300)
    rounds = args.rounds or (1 if args.quick else MIN_ROUNDS)
    presets = [p for p in args.presets.split(",") if p]
    print(f"warm start against cold: {', '.join(presets)}; {steps} steps, {rounds} round(s), order rotating; "
          f"{machine_line()}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cd-warm-") as tmp:
        work = Path(tmp)
        for preset in presets:
            def report(r: int, got: dict[str, tuple[float, float]], preset: str = preset) -> None:
                w, c = got["warm"], got["cold"]
                print(f"round {r + 1:2d} {preset}: warm {w[0]:.2f} s / {w[1]:.2f} CPU-s, "
                      f"cold {c[0]:.2f} s / {c[1]:.2f} CPU-s", flush=True)

            def measure(side: str, _round: int, preset: str = preset) -> tuple[float, float]:
                return run_once(preset, steps, side, work)

            got = interleaved(SIDES, rounds, measure, report)
            warm, cold = got["warm"], got["cold"]
            x: dict[str, Any] = {
                "wall": paired_ratio([w for w, _ in warm], [c for c, _ in cold]),
                "cpu": paired_ratio([c for _, c in warm], [c for _, c in cold]),
                "warm": (median([w for w, _ in warm]), median([c for _, c in warm])),
                "cold": (median([w for w, _ in cold]), median([c for _, c in cold])),
            }
            results[preset] = x
            print(f"{preset}: warm / cold wall {x['wall'].text()}, CPU {x['cpu'].text()}; medians warm "
                  f"{x['warm'][0]:.2f} s / {x['warm'][1]:.2f} CPU-s, cold {x['cold'][0]:.2f} s / "
                  f"{x['cold'][1]:.2f} CPU-s", flush=True)
    if want_doc(args):
        path = write_section("warm_start", doc_section(results, steps, rounds), args.doc)
        print(f"wrote {path}")
    return results


def doc_section(results: dict[str, dict[str, Any]], steps: int, rounds: int) -> str:
    lines = [
        "## 4c. Warm start",
        "",
        f"`python bench/warm_start.py` — whole `clusterdeck run PRESET --steps {steps} --json` processes, "
        f"{rounds} rounds, order rotating; {machine_line()}. *Warm*: ClusterDeck as shipped (each host's tasks "
        "forked from one template that imported TensorFlow once). *Cold*: the same with "
        f"`{WARM_START_ENV}=0` (every task imports TensorFlow itself). Wall time from the command's start to "
        "its exit; CPU time of the command and every process it reaped (`wait4`)."
        + (f" {rounds_note(rounds)}" if rounds_note(rounds) else ""),
        "",
        "| preset | cold wall / CPU (median) | warm wall / CPU (median) | wall warm / cold [95 % CI] "
        "| CPU warm / cold [95 % CI] |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for preset, x in results.items():
        lines.append(f"| `{preset}` | {x['cold'][0]:.2f} s / {x['cold'][1]:.2f} s | {x['warm'][0]:.2f} s / "
                     f"{x['warm'][1]:.2f} s | **{x['wall'].text()}** | **{x['cpu'].text()}** |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
