"""Run every benchmark one after another and update docs/benchmarks.md.

    python bench/run_all.py [--quick] [--only telemetry_overhead,whole_run,modes,...]

Each benchmark runs in its own process (a fresh Qt application, no TensorFlow
state shared), so one's leftovers never colour the next one's figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("telemetry_overhead", "whole_run", "modes", "step_cpu", "live_latency", "gui_scale", "gui_scale_large", "ingest",
              "run_storage", "attach_latency", "breakdown_cost", "app_scale", "startup_stop", "warm_start", "gpu_check")
#: Benchmarks that are another configuration of a script: (script, extra arguments).
VARIANTS = {"gui_scale_large": ("gui_scale", ["--large"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short smoke runs (docs/benchmarks.md left alone)")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmarks to run")
    parser.add_argument("--doc", type=Path, default=None, help="the results document (default: docs/benchmarks.md)")
    args = parser.parse_args(argv)
    chosen = [b for b in args.only.split(",") if b]
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(f"--only: expected some of {', '.join(BENCHMARKS)}, received: {', '.join(unknown)}")
    failed = []
    for name in chosen:
        script, extra = VARIANTS.get(name, (name, []))
        cmd = [sys.executable, str(HERE / f"{script}.py"), *extra]
        if args.quick:
            cmd.append("--quick")
        if args.doc is not None:
            cmd += ["--doc", str(args.doc)]
        print(f"== {name}", flush=True)
        start = time.monotonic()
        code = subprocess.call(cmd)
        print(f"== {name}: {'ok' if code == 0 else f'failed ({code})'} in {time.monotonic() - start:.0f} s\n", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
