"""Reliability, round three: bounded logs. A task printing without pause does not fill the disk (its log is cut
with the first and the latest output kept, and the run says so once); a log view never holds a partial line of
hundreds of MB (a progress bar redrawn with ``\\r`` for hours)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine.contract.run_folder import RunFolder
from engine.contract.task_logs import CUT_MARK, LOG_CAP_BYTES, MAX_LOG_LINE, LineTail, cap_log, log_tail
from tests.engine.test_faults import BOTH, fake_run, start_and_wait_for_steps

MIB = 1024 * 1024


def test_cap_log_keeps_the_head_and_the_latest_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    with open(log, "ab") as fh:  # the task's own descriptor, as the supervisor opens it
        fh.write(b"start-up line\n" + b"a" * (3 * MIB) + b"\n")
        for i in range(3000):
            fh.write(f"line {i} ".encode() + b"b" * 1000 + b"\n")
        fh.flush()
        dropped = cap_log(log, cap=2 * MIB, head=MIB, tail=MIB)
        assert dropped > 0 and os.path.getsize(log) < 2.2 * MIB
        fh.write(b"after the cut\n")  # O_APPEND: the task's next write lands at the new end
        fh.flush()
    data = log.read_bytes()
    assert data.startswith(b"start-up line\n") and CUT_MARK in data
    assert data.endswith(b"line 2999 " + b"b" * 1000 + b"\nafter the cut\n")
    assert log_tail(log, 1) == ["after the cut"]
    assert cap_log(log, cap=10 * MIB) == 0  # under the cap: untouched


def test_cap_log_never_follows_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"v" * (3 * MIB))
    link = tmp_path / "log.txt"
    link.symlink_to(victim)
    assert cap_log(link, cap=MIB, head=1024, tail=1024) == 0
    assert victim.stat().st_size == 3 * MIB


def test_a_log_view_holds_no_line_of_hundreds_of_mb() -> None:
    tail = LineTail()
    lines: list[str] = []
    bar = b"".join(f"{i}% |{'#' * 50}|\r".encode() for i in range(100)) * 2000  # ~12 MB of \r only
    for chunk in range(0, len(bar), 4 * MIB):
        lines += tail.feed(bar[chunk:chunk + 4 * MIB])
        assert len(tail.partial) <= MAX_LOG_LINE
    assert lines == []
    lines += tail.feed(b"\n")
    assert lines == [f"99% |{'#' * 50}|"]
    lines = tail.feed(b"y" * (3 * MAX_LOG_LINE) + b"\n")
    assert len(lines) == 1 and lines[0].startswith(f"[{2 * MAX_LOG_LINE} bytes of this line left out]")


def test_a_task_printing_without_pause_does_not_fill_the_disk(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="flood", worker_1="flood_cr")
    cuts: list[dict[str, Any]] = []
    run.add_listener(lambda e: cuts.append(e) if e["kind"] == "info" and e.get("log_cut") else None)
    start_and_wait_for_steps(run, 30, BOTH)
    folder = RunFolder(run.run_dir)
    written = {name: 0 for name in BOTH}
    peak = 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for name in BOTH:
            peak = max(peak, folder.task_log(name).stat().st_size)
            try:
                with open(f"/proc/{run.state.tasks[name].pid}/io", encoding="ascii") as fh:
                    written[name] = int(next(x for x in fh if x.startswith("wchar:")).split()[1])
            except OSError:
                pass
        time.sleep(0.1)
    run.stop()
    assert min(written.values()) > 3 * LOG_CAP_BYTES, f"the stand-in wrote too little to prove anything: {written}"
    assert peak < LOG_CAP_BYTES + 32 * MIB, peak
    for name in BOTH:
        size = folder.task_log(name).stat().st_size
        assert size < LOG_CAP_BYTES + 32 * MIB
        with open(folder.task_log(name), "rb") as fh:
            assert fh.read(64).startswith(b"--- ")  # the head (the task's start) is kept
    assert sorted(e["task"] for e in cuts) == sorted(BOTH), "the run says once per task that it cut its log"
    assert "was cut" in cuts[0]["message"]

