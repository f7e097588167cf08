"""bench/breakdown_cost.py end to end at its smallest: the real model-mode adapter stepped with the breakdown
measured and not, taking turns, its section written beside the others (the figures mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_benchmarks_smoke import run_bench


@pytest.mark.cluster
def test_breakdown_bench_pairs_measured_and_off_steps_and_reports(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n<!-- bench:modes -->\n## other\n<!-- /bench:modes -->\n")
    out, doc = run_bench("breakdown_cost", tmp_path, "--rounds", "2", "--block", "5", timeout=300)
    assert "ratio measured/off" in out and "ns per step" in out
    assert "## 8. What the step breakdown costs" in doc and "**measured / off**" in doc
    assert "smoke run" in doc and doc.index("bench:modes") < doc.index("bench:breakdown_cost")
