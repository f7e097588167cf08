"""Screenshots of ClusterDeck for docs/: two screen sizes, light and dark, offscreen.

    python scripts/screenshot.py [--out docs] [--sizes 1920x1080,1366x768]

For each screen size the script runs itself once more with Qt's offscreen platform given a
screen of that size (a config file, see shared GUIDE "Looking at the window"), opens the
window at the size it picks for that screen and saves:

- ``midrun-<size>-<theme>.png``: a 3-host cluster (8 workers + 2 ps, async) mid-run, the
  run's events replayed through the real window (no TensorFlow needed);
- ``failed-<size>-<theme>.png``: that run failing with a wall of TensorFlow text (the window stays
  within the screen, the user's own exception named first);
- ``preset-<size>-<theme>.png``: a bundled preset as it opens (one per size).

The 1920x1080 light mid-run shot is saved as ``screenshot.png`` (the README's picture).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = ("1920x1080", "1366x768")
PRESET_FOR_SIZE = {"1920x1080": ("model-2x2", "dark"), "1366x768": ("async-embedding-2ps", "light")}


def screen_config(width: int, height: int, folder: Path) -> Path:
    path = folder / f"screen-{width}x{height}.json"
    path.write_text(json.dumps({"synchronousWindowSystemEvents": False, "windowFrameMargins": False,
                                "screens": [{"name": "screen1", "x": 0, "y": 0, "width": width, "height": height,
                                             "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    return path


class ReplayRun:
    """A started run as the app's session sees it (the launcher's Run protocol), fed by this script."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.done = False

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def deliver(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            for listener in self.listeners:
                listener(event)

    def stop(self, reason: str = "stopped by the user", wait: bool = True) -> None:
        self.done = True

    def pids(self) -> list[int]:
        return []


def three_host_config() -> Any:
    from engine.contract import config as config_mod
    from engine.contract.config import Cluster, Host, Task

    hosts = (
        Host(name="node-a", address="10.0.0.11", gpus=4,
             tasks=(Task("chief", 0), Task("worker", 0), Task("worker", 1), Task("ps", 0))),
        Host(name="node-b", address="10.0.0.12", gpus=3,
             tasks=(Task("worker", 2), Task("worker", 3), Task("worker", 4), Task("ps", 1))),
        Host(name="node-c", address="10.0.0.13", gpus=3,
             tasks=(Task("worker", 5), Task("worker", 6), Task("worker", 7))),
    )
    base = config_mod.default_config()
    return config_mod.replace(base, name="async-3hosts", cluster=Cluster(hosts=hosts),
                       parallelism=config_mod.replace(base.parallelism, mode="async"),
                       training=config_mod.replace(base.training, steps=3000, global_batch_size=256))


def replay_events(config: Any, steps: int, t0: float) -> list[dict[str, Any]]:
    """A run of ``config`` up to ``steps``: tasks start, workers step at slightly different paces."""
    from engine.contract import events

    out: list[dict[str, Any]] = []

    def put(kind: str, task: str, t: float, **fields: Any) -> None:
        event = events.make(kind, task, **fields)
        event["t"] = t
        out.append(event)

    put("run", "launcher", t0, state="starting")
    tasks = [(h.name, t) for h, t in config.cluster.tasks()]
    for k, (host, task) in enumerate(tasks):
        put("status", task.name, t0 + 0.1, state="starting", pid=4100 + k, host=host, role=task.role)
        put("status", task.name, t0 + 4 + 0.2 * k, state="running", pid=4100 + k)
    put("run", "launcher", t0 + 4.5, state="running")
    workers = [t for _, t in tasks if t.role == "worker"]
    for step in range(1, steps + 1):
        for r, task in enumerate(workers):
            pace = 1.0 + 0.04 * r + (0.35 if r == 6 else 0.0)  # worker:6 a little slow
            t = t0 + 5 + step * 0.03 * pace
            loss = 2.3 * math.exp(-step / (260 + 15 * r)) + 0.08 + 0.02 * math.sin(step / 7 + r)
            put("step", task.name, t, replica=r, step=step, loss=loss, examples_per_sec=256 / (0.03 * pace) / 8,
                step_time=0.03 * pace)
        if step % 20 == 0:
            for k, (_, task) in enumerate(tasks):
                put("device", task.name, t0 + 5 + step * 0.03, cpu_percent=70.0 + 3 * (k % 5),
                    rss_bytes=(600 + 25 * k) * 2**20, pid=4100 + k)
    return out


def shoot(size: str, out: Path, scratch: Path) -> int:
    """In this process (its screen set up by the caller): every shot of one screen size."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QTimer

    import gui  # noqa: F401 - guards the Qt binding first
    from engine.contract.presets import resolve_preset
    from gui import theme
    from gui.app import application
    from gui.controller import Controller
    from gui.main_window import MainWindow

    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch / f"settings-{size}"))
    app = application()

    def settle(ms: int = 400) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    written: list[Path] = []
    for dark in (False, True):
        name = "dark" if dark else "light"
        theme.apply_palette(app, dark=dark)
        window = MainWindow(Controller(runs_root=scratch / "runs"))
        window.show()
        settle(300)
        c = window.controller
        preset, preset_theme = PRESET_FOR_SIZE.get(size, ("data-2workers", "light"))
        if preset_theme == name:
            window.open_path(resolve_preset(preset), ask=False)
            settle()
            path = out / f"preset-{size}-{name}.png"
            window.grab().save(str(path))
            written.append(path)
        config = three_host_config()
        c.new_document(config)
        run = ReplayRun()
        c.session.watch(run, config, state="starting")
        run.deliver(replay_events(config, 1400, time.time() - 60))
        c.document.select(("task", 1, 2))
        window.tasks_dock.raise_()
        settle(900)
        window.plots.redraw()
        settle(300)
        path = out / ("screenshot.png" if (size, name) == ("1920x1080", "light") else f"midrun-{size}-{name}.png")
        window.grab().save(str(path))
        written.append(path)
        # the same run failing with a wall of TensorFlow text: the window must stay within the screen
        from engine.contract import events
        tail = [f"  File \"/usr/lib/python3/dist-packages/tensorflow/{'deep/' * 30}ops.py\", line {i}"
                for i in range(10)] + ["AssertionError: labels must be in 0..9"]
        wall = "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error: " + "x" * 600
        run.deliver([events.make("status", "worker:6", state="failed", reason=wall, log_tail=tail),
                     events.make("run", "launcher", state="failed", reason=f"worker:6: {wall}", failed_task="worker:6")])
        run.done = True
        settle(900)
        path = out / f"failed-{size}-{name}.png"
        window.grab().save(str(path))
        written.append(path)
        settle(200)
        c.document.undo_stack.setClean()
        window.close()
        window.deleteLater()
        settle(100)
    for path in written:
        print(f"screenshot: wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: shoot one size in this process
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return shoot(args.one, out, Path(tempfile.mkdtemp(prefix="clusterdeck-shot-")))
    scratch = Path(tempfile.mkdtemp(prefix="clusterdeck-shots-"))
    try:
        code = 0
        for size in args.sizes.split(","):
            width, height = (int(v) for v in size.split("x"))
            env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={screen_config(width, height, scratch)}")
            code |= subprocess.call([sys.executable, __file__, "--out", str(out), "--one", size], env=env)
        return code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
