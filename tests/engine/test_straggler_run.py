"""A worker slowed on purpose is flagged as a straggler from a real synchronous run's events."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.config import replace
from engine.control.launcher import Run
from engine.observe.stragglers import StragglerDetector
from tests.conftest import PRESETS

pytestmark = pytest.mark.cluster


def test_slowed_worker_is_flagged_and_the_other_is_not(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=250, checkpoint_every=0, metrics_hz=20))
    # test-only setting: worker:1 sleeps 25 ms before each step
    run = Run(cfg, runs_root=runs_root, task_env={"CLUSTERDECK_TEST_STEP_DELAY": "worker:1=0.025"})
    detector = StragglerDetector(margin=0.5, window_s=2.0)
    changes = []
    run.add_listener(lambda e: changes.extend(detector.update(e)))
    run.start()
    assert run.wait(150) == "finished", run.state.summary()
    flagged = [c for c in changes if c.flagged]
    assert flagged, "the slowed worker was never flagged"
    assert {c.replica for c in flagged} == {1}
    first = flagged[0]
    assert first.task == "worker:1" and first.ratio > 1.5
    assert first.step_time > first.median
