"""engine.control.process_end: the one module that ends processes (real processes)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time

from engine.control import process_end
from engine.control.process_end import RUN_DIR_ENV, SUPERVISOR_ENV
from tests.conftest import wait_gone

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
POLITE = "import time; print('up', flush=True); time.sleep(60)"


def _start(code: str, **env: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, **env})
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_terminate_groups_gives_the_grace_then_kills() -> None:
    polite, stubborn = _start(POLITE), _start(STUBBORN)
    marked: list[int] = []
    t0 = time.monotonic()
    process_end.terminate_groups([polite, stubborn], 0.5, lambda p: marked.append(p.pid))
    took = time.monotonic() - t0
    assert polite.returncode == -15 and stubborn.returncode == -9
    assert 0.4 <= took < 3 and sorted(marked) == sorted([polite.pid, stubborn.pid])


def test_has_exited_does_not_reap() -> None:
    proc = _start("print('up', flush=True)")
    deadline = time.monotonic() + 5
    while not process_end.has_exited(proc) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_end.has_exited(proc) and proc.returncode is None  # still unreaped: its pid stays reserved
    assert proc.wait() == 0


def test_kill_popen_group_and_a_pid_that_is_not_a_task() -> None:
    proc = _start(POLITE)
    assert not process_end.is_task_process(proc.pid)  # not engine.runtime.task: never killed by kill_tasks
    process_end.kill_tasks([proc.pid])
    assert proc.poll() is None
    process_end.kill_popen_group(proc)
    assert proc.wait(5) == -9


def test_kill_run_processes_kills_only_the_marked_ones(tmp_path) -> None:
    mine = _start(POLITE, **{RUN_DIR_ENV: str(tmp_path), SUPERVISOR_ENV: "h/1"})
    other = _start(POLITE, **{RUN_DIR_ENV: str(tmp_path), SUPERVISOR_ENV: "h/2"})
    try:
        assert process_end.kill_run_processes(str(tmp_path), "h/1") == [mine.pid]
        assert mine.wait(5) == -9 and other.poll() is None
    finally:
        process_end.kill_popen_group(other)
        other.wait(5)
    assert wait_gone([mine.pid, other.pid], 2) == []


def test_no_other_control_module_signals_processes_itself() -> None:
    from engine.control import launcher, supervisor, transports

    for module in (launcher, supervisor, transports):
        source = inspect.getsource(module)
        assert "os.killpg" not in source and "os.kill(" not in source.replace("os.kill(tp.proc.pid, getattr", ""), \
            module.__name__
