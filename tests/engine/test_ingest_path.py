"""The launcher's ingest path: lines written as received, held and flushed in batches, never half a line."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import replace
from engine.control.launcher import Run, _line_to_write
from engine.control.run_record import SERIES_FLUSH_S
from engine.observe.run_reader import read_events
from tests.conftest import PRESETS

#: A stand-in supervisor (the run's ``python``): reads the spec, then writes the lines of the file named
#: by ``$INGEST_SCRIPT`` on its stdout, one per entry; an entry ``["sleep", s]`` pauses; at the end every
#: task reads ``finished``.
SUPERVISOR = r'''#!{python}
import json, os, sys, time
spec = json.loads(sys.stdin.buffer.readline())
out = sys.stdout.buffer
for entry in json.load(open(os.environ["INGEST_SCRIPT"])):
    if isinstance(entry, list):
        out.flush()
        time.sleep(entry[1])
    else:
        out.write(entry.encode("utf-8", "surrogateescape"))
out.flush()
for t in spec["tasks"]:
    line = {{"v": 1, "kind": "status", "task": t["name"], "t": time.time(), "state": "finished"}}
    out.write((json.dumps(line) + "\n").encode())
out.flush()
'''


def step_line(n: int, **extra: Any) -> str:
    event = {"v": 1, "kind": "step", "task": "worker:0", "t": 1.7e9 + n, "replica": 0, "step": n, "loss": 0.5,
             "examples_per_sec": 100.0, "step_time": 0.01}
    event.update(extra)
    return json.dumps(event, separators=(",", ":")) + "\n"


def strict(line: bytes) -> dict[str, Any]:
    """A line as a strict JSON reader takes it (no NaN, no Infinity)."""
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")
    value = json.loads(line, parse_constant=refuse)
    assert isinstance(value, dict)
    return value


def run_with(tmp_path: Path, entries: list[Any], listener: Any = None,
             on_start: Any = None) -> tuple[Run, list[dict[str, Any]]]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(entries))
    stand_in = tmp_path / "supervisor-stand-in"
    stand_in.write_text(SUPERVISOR.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=1000, checkpoint_every=0, restarts=0))
    os.environ["INGEST_SCRIPT"] = str(script)  # the supervisor's environment is the launcher's
    try:
        run = Run(cfg, runs_root=tmp_path / "runs", python=str(stand_in), isolate=False, checked=True)
        seen: list[dict[str, Any]] = []
        run.add_listener(seen.append)
        if listener is not None:
            run.add_listener(listener)
        run.start()
        if on_start is not None:
            on_start(run)
        assert run.wait(60) == "finished", run.state.summary()
    finally:
        del os.environ["INGEST_SCRIPT"]
    return run, seen


def test_the_file_holds_every_event_as_delivered_in_strict_json_lines(tmp_path: Path) -> None:
    entries = [step_line(1), step_line(2, loss=float("nan")),  # Python's json writes NaN: not JSON
               "  " + step_line(3).rstrip("\n") + " \r\n",  # odd spacing and a CR
               step_line(4, note="Infinity is a word"), step_line(5, big=10**30), "garbage\n", step_line(6)]
    run, seen = run_with(tmp_path, entries)
    data = run.folder.events.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    written = [strict(line) for line in lines]  # every line strict JSON, whole
    # the lifecycle reads back as delivered, in order; the step samples are in the run's tiered store
    assert [events.decode(line) for line in lines] == [e for e in seen if e["kind"] != "step"]
    assert not any(e["kind"] == "step" for e in written)
    steps = {e["step"]: e for e in read_events(run.folder.path) if e["kind"] == "step"}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    assert steps[2].get("loss") is None and steps[1]["loss"] == 0.5  # NaN kept as a missing value
    assert run.state.replicas[0].step == 6


@pytest.mark.parametrize("line", [step_line(1), step_line(2, generation=7), " " + step_line(3).rstrip() + "\r\n",
                                  step_line(4, loss=float("nan")), step_line(5, x=[1, {"y": "}"}])])
@pytest.mark.parametrize("generation", [0, 3])
def test_a_line_kept_as_received_decodes_to_the_event_the_launcher_delivers(line: str, generation: int) -> None:
    raw = line.encode()
    event = events.decode(raw)
    assert event is not None
    if generation:
        event["generation"] = generation  # what the reader does
    kept = _line_to_write(raw, b',"generation":%d}\n' % generation if generation else b"")
    written = kept if kept is not None else events.encode(event).encode()
    assert written.endswith(b"\n") and written.count(b"\n") == 1
    assert events.decode(written) == event
    strict(written)
    if "NaN" in line:
        assert kept is None  # encoded again: the file holds strict JSON


def test_events_reach_the_file_within_the_flush_interval_while_the_run_runs(tmp_path: Path) -> None:
    """Every sample is on disk (the run's store) soon after the launcher delivered it, also while events keep
    coming."""
    entries: list[Any] = []
    for n in range(1, 301):
        entries.append(step_line(n))
        if n % 3 == 0:
            entries.append(["sleep", 0.005])
    entries.append(["sleep", 0.5])  # a quiet spell: the last step must not wait for the end of the run
    entries.append(step_line(301))
    entries.append(["sleep", 0.5])
    seen_at: dict[int, float] = {}
    in_file_at: dict[int, float] = {}
    stop = threading.Event()

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "step":
            seen_at[e["step"]] = time.monotonic()

    def watch(path: Path) -> None:
        while not stop.is_set():  # the samples' store, read as a reopening view reads it
            now = time.monotonic()
            for e in read_events(path):
                if e["kind"] == "step":
                    in_file_at.setdefault(int(e["step"]), now)
            time.sleep(0.05)

    watchers: list[threading.Thread] = []

    def on_start(run: Run) -> None:
        watchers.append(threading.Thread(target=watch, args=(run.folder.path,), daemon=True))
        watchers[0].start()

    try:
        run_with(tmp_path, entries, on_event, on_start)
    finally:
        time.sleep(0.05)
        stop.set()
        for w in watchers:
            w.join(5)
    assert sorted(in_file_at) == list(range(1, 302))
    late = {n: in_file_at[n] - seen_at[n] for n in seen_at if in_file_at[n] - seen_at[n] > SERIES_FLUSH_S + 0.3}
    assert not late, f"{len(late)} events reached the file late, e.g. (s): {dict(list(late.items())[:5])}"


# -- the writer



def test_held_lines_are_written_in_order_by_flush_write_line_and_close(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = events.EventWriter(path)
    writer.hold(events.encode(events.make("info", "a", message="1")).encode())
    writer.hold(events.encode(events.make("info", "a", message="2")).encode())
    assert path.read_bytes() == b"" and writer.held_bytes > 0 and writer.held_since > 0
    writer.flush()
    assert [e["message"] for e in events.read_file(path)] == ["1", "2"] and writer.held_bytes == 0
    writer.hold(events.encode(events.make("info", "a", message="3")).encode())
    writer.write(events.make("info", "a", message="4"))  # after what is held
    writer.hold(events.encode(events.make("info", "a", message="5")).encode())
    writer.close()  # flushes
    assert [e["message"] for e in events.read_file(path)] == ["1", "2", "3", "4", "5"]


def test_a_full_disk_during_a_flush_leaves_only_whole_lines(tiny_tmpfs: Path) -> None:
    path = tiny_tmpfs / "events.jsonl"
    writer = events.EventWriter(path)
    line = events.encode(events.make("info", "launcher", message="x" * 3000)).encode()
    with pytest.raises(OSError) as failure:
        for _ in range(100):
            for _ in range(37):  # batches that do not end on the disk's last byte
                writer.hold(line)
            writer.flush()
    assert "No space left" in str(failure.value)
    writer.close()
    data = path.read_bytes()
    assert data.endswith(b"\n") and len(data) > 100_000
    assert all(events.decode(x) is not None for x in data.split(b"\n")[:-1])


@pytest.mark.parametrize("generation", [0, 3])
def test_the_reader_keeps_and_encodes_the_lines_that_line_to_write_does_wherever_its_reads_end(generation: int) -> None:
    """The reader checks a read for JSON's non-numbers once (not each line): a line begun in the read before (an
    ``Infinity`` cut in two among them) is still checked whole."""
    import io
    from types import SimpleNamespace

    from engine.control.supervisor_links import read_supervisor

    lines = [step_line(1), step_line(2, loss=float("inf")), step_line(3), step_line(4, loss=float("nan")),
             " " + step_line(5).rstrip() + "\r\n", step_line(6), "not json\n", step_line(7)]
    data = "".join(lines).encode()
    suffix = b',"generation":%d}\n' % generation if generation else b""
    want = [(e, _line_to_write(raw, suffix)) for raw in (x.encode() for x in lines)
            if (e := events.decode(raw)) is not None]
    for e, _ in want:
        if generation:
            e["generation"] = generation

    class Reads(io.RawIOBase):  # a stream whose reads end at ``cut`` bytes apart
        def __init__(self, cut: int) -> None:
            self.data, self.cut, self.at = data, cut, 0

        def read1(self, n: int = -1) -> bytes:
            piece = self.data[self.at:self.at + min(n, self.cut)]
            self.at += len(piece)
            return piece

    for cut in (1, 7, 50, 97, 150, len(data)):
        got: list[Any] = []
        sup = SimpleNamespace(generation=generation, proc=SimpleNamespace(wait=lambda: 0))
        read_supervisor(sup, Reads(cut), got.append, events.ReadStats())  # type: ignore[arg-type]
        pairs = [pair for item in got if isinstance(item, list) for pair in item]
        assert pairs == want, cut
