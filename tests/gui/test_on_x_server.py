"""The app on a real X server (Xvfb) with Qt's real ``xcb`` platform plugin, as users start it: open a
preset, run it, stop it, grab the screen. Offscreen Qt (every other GUI test) is a stand-in for this.

Marked ``cluster``: it starts real TensorFlow task processes (slow; still run in CI, where .ci/run
installs xvfb and the XCB libraries the README lists)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require
from tests.gui.conftest import PRESETS, ROOT

pytestmark = pytest.mark.cluster

#: Runs inside xvfb-run: the app's own entry (gui.app.create_window) on the X server's screen.
DRIVER = r"""
import json, sys, time
from pathlib import Path
from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from gui.app import application, create_window

out = Path(sys.argv[1])
report = {"platform": None, "states": [], "screen": None}
app = application()
window = create_window([sys.argv[2], "--run"])
t0 = time.monotonic()
phase = ["running"]

def shot(name):
    screen = QGuiApplication.primaryScreen()
    image = screen.grabWindow(0)
    image.save(str(out / name))
    report["screen"] = [screen.size().width(), screen.size().height()]
    report["window"] = [window.width(), window.height()]

def tick():
    report["platform"] = QGuiApplication.platformName()
    c = window.controller
    state = window.run_status.badge.text()
    if not report["states"] or report["states"][-1] != state:
        report["states"].append(state)
    if phase[0] == "running" and c.state.step >= 5:
        report["badge_visible"] = window.run_status.badge.isVisible()
        shot("running.png")
        phase[0] = "stopping"
        c.stop_run()
    elif phase[0] == "stopping" and c.run is None:
        shot("stopped.png")
        report["steps"] = c.state.step
        phase[0] = "done"
        c.document.undo_stack.setClean()
        window.close()
        app.quit()
    elif time.monotonic() - t0 > 150:
        report["timeout"] = True
        if c.run is not None:
            c.stop_run()
        window.close()
        app.quit()

timer = QTimer()
timer.timeout.connect(tick)
timer.start(200)
app.exec()
(out / "report.json").write_text(json.dumps(report))
"""


def test_the_app_runs_and_stops_a_preset_on_a_real_x_server(tmp_path: Path) -> None:
    xvfb_run = shutil.which("xvfb-run")
    require(xvfb_run is not None and shutil.which("Xvfb") is not None,
            "Xvfb is not installed (apt-get install xvfb libxcb-cursor0 …, see the README)")
    assert xvfb_run is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("QT_QPA")}
    env.update(QT_QPA_PLATFORM="xcb", XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
               HOME=str(tmp_path), PYTHONPATH=str(ROOT), CLUSTERDECK_RUNS=str(tmp_path / "runs"))
    env.pop("DISPLAY", None)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run([xvfb_run, "-a", "-s", "-screen 0 1366x768x24", sys.executable, str(script), str(tmp_path),
                           str(PRESETS / "data-2workers.yaml")], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    report_path = tmp_path / "report.json"
    assert report_path.exists(), f"the app did not finish under Xvfb (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert report["platform"] == "xcb"
    assert not report.get("timeout"), report
    assert "Running" in report["states"] and report["states"][-1] == "Stopped", report
    assert report["badge_visible"] and report["screen"] == [1366, 768]
    assert report["window"][0] <= 1366 and report["window"][1] <= 768
    for name in ("running.png", "stopped.png"):
        assert (tmp_path / name).stat().st_size > 10_000  # a real grab of the screen, not an empty one
