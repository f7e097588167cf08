"""ClusterDeck's own threads as background work (engine.control.background)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from engine.control import background

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")


def test_a_background_thread_yields_and_its_starter_does_not() -> None:
    seen: list[tuple[str, int]] = []
    thread = background.thread(lambda tag: seen.append((tag, os.sched_getscheduler(0))), "x", name="bg")
    assert thread.daemon and thread.name == "bg"
    thread.start()
    thread.join()
    assert seen == [("x", os.SCHED_BATCH)]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the policy is the thread's own


def test_a_child_gets_the_normal_policy_back_before_it_runs() -> None:
    code = "import os; print(os.sched_getscheduler(0))"
    out: dict[str, str] = {}

    def work(restore: bool) -> None:
        background.yield_to_training()
        kwargs = {"preexec_fn": background.restore_in_child} if restore else {}
        out[str(restore)] = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True, **kwargs).stdout.strip()

    for restore in (False, True):
        thread = threading.Thread(target=work, args=(restore,))
        thread.start()
        thread.join()
    assert out == {"False": str(os.SCHED_BATCH), "True": str(os.SCHED_OTHER)}  # inherited unless restored
