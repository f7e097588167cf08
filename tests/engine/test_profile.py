"""One-click profile of every task: a request file in the run folder, a TensorFlow profile per task in
TensorBoard's layout, the run going on; and the on-demand stack dump of a live run."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.cli import doctor as doctor_cli
from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from engine.control import doctor
from engine.control.launcher import Run
from engine.runtime import diagnostics
from tests.conftest import PRESETS


def test_a_task_takes_only_a_new_recent_well_formed_request(tmp_path: Path) -> None:
    requests = diagnostics.ProfileRequests(tmp_path, "worker:0")
    assert requests.read_request() is None
    requests.request_file.parent.mkdir(parents=True)
    for bad in ('{"id": "../x", "ms": 5}', '{"id": "a", "ms": "5"}', "[1]", "{",
                json.dumps({"id": "old", "ms": 5, "t": time.time() - 3600})):
        requests.request_file.write_text(bad)
        assert requests.read_request() is None, bad
    requests.request_file.write_text(json.dumps({"id": "r1", "ms": 10**9, "t": time.time()}))
    assert requests.read_request() == ("r1", diagnostics.MAX_MS)
    requests.seen.add("r1")
    assert requests.read_request() is None


def test_profile_refuses_a_folder_without_run_json_and_a_bad_ms(tmp_path: Path, capsys: Any) -> None:
    assert doctor_cli.main(["profile", str(tmp_path)]) == 2
    assert "expected a folder holding run.json" in capsys.readouterr().err
    (tmp_path / "run.json").write_text("{}")
    assert doctor_cli.main(["profile", str(tmp_path), "--ms", "0"]) == 2
    assert doctor_cli.main(["profile", str(tmp_path)]) == 1  # no live task


@pytest.mark.cluster
def test_every_task_profiles_at_once_and_the_run_finishes(runs_root: Path, capsys: Any) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=2500, checkpoint_every=0))
    run = Run(cfg, runs_root=runs_root)
    stepping = threading.Event()
    run.add_listener(lambda e: stepping.set() if e["kind"] == "step" else None)
    run.start()
    assert stepping.wait(120), run.state.summary()
    deadline = time.monotonic() + 10  # run.json names the tasks' pids within a flush or two
    while len(doctor.run_task_pids(RunFolder(run.run_dir))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    stacks = doctor.dump_stacks(run.run_dir)
    assert set(stacks) == {"worker:0", "worker:1"}, stacks
    assert all(isinstance(d, doctor.Dump) and d.main_frames for d in stacks.values()), stacks
    assert doctor_cli.main(["profile", str(run.run_dir), "--ms", "1000"]) == 0
    out = capsys.readouterr().out
    assert run.wait(180) == "finished", run.state.summary()
    xplanes = sorted(p.name for p in (run.run_dir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert xplanes == ["worker-0.xplane.pb", "worker-1.xplane.pb"], out
    assert "worker:0: tensorboard/plugins/profile/" in out and "tensorboard --logdir" in out
    print(out)
