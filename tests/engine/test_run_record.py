"""The run's record on a real folder: events.jsonl written in bursts of whole lines, run.json once per
burst with the run's fields (``created`` kept), and a folder that fails or vanishes reported once."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.contract import events
from engine.contract.run_folder import RunFolder
from engine.control.run_record import FLUSH_S, RunRecord
from engine.observe.run_reader import read_events
from tests import kit
from tests.conftest import require


class Recorded:
    """What the record asked of its run: ``describe()`` calls (one per run.json written) and failures."""

    def __init__(self) -> None:
        self.described = 0
        self.failures: list[str] = []
        self.state = "running"
        self.step = 0

    def describe(self) -> dict[str, Any]:
        self.described += 1
        return {"name": "r", "state": self.state, "mode": "sync", "launcher": {"pid": 1, "host": "h", "token": ""},
                "supervisors": {}, "tasks": {"worker:0": {"pid": 7, "state": "running", "host": "localhost"}},
                "step": self.step, "summary": {}}


@pytest.fixture
def folder(tmp_path: Path) -> RunFolder:
    return RunFolder.create(tmp_path, "r")


@pytest.fixture
def run() -> Recorded:
    return Recorded()


def record_of(folder: RunFolder, run: Recorded, **cadence: Any) -> RunRecord:
    return RunRecord(folder, describe=run.describe, on_failure=run.failures.append, **cadence)


def step(n: int) -> dict[str, Any]:
    """A lifecycle event (``events.jsonl``'s): step samples go to the tiers (see the tests at the end)."""
    return events.make("progress", "worker:0", step=n, total=100)


def lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "half a line in the file"
    out = [events.decode(line) for line in data.splitlines()]
    assert all(e is not None for e in out), "a line the decoder rejects"
    return [e for e in out if e is not None]


def busy() -> bool:
    return False


def dry() -> bool:
    return True


# --------------------------------------------------------------------------- events.jsonl


def test_events_are_held_while_the_queue_is_busy_and_written_when_it_runs_dry(folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run, flush_s=60.0)
    for n in range(5):
        record.write_event(step(n))
        record.catch_up(busy)
    assert folder.events.read_bytes() == b""  # held: the queue is still busy
    record.catch_up(dry)
    assert [e["step"] for e in lines(folder.events)] == [0, 1, 2, 3, 4]
    record.close()


def test_a_busy_queue_still_flushes_after_flush_s_or_flush_bytes(folder: RunFolder, run: Recorded) -> None:
    assert FLUSH_S == 0.1  # the launcher's cadence (README: at least every 0.1 s)
    clock = kit.Clock()
    record = record_of(folder, run, flush_s=0.5, flush_bytes=1 << 30, clock=clock)
    record.write_event(step(1))
    clock.advance(0.25)
    record.catch_up(busy)
    assert folder.events.read_bytes() == b""  # not yet
    clock.advance(0.25)
    record.catch_up(busy)
    assert [e["step"] for e in lines(folder.events)] == [1]

    by_size = record_of(RunFolder.create(folder.path.parent, "b"), run, flush_s=60.0, flush_bytes=1000)
    first = step(1)
    by_size.write_event(first)
    by_size.catch_up(busy)
    assert by_size.folder.events.read_bytes() == b""
    for n in range(2, 2 + 1000 // len(events.encode(first))):
        by_size.write_event(step(n))
    by_size.catch_up(busy)
    assert len(lines(by_size.folder.events)) > 1
    record.close()
    by_size.close()


def test_a_line_as_received_is_written_as_is_and_close_flushes_what_is_held(folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run, flush_s=60.0)
    raw = b'{"v":1,"kind":"info","task":"worker:0","t":1.5,"message":"as sent","generation":2}\n'
    record.write_event(events.decode(raw) or {}, raw)
    record.write_event(events.make("info", "launcher", message="encoded"))
    record.close()
    data = folder.events.read_bytes()
    assert data.startswith(raw)
    assert [e["message"] for e in lines(folder.events)] == ["as sent", "encoded"]
    assert not record.writing


@contextlib.contextmanager
def small_files(limit: int = 4096) -> Iterator[int]:
    """Files of this process may grow to ``limit`` bytes only (a real failed write: the kernel writes part
    of a line, then refuses). Only around the writes: pytest's own output (maybe to a file) must not meet it."""
    old_limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limits[1]))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limits)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_failed_write_leaves_whole_lines_fails_the_run_once_and_stops_writing(
        folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run, flush_s=60.0)
    record.write_meta("starting", strict=True)  # before the file is full
    sent = 0
    with small_files() as limit:
        for _ in range(20):
            for _ in range(10):
                record.write_event(events.make("info", "launcher", message="x" * 150, i=sent))
                sent += 1
            record.catch_up(dry)
            if run.failures:
                break
    assert len(run.failures) == 1, run.failures
    assert run.failures[0].startswith("the run folder cannot be written (")
    assert str(folder.events) in run.failures[0]
    kept = lines(folder.events)  # whole lines only, each one valid
    assert 0 < len(kept) < sent and folder.events.stat().st_size <= limit
    assert [e["i"] for e in kept] == list(range(len(kept)))
    assert not record.writing
    with small_files():
        record.write_event(events.make("info", "launcher", message="after"))
        record.catch_up(dry)
        record.check_folder()
    assert len(run.failures) == 1 and len(lines(folder.events)) == len(kept)
    record.close()


# --------------------------------------------------------------------------- run.json


def test_run_json_has_the_runs_fields_and_keeps_created(folder: RunFolder, run: Recorded) -> None:
    # a run.json from long ago (a caller's own run_dir): its creation time is kept
    folder.run_json.write_text(json.dumps({"state": "pending", "created": "2001-02-03T04:05:06"}), encoding="utf-8")
    record = record_of(folder, run)
    record.write_meta("starting", strict=True)
    meta = folder.read_meta()
    assert meta["state"] == "starting" and meta["created"] == "2001-02-03T04:05:06"
    assert meta["tasks"] == {"worker:0": {"pid": 7, "state": "running", "host": "localhost"}}
    assert {"name", "mode", "launcher", "supervisors", "step", "summary", "updated"} <= set(meta)
    run.step = 42
    record.write_meta()  # the run's own state of the moment
    meta = folder.read_meta()
    assert (meta["state"], meta["step"], meta["created"]) == ("running", 42, "2001-02-03T04:05:06")
    record.write_meta("finished", ended="2001-02-03T05:00:00")
    meta = json.loads(folder.run_json.read_text(encoding="utf-8"))
    assert (meta["state"], meta["ended"], meta["created"]) == ("finished", "2001-02-03T05:00:00",
                                                                "2001-02-03T04:05:06")
    record.close()


def test_run_json_is_written_once_per_burst_of_status_events(folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run, flush_s=60.0, meta_interval_s=60.0)
    record.write_meta("starting", strict=True)
    assert run.described == 1
    for n in range(50):  # steps alone never rewrite run.json
        record.write_event(step(n))
        record.catch_up(busy)
    record.catch_up(dry)
    assert run.described == 1
    for n in range(20):  # a burst of status events
        record.write_event(events.make("status", f"worker:{n}", state="running", pid=100 + n))
        record.catch_up(busy)
    assert run.described == 1  # the burst goes on
    record.catch_up(dry)
    assert run.described == 2
    record.catch_up(dry)
    assert run.described == 2  # nothing new since
    record.write_event(events.make("run", "launcher", state="running"))
    record.catch_up(dry)
    assert run.described == 3
    record.close()


def test_a_tick_rewrites_run_json_only_after_the_interval_and_new_events(folder: RunFolder, run: Recorded) -> None:
    clock = kit.Clock()
    record = record_of(folder, run, meta_interval_s=0.5, clock=clock)
    record.write_meta("starting", strict=True)
    clock.advance(0.25)
    record.update_meta()
    assert run.described == 1  # too soon
    clock.advance(0.25)
    record.update_meta()
    assert run.described == 1  # nothing came since
    record.write_event(step(1))
    record.update_meta()
    assert run.described == 2
    record.close()
    clock.advance(1.0)
    record.write_event(step(2))
    record.update_meta()
    assert run.described == 2  # closed: the run's end was the last word


# --------------------------------------------------------------------------- the folder


def test_a_vanished_folder_is_reported_and_never_recreated(folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run)
    record.write_meta("starting", strict=True)
    record.write_event(step(1))
    record.catch_up(dry)
    record.check_folder()
    assert run.failures == []
    shutil.rmtree(folder.path)
    record.check_folder()
    assert len(run.failures) == 1 and "run folder vanished" in run.failures[0]
    assert str(folder.path) in run.failures[0]
    record.check_folder()
    record.write_event(step(2))
    record.catch_up(dry)
    assert len(run.failures) == 1  # said once
    record.close()
    assert not folder.path.exists()


def test_an_event_file_made_immutable_is_found_by_the_folder_check_before_any_write(folder: RunFolder,
                                                                                   run: Recorded) -> None:
    record = record_of(folder, run)
    record.write_meta("starting", strict=True)
    record.write_event(step(1))
    record.catch_up(dry)
    done = subprocess.run(["chattr", "+i", str(folder.events)], capture_output=True)
    require(done.returncode == 0, f"chattr +i does not work here: {done.stderr.decode().strip()}", needed_in_ci=False)
    try:
        record.check_folder()  # nothing held: only the check can tell
        assert len(run.failures) == 1, run.failures
        assert "run folder cannot be written" in run.failures[0] and "Operation not permitted" in run.failures[0]
        record.check_folder()
        assert len(run.failures) == 1  # said once
    finally:
        subprocess.run(["chattr", "-i", str(folder.events)], check=False, capture_output=True)
    record.close()


def test_run_json_in_a_vanished_folder_fails_the_run_unless_it_ended(folder: RunFolder, run: Recorded) -> None:
    record = record_of(folder, run)
    shutil.rmtree(folder.path)
    with pytest.raises(OSError):
        record.write_meta("starting", strict=True)  # at start: the caller says the folder cannot be written
    record.write_meta("failed")  # the end was decided: nothing more to say
    assert run.failures == []
    record.write_meta()
    assert len(run.failures) == 1 and "run folder vanished" in run.failures[0]
    assert not folder.path.exists()
    record.close()


def test_samples_go_to_the_tiers_and_a_deleted_folder_is_not_recreated_by_them(folder: RunFolder,
                                                                             run: Recorded) -> None:
    record = record_of(folder, run)
    record.write_event(events.make("step", "worker:0", replica=0, step=1, loss=0.5))
    record.flush()
    assert lines(folder.events) == [] and (folder.path / "series" / "raw").is_dir()
    shutil.rmtree(folder.path)
    for n in range(2, 5):
        record.write_event(events.make("step", "worker:0", replica=0, step=n, loss=0.5, t=time.time() + 3600 * n))
    record.flush()
    record.check_folder()
    assert not folder.path.exists()
    assert len(run.failures) == 1 and "vanished" in run.failures[0]
    record.close()


def test_the_runs_end_reaches_events_jsonl_only_after_every_sample_before_it_is_in_the_tiers(
        folder: RunFolder, run: Recorded) -> None:
    """A follower (attach, a remote front end) stops once it reads the run's end and reads the tiers one last
    time: the samples held for the tiers (written every half second, not when the queue runs dry) are
    written before the end is."""
    record = record_of(folder, run)
    record.write_event(events.make("status", "worker:0", state="running"))
    record.catch_up(lambda: True)
    for n in range(1, 31):
        record.write_event(events.make("step", "worker:0", replica=0, step=n, loss=1.0 / n))
    record.write_event(events.make("run", "launcher", state="finished"))
    record.catch_up(lambda: True)  # the queue ran dry: the end is written at once, and the samples with it
    assert [e["kind"] for e in lines(folder.events)] == ["status", "run"]
    steps = [e["step"] for e in read_events(folder.path) if e["kind"] == "step"]
    assert steps == list(range(1, 31))
    record.close()
