"""The method's statistics, and smoke runs of the whole-run, step-CPU, async attribution, modes, ingest, GPU and
large-app benchmarks.

Smoke runs prove the scripts work end to end; their figures mean nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import _handwritten  # noqa: E402
import _stats  # noqa: E402

from tests.engine.lab import lab_fixture, lab_session_fixture  # noqa: E402,F401 - fixtures


def run_bench(name: str, tmp_path: Path, *args: str, timeout: float = 900, section: str | None = None
              ) -> tuple[str, str]:
    doc = tmp_path / "benchmarks.md"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--write-doc",
                           "--doc", str(doc), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = doc.read_text(encoding="utf-8")
    section = section or name
    assert f"<!-- bench:{section} -->" in text and f"<!-- /bench:{section} -->" in text
    return proc.stdout, text


# -- the method


def test_paired_ratio_is_the_median_of_round_ratios_with_a_seeded_interval() -> None:
    sides = [11.0, 10.5, 12.0, 10.0, 10.2, 10.8, 11.5, 10.1, 10.9, 10.4]
    bases = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    r = _stats.paired_ratio(sides, bases)
    assert r.median == pytest.approx(1.065)
    assert r.low <= r.median <= r.high and r.low < r.high
    assert _stats.paired_ratio(sides, bases) == r  # seeded: the same figures give the same interval
    # a ratio of medians would differ from the median of paired ratios when rounds drift
    drift = _stats.paired_ratio([2.0, 4.0, 8.0], [1.0, 4.0, 10.0])
    assert drift.median == pytest.approx(1.0)


def test_a_goal_is_met_only_when_the_whole_interval_clears_it() -> None:
    inside = _stats.Ratio(1.01, 0.99, 1.02)
    straddling = _stats.Ratio(1.02, 1.00, 1.05)
    above = _stats.Ratio(1.08, 1.05, 1.10)
    assert _stats.goal_verdict(inside, 1.03, at_most=True) == "met"
    assert "not shown" in _stats.goal_verdict(straddling, 1.03, at_most=True)
    assert "not met" in _stats.goal_verdict(above, 1.03, at_most=True)
    assert _stats.goal_met(_stats.Ratio(0.99, 0.975, 1.0), 0.97, at_most=False)
    assert not _stats.goal_met(_stats.Ratio(0.99, 0.96, 1.0), 0.97, at_most=False)


def test_rounds_rotate_the_order_of_the_sides() -> None:
    assert [_stats.rotated(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    calls: list[str] = []
    out = _stats.interleaved(["a", "b", "c"], 3, lambda side, r: calls.append(side) or len(calls))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out["a"] == [1, 6, 8]


def test_the_hand_written_launcher_is_about_ten_lines_and_sets_tf_config(tmp_path: Path) -> None:
    files = _handwritten.write_all(tmp_path)
    assert _handwritten.launch_lines("launch_data.sh") <= 12
    text = files["launch_data.sh"].read_text()
    assert "TF_CONFIG=" in text and "clusterdeck" not in text.lower()
    assert os.access(files["launch_data.sh"], os.X_OK)
    for script in ("mwms_loop.py", "pss_chief.py", "pss_server.py", "dtensor_loop.py"):
        source = files[script].read_text()
        compile(source, script, "exec")
        assert "engine" not in source  # plain TensorFlow: no ClusterDeck code


# -- smoke runs


def test_ingest_takes_every_event(tmp_path: Path) -> None:
    out, doc = run_bench("ingest", tmp_path, "--replicas", "8", "--seconds", "1", timeout=300)
    assert "0 not folded, 0 not written" in out
    assert "every replica at its last step: True" in out
    assert "What limits the next factor of ten" in doc and "<!-- bench:scale_design -->" in doc


def test_gpu_check_says_skipped_without_gpus(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import gpu_inventory

    if gpu_inventory()[0] > 0:
        pytest.skip("this machine has GPUs: the check itself runs for minutes")
    out, doc = run_bench("gpu_check", tmp_path, timeout=120)
    assert "skipped" in out and "skipped" in doc


def test_gui_scale_large_at_reduced_duration(tmp_path: Path) -> None:
    out, doc = run_bench("gui_scale", tmp_path, "--large", "--minutes", "0.1", "--live", "1", timeout=600,
                         section="gui_scale_large")
    assert out.startswith("128 replicas") or "128 replicas" in out
    assert "history: 0 points lost" in out
    assert "toward hundreds of replicas" in doc


@pytest.mark.cluster
def test_whole_run_against_the_hand_written_launch(tmp_path: Path) -> None:
    out, doc = run_bench("whole_run", tmp_path, "--modes", "data", "--steps", "30")
    assert "wall ratio" in out and "CPU ratio" in out
    assert "TF_CONFIG=" in doc and "Whole-run cost" in doc


@pytest.mark.cluster
def test_warm_start_runs_both_sides_and_writes_its_section(tmp_path: Path) -> None:
    out, doc = run_bench("warm_start", tmp_path, "--presets", "async-1ps", "--steps", "20")
    assert re.search(r"round  1 async-1ps: warm [0-9.]+ s / [0-9.]+ CPU-s, cold [0-9.]+ s", out), out
    assert "async-1ps: warm / cold wall" in out
    assert "## 4c. Warm start" in doc and "| `async-1ps` |" in doc


@pytest.mark.cluster
def test_cpu_per_training_step_by_process(tmp_path: Path) -> None:
    out, doc = run_bench("step_cpu", tmp_path, "--modes", "data", "--steps", "100")
    assert "task side, CPU per report: event" in out
    assert "data: CPU per step, clusterdeck / hand-written grouped" in out
    # both sides' workers were found and measured over their training phase
    for side in ("clusterdeck", "hand_grouped"):
        assert re.search(rf"data +{side} *:.*task: worker \d", out), out
    assert "Where the CPU of a training step goes" in doc and "| event + TensorBoard point |" in doc


@pytest.mark.cluster
def test_every_mode_against_its_bare_loop(tmp_path: Path) -> None:
    # one mode end to end keeps the suite short (the data mode's bare side runs in the telemetry smoke test)
    out, doc = run_bench("modes", tmp_path, "--steps", "30", "--modes", "model")
    assert "model: clusterdeck / bare" in out
    assert "Every mode against its own bare loop" in doc


def test_async_attribution_changes_apply_in_order_and_refuse_what_cannot_apply() -> None:
    import async_attribution as attribution

    base = _handwritten.PSS_CHIEF
    for side in ("counter", "float64", "counter+float64+window", "counter+window+halves", "copy_window+cached_size"):
        src = attribution.chief_source(side)
        compile(src, side, "exec")  # a chief that runs: every change left valid Python
        assert src != base
    assert "Dataset.counter()" in attribution.chief_source("counter")
    assert "tf.float64" in attribution.chief_source("float64") and "tf.float64" not in base
    assert "CAP, KEEP = 8, 4" in attribution.chief_source("copy_window+halves")
    for bad, says in (("window", "needs 'counter'"), ("counter+copy_window", "without the counter"),
                      ("cached_size", "cannot apply"), ("fast", "unknown change 'fast'")):
        with pytest.raises(SystemExit, match=says):
            attribution.chief_source(bad)


@pytest.mark.cluster
def test_async_attribution_runs_a_changed_chief_against_the_original(tmp_path: Path) -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "async_attribution.py"), "--quick", "--steps", "100",
                           "--sides", "counter+float64+window"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # both chiefs trained and were measured, and the changed one is read against the original
    for side in ("hand-written", "counter+float64+window"):
        assert re.search(rf"round  1 {re.escape(side)} *:.*steps/s, CPU ms/step chief \d", proc.stdout), proc.stdout
    assert "counter+float64+window / hand-written: chief " in proc.stdout


def test_modes_direct_side_runs_in_data_and_async_modes_and_is_read_against_both_sides(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import modes

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(modes, "clusterdeck_rate", lambda mode, cfg, root: calls.append(("clusterdeck", mode)) or 90.0)
    monkeypatch.setattr(modes, "bare_rate", lambda mode, cfg, root: calls.append(("bare", mode)) or 100.0)
    monkeypatch.setattr(modes, "runtime_rate",
                        lambda cfg, root, telemetry: calls.append(("direct", cfg.parallelism.mode)) or 95.0)
    monkeypatch.setattr(modes, "async_direct_rate",
                        lambda cfg, root: calls.append(("direct", cfg.parallelism.mode)) or 80.0)
    modes.main(["--modes", "data,async,model", "--rounds", "2", "--steps", "30", "--direct", "--no-doc"])
    out = capsys.readouterr().out
    assert calls.count(("direct", "data")) == calls.count(("direct", "async")) == 2
    assert ("direct", "model") not in calls
    assert calls.count(("clusterdeck", "model")) == calls.count(("bare", "model")) == 2
    assert "data: direct / bare 0.950" in out
    assert "clusterdeck / direct 0.947" in out and "async: direct / bare 0.800" in out
    assert "clusterdeck / direct 1.125" in out
    assert "model: direct" not in out


@pytest.mark.cluster
def test_the_async_direct_side_trains_every_task_by_hand_and_leaves_none(tmp_path: Path) -> None:
    import modes

    cfg = modes.load("async", 120)
    rate = modes.async_direct_rate(cfg, tmp_path)
    assert rate > 0
    assert list(tmp_path.iterdir()) == []  # its folder removed; the workers and the ps killed (the fixture checks)


def test_modes_tf_threads_side_is_the_bare_runtime_without_the_core_share(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import modes

    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    calls: list[tuple[bool, bool]] = []
    monkeypatch.setattr(modes, "clusterdeck_rate", lambda mode, cfg, root: 90.0)
    monkeypatch.setattr(modes, "bare_rate", lambda mode, cfg, root: 100.0)

    def runtime_rate(cfg: Any, root: Path, *, telemetry: bool, tf_threads: bool = False) -> float:
        calls.append((telemetry, tf_threads))
        return 80.0

    monkeypatch.setattr(modes, "runtime_rate", runtime_rate)
    modes.main(["--modes", "data", "--rounds", "2", "--steps", "30", "--tf-threads", "--no-doc"])
    out = capsys.readouterr().out
    assert calls == [(False, True)] * 2
    assert "data: bare / tf_threads 1.250" in out and "clusterdeck / tf_threads 1.125" in out
    # the bare environment shares the cores unless the environment chose; tf_threads drops the share
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
    assert modes.bare_env(2)["TF_NUM_INTRAOP_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))


def test_modes_unpinned_side_is_the_bare_loop_placed_by_the_kernel(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import modes

    calls: list[tuple[str, bool]] = []
    monkeypatch.setattr(modes, "clusterdeck_rate", lambda mode, cfg, root: 90.0)

    def bare_rate(mode: str, cfg: Any, root: Path, *, pinned: bool = True) -> float:
        calls.append((mode, pinned))
        return 100.0 if pinned else 80.0

    monkeypatch.setattr(modes, "bare_rate", bare_rate)
    results = modes.main(["--modes", "data,async,model", "--rounds", "2", "--steps", "30", "--unpinned", "--no-doc"])
    out = capsys.readouterr().out
    assert sorted(calls) == sorted([(m, True) for m in ("data", "async", "model")] * 2
                                   + [(m, False) for m in ("data", "async")] * 2)
    assert "data: bare / unpinned 1.250" in out and "async: bare / unpinned 1.250" in out
    assert "model: bare / unpinned" not in out
    assert "bare pinned / bare unpinned data **1.250" in modes.doc_section(results, 30, 2)


def test_hand_written_tasks_take_the_cores_and_threads_the_benchmark_gives_them(tmp_path: Path) -> None:
    """``CD_BENCH_CORES`` pins the task its ``TF_CONFIG`` names, before TensorFlow would be imported."""
    cpus = sorted(os.sched_getaffinity(0))
    probe = _handwritten._CORES + "print(sorted(os.sched_getaffinity(0)), os.environ.get('TF_NUM_INTEROP_THREADS'))\n"
    shares = {"worker:1": {"cores": [cpus[-1]], "env": {"TF_NUM_INTEROP_THREADS": str(len(cpus))}},
              "ps:0": {"cores": [], "env": {"TF_NUM_INTRAOP_THREADS": "1"}}}
    env = {k: v for k, v in os.environ.items() if k != "TF_NUM_INTEROP_THREADS"}
    env["CD_BENCH_CORES"] = json.dumps(shares)

    def run(task: str) -> str:
        role, index = task.split(":")
        env["TF_CONFIG"] = json.dumps({"cluster": {}, "task": {"type": role, "index": int(index)}})
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert run("worker:1") == f"[{cpus[-1]}] {len(cpus)}"
    assert run("ps:0") == f"{cpus} None"  # no cores of its own: placed by the kernel
    assert run("worker:0") == f"{cpus} None"  # not named: untouched
    for name in ("mwms_loop.py", "pss_chief.py", "pss_server.py"):
        assert _handwritten.FILES[name].lstrip().startswith(_handwritten._CORES.strip())


@pytest.mark.cluster
def test_launch_scale_launches_over_the_lab_and_measures_its_floor_in_the_same_rounds(
        tmp_path: Path, lab: Any) -> None:
    """Two lab hosts x 2 simulated tasks, one round: ClusterDeck's launch and the floor (a bare launch of the same
    tasks over the same ssh), and the share between them in the section."""
    out, doc = run_bench("launch_scale", tmp_path, "--rounds", "1", "--hosts", "2", "--per-host", "2",
                         "--no-reference", timeout=300)
    assert re.search(r"round 1\s+4/this: [0-9.]+ s, [0-9.]+ CPU-s busy \(launcher", out), out
    floor = re.search(r"round 1\s+4/bare: [0-9.]+ s, [0-9.]+ CPU-s busy \(.*bare ([0-9.]+), other", out)
    assert floor and float(floor.group(1)) > 0, out  # the floor's Pythons ran and were counted
    assert "4/this - 4/bare:" in out
    assert "## 4d. Launch at scale" in doc and "| `4/this` | `4/bare` |" in doc
    assert re.search(r"ClusterDeck's own share, the launch less the floor \(paired per round\): \*\*-?[0-9.]+", doc)
