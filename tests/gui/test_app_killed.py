"""The app killed with SIGKILL mid-run: every task of its run exits by itself within 5 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from engine.observe.run_reader import read_events
from tests.conftest import ROOT, descendants_running, wait_gone
from tests.gui.conftest import PRESETS


@pytest.mark.cluster
def test_tasks_outlive_a_killed_app_by_less_than_5s(tmp_path: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=100_000))
    preset = tmp_path / "long.yaml"
    config_mod.save(cfg, preset)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CLUSTERDECK_RUNS=str(tmp_path / "runs"),
               PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path / "config"))
    app = subprocess.Popen([sys.executable, "-m", "engine.cli", "gui", str(preset), "--run"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        tasks: list[psutil.Process] = []
        run_dir = None
        while time.monotonic() < deadline:
            tasks = descendants_running(app.pid, "engine.runtime.task")
            runs = list((tmp_path / "runs").glob("*"))
            # two tasks (and, where they were forked, the warm-start template, which must go as well)
            if len(tasks) >= 2 and runs and any(e["kind"] == "step"
                                                for e in read_events(runs[0])):
                run_dir = runs[0]
                break
            time.sleep(0.3)
        assert run_dir is not None, "the app did not start training within 120 s"
        pids = [p.pid for p in tasks]
        app.send_signal(signal.SIGKILL)
        app.wait(5)
        assert wait_gone(pids, 5.0) == [], "tasks outlived the killed app by more than 5 s"
        # the folder is complete enough to reopen: config and the events so far
        assert config_mod.load(run_dir / "config.yaml").name == cfg.name
        assert any(e["kind"] == "step" for e in read_events(run_dir))
    finally:
        if app.poll() is None:
            app.kill()


@pytest.mark.cluster
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_apps_run_and_closes_it(tmp_path: Path, signum: int) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=100_000))
    preset = tmp_path / "long.yaml"
    config_mod.save(cfg, preset)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CLUSTERDECK_RUNS=str(tmp_path / "runs"),
               PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path / "config"))
    app = subprocess.Popen([sys.executable, "-m", "gui", str(preset), "--run"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline and run_dir is None:
            runs = list((tmp_path / "runs").glob("*"))
            if runs and any(e["kind"] == "step" for e in read_events(runs[0])):
                run_dir = runs[0]
            time.sleep(0.3)
        assert run_dir is not None, "the app did not start training within 120 s"
        tasks = [p.pid for p in descendants_running(app.pid, "engine.runtime.task")]
        app.send_signal(signum)
        assert app.wait(20) == 128 + signum
        assert wait_gone(tasks, 5.0) == []
        assert RunFolder(run_dir).read_meta()["state"] == "stopped"  # stopped as Stop does, not interrupted
    finally:
        if app.poll() is None:
            app.kill()
