"""Render ClusterDeck mid-run, offscreen, into docs/screenshot.png.

    python scripts/screenshot.py [--out docs/screenshot.png] [--points 300] [--steps 20000]

Launches presets/data-2workers.yaml (with more steps) on this machine, waits
until each replica's loss curve has ``--points`` points, grabs the window and
stops the run (every process of it ends before this script exits).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings, QTimer  # noqa: E402, TID251 - a GUI script

import gui  # noqa: E402,F401 - guards the Qt binding first
from engine.contract import config as cfg  # noqa: E402
from gui.app import application  # noqa: E402
from gui.controller import Controller  # noqa: E402
from gui.main_window import MainWindow  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    parser.add_argument("--preset", default=str(ROOT / "presets" / "data-2workers.yaml"))
    parser.add_argument("--points", type=int, default=300, help="loss points per replica before the grab")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--dark", action="store_true", help="dark palette instead of light")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="clusterdeck-shot-"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch / "settings"))
    app = application()
    from gui import theme

    theme.apply_palette(app, dark=args.dark)
    window = MainWindow(Controller(runs_root=scratch / "runs"))
    window.resize(1600, 1000)
    window.show()
    if not window.open_path(args.preset, ask=False):
        return 1
    c = window.controller
    c.set_value("training", cfg.replace(c.config.training, steps=args.steps, epochs=None))
    c.undo_stack.setClean()
    c.start_run()
    deadline = time.monotonic() + args.timeout
    status = {"code": 0, "pids": []}

    def enough() -> bool:
        loss = window.plots.loss
        replicas = c.config.num_replicas()
        return all(loss.points(f"replica/{r}/loss") >= args.points for r in range(replicas))

    def poll() -> None:
        if c.run is None:
            print(f"screenshot: the run ended early: {c.state.state} {c.state.reason}", file=sys.stderr)
            status["code"] = 1
            timer.stop()
            app.quit()
            return
        if enough() or time.monotonic() > deadline:
            timer.stop()
            if not enough():
                print("screenshot: timed out waiting for curves; grabbing anyway", file=sys.stderr)
                status["code"] = 1
            c.select(("host", 0))
            window.tasks_dock.raise_()
            window.plots.redraw()
            QTimer.singleShot(300, grab)

    def grab() -> None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        window.grab().save(args.out)
        print(f"screenshot: wrote {args.out} at step {c.state.step}")
        status["pids"] = c.run.pids() if c.run is not None else []
        c.stop_run()
        ender.start()

    def wait_end() -> None:
        if c.run is None:
            ender.stop()
            c.undo_stack.setClean()
            window.close()
            app.quit()

    timer = QTimer()
    timer.setInterval(200)
    timer.timeout.connect(poll)
    ender = QTimer()
    ender.setInterval(100)
    ender.timeout.connect(wait_end)
    timer.start()
    app.exec()
    return int(status["code"])


if __name__ == "__main__":
    sys.exit(main())
