"""Every fault a test may inject into a task, in one place, read from the environment.

Tests (and only tests) set these variables on a run's tasks to make the rare paths happen on demand;
none is documented for users, and each costs one dictionary lookup where it is read. Nothing here
imports TensorFlow.

| variable | effect | read by |
| --- | --- | --- |
| ``CLUSTERDECK_TEST_FAIL=worker:1`` | that task raises before it starts training | ``task.main`` |
| ``CLUSTERDECK_TEST_START_DELAY=2.5`` | every task sleeps that long before it starts | ``task.main`` |
| ``CLUSTERDECK_TEST_STEP_DELAY=worker:1=0.03`` | that task sleeps that long in every step | ``loop.TrainingLoop`` |
| ``CLUSTERDECK_TEST_LEAVE_DELAY=1.0`` | model mode: DTensor clients other than 0 say goodbye that much later | ``model_parallel`` |
| ``CLUSTERDECK_TEST_SIMULATE=0.1`` | every task skips TensorFlow entirely: says ``running``, then a ``step`` event that many seconds apart until the run's steps are done or it is stopped; the warm-start template imports no TensorFlow either | ``task.main``, ``template.import_runtime`` |
"""

from __future__ import annotations

import os

FAIL = "CLUSTERDECK_TEST_FAIL"
START_DELAY = "CLUSTERDECK_TEST_START_DELAY"
STEP_DELAY = "CLUSTERDECK_TEST_STEP_DELAY"
LEAVE_DELAY = "CLUSTERDECK_TEST_LEAVE_DELAY"
SIMULATE = "CLUSTERDECK_TEST_SIMULATE"


def _seconds(text: str) -> float:
    try:
        value = float(text or 0)
    except ValueError:
        return 0.0
    return value if value > 0 else 0.0


def should_fail(task: str) -> bool:
    """True when a test asked ``task`` to fail at start-up."""
    return bool(task) and os.environ.get(FAIL) == task


def start_delay() -> float:
    """Seconds every task waits before it starts (0: none)."""
    return _seconds(os.environ.get(START_DELAY, ""))


def step_delay(task: str) -> float:
    """Seconds ``task`` sleeps in every step (0: none)."""
    name, _, seconds = os.environ.get(STEP_DELAY, "").rpartition("=")
    return _seconds(seconds) if name == task else 0.0


def leave_delay() -> float:
    """Seconds a DTensor client other than 0 waits before its goodbye (0: none)."""
    return _seconds(os.environ.get(LEAVE_DELAY, ""))


def simulated_step() -> float:
    """Seconds between the steps of a simulated task, which imports no TensorFlow (0: a real task)."""
    return _seconds(os.environ.get(SIMULATE, ""))
