"""Start-up and stop: the window, the first training step, and the end of every process.

Three figures, each over ``--rounds`` rounds interleaved with its baseline:

- *window shown*: a fresh ``python`` process creates the desktop app's main window
  (``gui.app.create_window``, offscreen Qt) and reports when the window has been
  shown and its first paint processed; measured from just before the process starts;
- *launch to first step, beyond importing TensorFlow*: :meth:`engine.control.launcher.Run.start`
  to the first ``step`` event's ``t``, minus the time a fresh process takes to
  ``import tensorflow`` (measured side by side: the two alternate);
- *stop to no process left*: :meth:`Run.stop` on a training run to the moment no
  process of the run (supervisor, tasks, their children) is alive.

And, over ``--import-rounds`` rounds of its own (order rotating): a task's import of its runtime
(``engine.runtime.data_parallel``) as the task does it (Keras first, without IPython's notebook extras:
:mod:`engine.runtime.keras_import`) against a plain import of the same module (Keras importing IPython
where it is installed), the median paired ratio with its bootstrap 95 % interval.

    python bench/startup_stop.py [--rounds 3] [--preset data-1worker-2gpus] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, median, verdict, want_doc, write_section  # noqa: E402
from _stats import Ratio, paired_ratio, rotated, rounds_note  # noqa: E402

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.presets import resolve_preset  # noqa: E402
from engine.control.launcher import Run  # noqa: E402

GOAL_WINDOW_S = 1.5
GOAL_FIRST_STEP_S = 1.0
GOAL_STOP_S = 3.0

_WINDOW_CHILD = r"""
import os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
import shutil, tempfile
from PySide6.QtCore import QSettings, QTimer
settings = tempfile.mkdtemp(prefix="cd-startup-")
QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, settings)
from gui.app import application, create_window
app = application()
window = create_window([])
def shown():
    print(f"SHOWN {time.time():.6f} {int(window.isVisible())}", flush=True)
    window.controller.undo_stack.setClean()
    shutil.rmtree(settings, True)  # os._exit runs no atexit handler
    os._exit(0)
QTimer.singleShot(0, shown)  # after the show and the first paint have been processed
app.exec()
"""

_IMPORT_CHILD = "import time, tensorflow; print(f'IMPORTED {time.time():.6f}', flush=True)"
#: a task's runtime imported as :mod:`engine.runtime.task` imports it, and plainly
_TASK_IMPORT = {
    "task": "from engine.runtime.keras_import import import_keras\nimport_keras()\nimport engine.runtime.data_parallel",
    "plain": "import engine.runtime.data_parallel",
}


def _child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")


def window_round() -> float:
    start = time.time()
    out = subprocess.run([sys.executable, "-c", _WINDOW_CHILD], env=_child_env(), cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("SHOWN "):
            _, t, visible = line.split()
            if visible != "1":
                raise SystemExit("the window was not visible")
            return float(t) - start
    raise SystemExit(f"the window process failed: {out.stderr[-2000:]}")


def import_round() -> float:
    start = time.time()
    out = subprocess.run([sys.executable, "-c", _IMPORT_CHILD], env=_child_env(), capture_output=True, text=True,
                         timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("IMPORTED "):
            return float(line.split()[1]) - start
    raise SystemExit(f"import tensorflow failed: {out.stderr[-2000:]}")


def task_import_round(side: str) -> float:
    """Seconds a fresh process takes to start and import the data-parallel runtime, ``side`` of
    :data:`_TASK_IMPORT`."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _TASK_IMPORT[side]], env=_child_env(), capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"the {side} import failed: {out.stderr[-2000:]}")
    return time.perf_counter() - start


def task_import_ratio(rounds: int) -> tuple[Ratio, dict[str, float]]:
    """The task's import against the plain one, paired over ``rounds`` rounds (order rotating)."""
    got: dict[str, list[float]] = {"task": [], "plain": []}
    for r in range(rounds):
        for side in rotated(list(got), r):
            got[side].append(task_import_round(side))
    return paired_ratio(got["task"], got["plain"]), {side: median(v) for side, v in got.items()}


def _run_processes(run: Run) -> list[psutil.Process]:
    procs = []
    for pid in run.pids():
        try:
            p = psutil.Process(pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    return procs


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def run_round(cfg: config_mod.RunConfig, root: Path, train_after_first_step: float) -> tuple[float, float]:
    """(launch to first step, stop to no process left) of one run, in seconds."""
    run = Run(cfg, runs_root=root)
    start = time.time()
    run.start()
    try:
        deadline = time.monotonic() + 300
        while run.state.first_step_at is None:
            if run.done or time.monotonic() > deadline:
                raise SystemExit(f"the run never stepped: {run.state.state} {run.state.reason}")
            time.sleep(0.005)
        first_step = run.state.first_step_at - start
        time.sleep(train_after_first_step)
        procs = _run_processes(run)
        stop_at = time.monotonic()
        run.stop(wait=False)
        while _alive(procs):
            if time.monotonic() - stop_at > 30:
                raise SystemExit(f"processes still alive 30 s after stop: {[p.pid for p in _alive(procs)]}")
            time.sleep(0.005)
        stopped = time.monotonic() - stop_at
    finally:
        if not run.done:
            run.stop()
        run.wait(30)
    return first_step, stopped


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
    parser.add_argument("--preset", default="data-1worker-2gpus")
    parser.add_argument("--import-rounds", type=int, default=None,
                        help="rounds of the task's import against the plain one (default 12, quick 1; 0: none)")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    import_rounds = args.import_rounds if args.import_rounds is not None else (1 if args.quick else 12)
    cfg = config_mod.load(resolve_preset(args.preset))
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=10_000_000, epochs=None,
                                                              checkpoint_every=0))
    windows, imports, firsts, stops = [], [], [], []
    print(f"preset {args.preset}, {rounds} round(s); {machine_line()}")
    print(f"{'round':>5} {'window s':>9} {'import tf s':>12} {'first step s':>13} {'beyond import':>14} {'stop s':>7}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="cd-startup-") as tmp:
        for i in range(rounds):
            # alternate which of the paired figures goes first
            if i % 2 == 0:
                w = window_round()
                imp = import_round()
                first, stop = run_round(cfg, Path(tmp), 2.0)
            else:
                first, stop = run_round(cfg, Path(tmp), 2.0)
                imp = import_round()
                w = window_round()
            windows.append(w)
            imports.append(imp)
            firsts.append(first)
            stops.append(stop)
            print(f"{i + 1:>5} {w:>9.2f} {imp:>12.2f} {first:>13.2f} {first - imp:>14.2f} {stop:>7.2f}", flush=True)
    beyond = [f - i for f, i in zip(firsts, imports, strict=True)]
    f = {"window_s": median(windows), "import_tf_s": median(imports), "first_step_s": median(firsts),
         "beyond_import_s": median(beyond), "stop_s": median(stops), "stop_max_s": max(stops), "rounds": rounds}
    print(f"window shown: {f['window_s']:.2f} s (goal <= {GOAL_WINDOW_S} s)")
    print(f"launch to first step: {f['first_step_s']:.2f} s, import tensorflow alone {f['import_tf_s']:.2f} s: "
          f"{f['beyond_import_s']:.2f} s beyond it (goal <= {GOAL_FIRST_STEP_S} s)")
    print(f"stop to no process left: {f['stop_s']:.2f} s, worst {f['stop_max_s']:.2f} s (goal <= {GOAL_STOP_S} s)")
    task_import: tuple[Ratio, dict[str, float]] | None = None
    if import_rounds:
        task_import = task_import_ratio(import_rounds)
        print(f"a task's import of its runtime / the plain import: {task_import[0].text()} over {import_rounds} "
              f"round(s){rounds_note(import_rounds)}; medians {task_import[1]['task']:.2f} s / "
              f"{task_import[1]['plain']:.2f} s", flush=True)
    if want_doc(args):
        write_section("startup_stop", _doc(args.preset, f, task_import, import_rounds), args.doc)
    return f


def _doc(preset: str, f: dict[str, float], task_import: tuple[Ratio, dict[str, float]] | None = None,
         import_rounds: int = 0) -> str:
    lines = [
        "## 4. Start-up and stop",
        "",
        f"`python bench/startup_stop.py` — preset `{preset}`, {int(f['rounds'])} rounds, each figure paired with its "
        f"baseline in the same round; medians; {machine_line()}.",
        "",
        "| figure | value | goal |",
        "| --- | ---: | --- |",
        f"| process start to main window shown (first paint processed) | **{f['window_s']:.2f} s** | <= "
        f"{GOAL_WINDOW_S} s ({verdict(f['window_s'] <= GOAL_WINDOW_S)}) |",
        f"| `Run.start()` to the first step event | {f['first_step_s']:.2f} s | |",
        f"| `import tensorflow` in a fresh process (side by side) | {f['import_tf_s']:.2f} s | |",
        f"| launch to first step **beyond importing TensorFlow** | **{f['beyond_import_s']:.2f} s** | <= "
        f"{GOAL_FIRST_STEP_S} s ({verdict(f['beyond_import_s'] <= GOAL_FIRST_STEP_S)}) |",
        f"| `Run.stop()` to no process of the run alive (median / worst) | **{f['stop_s']:.2f} s** / "
        f"{f['stop_max_s']:.2f} s | <= {GOAL_STOP_S} s ({verdict(f['stop_max_s'] <= GOAL_STOP_S)}) |",
    ]
    if task_import is not None:
        ratio, medians = task_import
        lines += [
            "",
            f"A task's import of its runtime (`engine.runtime.data_parallel`, in a fresh process) as the task does it, "
            f"Keras first without IPython's notebook extras (`engine/runtime/keras_import.py`), against the plain "
            f"import (Keras imports IPython where it is installed, as here): **{ratio.text()}** over {import_rounds} "
            f"rounds, order rotating (medians {medians['task']:.2f} s and {medians['plain']:.2f} s).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
