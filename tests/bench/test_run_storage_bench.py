"""bench/run_storage.py end to end at its smallest: a simulated run written through the real record,
its folder measured and reopened in fresh processes, its section written (the figures mean nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.test_benchmarks_smoke import run_bench


def test_run_storage_writes_reopens_and_reports(tmp_path: Path) -> None:
    out, doc = run_bench("run_storage", tmp_path, "--hours", "0.01", "--replicas", "2", "--early-hz", "2",
                         "--full-hours", "0.005", "--rounds", "2", "--points", "100", timeout=300)
    assert "simulated 0.01 h x 2 replicas" in out and "round 2 points 100" in out
    assert "A long run's folder" in doc and "| **all** |" in doc and "reopen, first frame" in doc
