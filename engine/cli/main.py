"""The ``clusterdeck`` command: the desktop app by default, and the headless engine.

    clusterdeck                          open the desktop app
    clusterdeck gui [PRESET] [--run]     the same, with a preset (and start it)
    clusterdeck run PRESET [--steps N] [--out DIR] [--json]
    clusterdeck validate PRESET...
    clusterdeck tf-config PRESET         each task's TF_CONFIG, as JSON
    clusterdeck export PRESET [--out DIR] [--image IMG]   launch scripts, TF_CONFIG files, Kubeflow TFJob
    clusterdeck scaling [PRESET] [--workers 1,2,4] [--steps N] [--strong] [--out DIR] [--report DIR] [--no-png]
    clusterdeck presets                  the presets shipped with ClusterDeck
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from engine.contract import config as config_mod
from engine.contract.config import ConfigError
from engine.contract.presets import DEFAULT_PRESET, load_preset, presets_dir, resolve_preset


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def _fmt_loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def cmd_run(args: argparse.Namespace) -> int:
    from engine.control.launcher import Run
    from engine.control.memory import tune_allocator

    tune_allocator()  # this process keeps the run's history: see engine.control.memory
    try:
        cfg = load_preset(args.preset)
        if args.steps is not None:
            if args.steps < 1:
                raise ConfigError([config_mod.Problem("--steps", f"expected an integer >= 1, got {args.steps}")])
            cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=args.steps, epochs=None))
        run = Run(cfg, runs_root=args.out)
        if args.json:
            return _run_json(run)
        return _run_pretty(run)
    except ConfigError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2


def _install_stop_handlers(run: Any) -> None:
    def handler(signum: int, frame: Any) -> None:
        run.stop(reason="interrupted", wait=False)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _run_json(run: Any) -> int:
    import dataclasses

    from engine.observe.stragglers import StragglerDetector

    lock = threading.Lock()
    detector = StragglerDetector()

    def emit(event: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    def on_event(event: dict[str, Any]) -> None:
        emit(event)
        for change in detector.update(event):
            emit({"kind": "straggler", **dataclasses.asdict(change)})

    run.add_listener(on_event)
    run.start()
    _install_stop_handlers(run)
    while not run.done:
        run.wait(0.2)
    summary = run.state.summary()
    summary["run_dir"] = str(run.run_dir)
    emit({"kind": "summary", **summary})
    return 0 if run.state.state == "finished" else 1


def _run_pretty(run: Any) -> int:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from engine.observe.stragglers import StragglerDetector

    console = Console(stderr=False)
    notes: list[str] = []
    detector = StragglerDetector()

    def on_event(event: dict[str, Any]) -> None:
        for c in detector.update(event):
            if c.flagged:
                notes.append(f"[yellow]replica {c.replica} ({c.task}) is straggling: step {c.step_time * 1000:.0f} ms "
                             f"vs median {c.median * 1000:.0f} ms ({c.ratio:.2f}x)[/]")
            else:
                notes.append(f"[dim]replica {c.replica} ({c.task}) no longer straggling ({c.reason})[/]")
        kind = event.get("kind")
        if kind == "info" and event.get("message"):
            notes.append(f"[dim]{event['task']}[/]: {event['message']}")
        elif kind == "status" and event.get("state") == "failed":
            notes.append(f"[red]{event['task']} failed[/]: {event.get('reason', '')}")

    run.add_listener(on_event)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                        console=console, transient=False)
    bar = progress.add_task(run.config.name, total=run.state.total_steps)

    def replica_table() -> Table:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold dim")
        for col in ("replica", "task", "step", "loss", "examples/s", "step ms", "slow"):
            table.add_column(col, justify="right" if col != "task" else "left")
        slow = detector.flagged()
        for r in sorted(run.state.replicas.values(), key=lambda r: r.replica):
            flag = f"[yellow]{slow[r.replica].ratio:.2f}x[/]" if r.replica in slow else ""
            table.add_row(str(r.replica), r.task, str(r.step), _fmt_loss(r.loss), _fmt_rate(r.examples_per_sec),
                          "-" if r.step_time is None else f"{r.step_time * 1000:.1f}", flag)
        return table

    def view() -> Group:
        state = run.state
        progress.update(bar, completed=state.step)
        tasks = "  ".join(f"{t.name}:{t.state}" for t in state.tasks.values())
        return Group(progress, replica_table(), f"[dim]{tasks}[/]", *notes[-4:])

    run_dir = run.start()
    _install_stop_handlers(run)
    console.print(f"run folder: {run_dir}")
    with Live(view(), console=console, refresh_per_second=8, transient=False) as live:
        while not run.done:
            run.wait(0.125)
            live.update(view())
        live.update(view())
    console.print()
    _print_summary(console, run)
    return 0 if run.state.state == "finished" else 1


def _print_summary(console: Any, run: Any) -> None:
    from rich.text import Text

    s = run.state.summary()
    state = s["state"]
    colour = {"finished": "green", "failed": "red", "stopped": "yellow"}.get(state, "white")
    console.print(f"[bold {colour}]{state}[/] after {s['steps']} of {s['total_steps']} steps"
                  + (f" in {s['duration_s']:.1f} s" if s["duration_s"] else ""))
    if state == "failed":
        console.print(f"[red]failed task: {s['failed_task'] or '?'}[/] - {s['reason']}")
        task = run.state.tasks.get(s["failed_task"])
        if task is not None and task.log_tail:
            console.print("[dim]last log lines:[/]")
            for line in task.log_tail[-10:]:
                console.print(Text("  " + line, style="dim"), highlight=False)
    for rid, r in s["replicas"].items():
        console.print(f"  replica {rid} ({r['task']}): final loss {_fmt_loss(r['loss'])} "
                      f"(from {_fmt_loss(r['first_loss'])}), {_fmt_rate(r['examples_per_sec'])} examples/s")
    console.print(f"  total: {_fmt_rate(s['examples_per_sec'])} examples/s")
    console.print(f"run folder: {run.run_dir}")


def cmd_validate(args: argparse.Namespace) -> int:
    code = 0
    for preset in args.presets:
        try:
            cfg = load_preset(preset)
            print(f"{preset}: ok ({cfg.parallelism.mode}, {len(cfg.cluster.tasks())} tasks, "
                  f"{cfg.num_replicas()} replicas, {cfg.total_steps()} steps)")
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            code = 2
    return code


def cmd_tf_config(args: argparse.Namespace) -> int:
    from engine.control import export

    try:
        out = export.tf_configs(load_preset(args.preset))
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from engine.control import export

    try:
        cfg = load_preset(args.preset)
        paths = export.write_export(cfg, args.out, image=args.image, python=args.python,
                                    workdir=args.workdir, namespace=args.namespace)
    except ConfigError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"clusterdeck: cannot write the export to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


def cmd_scaling(args: argparse.Namespace) -> int:
    from engine.cli import scaling_report

    return scaling_report.command(args)


def cmd_presets(args: argparse.Namespace) -> int:
    for p in sorted(presets_dir().glob("*.yaml")):
        try:
            cfg = config_mod.load(p)
            print(f"{p.stem:32s} {cfg.parallelism.mode:6s} {len(cfg.cluster.tasks())} tasks  {p}")
        except ConfigError as exc:
            print(f"{p.stem:32s} invalid: {exc}")
    return 0


def cmd_gui(args: argparse.Namespace) -> int:
    """Hand over to the desktop app in its own interpreter: the engine never imports ``gui``."""
    argv = [sys.executable, "-m", "gui"]
    if getattr(args, "preset", None):
        argv.append(str(resolve_preset(args.preset)))
    if getattr(args, "run", False):
        argv.append("--run")
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, argv)  # does not return
    return subprocess.call(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clusterdeck", description="Draw, launch and watch TensorFlow clusters.")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("run", help="run a preset headless, with live progress")
    p.add_argument("preset", nargs="?", default=DEFAULT_PRESET,
                   help=f"a YAML preset (path or bundled name; default: {DEFAULT_PRESET})")
    p.add_argument("--steps", type=int, default=None, help="override training.steps")
    p.add_argument("--out", default=None, help="folder for run folders (default: ./runs or $CLUSTERDECK_RUNS)")
    p.add_argument("--json", action="store_true", help="print every event and a summary as JSON lines")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("validate", help="check presets without running them")
    p.add_argument("presets", nargs="+")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("tf-config", help="print each task's TF_CONFIG")
    p.add_argument("preset")
    p.set_defaults(func=cmd_tf_config)
    p = sub.add_parser("export", help="write TF_CONFIG files, per-host launch scripts and (with --image) a "
                                      "Kubeflow TFJob")
    p.add_argument("preset")
    p.add_argument("--out", default="export", help="folder to write into (default: ./export)")
    p.add_argument("--image", default=None, help="container image; also writes tfjob.yaml")
    p.add_argument("--namespace", default="default", help="Kubernetes namespace of the TFJob")
    p.add_argument("--python", default="python3", help="python on the hosts (a host's own python setting wins)")
    p.add_argument("--workdir", default=None, help="ClusterDeck folder on the hosts (default: where the script starts)")
    p.set_defaults(func=cmd_export)
    from engine.cli.scaling_report import add_arguments as scaling_arguments

    p = sub.add_parser("scaling", help="run a preset at 1, 2, 4, ... workers; CSV and PNG of throughput and "
                                       "scaling efficiency")
    scaling_arguments(p)
    p.set_defaults(func=cmd_scaling)
    p = sub.add_parser("presets", help="list the bundled presets")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("gui", help="open the desktop app")
    p.add_argument("preset", nargs="?")
    p.add_argument("--run", action="store_true", help="start the preset at once")
    p.set_defaults(func=cmd_gui)
    parser.set_defaults(commands=set(sub.choices))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or (argv[0] not in parser.get_default("commands") and not argv[0].startswith("-")):
        argv = ["gui", *argv]  # `clusterdeck` and `clusterdeck PRESET` open the app
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
