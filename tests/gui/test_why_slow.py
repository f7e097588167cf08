"""The "Why slow" panel: each replica's step breakdown as bars and over time, the straggler's cause, and the
Profile and Dump stacks buttons, against events built with the kit and against a real run."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QApplication,
    QComboBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidgetItem,
    QWidget,
)

from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from engine.control import doctor, profiling
from gui import theme
from gui.run_session import RunSession
from gui.why_slow import NO_LIVE_RUN, WhySlowPanel
from gui.why_slow_bars import ROW_GAP, ROW_HEIGHT
from tests import kit
from tests.conftest import wait_gone
from tests.gui.conftest import PRESETS, ReplayRun

PANEL_PNG = Path("/tmp/why_slow_panel.png")


def two_workers() -> config_mod.RunConfig:
    return config_mod.load(PRESETS / "data-2workers.yaml")


def steps_with_a_slow_input(replicas: int = 4, steps: int = 80, slow: int = 3) -> list[dict[str, Any]]:
    """Data-mode steps of ``replicas`` replicas (two per task); replica ``slow`` waits for its input, the others
    wait for it in the all-reduce."""
    out = []
    for i in range(1, steps + 1):
        for rid in range(replicas):
            if rid == slow:
                step_time, sync, waited = 0.060, 0.002, 0.035 + 0.004 * math.sin(i / 6)
            else:
                step_time, sync, waited = 0.050, 0.030, 0.002
            out.append(kit.step(rid, i, task=f"worker:{rid // 2}", t=1000.0 + 0.1 * i, step_time=step_time,
                                sync_wait=sync, own_time=step_time - sync, input_wait=waited))
    return out


@pytest.fixture
def shown(qtbot: Any, runs_root: Path) -> Any:
    """A panel on a session showing a replayed run (the panel made first, as the window makes it)."""
    session = RunSession(runs_root, two_workers())
    panel = WhySlowPanel(session)
    qtbot.addWidget(panel)
    panel.resize(1000, 560)
    panel.show()
    run = ReplayRun()
    run_dir = runs_root / "replayed"
    run_dir.mkdir(parents=True)
    session.watch(run, two_workers(), run_dir, "running")
    yield session, panel, run
    panel.shutdown()
    session.shutdown()


def test_bars_show_where_each_replicas_step_goes_and_the_cause_names_the_input(qtbot: Any, shown: Any) -> None:
    session, panel, run = shown
    run.feed(*steps_with_a_slow_input())
    qtbot.waitUntil(lambda: len(panel.bars.rows) == 4, timeout=5000)
    qtbot.waitUntil(lambda: panel.cause.text().startswith("⚠ Straggler"), timeout=5000)
    assert "replica 3 (worker:1)" in panel.cause.text() and "waiting for input" in panel.cause.text()
    assert panel.bars.flagged == {3}
    # the slow replica's bar is mostly input wait, a fast one's mostly collective wait
    slow, fast = panel.bars.rows[3][2], panel.bars.rows[0][2]
    assert slow.shares()["input"] > 0.5 and fast.shares()["collective"] > 0.5
    tip = panel.bars.tip_for(3)
    assert tip.startswith("replica 3 (worker:1): ") and "input wait" in tip and "collective wait" in tip
    assert "not measured in this mode: dispatch wait" in tip
    # hover: the part under the mouse is the one drawn there
    y = ROW_GAP + 3 * (ROW_HEIGHT + ROW_GAP) + ROW_HEIGHT // 2
    bar = panel.bars._bar_rect()
    assert panel.bars.part_at(QPoint(bar.left() + 2, y)) == (3, "compute")
    assert panel.bars.part_at(QPoint(bar.left() + int(bar.width() * 0.8), y)) == (3, "input")
    # a click on a bar follows that replica over time
    qtbot.mouseClick(panel.bars, Qt.MouseButton.LeftButton, pos=QPoint(20, y))
    assert panel.replica_choice.currentData() == 3
    assert len(panel.trend.stack) == 80 and panel.trend.readout.text().startswith("at 7.9 s: compute")
    legend = [w.text() for w in panel.findChildren(type(panel.cause)) if w.text() in ("compute", "collective wait",
                                                                                        "input wait")]
    assert sorted(legend) == ["collective wait", "compute", "input wait"]
    panel.grab().save(str(PANEL_PNG))


def test_the_mean_over_replicas_and_a_model_runs_compute_holding_its_collectives(qtbot: Any, runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "model-2clients.yaml")
    session = RunSession(runs_root, cfg)
    panel = WhySlowPanel(session)
    qtbot.addWidget(panel)
    run = ReplayRun()
    session.watch(run, cfg, None, "running")
    run.feed(*(kit.step(rid, i, t=2000.0 + 0.1 * i, step_time=0.02, input_wait=0.004) for i in range(1, 30)
               for rid in range(2)))
    qtbot.waitUntil(lambda: len(panel.bars.rows) == 2, timeout=5000)
    assert panel.cause.text() == "Mean step 20.0 ms over 2 replicas: compute + collectives 80 %, input wait 20 %."
    assert "collectives run inside" in panel.bars.tip_for(0) or "compute + collectives" in panel.bars.tip_for(0)
    stack = panel.trend.stack
    assert stack is not None and set(stack.tops) == {"compute", "input"}
    assert stack.tops["input"][-1] == pytest.approx(0.02) and stack.bottoms["input"][-1] == pytest.approx(0.016)
    # an opened folder or a replay without a folder: nothing to ask
    assert not panel.profile_button.isEnabled()
    assert panel.profile_button.toolTip() == NO_LIVE_RUN.format(what="Profile")
    panel.shutdown()
    session.shutdown()


def test_buttons_wait_for_a_live_run_and_say_why(qtbot: Any, runs_root: Path) -> None:
    session = RunSession(runs_root, two_workers())
    panel = WhySlowPanel(session)
    qtbot.addWidget(panel)
    for button, what in ((panel.profile_button, "Profile"), (panel.stacks_button, "Dump stacks")):
        assert not button.isEnabled() and button.toolTip() == NO_LIVE_RUN.format(what=what)
    assert panel.cause.text().startswith("No step breakdown yet")
    panel.show()
    untipped = [f"{type(w).__name__} {w.objectName()}" for w in panel.findChildren(QWidget)
                if isinstance(w, (QLabel, QPushButton, QComboBox, QAbstractScrollArea)) and w.isVisible()
                and not isinstance(w, QHeaderView) and not w.toolTip()]
    assert untipped == []
    # it fits a 1366x768 screen's window, as a dock or a tab
    hint, least = panel.sizeHint(), panel.minimumSizeHint()
    assert hint.width() <= 1366 and hint.height() <= 600 and least.width() <= 700 and least.height() <= 420
    panel.shutdown()


def write_capture(run_dir: Path, rid: str) -> None:
    """A capture's files as two tasks leave them: one with its summary, one that failed."""
    folder = RunFolder(run_dir)
    trace = folder.tensorboard / "plugins" / "profile" / rid
    trace.mkdir(parents=True)
    (trace / "worker-0.xplane.pb").write_bytes(b"")
    capture = run_dir / "profile" / rid
    capture.mkdir(parents=True)
    summary = {"top_ops": [{"type": "CollectiveReduceV2", "op": "sgd/CollectiveReduceV2", "category": "collective",
                            "self_us": 626000.0, "count": 90, "share": 0.53},
                           {"type": "_MklMatMul", "op": "dense/MatMul", "category": "compute", "self_us": 52000.0,
                            "count": 90, "share": 0.04}],
               "breakdown": {"compute": 0.2, "collective": 0.6, "input": 0.2}, "busy_us": 1181000.0}
    profiling.summary_file(folder, rid, "worker:0").write_text(json.dumps(summary))
    profiling.done_file(folder, rid, "worker:0").write_text(json.dumps(
        {"task": "worker:0", "id": rid, "ms": 2000, "xplane": f"tensorboard/plugins/profile/{rid}/worker-0.xplane.pb"}))
    profiling.done_file(folder, rid, "worker:1").write_text(json.dumps({"task": "worker:1", "error": "boom"}))


def test_an_opened_folders_last_capture_shows_its_top_ops(qtbot: Any, runs_root: Path, monkeypatch: Any) -> None:
    run_dir = runs_root / "ended"
    run_dir.mkdir(parents=True)
    write_capture(run_dir, "20260101-000000.000")
    config_mod.save(two_workers(), run_dir / "config.yaml")
    (run_dir / "run.json").write_text(json.dumps({"state": "finished"}))
    session = RunSession(runs_root, two_workers())
    panel = WhySlowPanel(session)
    qtbot.addWidget(panel)
    session.open_folder(run_dir)  # an ended run folder on screen
    assert session.state.state == "finished" and not panel.profile_button.isEnabled()
    table = panel.profile_results.table
    cells = [[(table.item(r, c) or QTableWidgetItem()).text() for c in range(table.columnCount())]
             for r in range(table.rowCount())]
    assert cells[0][:1] == ["worker:0"] and "collectives 60 %" in cells[0][1] and cells[0][4] == "1181.0 ms"
    assert cells[1][1:] == ["sgd/CollectiveReduceV2", "CollectiveReduceV2", "collective", "626.0 ms", "53.0 %"]
    assert cells[3][:2] == ["worker:1", "boom"]
    opened: list[str] = []
    monkeypatch.setattr("gui.why_slow_results.QDesktopServices.openUrl", lambda url: opened.append(url.toLocalFile()))
    assert panel.profile_results.open_button.isEnabled()
    qtbot.mouseClick(panel.profile_results.open_button, Qt.MouseButton.LeftButton)
    assert opened == [str(run_dir / "tensorboard" / "plugins" / "profile" / "20260101-000000.000")]
    panel.shutdown()


DUMP = """# clusterdeck stacks of worker:1: pid 42, main thread 0x00007f0000000001

# dump requested at 2026-01-01T00:00:00 (asked)
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/x/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute
  File "/repo/engine/runtime/data_parallel.py", line 123 in train_step
  File "/repo/engine/runtime/task.py", line 140 in main
"""


def test_stacks_sit_side_by_side_with_the_frame_to_look_at_marked(qtbot: Any, shown: Any) -> None:
    _, panel, _ = shown
    dump = doctor.parse("worker:1", Path("stacks.txt"), DUMP)
    panel._dumped({"worker:0": "pid 7 is not a task of this run on this machine", "worker:1": dump})
    assert set(panel.stacks_view.browsers) == {"worker:0", "worker:1"}
    text = panel.stacks_view.browsers["worker:1"].toPlainText()
    marked = [line for line in text.splitlines() if "▶" in line]
    assert marked == ["▶ train_step  /repo/engine/runtime/data_parallel.py:123"], text
    assert "quick_execute" in text and "1 other thread" in text
    highlight = panel.palette().color(panel.palette().ColorRole.Highlight).name()
    assert highlight in panel.stacks_view.browsers["worker:1"].toHtml()
    assert "not a task of this run" in panel.stacks_view.browsers["worker:0"].toPlainText()


@pytest.mark.parametrize("dark", [False, True])
def test_the_panel_reads_in_both_palettes(qtbot: Any, shown: Any, dark: bool) -> None:
    session, panel, run = shown
    app = cast(QApplication, QApplication.instance())
    old = app.palette()
    theme.apply_palette(app, dark)
    try:
        run.feed(*steps_with_a_slow_input(steps=20))
        qtbot.waitUntil(lambda: len(panel.bars.rows) == 4, timeout=5000)
        image = panel.bars.grab().toImage()
        background = image.pixelColor(2, image.height() - 2)
        text = panel.bars.palette().color(panel.bars.foregroundRole())
        assert abs(background.lightness() - text.lightness()) > 100
        if dark:
            panel.grab().save(str(PANEL_PNG.with_name("why_slow_panel_dark.png")))
    finally:
        app.setPalette(old)


@pytest.mark.cluster
def test_a_real_run_profiles_and_dumps_its_stacks_from_the_panel(qtbot: Any, runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-1worker-2gpus.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))
    session = RunSession(runs_root, cfg)
    panel = WhySlowPanel(session)
    qtbot.addWidget(panel)
    panel.resize(1100, 620)
    panel.show()
    assert not panel.profile_button.isEnabled()
    session.launch(cfg, checked=True)
    try:
        qtbot.waitUntil(lambda: len(panel.bars.rows) == 2, timeout=120_000)
        assert panel.profile_button.isEnabled() and panel.stacks_button.isEnabled()
        b = panel.bars.rows[0][2]
        assert b.collective is not None and b.input is not None and b.step_time > 0
        qtbot.mouseClick(panel.profile_button, Qt.MouseButton.LeftButton)
        assert not panel.stacks_button.isEnabled() and panel.busy.text().startswith("Profiling")
        qtbot.waitUntil(lambda: panel.profile_results.capture is not None, timeout=90_000)
        capture = panel.profile_results.capture
        assert capture is not None
        assert list(capture.tasks) == ["worker:0"] and capture.tasks["worker:0"].ok, capture.tasks
        assert capture.tasks["worker:0"].top_ops and panel.profile_results.table.rowCount() >= 2
        assert panel.profile_results.open_button.isEnabled()
        qtbot.mouseClick(panel.stacks_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "worker:0" in panel.stacks_view.browsers, timeout=30_000)
        assert "▶" in panel.stacks_view.browsers["worker:0"].toPlainText()
        panel.grab().save(str(PANEL_PNG.with_name("why_slow_panel_live.png")))
    finally:
        pids = session.run.pids() if session.run is not None else []
        session.stop()
        qtbot.waitUntil(lambda: session.run is None, timeout=60_000)
        wait_gone(pids, 10.0)
        panel.shutdown()
