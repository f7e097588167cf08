"""Program mode: the user's own training program, unchanged, run in ClusterDeck's tasks (real TensorFlow
processes): the tutorial-shaped examples report every replica of every worker, a program's failure reads
as its own last line, a stop ends it, and a bad program is refused before launch."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events, presets
from engine.contract.config import Cluster, Host, Program, RunConfig, Task, Training
from engine.control import preflight
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import ROOT, EventRecorder, run_story

PRESETS = ("program-custom-training", "program-multi-worker-ctl", "program-keras-fit", "program-ps-custom-loop")


def launch(config: RunConfig, runs_root: Path, timeout: float = 150) -> tuple[Run, EventRecorder]:
    run = Run(config, runs_root=runs_root)
    seen = EventRecorder()
    run.add_listener(seen)
    run.start()
    run.wait(timeout)
    return run, seen


def program_config(script: Path, *args: str, workers: int = 1, gpus: int = 0, **training: Any) -> RunConfig:
    tasks = tuple(Task("worker", i) for i in range(workers))
    return RunConfig(name="program", cluster=Cluster(hosts=(Host(name="local", gpus=gpus, tasks=tasks),)),
                     training=Training(**{"metrics_hz": 1000.0, **training}),
                     program=Program(script=str(script), args=args))


def write(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path


@pytest.mark.cluster
@pytest.mark.parametrize("name", PRESETS)
def test_each_tutorial_program_reports_every_replica_of_every_worker(name: str, runs_root: Path) -> None:
    cfg = presets.load_preset(name)
    run, seen = launch(cfg, runs_root)
    assert run.state.state == "finished", run_story(run.run_dir)
    stream = read_events(run.folder.path)  # the lifecycle and the samples' store
    steps = [e for e in stream if e["kind"] == "step"]
    expected = set(range(cfg.num_replicas()))
    assert {e["replica"] for e in steps} == expected, (name, sorted({e["replica"] for e in steps}))
    assert all(isinstance(e["loss"], float) and math.isfinite(e["loss"]) for e in steps)
    trainers = {t.name for _, t in cfg.cluster.tasks() if t.role in (("chief",) if cfg.parallelism.mode == "async"
                                                                        else ("chief", "worker"))}
    assert {e["task"] for e in steps} == trainers
    for task in trainers:  # the task's own file holds its lifecycle (the Emitter, not a run folder of the callback)
        own = events.read_file(run.folder.task_events(task))
        assert not [e for e in own if e["kind"] == "step"]
        states = [e["state"] for e in own if e["kind"] == "status"]
        assert states[0] == "running" and states[-1] == "finished", (task, states)
    assert max(e["step"] for e in steps) == 20  # 2 epochs of 10 steps (the presets' program args)
    totals = [e["total"] for e in stream if e["kind"] == "progress" and "total" in e]
    assert totals and totals[-1] == 20, "the program says how many steps it runs"
    if name == "program-keras-fit":  # no ClusterDeck line: the callback was added to fit
        assert all("accuracy" in e["metrics"] for e in steps)
        assert [e for e in stream if e["kind"] == "eval"], "fit's validation arrives as eval events"
        training = [e["training"] for e in stream if e["kind"] == "info" and "training" in e]
        assert training and training[0]["optimizer"] == "Adam" and training[0]["metrics"] == ["accuracy"]
    if name == "program-ps-custom-loop":
        assert {e["worker"] for e in steps} == {0, 1}


@pytest.mark.cluster
def test_a_failing_program_fails_with_its_own_last_line_and_a_silent_one_says_it_reports_nothing(
        tmp_path: Path, runs_root: Path) -> None:
    script = write(tmp_path, "train.py", """
        import sys
        import tensorflow as tf

        print("argv", sys.argv[1:])
        assert sys.argv[1:] == ["--epochs", "3"], sys.argv
        x = tf.constant(1.0)
        assert float(x) > 2, "the loss went up: 1.0 is not above 2"
    """)
    run, seen = launch(program_config(script, "--epochs", "3"), runs_root)
    assert run.state.state == "failed", run_story(run.run_dir)
    failed = seen.of("status", state="failed")[0]
    assert failed["reason"] == "AssertionError: the loss went up: 1.0 is not above 2 (train.py, line 7)"
    assert "engine/runtime" not in failed["traceback"] and "train.py" in failed["traceback"]

    quiet = write(tmp_path, "quiet.py", "import os\nprint('cwd', os.getcwd())\n")
    run, seen = launch(program_config(quiet), runs_root)
    assert run.state.state == "finished", run_story(run.run_dir)
    assert [e for e in seen.of("info") if e.get("program_metrics") is False], "said once: no metrics"
    log = run.folder.task_log("worker:0").read_text(encoding="utf-8")
    assert f"cwd {run.run_dir}" in log, "the program runs in the run folder"


@pytest.mark.cluster
def test_stop_ends_a_reporting_program_as_stopped(tmp_path: Path, runs_root: Path) -> None:
    import threading
    import time

    script = write(tmp_path, "endless.py", """
        import time
        import clusterdeck

        step = 0
        while True:
            step += 1
            clusterdeck.report(step, loss=1.0 / step)
            time.sleep(0.01)
    """)
    run = Run(program_config(script), runs_root=runs_root)
    seen = EventRecorder()
    run.add_listener(seen)
    run.start()
    deadline = time.monotonic() + 90
    while not seen.of("step") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen.of("step"), run_story(run.run_dir)
    threading.Thread(target=run.stop, daemon=True).start()
    assert run.wait(30) == "stopped"
    stopped = seen.of("status", task="worker:0", state="stopped")
    assert stopped and stopped[0].get("step", 0) > 0, seen.of("status")


@pytest.mark.parametrize(("body", "name", "message"), [
    (None, "missing.py", "no such file"),
    ("print('hi')\n", "train.txt", "is not a Python file"),
    ("def f(:\n    pass\n", "broken.py", "syntax error at line 1"),
])
def test_a_bad_program_is_refused_before_launch(tmp_path: Path, body: str | None, name: str, message: str) -> None:
    path = tmp_path / name
    if body is not None:
        path.write_text(body, encoding="utf-8")
    problems = preflight.preflight(program_config(path), scripts=False)
    assert [p.field for p in problems] == ["program.script"], [str(p) for p in problems]
    assert message in problems[0].message and str(path) in problems[0].message


def test_report_outside_a_run_is_a_no_op_and_the_api_loads_lazily() -> None:
    import subprocess
    import sys

    code = ("import sys, clusterdeck\n"
            "clusterdeck.report(1, loss=0.5)\n"
            "assert 'tensorflow' not in sys.modules and 'engine.runtime.program' not in sys.modules\n"
            "assert sorted(clusterdeck.__all__) == ['ClusterDeckCallback', 'report', 'sharded']\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    about = subprocess.run([sys.executable, "-m", "clusterdeck"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert about.returncode == 0 and about.stdout.startswith("clusterdeck "), about.stderr


def test_config_keeps_the_program_through_the_run_folder(tmp_path: Path) -> None:
    cfg = program_config(tmp_path / "train.py", "--epochs", "3")
    config_mod.save(cfg, tmp_path / "config.yaml")
    assert config_mod.load(tmp_path / "config.yaml", check=False).program == cfg.program
