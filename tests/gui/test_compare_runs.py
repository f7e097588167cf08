"""Compare with run: two runs of one preset read apart in the legend, the overlay is drawn over the current
run, the current run's entries come first, and opening another preset ends the comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import PRESETS
from tests.gui.test_runs import make_run_folder


def test_two_runs_of_one_preset_read_apart_and_the_overlay_sits_on_top(qtbot: Any, window: Any,
                                                                       tmp_path: Path) -> None:
    first = make_run_folder(tmp_path / "a", "20261205-101500-data-2workers")
    second = make_run_folder(tmp_path / "b", "20261205-113042-data-2workers", steps=80, loss_scale=0.5)
    assert window.open_run_folder(first)
    assert window.compare_with_run(second)
    loss = window.plots.loss
    key = "cmp:20261205-113042-data-2workers:replica/0/loss"
    qtbot.waitUntil(lambda: loss.points(key) == 80)
    label = loss.labels[key]
    assert "11:30:42" in label and "data-2workers" in label, label  # the start time tells the runs apart
    assert loss.curves[key].on_top and not loss.curves["replica/0/loss"].on_top  # drawn over the current run
    names = [loss.labels[k] for k in loss.labels if k in loss.curves]
    own = [i for i, k in enumerate(k for k in loss.labels if k in loss.curves) if not k.startswith("cmp:")]
    overlay = [i for i, k in enumerate(k for k in loss.labels if k in loss.curves) if k.startswith("cmp:")]
    assert own and overlay and max(own) < min(overlay), names  # the current run's entries first
    window.open_path(PRESETS / "async-1ps.yaml", ask=False)  # another preset: the comparison ends
    qtbot.waitUntil(lambda: key not in loss.curves)
    assert not window.commands["clear_compare"].isEnabled()
