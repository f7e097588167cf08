"""Stop storm: launch and stop a 2-worker run many times; count what is left behind.

Each cycle starts the data-2workers preset and stops it at a different moment
(at once, during TensorFlow's import, after the first steps). After every
cycle the script checks that no process of the run is alive; at the end it
compares the launcher's open file descriptors, its threads and the machine's
listening TCP ports with what they were before the first cycle.

    python bench/stop_storm.py [--cycles 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.presets import resolve_preset  # noqa: E402
from engine.control.launcher import Run  # noqa: E402


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def listening() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--preset", default="data-2workers")
    args = parser.parse_args()
    cfg = config_mod.load(resolve_preset(args.preset))
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=1_000_000, checkpoint_every=0))
    me = psutil.Process()
    fds0, threads0, ports0 = me.num_fds(), threading.active_count(), listening()
    stop_times: list[float] = []
    leftovers = 0
    with tempfile.TemporaryDirectory(prefix="cd-storm-") as tmp:
        for cycle in range(args.cycles):
            run = Run(cfg, runs_root=Path(tmp))
            run.start()
            moment = cycle % 3
            if moment == 1:
                time.sleep(1.0)
            elif moment == 2:
                got = threading.Event()
                run.add_listener(lambda e, got=got: got.set() if e["kind"] == "step" else None)
                got.wait(60)
            pids = run.pids()
            t0 = time.monotonic()
            run.stop()
            deadline = t0 + 3.0
            while alive(pids) and time.monotonic() < deadline:
                time.sleep(0.01)
            stop_times.append(time.monotonic() - t0)
            left = alive(pids)
            leftovers += len(left)
            for pid in left:
                psutil.Process(pid).kill()
            run.wait(5)
            print(f"cycle {cycle + 1:3d}/{args.cycles}: stopped in {stop_times[-1]:.2f} s "
                  f"({['at once', 'during start-up', 'after first steps'][moment]}), left {len(left)}", flush=True)
    time.sleep(0.5)
    fds, threads, ports = me.num_fds(), threading.active_count(), listening()
    print()
    print(f"cycles: {args.cycles}")
    print(f"stop to no process left: median {statistics.median(stop_times):.2f} s, "
          f"max {max(stop_times):.2f} s (goal <= 3 s)")
    print(f"processes left behind: {leftovers}")
    print(f"launcher file descriptors: {fds0} before, {fds} after")
    print(f"launcher threads: {threads0} before, {threads} after")
    print(f"new listening TCP ports: {sorted(ports - ports0) or 'none'}")
    ok = leftovers == 0 and fds <= fds0 + 2 and not (ports - ports0) and max(stop_times) <= 3.0
    print("result:", "clean" if ok else "NOT clean")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
