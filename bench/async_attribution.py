"""Take the async gap apart: the hand-written chief changed one step at a time toward ClusterDeck's.

Section 1e finds ClusterDeck's async tasks spending more CPU per step than the hand-written
``ParameterServerStrategy`` loop. This script says which of their differences costs what: it runs
the hand-written loop (``bench/_handwritten.py``, grouping its steps as the preset does) as it is and
with changes made to its chief, and optionally ``clusterdeck run async-1ps``, interleaved, order
rotating, and reads every process's CPU per training step over the training phase as section 1e does
(:func:`step_cpu.measure`). Each side is reported against the unchanged loop in the same rounds: paired
ratios of the chief's, the workers', the ps' and all tasks' CPU per step, and of steps per second.

The changes (``--sides``; join several with ``+``, applied in that order):

- ``counter``: a counter zipped into each worker's stream (ClusterDeck counts each worker's batches so);
- ``float64``: a group's loss carried in float64;
- ``window``: ClusterDeck's window, needs ``counter``: at most 8 groups in flight, waited for oldest
  first (each held, so ``ClusterCoordinator`` copies each result to the chief as it ends), a sample
  (loss, worker, clock, batch count) scheduled about every 25 ms, the others returning their loss (as
  ClusterDeck's chief did until its groups that are not a sample returned nothing, section 1d);
- ``copy_window``: the same window without samples: every group returns its mean loss, worker and
  clock as one vector, and the chief copies each;
- ``halves``: needs a window: a full window is drained to half before the next group is scheduled;
- ``cached_size``: needs ``copy_window``: the group size sent as one cached tensor instead of a fresh
  one per group.

It prints its figures and writes nothing to ``docs/benchmarks.md`` (1e's reading quotes them).

    python bench/async_attribution.py [--sides counter+float64,counter+float64+window,clusterdeck]
                                      [--rounds 6] [--steps 1500] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _handwritten  # noqa: E402
from _common import machine_line  # noqa: E402
from _stats import paired_ratio, rotated, rounds_note  # noqa: E402
from step_cpu import measure  # noqa: E402
from whole_run import GROUPED, Bench  # noqa: E402

BASELINE = "hand-written"
CLUSTERDECK = "clusterdeck"
DEFAULT_SIDES = ("counter+float64", "counter+float64+window", CLUSTERDECK)
ROLES = ("chief", "worker", "ps")


def _sub(text: str, old: str, new: str, change: str) -> str:
    if old not in text:
        raise SystemExit(f"--sides: {change!r} cannot apply here (expected the loop it changes; "
                         "see the order in this script's help)")
    return text.replace(old, new)


_SCHEDULE = """    if n == 1:
        result = coordinator.schedule(train_step, args=(iterator,))
    else:
        result = coordinator.schedule(train_steps, args=(iterator, counts.setdefault(n, tf.constant(n))))
"""
_WORKER_INDEX = "tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.float64)"


def counter(src: str) -> str:
    src = _sub(src, "return strategy.distribute_datasets_from_function(dataset_fn)",
               "return strategy.distribute_datasets_from_function(\n"
               "        lambda c: tf.data.Dataset.zip((tf.data.Dataset.counter(), dataset_fn(c))))", "counter")
    src = _sub(src, "        loss = strategy.run(step_fn, args=next(it))\n",
               "        _, batch = next(it)\n        loss = strategy.run(step_fn, args=batch)\n", "counter")
    return _sub(src, "    return strategy.run(step_fn, args=next(it))\n",
                "    _, batch = next(it)\n    return strategy.run(step_fn, args=batch)\n", "counter")


def float64(src: str) -> str:
    src = _sub(src, "    loss = tf.constant(0.0)\n", "    loss = tf.constant(0.0, tf.float64)\n", "float64")
    for call in ("strategy.run(step_fn, args=batch)", "strategy.run(step_fn, args=next(it))"):
        src = src.replace(f"        loss = {call}\n", f"        loss = tf.cast({call}, tf.float64)\n")
    return src


def _window(src: str, change: str, body: str, fetch: str, function: str) -> str:
    src = _sub(src, "counts = {}\n", "counts = {}\nimport collections\nWINDOW = collections.deque()\n"
               "LAST = [-1e9]\nCAP, KEEP = 8, 8\n", change)
    src = _sub(src, "final = float(result.fetch())", "final = float(np.asarray(result.fetch()).ravel()[0])", change)
    src = _sub(src, "\n\nstamp(\"built\")", f"\n\n{function}\n\nstamp(\"built\")", change)
    return _sub(src, _SCHEDULE, f"""    if len(WINDOW) > CAP:
        while len(WINDOW) > KEEP:
            {fetch}
{body}""", change)


def window(src: str) -> str:
    function = f"""@tf.function
def sampled_steps(it, n):
    total = tf.constant(0.0, tf.float64)
    count = tf.constant(0, tf.int64)
    for _ in tf.range(n):
        count, batch = next(it)
        total += tf.cast(strategy.run(step_fn, args=batch), tf.float64)
    return tf.stack([total / tf.cast(n, tf.float64), {_WORKER_INDEX}, tf.timestamp(),
                     tf.cast(count, tf.float64)])"""
    if "tf.data.Dataset.counter()" not in src:
        raise SystemExit("--sides: 'window' needs 'counter' before it (its samples copy each worker's batch count)")
    body = """    now = time.perf_counter()
    sample = n > 1 and now - LAST[0] >= 0.025
    if n == 1:
        result = coordinator.schedule(train_step, args=(iterator,))
    elif sample:
        LAST[0] = now
        result = coordinator.schedule(sampled_steps, args=(iterator, tf.constant(n, tf.int64)))
    else:
        result = coordinator.schedule(train_steps, args=(iterator, tf.constant(n, tf.int64)))
    WINDOW.append((result, sample))
"""
    return _window(src, "window", body, "WINDOW.popleft()[0].fetch()", function)


def copy_window(src: str) -> str:
    function = f"""@tf.function
def copied_steps(it, n):
    total = tf.constant(0.0, tf.float64)
    for _ in tf.range(n):
        total += tf.cast(strategy.run(step_fn, args=next(it)), tf.float64)
    return tf.stack([total / tf.cast(n, tf.float64), {_WORKER_INDEX}, tf.timestamp()])"""
    if "tf.data.Dataset.counter()" in src:
        raise SystemExit("--sides: 'copy_window' reads each worker's stream without the counter (not after 'counter')")
    body = """    if n == 1:
        result = coordinator.schedule(train_step, args=(iterator,))
    else:
        result = coordinator.schedule(copied_steps, args=(iterator, tf.constant(n, tf.int64)))
        WINDOW.append(result)
"""
    return _window(src, "copy_window", body, "WINDOW.popleft().fetch()", function)


def halves(src: str) -> str:
    return _sub(src, "CAP, KEEP = 8, 8\n", "CAP, KEEP = 8, 4\n", "halves")


def cached_size(src: str) -> str:
    return _sub(src, "coordinator.schedule(copied_steps, args=(iterator, tf.constant(n, tf.int64)))",
                "coordinator.schedule(copied_steps, args=(iterator, counts.setdefault(n, tf.constant(n, tf.int64))))",
                "cached_size")


CHANGES: dict[str, Callable[[str], str]] = {"counter": counter, "float64": float64, "window": window,
                                            "copy_window": copy_window, "halves": halves, "cached_size": cached_size}


def chief_source(side: str) -> str:
    """The hand-written chief with ``side``'s changes ('+'-joined) applied in order."""
    src = _handwritten.PSS_CHIEF
    for name in side.split("+"):
        if name not in CHANGES:
            raise SystemExit(f"--sides: unknown change {name!r} (expected {', '.join(CHANGES)} or {CLUSTERDECK})")
        src = CHANGES[name](src)
    return src


def tasks_ms(x: dict[str, Any], role: str | None = None) -> float:
    return sum(v for k, v in x["ms_per_step"].items()
               if k.startswith("task: ") and (role is None or k == f"task: {role}"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help="comma-separated: changes joined with '+', or 'clusterdeck'")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1500; quick 200)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 6, quick 1)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (figures are rough)")
    args = parser.parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]
    steps = args.steps or (200 if args.quick else 1500)
    rounds = args.rounds or (1 if args.quick else 6)
    sources = {s: chief_source(s) for s in sides if s != CLUSTERDECK}  # a bad change fails before any run
    everyone = [BASELINE, *sides]
    print(f"async attribution: {', '.join(everyone)}; {steps} steps, {rounds} round(s), order rotating"
          f"{rounds_note(rounds)}; {machine_line()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="cd-async-attribution-"))
    try:
        benches: dict[str, Bench] = {}
        for i, side in enumerate(everyone):
            bench = benches[side] = Bench.create(root / f"side-{i}")
            if side in sources:
                (bench.work / "pss_chief.py").write_text(sources[side].lstrip("\n"), encoding="utf-8")
        got: dict[str, list[dict[str, Any]]] = {s: [] for s in everyone}
        for r in range(rounds):
            for side in rotated(everyone, r):
                x = measure(benches[side], CLUSTERDECK if side == CLUSTERDECK else GROUPED, "async", steps)
                got[side].append(x)
                print(f"round {r + 1:>2} {side:<28}: {x['steps_per_sec']:6.1f} steps/s, CPU ms/step "
                      + ", ".join(f"{role} {tasks_ms(x, role):.3f}" for role in ROLES), flush=True)
        results: dict[str, dict[str, Any]] = {}
        base = got[BASELINE]
        for side in sides:
            row = {role or "tasks": paired_ratio([tasks_ms(x, role) for x in got[side]],
                                                 [tasks_ms(x, role) for x in base]) for role in (*ROLES, None)}
            row["steps/s"] = paired_ratio([x["steps_per_sec"] for x in got[side]], [x["steps_per_sec"] for x in base])
            results[side] = row
            print(f"{side} / {BASELINE}: " + "; ".join(f"{k} {v.text()}" for k, v in row.items()), flush=True)
        return {"steps": steps, "rounds": rounds, "results": results}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
