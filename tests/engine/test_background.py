"""ClusterDeck's own threads as background work (engine.control.background)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from engine.control import background

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")


def test_yielding_changes_the_calling_thread_only() -> None:
    seen: list[int] = []

    def work() -> None:
        assert background.yield_to_training()
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


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
