"""Scaling report: configs per worker count, the measurement, efficiency, CSV, and real tiny runs."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.cli import scaling_report
from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, ConfigError, Host, RunConfig, Task, replace
from engine.control import scaling
from engine.control.lifecycle import RunHandle
from engine.control.scaling import ScalingPoint, ScalingReport, ScalingSession
from engine.observe.telemetry import TERMINAL, RunState
from tests.conftest import PRESETS, ROOT


def preset(name: str = "data-2workers") -> RunConfig:
    return config_mod.load(PRESETS / f"{name}.yaml")


# --------------------------------------------------------------------------- configs


def test_weak_scaling_keeps_the_per_replica_batch_and_everything_else() -> None:
    base = preset()  # 2 workers, global batch 128: 64 per replica
    configs = scaling.scaling_configs(base, (4, 1, 2, 2), steps=50)
    assert [len(c.cluster.tasks_of("worker")) for c in configs] == [1, 2, 4]
    assert [c.training.global_batch_size for c in configs] == [64, 128, 256]
    for c in configs:
        assert c.parallelism.mode == "data" and c.cluster.is_local and len(c.cluster.hosts) == 1
        assert [t.name for _, t in c.cluster.tasks()] == [f"worker:{i}" for i in range(c.num_replicas())]
        assert c.training.steps == 50 and c.training.epochs is None
        assert c.training.checkpoint_every == 0 and c.training.restarts == 0
        assert (c.model, c.data, c.training.optimizer, c.training.learning_rate, c.training.seed) == \
            (base.model, base.data, base.training.optimizer, base.training.learning_rate, base.training.seed)
        assert config_mod.validate(c) == []
    assert configs[0].name == "data-2workers-scaling-1w"


def test_strong_scaling_keeps_the_global_batch_and_names_the_field_when_it_cannot() -> None:
    configs = scaling.scaling_configs(preset(), (1, 2, 4), strong=True)
    assert [c.training.global_batch_size for c in configs] == [128, 128, 128]
    with pytest.raises(ConfigError, match=r"training.global_batch_size: .*divisible by 3, got 128"):
        scaling.scaling_configs(preset(), (3,), strong=True)


def test_an_async_preset_scales_as_async_runs_with_its_chief_and_servers() -> None:
    base = preset("async-1ps")  # chief, 2 workers, 1 ps; 16 steps per function
    configs = scaling.scaling_configs(base, (1, 2, 4), steps=40)
    assert [len(c.cluster.tasks_of("worker")) for c in configs] == [1, 2, 4]
    for c in configs:
        assert c.parallelism == base.parallelism and c.parallelism.mode == "async"
        assert len(c.cluster.tasks_of("chief")) == 1 and len(c.cluster.tasks_of("ps")) == 1
        assert c.training.steps_per_execution == base.training.steps_per_execution  # async keeps its groups
        assert config_mod.validate(c) == []
    report = scaling.ScalingSession(base, (1, 2), steps=40).report()
    assert report.mode == "async" and "asynchronous" in scaling.describe(report)


def test_a_model_parallel_preset_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"parallelism.mode: .*not 'model': .*mesh"):
        scaling.scaling_configs(preset("model-2x2"), (1, 2))


def test_a_chief_of_a_data_preset_becomes_a_worker() -> None:
    hosts = (Host(name="local", tasks=(Task("chief", 0), Task("worker", 0))),)
    configs = scaling.scaling_configs(replace(preset(), cluster=Cluster(hosts=hosts)), (1, 2))
    for c in configs:
        assert {t.role for _, t in c.cluster.tasks()} == {"worker"} and c.parallelism.mode == "data"


def test_emulated_gpus_per_worker_are_kept() -> None:
    base = replace(preset(), cluster=Cluster(hosts=(Host(name="local", gpus=2, tasks=(Task("worker", 0),)),)))
    configs = scaling.scaling_configs(base, (1, 2))
    assert [c.cluster.hosts[0].gpus for c in configs] == [2, 4]
    assert [c.num_replicas() for c in configs] == [2, 4]
    assert [c.training.global_batch_size for c in configs] == [128, 256]


@pytest.mark.parametrize("bad", ["", "0", "1, two", "-2", "1.5", "100000"])
def test_worker_counts_are_checked(bad: str) -> None:
    with pytest.raises(ConfigError, match="^workers: expected"):
        scaling.parse_workers(bad)
    assert scaling.parse_workers("4 2,1, 2") == (1, 2, 4)


# --------------------------------------------------------------------------- measurement and report


def test_window_figures_of_the_trainers_are_averaged_not_summed() -> None:
    cfg = scaling.scaling_configs(preset(), (2,), steps=100)[0]
    evs = [{"kind": "status", "task": "worker:0", "state": "finished", "window_examples_per_sec": 1000.0},
           {"kind": "status", "task": "worker:1", "state": "finished", "window_examples_per_sec": 1200.0},
           {"kind": "status", "task": "launcher", "state": "finished", "window_examples_per_sec": 9e9}]
    assert scaling.measure(evs, cfg) == (pytest.approx(1100.0), "window")


def test_without_window_figures_the_step_events_after_the_warm_up_give_the_pace() -> None:
    cfg = scaling.scaling_configs(preset(), (2,), steps=100)[0]  # global batch 128, warm-up 20 steps
    evs = []
    for step in range(1, 101):
        t = 100.0 + (5.0 if step == 1 else 0.0) + step * 0.01  # step 1 is slow (tracing): left out
        for replica in (0, 1):
            evs.append({"kind": "step", "task": f"worker:{replica}", "replica": replica, "step": step, "t": t})
    value, source = scaling.measure(evs, cfg)
    assert source == "steps" and value == pytest.approx(128 / 0.01)
    assert scaling.measure([], cfg) == (None, "")


def points(*figures: tuple[int, float | None]) -> ScalingReport:
    pts = tuple(ScalingPoint(workers=n, replicas=n, global_batch_size=64 * n, steps=100, examples_per_sec=tp,
                             source="window" if tp else "", state="finished" if tp else "failed")
                for n, tp in figures)
    return ScalingReport(preset="p", scaling="weak", cpu_count=2, points=pts)


def test_efficiency_is_throughput_over_n_times_one_worker() -> None:
    report = points((1, 1000.0), (2, 1500.0), (4, None))
    eff = [report.efficiency(p) for p in report.points]
    assert eff == [pytest.approx(1.0), pytest.approx(1500 / (2 * 1000)), None]
    assert report.ideal(report.points[2]) == pytest.approx(4000.0)
    no_one = points((2, 1800.0), (4, 2700.0))  # no 1-worker run: the fewest workers are the baseline
    assert no_one.efficiency(no_one.points[1]) == pytest.approx(2700 / (2 * 1800))


def test_csv_has_the_columns_and_reads_back(tmp_path: Path) -> None:
    report = points((1, 1000.0), (2, 1500.0), (4, None))
    path = scaling.write_csv(report, tmp_path / "out" / "scaling.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == scaling.CSV_COLUMNS
    assert [r["efficiency"] for r in rows] == ["1.0000", "0.7500", ""]
    assert rows[2]["state"] == "failed" and rows[1]["ideal_examples_per_sec"] == "2000.00"
    back = scaling.read_csv(path)
    assert back.points == report.points and (back.preset, back.scaling, back.cpu_count) == ("p", "weak", 2)
    assert "2 CPU cores shared by all workers" in scaling.describe(back)
    assert "beyond 2 workers" in scaling.describe(back)


def test_a_file_that_is_no_report_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a scaling report"):
        scaling.read_csv(bad)


# --------------------------------------------------------------------------- the session, with stand-in runs


class FakeRun:
    """Stands in for engine.control.launcher.Run as a :class:`~engine.control.lifecycle.RunHandle`: its events
    are made by ``events.make`` and pass the real decoder; it finishes after ``polls`` looks at ``done``, each
    trainer reporting a window figure."""

    made: list[FakeRun] = []

    def __init__(self, config: RunConfig, *, runs_root: Any = None, rate: float = 1000.0, polls: int = 3) -> None:
        self.config = config
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.state = RunState(total_steps=config.total_steps(),
                              tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()])
        self.polls = polls
        self.rate = rate
        self.stopped = ""
        self._run_dir = Path(runs_root or "/nonexistent") / config.name
        FakeRun.made.append(self)

    def _emit(self, kind: str, task: str, **fields: Any) -> None:
        event = events.decode(events.encode(events.make(kind, task, **fields)))
        assert event is not None, "the real decoder rejects this stand-in's event"
        self.state.apply(event)
        for fn in self.listeners:
            fn(event)

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self.listeners.append(listener)

    def start(self) -> Path:
        self._emit("run", "launcher", state="running")
        return self.run_dir

    def stop(self, reason: str = "stopped by the user", wait: bool = True) -> None:
        self.stopped = reason
        if not self.done:
            self._emit("run", "launcher", state="stopped", reason=reason)

    def wait(self, timeout: float | None = None) -> str:
        return self.state.state

    @property
    def done(self) -> bool:
        if self.state.state in TERMINAL:
            return True
        self.polls -= 1
        if self.polls > 0:
            self._emit("step", "worker:0", replica=0, step=5, loss=1.0)
            return False
        n = len(self.config.cluster.tasks_of("worker"))
        for i in range(n):
            self._emit("status", f"worker:{i}", state="finished", window_examples_per_sec=self.rate * n ** 0.5)
        self._emit("run", "launcher", state="finished")
        return True


def test_the_stand_in_run_is_a_run_handle_as_the_real_one_is() -> None:
    from engine.control.launcher import Run

    fake = FakeRun(preset())
    fake.start()
    assert isinstance(fake, RunHandle)
    members = ("start", "stop", "wait", "done", "add_listener", "run_dir")
    assert all(callable(getattr(Run, m, None)) or isinstance(getattr(Run, m, None), property) for m in members)
    assert "state" in vars(Run(preset()))  # (mypy checks Run against RunHandle where ScalingSession uses it)


def test_a_session_runs_each_count_in_turn_with_progress_and_eta(tmp_path: Path) -> None:
    FakeRun.made = []
    seen: list[scaling.ScalingProgress] = []
    session = ScalingSession(preset(), (1, 2, 4), 20, tmp_path, run_factory=FakeRun)
    report = scaling.run_scaling(preset(), session=session, on_progress=seen.append, poll_s=0.0)
    assert [len(r.config.cluster.tasks_of("worker")) for r in FakeRun.made] == [1, 2, 4]
    assert [p.workers for p in report.points] == [1, 2, 4]
    assert [round(report.efficiency(p) or 0, 4) for p in report.points] == [1.0, round(2 ** 0.5 / 2, 4), 0.5]
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and seen[-1].state == "finished"
    assert any(p.eta_s is not None and p.eta_s >= 0 for p in seen) and seen[-1].eta_s == 0.0
    assert any(p.step == 5 and p.total_steps == 20 for p in seen)


def test_cancel_stops_the_run_in_progress_and_starts_no_other(tmp_path: Path) -> None:
    FakeRun.made = []
    session = ScalingSession(preset(), (1, 2), 20, tmp_path, run_factory=FakeRun)
    assert not session.poll()
    session.cancel()
    while not session.poll():
        pass
    assert session.state == "cancelled" and len(FakeRun.made) == 1 and FakeRun.made[0].stopped
    assert [p.state for p in session.report().points] == ["stopped"]


# --------------------------------------------------------------------------- real runs


@pytest.mark.cluster
def test_a_tiny_real_report_gives_csv_and_png(runs_root: Path, tmp_path: Path) -> None:
    cfg = preset()
    seen: list[scaling.ScalingProgress] = []
    report = scaling.run_scaling(cfg, (1, 2), 60, runs_root, on_progress=seen.append, poll_s=0.05)
    assert [p.workers for p in report.points] == [1, 2]
    assert all(p.state == "finished" and p.examples_per_sec and p.examples_per_sec > 0 for p in report.points)
    assert all(Path(p.run_dir).is_dir() and Path(p.run_dir).parent == runs_root for p in report.points)
    one, two = report.points
    assert one.examples_per_sec and two.examples_per_sec
    assert report.efficiency(two) == pytest.approx(two.examples_per_sec / (2 * one.examples_per_sec))
    assert any(p.step > 0 for p in seen) and seen[-1].fraction == 1.0
    path = scaling.write_csv(report, tmp_path / "scaling.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == scaling.CSV_COLUMNS and [r["workers"] for r in rows] == ["1", "2"]
    tp = [float(r["examples_per_sec"]) for r in rows]
    assert math.isclose(float(rows[1]["efficiency"]), tp[1] / (2 * tp[0]), rel_tol=1e-3)
    png = scaling_report.render_png(path, tmp_path / "scaling.png")
    assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png.read_bytes()[16:20], "big"), int.from_bytes(png.read_bytes()[20:24], "big")
    assert (width, height) == (1200, 560)


def test_the_plot_renderer_subprocess_reports_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("nothing,here\n")
    with pytest.raises(RuntimeError, match="not a scaling report"):
        scaling_report.render_png(bad, tmp_path / "x.png")
    out = subprocess.run([sys.executable, "-c", "import engine.control.scaling, sys; "
                          "print(any(m.split('.')[0] in ('PySide6', 'pyqtgraph', 'tensorflow') for m in sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# --------------------------------------------------------------------------- command line


def test_the_command_writes_csv_and_png_and_prints_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    import engine.control.launcher

    monkeypatch.setattr(engine.control.launcher, "Run", FakeRun)
    monkeypatch.setenv("COLUMNS", "200")
    parser = argparse.ArgumentParser()
    scaling_report.add_arguments(parser)
    args = parser.parse_args(["data-2workers", "--workers", "1,2", "--steps", "30", "--out", str(tmp_path / "runs"),
                              "--report", str(tmp_path / "report")])
    assert scaling_report.command(args) == 0
    out = capsys.readouterr().out
    assert "efficiency" in out and "71%" in out and "scaling.csv" in out
    assert [p.workers for p in scaling.read_csv(tmp_path / "report" / "scaling.csv").points] == [1, 2]
    assert (tmp_path / "report" / "scaling.png").stat().st_size > 5000
    bad = parser.parse_args(["data-2workers", "--workers", "0"])
    assert scaling_report.command(bad) == 2 and "workers: expected" in capsys.readouterr().err
