"""The supervisor's relay at scale: what one event of a task's pipe costs the supervisor on its way to the launcher.

A real :class:`engine.control.supervisor.Supervisor` (built in process, as the tests build one) reads a task's event
pipe with its own ``read_events`` (64 KiB reads, ``LineSplitter``, decoding, ``forward``, ``send_line``), its output
going to ``/dev/null``. The feed is the lines a task's emitter writes (:func:`engine.contract.events.encode`): per
replica and tick one ``step`` event and one ``device`` event, as in ``bench/ingest.py``. It is read from a file
standing in for the pipe (``os.read`` takes 64 KiB at a time from it as from a full pipe), so only the supervisor's
own work is timed (thread CPU time, in µs per event).

With ``--against REV`` the same feed goes, in ``--rounds`` interleaved rounds (order rotating, each side in a fresh
process), through this tree's supervisor and that of git revision ``REV`` (exported with ``git archive``): the median
µs/event of each side with a bootstrap 95 % interval, and the median paired ratio now / REV.

    python bench/relay.py [--events 100000]
    python bench/relay.py --against REV [--rounds 10] [--events 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT  # noqa: E402
from _stats import MIN_ROUNDS, bootstrap_median, paired_ratio, rotated  # noqa: E402

#: A child run of ``--against`` imports the engine from this tree (an exported revision), not this checkout.
TREE_ENV = "CD_RELAY_TREE"
if os.environ.get(TREE_ENV):
    sys.path.insert(0, os.environ[TREE_ENV])

TASK = "worker:0"


def feed(n_events: int, replicas: int = 8) -> bytes:
    """``n_events`` lines as the task's emitter writes them: a step and a device sample per replica and tick."""
    from engine.contract import events

    lines = []
    tick = 0
    while len(lines) < n_events:
        tick += 1
        for r in range(replicas):
            lines.append(events.encode(events.make(
                "step", TASK, replica=r, step=tick, loss=2.3 / (1.0 + tick * 1e-3) + r * 1e-4,
                examples_per_sec=800.0 + r, step_time=0.02, sync_wait=0.004, own_time=0.016)))
            lines.append(events.encode(events.make("device", TASK, cpu_percent=90.0 + tick % 10,
                                                   rss_bytes=500_000_000 + tick, pid=1000 + r)))
    return "".join(lines[:n_events]).encode()


def one(n_events: int) -> dict[str, float | int | str]:
    """This process's supervisor relaying ``n_events`` lines: µs of CPU per event, lines out."""
    import engine
    from engine.contract.task_plan import TaskPlan
    from engine.control.supervisor import Supervisor, TaskProcess

    data = feed(n_events)
    with tempfile.TemporaryDirectory(prefix="cd-relay-") as tmp:
        src = Path(tmp) / "pipe"
        src.write_bytes(data)
        plan = TaskPlan(name=TASK, role="worker", index=0, host="local", port=1, gpu_ids=(), devices=1, env={})
        with open(os.devnull, "wb") as out:
            counted = _Counting(out)
            sup = Supervisor({"run_dir": str(Path(tmp) / "run"), "tasks": [plan.to_dict()]}, out=counted)
            tp = TaskProcess(plan)
            tp.event_fd = os.open(src, os.O_RDONLY)
            t0 = time.thread_time()
            sup.read_events(tp)  # to the end of the feed, then the "pipe" is closed
            cpu = time.thread_time() - t0
    return {"us_per_event": cpu / n_events * 1e6, "events": n_events, "lines_out": counted.lines,
            "bad": sup.stats.bad, "engine": str(Path(engine.__file__).resolve().parent.parent)}


class _Counting:
    """``/dev/null`` that counts the lines written to it."""

    def __init__(self, out: object) -> None:
        self.out = out
        self.lines = 0

    def write(self, data: bytes) -> int:
        self.lines += data.count(b"\n")
        return self.out.write(data)  # type: ignore[attr-defined, no-any-return]

    def flush(self) -> None:
        self.out.flush()  # type: ignore[attr-defined]


def against(rev: str, rounds: int, n_events: int) -> None:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    sides = ("now", sha)
    runs: dict[str, list[float]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="cd-relay-rev-") as tree:
        archive = subprocess.run(["git", "archive", "--format=tar", sha, "engine"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        trees = {"now": str(ROOT), sha: tree}
        print(f"supervisor relay, interleaved: this tree against {sha}, {rounds} rounds of {n_events:,} events")
        for r in range(rounds):
            for side in rotated(sides, r):
                env = dict(os.environ, **{TREE_ENV: trees[side]})
                done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", "--events",
                                       str(n_events)], env=env, capture_output=True, text=True, timeout=600)
                got = [ln for ln in done.stdout.splitlines() if ln.startswith("RELAY_JSON ")]
                if done.returncode != 0 or not got:
                    raise RuntimeError(f"the {side} run failed: {done.stderr[-2000:]}")
                f = json.loads(got[-1][len("RELAY_JSON "):])
                if Path(f["engine"]) != Path(trees[side]).resolve():
                    raise RuntimeError(f"the {side} run imported the engine from {f['engine']}")
                if f["lines_out"] != n_events or f["bad"]:
                    raise RuntimeError(f"the {side} run relayed {f['lines_out']} of {n_events} lines ({f['bad']} bad)")
                runs[side].append(f["us_per_event"])
                print(f"  round {r + 1:2d} {side:>8}: {f['us_per_event']:.2f} µs/event", flush=True)
    for side in sides:
        m, lo, hi = bootstrap_median(runs[side])
        print(f"  {side:>8}: {m:.2f} µs/event [{lo:.2f}, {hi:.2f}] (median, bootstrap 95 % interval)")
    print(f"  now / {sha}: {paired_ratio(runs['now'], runs[sha]).text(3)} (median paired ratio of µs/event)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--against", metavar="REV", help="also run the supervisor of git revision REV, interleaved")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        against(args.against, args.rounds, args.events)
        return 0
    f = one(args.events)
    if args.one:
        print("RELAY_JSON " + json.dumps(f))
    else:
        print(f"supervisor relay: {f['us_per_event']:.2f} µs/event over {f['events']:,} events "
              f"({f['lines_out']:,} lines out, {f['bad']} bad), engine {f['engine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
