"""``clusterdeck sbatch PRESET``: a Slurm preset submitted as a batch job, which runs on after you log out.

The command checks the preset (one Slurm group and nothing else, Slurm reachable, the partition able to hold it,
the data and scripts as ``clusterdeck run`` checks them), makes the run folder, submits the job and returns at
once, printing the job id, the run folder and how to watch it. The run's launcher runs inside the job
(:mod:`engine.control.slurm_batch`); at the time limit it checkpoints and requeues the job while
``training.restarts`` allows.

A subcommand of its own rather than ``clusterdeck run --sbatch``: ``run`` shows the run live in this terminal and
ends with it, ``sbatch`` never shows it and returns before it starts, takes only Slurm presets, and has options
``run`` has not (``--signal-before``); Slurm's own users know the verb (``sbatch`` vs ``salloc``).

Exit status: 0 submitted, 2 refused before anything was submitted (a config or usage problem, no Slurm here),
1 Slurm refused the job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from engine.cli.folders import expand_folder, unusable_folder
from engine.contract import config as config_mod
from engine.contract.config import ConfigError, Problem
from engine.contract.run_folder import RUNS_ENV, default_runs_root

COMMAND = "sbatch"


def register(sub: Any) -> None:
    """Add ``clusterdeck sbatch`` to the command's subparsers."""
    from engine.control.slurm_batch import DEFAULT_WARNING_S

    p = sub.add_parser(COMMAND, help="submit a Slurm preset as a batch job: it runs on after you log out, and is "
                                     "checkpointed and requeued at its time limit (docs/slurm-batch.md)")
    p.add_argument("preset", help="a YAML preset with one Slurm group (path or bundled name)")
    p.add_argument("--steps", type=int, default=None, help="override training.steps")
    p.add_argument("--out", default=None,
                   help=f"folder for run folders, on storage the nodes share (default: ${RUNS_ENV}, else "
                        f"{default_runs_root()})")
    p.add_argument("--json", action="store_true", help="print the submission (or the problems) as one JSON line")
    p.add_argument("--signal-before", dest="signal_before", type=int, default=DEFAULT_WARNING_S, metavar="SECONDS",
                   help="seconds before the time limit at which the launcher checkpoints and requeues the job "
                        f"(sbatch --signal=B:USR1@SECONDS; default {DEFAULT_WARNING_S})")
    p.set_defaults(func=cmd_sbatch)


def cmd_sbatch(args: argparse.Namespace) -> int:
    from engine.contract.presets import load_preset
    from engine.control.slurm import SlurmError
    from engine.control.slurm_batch import BatchRefused, submit

    try:
        cfg = load_preset(args.preset)
        if args.steps is not None:
            if args.steps < 1:
                raise ConfigError([Problem("--steps", f"expected an integer >= 1, got {args.steps}")])
            cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=args.steps, epochs=None))
    except ConfigError as exc:
        _refused(args, exc)
        return 2
    if args.out:
        runs_root, named = expand_folder(args.out), "--out"
    else:
        runs_root = default_runs_root()
        named = f"${RUNS_ENV}" if os.environ.get(RUNS_ENV, "").strip() else "runs folder"
    why = unusable_folder(runs_root)
    if why is not None:
        _refused(args, ConfigError([Problem(named, f"{str(runs_root)!r} cannot hold run folders: {why}")]))
        return 2
    try:
        done = submit(cfg, runs_root, warning_s=args.signal_before)
    except ConfigError as exc:
        _refused(args, exc)
        return 2
    except BatchRefused as exc:
        _failed(args, cfg.name, str(exc))
        return 1
    except SlurmError as exc:  # no Slurm here: nothing was submitted
        _failed(args, cfg.name, str(exc))
        return 2
    except OSError as exc:
        _refused(args, ConfigError([Problem(named, f"cannot write a run folder in {str(runs_root)!r}: "
                                                   f"{exc.strerror or exc}")]))
        return 2
    status = done.status
    state = "running" if status is not None and status.running else "pending"
    said = status.explain() if status is not None else f"Slurm job {done.job_id} submitted"
    if args.json:
        print(json.dumps({"kind": "submitted", "job_id": done.job_id, "run_dir": str(done.folder.path),
                          "group": done.group, "state": state, "slurm_state": status.state if status else "",
                          "reason": status.reason if status else "", "message": said}), flush=True)
        return 0
    try:
        by_name = runs_root.resolve() == default_runs_root().resolve()
    except OSError:
        by_name = False
    ref = done.folder.path.name if by_name else str(done.folder.path)
    out = "" if by_name else f" --out {runs_root}"
    print(f"submitted {done.folder.path.name} as Slurm job {done.job_id}: {said}\n"
          f"run folder: {done.folder.path}\n"
          f"  watch it:  clusterdeck attach {ref}   (waits while the job is queued; Ctrl+C detaches)\n"
          f"  the queue: squeue -j {done.job_id}\n"
          f"  stop it:   clusterdeck stop {ref}   (while queued: scancel {done.job_id})\n"
          f"  all runs:  clusterdeck ls{out}\n"
          "Its launcher runs inside the job: the run goes on after you log out, and at the time limit it "
          "checkpoints and requeues the job while training.restarts allows (docs/slurm-batch.md).", flush=True)
    return 0


def _refused(args: argparse.Namespace, exc: ConfigError) -> None:
    if args.json:
        for p in exc.problems:
            print(json.dumps({"kind": "error", "source": exc.source, "field": p.field, "message": p.message}),
                  flush=True)
        return
    print(f"clusterdeck: {exc}", file=sys.stderr)


def _failed(args: argparse.Namespace, source: str, message: str) -> None:
    if args.json:
        print(json.dumps({"kind": "error", "source": source, "field": "", "message": message}), flush=True)
        return
    print(f"clusterdeck: cannot submit {source!r} as a batch job: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.cli.batch [sbatch] PRESET ...``: the subcommand alone, as ``clusterdeck sbatch`` runs it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] != COMMAND:
        argv = [COMMAND, *argv]
    parser = argparse.ArgumentParser(prog="clusterdeck")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
