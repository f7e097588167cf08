"""A task dies with its supervisor: the kernel's signal, armed as the supervisor starts it (no thread in the
task), else the task's own lifeline watcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.contract import parent_death
from tests.conftest import alive, wait_gone

pytestmark = pytest.mark.skipif(not parent_death.available(), reason="PR_SET_PDEATHSIG exists on Linux only")

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
#: A child that says whether it is armed, then waits (it has no lifeline of its own).
CHILD = "from engine.contract import parent_death; import time; print(parent_death.armed(), flush=True); time.sleep(600)"
#: A starter (a supervisor's stand-in): starts CHILD as the supervisor starts a task, or plainly, then waits.
STARTER = f"""
import subprocess, sys, time
from engine.control.supervisor import start_arguments
how = {{}} if sys.argv[1] == "plain" else start_arguments(())
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], **how)
print(child.pid, flush=True)
time.sleep(600)
"""


def start(how: str) -> tuple[subprocess.Popen[str], int, str]:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, how], stdout=subprocess.PIPE, text=True, env=ENV)
    assert starter.stdout is not None
    pid = int(starter.stdout.readline())
    armed = starter.stdout.readline().strip()
    return starter, pid, armed


@pytest.mark.parametrize("how", ["supervisor", "plain"])
def test_a_task_dies_with_the_supervisor_that_armed_it(how: str) -> None:
    starter, child, armed = start(how)
    try:
        assert armed == str(how == "supervisor")
        starter.kill()
        starter.wait()
        if how == "supervisor":
            assert wait_gone([child], 3.0) == [], "the task outlived its supervisor"
        else:  # nothing armed: only a lifeline would end it (this child has none)
            assert alive([child]) == [child]
    finally:
        if alive([child]):
            os.kill(child, signal.SIGKILL)
            wait_gone([child], 3.0)


@pytest.mark.parametrize("how", ["supervisor", "plain"])
def test_the_task_watches_its_lifeline_only_where_nothing_is_armed(how: str) -> None:
    from engine.control.supervisor import start_arguments

    code = ("import os, threading; from engine.runtime.task import _watch_lifeline; r, w = os.pipe(); "
            "_watch_lifeline(r); print(threading.active_count())")
    extra = start_arguments(()) if how == "supervisor" else {}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60,
                          **extra)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == (1 if how == "supervisor" else 2)
