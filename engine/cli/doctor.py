"""``clusterdeck stacks RUN`` and ``clusterdeck profile RUN --ms 2000``: why a running run is stuck, or slow.

    clusterdeck stacks RUN               every task's Python stacks (this machine's tasks), and where each waits
    clusterdeck profile RUN [--ms 2000]  a TensorFlow profile of every task at once, the run going on

Exit status: 0 done, 1 nothing could be had (no live task answered), 2 a usage problem (not a run folder,
bad ``--ms``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.cli.folders import expand_folder
from engine.contract.run_folder import RunFolder, task_folder_name, write_atomic
from engine.control import doctor

#: Bounds of ``--ms``.
MIN_MS, MAX_MS = 10, 60_000
#: Seconds a profile may take beyond ``--ms`` (a task notices a request within 0.5 s; writing and reading the
#: trace takes a few seconds on a busy machine).
PROFILE_SLACK_S = 30.0


def _run_folder(text: str) -> RunFolder | None:
    path = Path(expand_folder(text))
    if not (path / "run.json").is_file():
        print(f"clusterdeck: {text!r} is not a run folder: expected a folder holding run.json", file=sys.stderr)
        return None
    return RunFolder(path)


def cmd_stacks(args: argparse.Namespace) -> int:
    folder = _run_folder(args.run)
    if folder is None:
        return 2
    results = doctor.dump_stacks(folder.path, timeout=args.timeout)
    if not results:
        print(f"clusterdeck: no live task in {folder.path} (run.json names none running)", file=sys.stderr)
        return 1
    got = 0
    for task, result in results.items():
        if isinstance(result, str):
            print(f"{task}: {result}")
            continue
        got += bool(result.threads)
        print(f"{task}: {result.where()}   [{result.path}]")
        if args.full and result.text:
            print("    " + result.text.replace("\n", "\n    "))
    return 0 if got else 1


def request_profile(folder: RunFolder, ms: int) -> str:
    """Write ``RUN/profile/request.json``; the request's id (tasks write under ``profile/<id>/``)."""
    rid = time.strftime("%Y%m%d-%H%M%S")
    folder.private_dir(folder.path / "profile")
    write_atomic(folder.path / "profile" / "request.json", json.dumps({"id": rid, "ms": ms, "t": time.time()}))
    return rid


def wait_for_profiles(folder: RunFolder, rid: str, tasks: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Each task's done file (JSON) under ``profile/<id>/``, waiting up to ``timeout`` s for all of them."""
    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    while True:
        for task in tasks:
            path = folder.path / "profile" / rid / f"{task_folder_name(task)}.done"
            if task not in done and path.is_file():
                try:
                    done[task] = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
        if len(done) == len(tasks) or time.monotonic() >= deadline:
            return done
        time.sleep(0.2)


def cmd_profile(args: argparse.Namespace) -> int:
    folder = _run_folder(args.run)
    if folder is None:
        return 2
    if not MIN_MS <= args.ms <= MAX_MS:
        print(f"clusterdeck: --ms: expected {MIN_MS} to {MAX_MS}, got {args.ms}", file=sys.stderr)
        return 2
    tasks = sorted(doctor.run_task_pids(folder))
    if not tasks:
        print(f"clusterdeck: no live task in {folder.path} (run.json names none running): nothing to profile",
              file=sys.stderr)
        return 1
    rid = request_profile(folder, args.ms)
    print(f"profiling {', '.join(tasks)} for {args.ms} ms (request {rid})...", flush=True)
    done = wait_for_profiles(folder, rid, tasks, args.ms / 1000 + args.timeout)
    written = 0
    for task in tasks:
        result = done.get(task)
        if result is None:
            print(f"{task}: no profile within {args.ms / 1000 + args.timeout:g} s (its TensorFlow not started, or it "
                  "is blocked: try clusterdeck stacks)")
            continue
        if "error" in result:
            print(f"{task}: the capture failed: {result['error']}")
            continue
        written += 1
        print(f"{task}: {result.get('xplane')}")
        for op in result.get("top_ops", [])[:5]:
            print(f"    {op.get('self_us', 0) / 1000:9.1f} ms  {100 * op.get('share', 0):5.1f} %  "
                  f"{op.get('type')}  {op.get('op')}")
        if "top_ops_error" in result:
            print(f"    (no summary: {result['top_ops_error']})")
    if written:
        print(f"open: tensorboard --logdir {folder.tensorboard}  (the Profile tab needs tensorboard-plugin-profile; "
              f"run {rid}, one host per task)")
    return 0 if written else 1


def register(sub: Any) -> None:
    """Add ``stacks`` and ``profile`` to the ``clusterdeck`` command's subparsers."""
    p = sub.add_parser("stacks", help="every task's Python stacks (why a run is stuck)")
    p.add_argument("run", metavar="RUN", help="a run folder")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the dumps")
    p.add_argument("--full", action="store_true", help="print every thread's stack, not just where each task waits")
    p.set_defaults(func=cmd_stacks)
    p = sub.add_parser("profile", help="a TensorFlow profile of every task at once (why a run is slow)")
    p.add_argument("run", metavar="RUN", help="a run folder")
    p.add_argument("--ms", type=int, default=2000, help="milliseconds to capture")
    p.add_argument("--timeout", type=float, default=PROFILE_SLACK_S, help="seconds to wait beyond --ms")
    p.set_defaults(func=cmd_profile)


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.cli.doctor stacks RUN`` (what ``clusterdeck stacks`` runs)."""
    parser = argparse.ArgumentParser(prog="clusterdeck")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
