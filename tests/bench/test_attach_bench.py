"""bench/attach_latency.py end to end at its smallest: a simulated running run attached locally and over SSH to
127.0.0.1 in fresh processes, its section written (the figures mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_benchmarks_smoke import run_bench


@pytest.mark.cluster
def test_attach_bench_measures_local_and_ssh_and_reports(tmp_path: Path) -> None:
    out, doc = run_bench("attach_latency", tmp_path, "--hours", "0.005", "--replicas", "2", "--rounds", "2",
                         "--seconds", "1.5", timeout=300)
    assert "round 2 local" in out and "history folded" in doc and "first live step shown" in doc
    assert "round 2 ssh" in out or "SSH side **not measured**" in doc
    assert "Attaching to a long run" in doc
