"""The run folder: one bounded line splitter, run.json kept honest, atomic event lines on a full disk."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.contract import events
from engine.contract.run_folder import (
    OVERLONG,
    LineSplitter,
    RunFolder,
    bounded_lines,
    process_alive,
    process_token,
)
from tests.conftest import ROOT


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
       limit=st.integers(min_value=1, max_value=20))
def test_the_chunk_splitter_cuts_lines_as_the_stream_reader_does(data: bytes, cuts: list[int], limit: int) -> None:
    data = data.replace(b"\x00", b"\n")  # plenty of line ends
    expected = list(bounded_lines(io.BytesIO(data), limit))
    splitter = LineSplitter(limit)
    got: list[bytes] = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        got += splitter.feed(data[start:cut])
        start = max(start, cut)
    got += splitter.finish()
    assert got == expected


def test_an_over_long_line_reads_as_overlong_and_the_next_line_survives() -> None:
    splitter = LineSplitter(8)
    assert splitter.feed(b"0123456789") == [OVERLONG]
    assert splitter.feed(b"abc\nok\n") == [b"ok\n"]


def test_run_json_keeps_created_and_is_never_recreated_in_a_vanished_folder(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "a run")
    first = folder.write_meta(state="running")
    time.sleep(1.1)
    later = folder.write_meta(state="finished")
    assert later["created"] == first["created"] and later["updated"] != first["updated"]
    assert folder.read_meta()["state"] == "finished"
    for path in folder.path.iterdir():
        path.unlink()
    folder.path.rmdir()
    with pytest.raises(FileNotFoundError):
        folder.write_meta(state="failed")
    assert not folder.path.exists()


@pytest.fixture
def launcher_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], RunFolder]]:
    """A process that records itself as a run's launcher in run.json, then waits."""
    folder = RunFolder.create(tmp_path, "launched")
    code = ("import sys, time; from engine.contract.run_folder import RunFolder, launcher_identity; "
            "RunFolder(sys.argv[1]).write_meta(state='running', launcher=launcher_identity()); "
            "print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder.path)], cwd=ROOT, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    try:
        yield proc, folder
    finally:
        proc.kill()
        proc.wait()


def test_a_run_whose_launcher_died_reads_interrupted(launcher_process: tuple[subprocess.Popen[bytes], RunFolder]) -> None:
    proc, folder = launcher_process
    assert folder.effective_state() == "running"
    proc.kill()  # kill -9 of the CLI or the app
    proc.wait()
    assert folder.read_meta()["state"] == "running"  # what the file says…
    assert folder.effective_state() == "interrupted"  # …and what a reader makes of it


def test_a_reused_pid_is_not_taken_for_the_launcher(tmp_path: Path) -> None:
    me = os.getpid()
    assert process_alive(me, process_token(me))
    assert not process_alive(me, "another-boot:123")
    folder = RunFolder.create(tmp_path, "r")
    folder.write_meta(state="finished", launcher={"pid": me, "host": "x", "token": ""})
    assert folder.effective_state() == "finished"  # an ended run is what it says
    folder.write_meta(state="running", launcher={"pid": me, "host": "elsewhere", "token": "t"})
    assert folder.effective_state() == "running"  # another host cannot be checked from here



def test_a_full_disk_never_leaves_half_an_event_line(tiny_tmpfs: Path) -> None:
    path = tiny_tmpfs / "events.jsonl"
    writer = events.EventWriter(path)
    big = "x" * 3000
    with pytest.raises(OSError) as failure:
        for i in range(10_000):
            writer.write(events.make("info", "launcher", message=big, i=i))
    assert "No space left" in str(failure.value)
    writer.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) > 100
    assert all(events.decode(line) is not None for line in lines[:-1])
    keep = events.EventWriter(path, keep_going=True)
    keep.write(events.make("info", "launcher", message=big))
    assert keep.error is not None and keep.error.errno == 28
    keep.write(events.make("info", "launcher", message="after"))  # no raise: the file is left alone
    assert path.read_bytes().endswith(b"}\n")


def test_a_replaced_or_deleted_event_file_is_noticed(tmp_path: Path) -> None:
    writer = events.EventWriter(tmp_path / "e.jsonl")
    assert writer.alive()
    (tmp_path / "e.jsonl").unlink()
    assert not writer.alive()
    writer.close()


def test_run_json_state_is_valid_json_after_many_writes(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "r")
    for i in range(50):
        folder.write_meta(state="running", step=i)
    assert json.loads(folder.run_json.read_text())["step"] == 49
    assert [p.name for p in folder.path.iterdir()] == ["run.json"]  # no temporary file left
