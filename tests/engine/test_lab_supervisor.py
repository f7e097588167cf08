"""Supervisors that share a machine's processes (the lab's hosts do; so do a host's supervisor and the one started
again for it after its connection was lost) end only what is theirs, and a later one takes over from an earlier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.contract.run_folder import RunFolder
from engine.control.supervisor import (
    RUN_DIR_ENV,
    SUPERVISOR_ENV,
    end_earlier_supervisor,
    kill_run_processes,
    write_record,
)
from tests.conftest import alive, wait_gone

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def spawn() -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def start(run_dir: Path, mark: str, *extra: str) -> int:
        env = dict(os.environ, **{RUN_DIR_ENV: str(run_dir), SUPERVISOR_ENV: mark})
        proc = subprocess.Popen([sys.executable, "-c", SLEEP, *extra], env=env)
        started.append(proc)
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_supervisor_ends_only_the_processes_it_marked(tmp_path: Path, spawn: object) -> None:
    mine = spawn(tmp_path, "lab2/100-aaaa")  # type: ignore[operator]
    later = spawn(tmp_path, "lab2/200-bbbb")  # type: ignore[operator]
    other_host = spawn(tmp_path, "lab3/300-cccc")  # type: ignore[operator]
    assert kill_run_processes(str(tmp_path), "lab2/100-aaaa") == [mine]
    assert wait_gone([mine], 5) == [] and alive([later, other_host]) == [later, other_host]
    # the launcher's own sweep at the end of a run: every process of the run folder
    assert sorted(kill_run_processes(str(tmp_path))) == sorted([later, other_host])


def test_a_host_started_again_ends_its_earlier_supervisor_and_what_it_left(tmp_path: Path, spawn: object) -> None:
    folder = RunFolder(tmp_path)
    record = folder.host_dir("lab2") / "supervisor.json"
    # the earlier supervisor of lab2 (a stand-in whose command line names the module), its task and another host's
    earlier = spawn(tmp_path, "", "-m", "engine.control.supervisor")  # type: ignore[operator]
    left = spawn(tmp_path, "lab2/100-aaaa")  # type: ignore[operator]
    other_host = spawn(tmp_path, "lab3/300-cccc")  # type: ignore[operator]
    write_record(folder, record, "lab2/100-aaaa")  # what a supervisor writes of itself, made the stand-in's
    data = json.loads(record.read_text())
    data.update(pid=earlier, created=psutil.Process(earlier).create_time())
    record.write_text(json.dumps(data))
    ended = end_earlier_supervisor(record, str(tmp_path), "lab2", "lab2/400-dddd")
    assert sorted(ended) == sorted([earlier, left])
    assert wait_gone([earlier, left], 5) == [] and alive([other_host]) == [other_host]
    # a record of another machine (or boot) is never acted on
    again = spawn(tmp_path, "", "-m", "engine.control.supervisor")  # type: ignore[operator]
    data.update(pid=again, created=psutil.Process(again).create_time(), node="elsewhere")
    record.write_text(json.dumps(data))
    assert end_earlier_supervisor(record, str(tmp_path), "lab2", "lab2/400-dddd") == []
    assert alive([again]) == [again]
