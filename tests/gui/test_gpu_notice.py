"""One notice of emulated GPUs in every mode: Messages says it once (however many tasks say it, or
before any does), the chips say their GPUs are emulated, and TensorFlow's "GPU will not be used"
line stays in the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from gui import gpu_notice
from gui.logs import LogTail
from tests.gui.conftest import PRESETS, ReplayRun


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_notice, "_driver_present", lambda: False)


def with_gpus(preset: str) -> config_mod.RunConfig:
    cfg = config_mod.load(PRESETS / preset)
    hosts = tuple(config_mod.replace(h, gpus=2) for h in cfg.cluster.hosts)
    return config_mod.replace(cfg, cluster=config_mod.replace(cfg.cluster, hosts=hosts))


@pytest.mark.parametrize("preset", ["data-2workers.yaml", "async-1ps.yaml"])
def test_one_notice_of_emulated_gpus_in_every_mode(qtbot: Any, window: Any, no_driver: None, preset: str) -> None:
    cfg = with_gpus(preset)
    assert not config_mod.validate(cfg)
    window.controller.new_document(cfg)
    chips = [c for h in window.canvas.hosts for c in h.chips if c.gpus]
    assert chips and all(c.emulated and "emulated" in c.toolTip() for c in chips)  # said while designing too
    run = ReplayRun()
    window.controller.session.watch(run, cfg, state="starting")
    texts = window.messages.texts()
    assert [t for t in texts if "no GPU here" in t] == [t for t in texts if "emulated" in t]
    assert len([t for t in texts if "no GPU here" in t]) == 1  # at once, before any task says it
    trainers = [t.name for _, t in cfg.cluster.tasks() if t.role == "worker"]
    run.feed(*(events.make("info", name, message="no GPU here: 1 GPU(s) emulated as logical CPU devices",
                           emulated_gpus=1) for name in trainers))
    qtbot.waitUntil(lambda: len(window.controller.state.infos) == len(trainers))
    notices = [t for t in window.messages.texts() if "no GPU here" in t]
    assert len(notices) == 1 and f"{sum(gpu_notice.assigned_gpus(cfg).values())} GPU(s) emulated" in notices[0]
    chips = [c for h in window.canvas.hosts for c in h.chips if c.gpus]
    assert all(c.emulated for c in chips)
    run.done = True


def test_a_past_run_says_it_from_its_tasks_words(qtbot: Any, window: Any) -> None:
    cfg = with_gpus("data-2workers.yaml")
    run = ReplayRun()
    window.controller.session.watch(run, cfg, state="running")
    run.feed(events.make("info", "worker:0", message="no GPU here: 1 GPU(s) emulated as logical CPU devices",
                         emulated_gpus=1),
             events.make("info", "worker:1", message="no GPU here: 1 GPU(s) emulated as logical CPU devices",
                         emulated_gpus=1))
    qtbot.waitUntil(lambda: len(window.controller.state.infos) == 2)
    notices = [t for t in window.messages.texts() if "emulated" in t]
    assert len(notices) == 1 and "2 GPU(s) emulated" in notices[0]
    run.done = True


def test_the_gpu_will_not_be_used_line_is_not_folded_away(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text("2026-01-01 00:00:00.0: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:31] Could not find "
                   "cuda drivers on your machine, GPU will not be used.\n", encoding="utf-8")
    lines = LogTail(log).poll()
    assert lines and not lines[0][0]
