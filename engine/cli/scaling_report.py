"""``clusterdeck scaling``: the terminal front end of :mod:`engine.control.scaling` (rich progress, table, CSV, PNG)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.cli.folders import unusable_folder
from engine.contract.config import ConfigError
from engine.contract.presets import load_preset
from engine.control.scaling import (
    DEFAULT_WORKERS,
    HOROVOD_EFFICIENCY,
    ScalingProgress,
    ScalingSession,
    describe,
    format_number,
    run_scaling,
    write_csv,
)


def render_png(csv_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *, timeout: float = 120.0,
               python: str | None = None) -> Path:
    """Draw the report's PNG with ``python -m gui.scaling_plot`` in a subprocess (Qt stays out of the engine).

    Raises RuntimeError with the renderer's message when it fails.
    """
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [python or sys.executable, "-m", "gui.scaling_plot", str(csv_path), str(png_path)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the plot renderer took more than {timeout:.0f} s") from None
    if out.returncode != 0:
        lines = [x for x in (out.stderr or out.stdout).strip().splitlines() if x.strip()]
        raise RuntimeError(f"the plot renderer failed: {lines[-1] if lines else f'exit code {out.returncode}'}")
    return Path(png_path)


# --------------------------------------------------------------------------- command line


def add_arguments(parser: Any) -> None:
    """The options of ``clusterdeck scaling`` (an ``argparse`` subparser)."""
    parser.add_argument("preset", nargs="?", default="data-2workers",
                        help="a YAML preset (path or bundled name; default: data-2workers)")
    parser.add_argument("--workers", default=",".join(map(str, DEFAULT_WORKERS)),
                        help="worker counts, comma-separated (default: 1,2,4)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of each run (default: 200)")
    parser.add_argument("--strong", action="store_true",
                        help="strong scaling: keep the global batch (default: weak, keep the per-replica batch)")
    parser.add_argument("--out", default=None,
                        help="folder for run folders (default: $CLUSTERDECK_RUNS, else the per-user data folder)")
    parser.add_argument("--report", default=None,
                        help="folder for scaling.csv and scaling.png (default: <runs folder>/scaling-<preset>-<time>)")
    parser.add_argument("--no-png", action="store_true", help="write the CSV only (no Qt needed)")


def command(args: Any) -> int:
    """``clusterdeck scaling``: run, show progress with ETA, write CSV and PNG, print a table. Exit code 0 when
    every run finished, 1 when one failed or the report was interrupted (Ctrl-C, SIGTERM, SIGHUP), 2 for a config
    problem or an unusable ``--out``."""
    import signal

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from engine.contract.run_folder import expand_user
    from engine.control.launcher import default_runs_root

    console = Console()
    try:
        cfg = load_preset(args.preset)
        runs_root = expand_user(args.out) if args.out else default_runs_root()
        session = ScalingSession(cfg, args.workers, args.steps, runs_root, strong=args.strong)
    except ConfigError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    why = unusable_folder(runs_root)
    if why is not None:
        print(f"clusterdeck: {'--out' if args.out else 'runs folder'}: {str(runs_root)!r} cannot hold run folders: {why}",
              file=sys.stderr)
        return 2
    report_dir = Path(args.report) if args.report else runs_root / f"scaling-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stops = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, lambda *_: session.cancel()) for s in stops}
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), console=console)
    try:
        with progress:
            bar = progress.add_task(cfg.name, total=1000, eta="")

            def show(p: ScalingProgress) -> None:
                eta = "ETA -:--" if p.eta_s is None else f"ETA {int(p.eta_s) // 60}:{int(p.eta_s) % 60:02d}"
                step = f"step {p.step}/{p.total_steps}" if p.total_steps else "starting"
                what = f"run {p.index + 1}/{p.runs}: {p.workers} worker(s), {step}" if p.state == "running" else \
                    f"{cfg.name}: {p.state}"
                progress.update(bar, completed=int(1000 * p.fraction), eta=eta, description=what)

            report = run_scaling(cfg, session=session, on_progress=show)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    table = Table(box=None, header_style="bold dim")
    for col in ("workers", "examples/s", "ideal", "efficiency", "state"):
        table.add_column(col, justify="right")
    for p in report.points:
        eff = report.efficiency(p)
        table.add_row(str(p.workers), format_number(p.examples_per_sec, 0) or "-", format_number(report.ideal(p), 0) or "-",
                      f"{eff:.0%}" if eff is not None else "-", p.state)
    console.print(table)
    console.print(f"[dim]{escape(describe(report))}; Horovod's published efficiency: {HOROVOD_EFFICIENCY:.0%}[/]",
                  soft_wrap=True)
    csv_path = write_csv(report, report_dir / "scaling.csv")
    console.print(f"CSV: {escape(str(csv_path))}", soft_wrap=True)
    if not args.no_png and any(p.examples_per_sec for p in report.points):
        try:
            console.print(f"PNG: {escape(str(render_png(csv_path, report_dir / 'scaling.png')))}", soft_wrap=True)
        except RuntimeError as exc:
            print(f"clusterdeck: no PNG: {exc}", file=sys.stderr)
    ok = session.state == "finished" and all(p.state == "finished" for p in report.points)
    return 0 if ok else 1
