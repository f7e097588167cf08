"""``clusterdeck stacks RUN`` and ``clusterdeck profile RUN --ms 2000``: why a running run is stuck, or slow.

    clusterdeck stacks RUN               every task's Python stacks (this machine's tasks), and where each waits
    clusterdeck profile RUN [--ms 2000]  a TensorFlow profile of every task at once, the run going on

Exit status: 0 done, 1 nothing could be had (no live task answered), 2 a usage problem (not a run folder,
bad ``--ms``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.cli.folders import expand_folder
from engine.contract.run_folder import RunFolder
from engine.control import doctor, profiling

#: Bounds of ``--ms``.
MIN_MS, MAX_MS = profiling.MIN_MS, profiling.MAX_MS
#: Seconds a profile may take beyond ``--ms`` (see ``engine.control.profiling``).
PROFILE_SLACK_S = profiling.PROFILE_SLACK_S


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


def _share(value: float) -> str:
    return f"{100 * value:.0f} %"


def print_capture(result: profiling.ProfileCapture, top: int = 5) -> int:
    """Each task's trace, its ops' time by category and its top ops by self time; how many traces were written."""
    for task, got in result.tasks.items():
        if not got.ok:
            print(f"{task}: {'the capture failed: ' if not got.missing else ''}{got.error}")
            continue
        print(f"{task}: {got.xplane.relative_to(result.run_dir) if got.xplane else '?'}")
        if got.breakdown:
            print("    op time: " + ", ".join(f"{profiling.CATEGORY_LABELS[name]} {_share(got.breakdown.get(name, 0.0))}"
                                            for name in profiling.CATEGORIES))
        for op in got.top_ops[:top]:
            print(f"    {op.self_us / 1000:9.1f} ms  {100 * op.share:5.1f} %  {op.type}  {op.op}")
        if got.summary_error:
            print(f"    (no summary: {got.summary_error})")
    written = len(result.written())
    if written:
        print(f"open: tensorboard --logdir {result.logdir}  (the Profile tab needs tensorboard-plugin-profile; "
              f"run {result.rid}, one host per task)")
    return written


def cmd_profile(args: argparse.Namespace) -> int:
    folder = _run_folder(args.run)
    if folder is None:
        return 2
    if not MIN_MS <= args.ms <= MAX_MS:
        print(f"clusterdeck: --ms: expected {MIN_MS} to {MAX_MS}, got {args.ms}", file=sys.stderr)
        return 2

    def requested(rid: str, tasks: list[str]) -> None:
        print(f"profiling {', '.join(tasks)} for {args.ms} ms (request {rid})...", flush=True)

    try:
        result = profiling.capture(folder.path, args.ms, args.timeout, on_requested=requested)
    except profiling.ProfileError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 1
    return 0 if print_capture(result) else 1


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
