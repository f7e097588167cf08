"""The ``clusterdeck`` command: the desktop app by default, and the headless engine.

    clusterdeck                          open the desktop app
    clusterdeck gui [PRESET] [--run]     the same, with a preset (and start it)
    clusterdeck gui RUN_FOLDER           the app, showing a run folder (one holding config.yaml)
    clusterdeck run PRESET [--steps N] [--out DIR] [--json] [--detach] [--program SCRIPT [-- ARGS...]]
    clusterdeck ls [USER@HOST[:DIR]] [--out DIR] [--json]  the runs in the runs folder (state, step x of y,
                                         started, duration); of another machine over ssh
    clusterdeck attach RUN               watch a run (history, then live); Ctrl+C detaches, the run goes on
    clusterdeck stop RUN                 stop a run through its control socket
                                         (RUN: a folder, a run's name, or user@host:/path over ssh: docs/remote.md)
    clusterdeck validate PRESET...
    clusterdeck tf-config PRESET         each task's TF_CONFIG, as JSON
    clusterdeck export PRESET [--out DIR] [--image IMG]   launch scripts, TF_CONFIG files, Kubeflow TFJob
    clusterdeck scaling [PRESET] [--workers 1,2,4] [--steps N] [--strong] [--out DIR] [--report DIR] [--no-png]
    clusterdeck presets                  the presets shipped with ClusterDeck
    clusterdeck --version

Exit status: 0 done, 1 a run failed (or the app could not open), 2 a usage or config problem
(unknown command, invalid preset, unusable ``--out``), 128 + the signal when Ctrl-C (130), SIGTERM
(143) or SIGHUP (129) stopped it. Runs go to ``--out``, else ``$CLUSTERDECK_RUNS``, else the per-user
data folder (:func:`engine.contract.run_folder.default_runs_root`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from engine import version
from engine.cli import detached, live_view
from engine.cli.folders import expand_folder, unusable_folder
from engine.cli.stopping import Interrupted
from engine.cli.stopping import StopOnSignal as _StopOnSignal
from engine.cli.stopping import signal_name as _signal_name
from engine.contract import config as config_mod
from engine.contract import presets
from engine.contract.config import ConfigError, Problem
from engine.contract.presets import DEFAULT_PRESET, load_preset, not_found, resolve_preset, suggest
from engine.contract.run_folder import CONFIG_YAML, RUNS_ENV, default_runs_root

#: The option of ``python -m gui`` that opens a run folder (``clusterdeck gui RUN_FOLDER``).
RUN_FOLDER_OPTION = "--run-folder"
#: Qt platforms that need no display server.
_HEADLESS_QPA = frozenset({"offscreen", "minimal", "minimalegl", "vnc", "eglfs", "linuxfb", "vkkhrdisplay"})


def cmd_run(args: argparse.Namespace) -> int:
    report = _json_errors if args.json else _text_errors
    try:
        cfg = _with_program(load_preset(args.preset), args.program, getattr(args, "program_args", None))
        if args.steps is not None:
            if args.steps < 1:
                raise ConfigError([Problem("--steps", f"expected an integer >= 1, got {args.steps}")])
            cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=args.steps, epochs=None))
    except ConfigError as exc:
        report(exc)
        return 2
    if args.detached_launcher:  # this process is the launcher `run --detach` started
        return detached.launch(args, cfg)
    runs_root, named = _runs_root(args.out)
    why = unusable_folder(runs_root)
    if why is not None:
        report(ConfigError([Problem(named, f"{str(runs_root)!r} cannot hold run folders: {why}")]))
        return 2
    if args.detach:
        return detached.spawn(args, cfg, runs_root, named, report)
    with _StopOnSignal() as stopper:  # Ctrl-C, SIGTERM, SIGHUP: end the command before the start, stop the run after
        from engine.control.launcher import Run, launch_problems
        from engine.control.memory import tune_allocator

        tune_allocator()  # this process keeps the run's history: see engine.control.memory
        problems = launch_problems(cfg, deep=True)  # the data files and the user's script (a subprocess)
        if problems:
            report(ConfigError(problems, cfg.name))
            return 2
        run = Run(cfg, runs_root=runs_root, checked=True)
        try:
            code = _run_json(run, stopper) if args.json else _run_pretty(run, stopper)
        except ConfigError as exc:
            report(exc)
            return 2
        except OSError as exc:
            report(ConfigError([Problem(named, f"cannot write a run folder in {str(runs_root)!r}: "
                                               f"{exc.strerror or exc}")]))
            return 2
    return code


def _with_program(cfg: config_mod.RunConfig, script: str | None, args: list[str] | None) -> config_mod.RunConfig:
    """The preset with ``--program SCRIPT`` (a path from this folder) and the words after ``--`` as its
    arguments; without ``--program``, words after ``--`` replace the preset's program's arguments."""
    if script is None and args is None:
        return cfg
    if script is None and cfg.program is None:
        raise ConfigError([Problem("--", f"arguments {args!r} are for a program, but the preset names none; "
                                         "expected --program SCRIPT before them")])
    if script is not None and not script.strip():
        raise ConfigError([Problem("--program", "expected the path of your training program, got ''")])
    base = cfg.program or config_mod.Program()
    program = config_mod.replace(
        base, script=os.path.abspath(os.path.expanduser(script)) if script is not None else base.script,
        args=tuple(args) if args is not None else base.args)
    return config_mod.replace(cfg, program=program)


def _warn(problems: list[Problem], as_json: bool) -> None:
    """What the launch says but does not refuse (e.g. more local tasks than CPUs), on stderr."""
    for p in problems:
        if as_json:
            print(json.dumps({"kind": "warning", "field": p.field, "message": p.message}), flush=True)
        else:
            print(f"clusterdeck: warning: {p.field}: {p.message}" if p.field else f"clusterdeck: warning: {p.message}",
                  file=sys.stderr)


def _runs_root(out: str | None) -> tuple[Path, str]:
    """The folder for run folders, and how to name it in a message."""
    if out:
        return expand_folder(out), "--out"
    root = default_runs_root()
    return root, f"${RUNS_ENV}" if os.environ.get(RUNS_ENV, "").strip() else "runs folder"


def _text_errors(exc: ConfigError) -> None:
    print(f"clusterdeck: {exc}", file=sys.stderr)


def _json_errors(exc: ConfigError) -> None:
    """One JSON line per problem on stdout (what ``run --json`` readers parse), nothing else."""
    for p in exc.problems:
        sys.stdout.write(json.dumps({"kind": "error", "source": exc.source, "field": p.field,
                                     "message": p.message}) + "\n")
    sys.stdout.flush()


def _run_json(run: Any, stopper: _StopOnSignal) -> int:
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
    stopper.start(run)
    with _hosted(run):
        while not run.done:
            run.wait(0.2)
    summary = run.state.summary()
    summary["run_dir"] = str(run.run_dir)
    emit({"kind": "summary", **summary})
    return stopper.exit_code(run)


def _run_pretty(run: Any, stopper: _StopOnSignal) -> int:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=False)
    view = live_view.LiveView(run, console)  # listening before the start: no event missed
    run_dir = stopper.start(run)
    console.print(f"run folder: {escape(str(run_dir))}")
    with _hosted(run):
        view.follow()
    console.print()
    _print_summary(console, run)
    if stopper.signum is not None:
        console.print(f"[yellow]stopped by {_signal_name(stopper.signum)}[/]")
    return stopper.exit_code(run)


def _hosted(run: Any) -> Any:
    """The run's control channel while this command shows it (``clusterdeck stop`` from another terminal)."""
    import contextlib

    from engine.control.detach import RunHost

    try:
        return RunHost(run, detached=False).start()
    except OSError as exc:  # the run goes on without a channel: say so, never fail it for that
        print(f"clusterdeck: warning: no control channel for this run ({exc.strerror or exc})", file=sys.stderr)
        return contextlib.nullcontext()


#: The view's parts, under the names tests and older callers know.
_Notes = live_view.Notes
_print_summary = live_view.print_summary
_figure_lines = live_view.figure_lines


#: The most script checks ``clusterdeck validate`` runs at once (each a process importing TensorFlow, ~0.5 GB).
MAX_PARALLEL_CHECKS = 4


def cmd_validate(args: argparse.Namespace) -> int:
    """Each preset's config rules, its data files, the user's script (the same check as ``run``: in a
    subprocess, as it imports TensorFlow) and the user's program (its file, and that it compiles).

    The presets are checked in order, but their scripts' checks (each a process importing TensorFlow, seconds
    each) run side by side, as many at once as this process has CPUs (at most :data:`MAX_PARALLEL_CHECKS`);
    each preset is said in the order given."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.control import reachability, script_check
    from engine.control.machine_fit import cpu_count
    from engine.control.preflight import preflight
    from engine.control.preflight import warnings as preflight_warnings

    checked: list[tuple[str, config_mod.RunConfig | None, list[Problem] | ConfigError]] = []
    scripted: list[tuple[int, config_mod.RunConfig]] = []  # the presets whose script is checked, as ``run`` would
    for preset in args.presets:
        try:
            cfg = load_preset(preset)
        except ConfigError as exc:
            checked.append((preset, None, exc))
            continue
        missing = _missing_scripts(cfg)
        if missing:
            checked.append((preset, cfg, missing))
            continue
        problems = preflight(cfg, scripts=False)
        reachability.close_logins(cfg)  # no supervisor follows a validation: its login checks' connections end
        if script_check.uses_script(cfg):
            scripted.append((len(checked), cfg))
        checked.append((preset, cfg, problems))
    if scripted:
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=max(1, min(len(scripted), cpu_count(), MAX_PARALLEL_CHECKS)),
                                  thread_name_prefix="script-check")
        try:
            results = list(pool.map(lambda s: script_check.check(s[1], stop=stop), scripted))
        except BaseException:  # Ctrl-C: the checks running now end, with their processes
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        for (i, _), problems in zip(scripted, results, strict=True):
            name, scripted_cfg, earlier = checked[i]
            assert isinstance(earlier, list)
            checked[i] = (name, scripted_cfg, earlier + problems)
    code = 0
    for name, ok_cfg, found in checked:
        if isinstance(found, ConfigError) or found or ok_cfg is None:
            print(str(found if isinstance(found, ConfigError) else ConfigError(list(found), name)), file=sys.stderr)
            code = 2
            continue
        _warn(preflight_warnings(ok_cfg), False)
        steps = (f"program {Path(ok_cfg.program.script).name}" if ok_cfg.program
                 else _count(ok_cfg.total_steps(), 'step'))
        print(f"{name}: ok ({ok_cfg.parallelism.mode}, {_count(len(ok_cfg.cluster.tasks()), 'task')}, "
              f"{_count(ok_cfg.num_replicas(), 'replica')}, {steps})")
    return code


def _missing_scripts(cfg: config_mod.RunConfig) -> list[Problem]:
    """The user's scripts the config names that are not there (the full check imports them, with TensorFlow)."""
    named = ([("model.script", cfg.model.script)] if cfg.model.name == "script" else []) + \
            ([("data.path", cfg.data.path)] if cfg.data.source == "script" else [])
    from engine.control.script_check import script_file_problem

    return [problem for field, path in named if (problem := script_file_problem(field, path)) is not None]


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
        report = export.write_export_report(cfg, args.out, image=args.image, python=args.python,
                                            workdir=args.workdir, namespace=args.namespace, pvc=args.pvc,
                                            pvc_size=args.pvc_size)
    except ConfigError as exc:
        print(f"clusterdeck: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"clusterdeck: cannot write the export to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for p in report.paths:
        print(p)
    for copy in report.copied:  # what of the user's went into the image's build folder, and how much
        print(f"copied {copy.describe()}", file=sys.stderr)
    if report.skipped:
        print(f"clusterdeck: no TFJob, Dockerfile or image build folder written (see {export.SKIPPED_NOTE}):",
              file=sys.stderr)
        for problem in report.skipped:
            print(f"  {problem}", file=sys.stderr)
    return 0


def cmd_scaling(args: argparse.Namespace) -> int:
    from engine.cli import scaling_report

    return scaling_report.command(args)


def cmd_presets(args: argparse.Namespace) -> int:
    for p in presets.bundled_presets():
        try:
            cfg = config_mod.load(p)
            tasks = _count(len(cfg.cluster.tasks()), "task")
            print(f"{p.stem:24s} {cfg.parallelism.mode:6s} {tasks:8s} {presets.description(p)}")
        except ConfigError as exc:
            print(f"{p.stem:24s} invalid: {exc}")
    print(f"(in {presets.presets_dir()}; run one with: clusterdeck run NAME)")
    return 0


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_YAML).is_file()


def display_problem(env: dict[str, str] | None = None, platform: str | None = None) -> str | None:
    """Why the app cannot open a window here (no display server), or None."""
    env = dict(os.environ) if env is None else env
    if (platform or sys.platform) in ("darwin", "win32", "cygwin"):
        return None
    qpa = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if qpa in _HEADLESS_QPA or env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("no display to open the app on ($DISPLAY and $WAYLAND_DISPLAY are not set).\n"
            "  Without a screen, run a preset headless: clusterdeck run PRESET (clusterdeck presets lists them);\n"
            "  over SSH, connect with ssh -X; to open the app off screen anyway: QT_QPA_PLATFORM=offscreen.")


def _xcb_hint(env: dict[str, str]) -> str | None:
    """A hint when Qt will use X11 (xcb) and libxcb-cursor, which Qt 6.5+ needs there, is not installed."""
    if not sys.platform.startswith("linux"):
        return None
    qpa = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if qpa not in ("", "xcb") or (qpa == "" and env.get("WAYLAND_DISPLAY")) or not env.get("DISPLAY"):
        return None
    import ctypes.util

    if ctypes.util.find_library("xcb-cursor"):
        return None
    return ("libxcb-cursor0 was not found: Qt needs it to open windows on X11. If the app does not start, "
            "install it (Debian/Ubuntu: sudo apt install libxcb-cursor0; Fedora: sudo dnf install xcb-util-cursor).")


def cmd_gui(args: argparse.Namespace) -> int:
    """Hand over to the desktop app in its own interpreter: the engine never imports ``gui``."""
    argv = [sys.executable, "-m", "gui"]
    target = getattr(args, "preset", None)
    if target:
        path = Path(os.path.expanduser(target))  # "~nosuchuser" stays as written (no such file)
        if path.is_dir():
            if not is_run_folder(path):
                print(f"clusterdeck: {target}: is a folder but not a run folder (it has no {CONFIG_YAML}); "
                      "expected a preset file, a bundled preset name or a run folder", file=sys.stderr)
                return 2
            if getattr(args, "run", False):
                print(f"clusterdeck: {target}: --run starts a preset; a run folder opens to be looked at",
                      file=sys.stderr)
                return 2
            argv += [RUN_FOLDER_OPTION, str(path.resolve())]
        else:
            resolved = resolve_preset(target)
            if not os.path.lexists(resolved):
                print(f"clusterdeck: {not_found(target)}", file=sys.stderr)
                return 2
            argv.append(str(resolved.resolve()))
    if getattr(args, "run", False):
        argv.append("--run")
    problem = display_problem()
    if problem is not None:
        print(f"clusterdeck: {problem}", file=sys.stderr)
        return 1
    hint = _xcb_hint(dict(os.environ))
    if hint is not None:
        print(f"clusterdeck: {hint}", file=sys.stderr)
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, argv)  # does not return
    return subprocess.call(argv)


#: commands ClusterDeck runs for itself (over ssh), left out of the usage line
PLUMBING = ("follow",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clusterdeck", description="Draw, launch and watch TensorFlow clusters.")
    parser.add_argument("-V", "--version", action="version", version=f"clusterdeck {version()}")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("run", help="run a preset headless, with live progress")
    p.add_argument("preset", nargs="?", default=DEFAULT_PRESET,
                   help=f"a YAML preset (path or bundled name; default: {DEFAULT_PRESET})")
    p.add_argument("--steps", type=int, default=None, help="override training.steps")
    p.add_argument("--out", default=None,
                   help=f"folder for run folders (default: ${RUNS_ENV}, else {default_runs_root()})")
    p.add_argument("--json", action="store_true",
                   help="print every event and a summary as JSON lines (config problems too, as kind 'error')")
    p.add_argument("--program", default=None, metavar="SCRIPT",
                   help="run your own training program (a .py file) on the preset's cluster; its arguments "
                        "follow '--' (docs/programs.md)")
    detached.add_arguments(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("validate", help="check presets and their data files without running them")
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
    p.add_argument("--pvc", default="", help="Kubernetes: a PersistentVolumeClaim holding the run folder in every replica")
    p.add_argument("--pvc-size", default="", help="Kubernetes: also write pvc.yaml creating the claim with this size "
                                                   "(e.g. 20Gi)")
    p.set_defaults(func=cmd_export)
    from engine.cli.scaling_report import add_arguments as scaling_arguments

    p = sub.add_parser("scaling", help="run a preset at 1, 2, 4, ... workers; CSV and PNG of throughput and "
                                       "scaling efficiency")
    scaling_arguments(p)
    p.set_defaults(func=cmd_scaling)
    _add_run_commands(sub)
    p = sub.add_parser("presets", help="list the bundled presets")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("gui", help="open the desktop app (with a preset or a run folder)")
    p.add_argument("preset", nargs="?", metavar="PRESET_OR_RUN_FOLDER",
                   help="a preset file, a bundled preset name, or a run folder (one holding config.yaml)")
    p.add_argument("--run", action="store_true", help="start the preset at once")
    p.set_defaults(func=cmd_gui)
    from engine.cli import doctor as doctor_cli

    doctor_cli.register(sub)  # stacks, profile: why a run is stuck or slow
    from engine.cli import batch as batch_cli

    batch_cli.register(sub)  # sbatch: a Slurm group as a batch job that outlives the login
    parser.set_defaults(commands=set(sub.choices))
    sub.metavar = "{" + ",".join(name for name in sub.choices if name not in PLUMBING) + "}"
    return parser


def _add_run_commands(sub: Any) -> None:
    """``ls``, ``attach`` and ``stop``: runs that outlive the terminal that started them."""
    from engine.cli import attach, runs_list

    remote = "; or user@host:/path/to/run on another machine, over ssh"
    p = sub.add_parser("ls", help="list the runs in the runs folder: state, step, started, duration")
    p.add_argument("where", nargs="?", default=None, metavar="USER@HOST[:DIR]",
                   help="list the runs of another machine over ssh (its runs folder, or DIR there); a folder "
                        "here lists that folder, as --out")
    runs_list.add_runs_option(p)
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    attach.add_remote_option(p)
    p.set_defaults(func=runs_list.ls)
    p = sub.add_parser("attach", help="watch a run (history, then live) until it ends; Ctrl+C detaches")
    p.add_argument("run", metavar="RUN", help="a run folder, or a run's name under the runs folder (clusterdeck ls)"
                   + remote)
    runs_list.add_runs_option(p)
    attach.add_remote_option(p)
    p.set_defaults(func=attach.attach)
    p = sub.add_parser("stop", help="stop a running run, as Ctrl+C in its terminal would")
    p.add_argument("run", metavar="RUN", help="a run folder, or a run's name under the runs folder (clusterdeck ls)"
                   + remote)
    runs_list.add_runs_option(p)
    attach.add_remote_option(p)
    p.set_defaults(func=attach.stop)
    p = sub.add_parser("restart", help="restart a running run from its last checkpoint (every task; not counted "
                                       "against training.restarts)")
    p.add_argument("run", metavar="RUN", help="a run folder, or a run's name under the runs folder (clusterdeck ls)")
    runs_list.add_runs_option(p)
    p.set_defaults(func=attach.restart)
    attach.add_follow_command(sub)  # the remote side of the three over ssh (plumbing)


def _unknown_command(word: str, commands: list[str]) -> int:
    close = suggest(word, commands)
    hint = f"; did you mean {close!r}?" if close else ""
    if close is None:
        preset = suggest(word, presets.bundled_names())
        if preset is not None:
            hint = f"; did you mean the preset {preset!r} (clusterdeck gui {preset}, clusterdeck run {preset})?"
    print(f"clusterdeck: unknown command {word!r}{hint}\n"
          f"  commands: {', '.join(commands)}; or give a preset file, a bundled preset name or a run folder "
          "to open in the app (clusterdeck --help)", file=sys.stderr)
    return 2


def _opens_in_app(word: str) -> bool:
    """Whether ``clusterdeck WORD`` means ``clusterdeck gui WORD``: a file or folder, a preset name or file name."""
    return (os.path.lexists(os.path.expanduser(word)) or word.endswith(presets.PRESET_SUFFIXES)
            or word in presets.bundled_names())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on Ctrl-C is handled below
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("clusterdeck: interrupted (Ctrl-C)", file=sys.stderr)
        return 128 + signal.SIGINT
    except Interrupted as exc:
        print(f"clusterdeck: interrupted ({_signal_name(exc.signum)}); nothing was started", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:  # e.g. `clusterdeck presets | head -1`
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 1


def _main(argv: list[str]) -> int:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (README: eval "$(register-python-argcomplete clusterdeck)")
        import argcomplete

        argcomplete.autocomplete(parser)  # answers and exits
    commands = sorted(parser.get_default("commands"))
    if not argv:
        argv = ["gui"]  # `clusterdeck` opens the app
    elif argv[0] not in commands and not argv[0].startswith("-"):
        if not _opens_in_app(argv[0]):
            return _unknown_command(argv[0], commands)
        argv = ["gui", *argv]  # `clusterdeck PRESET` and `clusterdeck RUN_FOLDER` open the app
    program_args: list[str] | None = None
    if argv[0] == "run" and "--" in argv:  # `clusterdeck run PRESET --program train.py -- ARGS...`
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if program_args is not None:
        args.program_args = program_args
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
