"""The hang doctor: stacks dumped on SIGUSR1 (even with SIGTERM blocked and the main thread blocked), read back
as "who waits where", on a hang of a real run and on demand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.run_folder import RunFolder
from engine.control import doctor
from engine.control.launcher import Run
from engine.runtime import diagnostics
from tests.conftest import PRESETS, ROOT

DUMP = """# clusterdeck stacks of worker:1: pid 42, main thread 0x00007f0000000001

# dump requested at 2026-01-01T00:00:00 (asked)
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1000 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/x/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute
  File "/x/site-packages/tensorflow/python/eager/context.py", line 1500 in call_function
  File "/repo/engine/runtime/data_parallel.py", line 123 in train_step
  File "/repo/engine/runtime/task.py", line 140 in main
"""


def test_the_newest_dump_names_the_main_threads_innermost_and_own_frames() -> None:
    old = DUMP.replace("quick_execute", "old_frame").replace("(asked)", "(older)")
    dump = doctor.parse("worker:1", Path("stacks.txt"), old + "\n" + DUMP)
    assert dump.main_thread == "0x00007f0000000001" and len(dump.threads) == 2
    where = dump.where()
    assert where.startswith("waiting in TensorFlow") and "quick_execute (execute.py:53)" in where
    assert "from train_step (data_parallel.py:123)" in where and "old_frame" not in dump.text
    assert doctor.parse("worker:1", Path("s"), "").where() == "no stacks were dumped"


def test_the_runtime_and_control_agree_on_the_file_and_signal() -> None:
    assert diagnostics.STACKS_FILE == doctor.STACKS_FILE
    assert diagnostics.DUMP_SIGNAL == getattr(signal, doctor.DUMP_SIGNAL)


BLOCKED = """
import sys, threading
from pathlib import Path
from engine.runtime.stop import StopSignal
from engine.runtime import diagnostics
StopSignal().watch()  # SIGTERM blocked in the main thread, as in a task
diagnostics.arm_stack_dumps(Path(sys.argv[1]), "worker:0")
def blocked_here():
    print("ready", flush=True)
    threading.Event().wait()  # the main thread blocked in C, as in a collective
blocked_here()
"""


def test_a_blocked_main_thread_dumps_its_stack_on_sigusr1_and_lives_on(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    task_dir = folder.task_dir("worker:0")
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED, str(task_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for _ in range(2):  # twice: the second read is the newest dump only
            assert doctor.mark_request(folder, "worker:0", "test")
            os.kill(proc.pid, signal.SIGUSR1)
            dump = doctor.wait_for_dumps(folder, ["worker:0"], 5.0)["worker:0"]
            assert dump.main_frames and dump.main_frames[-1].function == "<module>"
            assert any(f.function == "blocked_here" for f in dump.main_frames), dump.text
            assert "sigterm" not in dump.text or len(dump.threads) == 2
            assert proc.poll() is None, "SIGUSR1 ended the task"
        assert dump.text.count("blocked_here") == 1
    finally:
        proc.kill()
        proc.wait()


HANG_SCRIPT = '''
import os
import keras


def build_model(config):
    if os.environ.get("CLUSTERDECK_TASK") == "worker:1":
        while True:  # the user's bug: an endless loop on one worker; worker:0 waits in a collective
            pass
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(10)])
'''


@pytest.mark.cluster
def test_a_hung_run_says_where_every_task_waits_before_it_fails(runs_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG_SCRIPT)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, model=replace(cfg.model, name="script", script=str(script)),
                  training=replace(cfg.training, steps=100_000, progress_timeout_s=4.0))
    run = Run(cfg, runs_root=runs_root, checked=True)
    infos: list[dict[str, Any]] = []
    run.add_listener(lambda e: infos.append(e) if e["kind"] == "info" and "stacks_of" in e else None)
    run.start()
    assert run.wait(120) == "failed", run.state.summary()
    assert run.state.failed_task == "worker:1" and "tasks/<task>/stacks.txt" in run.state.reason
    said = {e["stacks_of"]: e["message"] for e in infos}
    assert set(said) == {"worker:0", "worker:1"}, infos
    assert "build_model (hang.py:" in said["worker:1"], said
    assert said["worker:0"].startswith("worker:0: waiting in TensorFlow"), said
    for task in ("worker-0", "worker-1"):
        assert "most recent call first" in (run.run_dir / "tasks" / task / "stacks.txt").read_text()
    recorded = [e for e in events.read_file(run.run_dir / "events.jsonl") if e.get("stacks_of")]
    assert len(recorded) == 2


def test_dump_stacks_refuses_pids_that_are_not_the_runs_tasks(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.run_json.write_text(json.dumps({"tasks": {"worker:0": {"pid": os.getpid(), "state": "running"},
                                                     "worker:1": {"pid": 1, "state": "finished"}}}))
    results = doctor.dump_stacks(tmp_path, timeout=0.1)
    assert list(results) == ["worker:0"]
    assert "not a task of this run" in str(results["worker:0"])
