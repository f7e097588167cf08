"""A smoke run of bench/app_scale.py: its three scenarios end to end at reduced scale (figures mean nothing),
and its section of the results document written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_app_scale_runs_every_scenario_and_writes_its_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:other -->\nkept\n<!-- /bench:other -->\n", encoding="utf-8")
    figures = tmp_path / "figures.json"
    tmp = tmp_path / "tmp"  # the benchmark's temporary folder: nothing may be left in it
    tmp.mkdir()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TMPDIR=str(tmp))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "app_scale.py"), "all", "--quick", "--write-doc",
                           "--doc", str(doc), "--json", str(figures)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(figures.read_text(encoding="utf-8"))
    assert set(got) == {"live", "folder", "many"}
    assert got["live"]["lost"] == 0 and got["live"]["frames"], "every point kept, frames timed"
    assert got["folder"]["band_min"] == got["folder"]["loss_min"], "the band holds the lowest loss written"
    assert got["many"]["curves"] == got["live"]["curves"], "as many curves at 300 replicas as at 64"
    text = doc.read_text(encoding="utf-8")
    assert "<!-- bench:app_scale -->" in text and "<!-- /bench:app_scale -->" in text
    assert "kept" in text and "frame p95" in text
    assert sorted(os.listdir(tmp)) == [], "the benchmark left its settings, runs or folders behind"
