"""Every benchmark runs end to end in a tiny mode and writes its section of a results document.

The figures of such short runs mean nothing; these tests prove the scripts work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, tmp_path: Path, *args: str, timeout: float = 120) -> tuple[str, str]:
    doc = tmp_path / "benchmarks.md"
    tmp = tmp_path / "tmp"  # the benchmark's temporary folder: nothing may be left in it
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--write-doc",
                           "--doc", str(doc), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert doc.exists(), "the benchmark wrote its section"
    text = doc.read_text(encoding="utf-8")
    assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text
    # TensorBoard keeps its folder of running instances there (each instance's file goes with it): it may stay, empty
    left = [n for n in os.listdir(tmp) if not (n == ".tensorboard-info" and not os.listdir(tmp / n))]
    assert left == [], f"{name} left files in the temporary folder"
    return proc.stdout, text


def test_doc_sections_are_replaced_in_place_and_kept_in_order(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from _common import write_section
    finally:
        sys.path.pop(0)
    doc = tmp_path / "b.md"
    write_section("startup_stop", "## four", doc)
    write_section("telemetry_overhead", "## one", doc)
    write_section("startup_stop", "## four again", doc)
    text = doc.read_text(encoding="utf-8")
    assert text.index("## one") < text.index("## four again") and "## four\n" not in text
    with pytest.raises(ValueError, match="expected one of"):
        write_section("nonsense", "x", doc)


def test_gui_scale_keeps_every_point(tmp_path: Path) -> None:
    out, doc = run_bench("gui_scale", tmp_path, "--minutes", "0.5", "--live", "1", "--replicas", "8")
    assert "history: 0 points lost" in out
    assert "every curve holds all" in out and ": True;" in out
    assert "The desktop app at scale" in doc


@pytest.mark.cluster
def test_telemetry_overhead_compares_engine_bare_and_keras(tmp_path: Path) -> None:
    out, doc = run_bench("telemetry_overhead", tmp_path, "--steps", "120", "--sides", "engine,bare,fit,fit+TB")
    assert "ratio engine/bare" in out and "ratio fit+TB/fit" in out
    assert "engine / bare" in doc


@pytest.mark.cluster
def test_live_latency_against_tensorboard(tmp_path: Path) -> None:
    out, doc = run_bench("live_latency", tmp_path, "--seconds", "3", "--drain", "7")
    assert "TensorBoard / ClusterDeck median latency" in out
    assert "Live latency" in doc


@pytest.mark.cluster
def test_startup_and_stop(tmp_path: Path) -> None:
    out, doc = run_bench("startup_stop", tmp_path)
    assert "stop to no process left" in out and "beyond it" in out
    assert "a task's import of its runtime / the plain import:" in out
    assert "Start-up and stop" in doc and "without IPython's notebook extras" in doc
