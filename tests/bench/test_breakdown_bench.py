"""bench/breakdown_cost.py end to end at its smallest: in each mode the real adapter stepped with the breakdown
measured and not, taking turns (model mode: one MeshAdapter; data mode: one MirroredAdapter holding its step
functions in both forms), each mode in a process of its own, its section written beside the others (the figures
mean nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.test_benchmarks_smoke import run_bench
from tests.conftest import ROOT


@pytest.mark.cluster
def test_breakdown_bench_pairs_measured_and_off_steps_in_each_mode_and_reports(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n<!-- bench:modes -->\n## other\n<!-- /bench:modes -->\n")
    out, doc = run_bench("breakdown_cost", tmp_path, "--rounds", "2", "--block", "5", "--data-block", "2",
                         timeout=400)
    assert "model: ratio measured/off" in out and "data: ratio measured/off" in out and "ns per step" in out
    assert "## 8. What the step breakdown costs" in doc and "smoke run" in doc
    assert "| model: **measured / off**" in doc and "| data: **measured / off**" in doc
    assert "| data | measured |" in doc and "| data | off |" in doc
    assert doc.index("bench:modes") < doc.index("bench:breakdown_cost")


def test_breakdown_bench_refuses_a_preset_of_another_mode(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "breakdown_cost.py"), "--modes", "data",
                           "--data-preset", "model-2x2", "--no-doc"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected a data-mode preset with one task" in proc.stderr, proc.stderr
