"""Telemetry events: the encoder writes lines every reader parses; the readers never trust a line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract import events
from engine.contract.events import MAX_LINE_BYTES, EventWriter, ReadStats, decode, encode, make, parse_lines, read_file
from tests import kit


def step(step: int = 1, replica: int = 0, **fields: Any) -> dict[str, Any]:
    return kit.step(replica, step, task="worker:0", **fields)


def line_of(**fields: Any) -> str:
    """A JSON line written without the encoder (as a hostile or buggy writer would)."""
    event = {"v": 1, "kind": "info", "task": "worker:0", "t": 1.0, "message": "m"}
    event.update(fields)
    return json.dumps({k: v for k, v in event.items() if v is not ...})


# --------------------------------------------------------------------------- encode / decode


@pytest.mark.parametrize("event", [
    step(),
    step(7, 3, worker=1),
    make("device", "ps:0", cpu_percent=12.5, rss_bytes=123456789, tf_bytes=0, gpu_util=None, pid=4242),
    make("status", "chief:0", state="failed", reason="boom", log_tail=["a", "é ü 中"], pid=1, exit_code=-9),
    make("info", "worker:1", message="hello", emulated_gpus=2, nested={"a": [1, 2.5, None]}),
    make("progress", "chief:0", step=10, total=100, scheduled=12, completed=10),
    make("run", "", state="running"),
    make("eval", "evaluator:0", step=10, loss=0.1),
    make("placement", "chief:0", variables=[{"name": "dense/kernel", "task": "ps:0"}]),
], ids=lambda e: e["kind"])
def test_encode_decode_round_trip(event: dict[str, Any]) -> None:
    line = encode(event)
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode(line) == event
    assert decode(line.encode("utf-8")) == event
    assert decode(line.rstrip("\n")) == event


def test_make_stamps_version_kind_task_and_time() -> None:
    event = make("info", "worker:0", message="x")
    assert event["v"] == events.EVENT_VERSION and event["kind"] == "info" and event["task"] == "worker:0"
    assert isinstance(event["t"], float) and event["t"] > 1.6e9


def test_non_finite_floats_become_null() -> None:
    event = step(loss=float("nan"))
    event.update(examples_per_sec=float("inf"), step_time=float("-inf"), extra=[float("nan"), {"x": float("inf")}])
    line = encode(event)
    assert "NaN" not in line and "Infinity" not in line
    back = decode(line)
    assert back is not None
    assert back["loss"] is None and back["examples_per_sec"] is None and back["step_time"] is None
    assert back["extra"] == [None, {"x": None}]


def test_numpy_scalars_are_written_as_numbers() -> None:
    back = decode(encode(step(loss=np.float32(0.25), step_time=np.float64(0.5), worker=np.int64(2),
                              examples_per_sec=np.float32("nan"))))
    assert back is not None
    assert back["loss"] == 0.25 and back["step_time"] == 0.5 and back["worker"] == 2
    assert back["examples_per_sec"] is None


def test_decode_reads_non_json_numbers_as_null() -> None:
    # Python's json writes these by default; a reader must neither keep them nor choke on them
    back = decode(line_of(kind="step", replica=0, step=1).replace('"message": "m"', '"loss": NaN, "x": Infinity, '
                                                                                  '"y": 1e999, "z": -Infinity'))
    assert back is not None
    assert back["loss"] is None and back["x"] is None and back["y"] is None and back["z"] is None


VALID_STEP = {"kind": "step", "replica": 0, "step": 1, "message": ...}


@pytest.mark.parametrize("line", [
    "",
    "   ",
    "hello world",
    "2024-01-01 12:00:00 INFO something",
    "[1, 2, 3]",
    '"a string"',
    "{not json}",
    '{"v":1,"kind":"step","task":"worker:0","t":1.0,"replica":0,',  # truncated
    "{" * 100_000 + "}" * 100_000,
    line_of(v=2),
    line_of(v="1"),
    line_of(v=True),
    line_of(v=...),
    line_of(kind="gossip"),
    line_of(kind=None),
    line_of(task=3),
    line_of(task=...),
    line_of(t="now"),
    line_of(t=True),
    line_of(t=None),
    line_of(t=...),
    line_of(t=10**30),  # beyond 64 bits: unusable as a time
    line_of(**{**VALID_STEP, "replica": "0"}),
    line_of(**{**VALID_STEP, "replica": -1}),
    line_of(**{**VALID_STEP, "replica": 1.0}),
    line_of(**{**VALID_STEP, "replica": True}),
    line_of(**{**VALID_STEP, "replica": ...}),
    line_of(**{**VALID_STEP, "step": "1"}),
    line_of(**{**VALID_STEP, "step": -5}),
    line_of(**{**VALID_STEP, "step": 2.5}),
    line_of(**{**VALID_STEP, "step": None}),
    line_of(**{**VALID_STEP, "step": 10**40}),
    line_of(**{**VALID_STEP, "loss": "low"}),
    line_of(**{**VALID_STEP, "loss": False}),
    line_of(**{**VALID_STEP, "examples_per_sec": [1]}),
    line_of(**{**VALID_STEP, "step_time": {}}),
], ids=lambda x: x[:60] if x else "empty")
def test_decode_rejects(line: str) -> None:
    assert decode(line) is None
    assert decode(line.encode("utf-8")) is None


def test_the_rejection_table_holds_a_valid_base() -> None:
    assert decode(line_of()) is not None
    assert decode(line_of(**VALID_STEP)) is not None


def test_decode_rejects_non_utf8() -> None:
    good = encode(make("info", "worker:0", message="x")).encode("utf-8")
    assert decode(good) is not None
    assert decode(good.replace(b'"x"', b'"\xff\xfe"')) is None


def test_decode_line_length_limit_in_bytes() -> None:
    def sized(n: int, char: str = "a") -> str:
        base = line_of(message="")
        pad = (n - len(base.encode("utf-8"))) // len(char.encode("utf-8"))
        return line_of(message=char * pad)

    at_limit = sized(MAX_LINE_BYTES)
    assert len(at_limit.encode()) == MAX_LINE_BYTES
    assert decode(at_limit) is not None
    assert decode(at_limit + "\n") is not None, "the line ending is not part of the limit"
    assert decode(at_limit.encode() + b"\n") is not None
    over = sized(MAX_LINE_BYTES + 1)
    assert decode(over) is None and decode(over.encode()) is None
    # counted in UTF-8 bytes, not characters: 30 000 three-byte characters are ~90 KB
    wide = line_of(message="中" * 30_000)
    wide_json = json.dumps({"v": 1, "kind": "info", "task": "w", "t": 1.0, "m": "中" * 30_000}, ensure_ascii=False)
    assert len(wide_json) < MAX_LINE_BYTES < len(wide_json.encode())
    assert decode(wide_json) is None and decode(wide_json.encode()) is None
    assert decode(wide) is None  # escaped by json.dumps: six bytes per character


# --------------------------------------------------------------------------- reading streams and files


def test_parse_lines_counts_bad_lines_and_keeps_samples() -> None:
    good = [encode(step(i)) for i in range(3)]
    bad = [f"garbage {i}\n" for i in range(7)]
    stats = ReadStats()
    got = list(parse_lines([good[0], *bad, "\n", good[1], b"\xff\xfe\n", good[2]], stats))
    assert [e["step"] for e in got] == [0, 1, 2]
    assert stats.good == 3 and stats.bad == 8
    assert len(stats.bad_samples) == 5 and stats.bad_samples[0] == "garbage 0\n"
    assert all(len(s) <= 200 for s in stats.bad_samples)


def test_read_file_mixing_good_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = [step(i) for i in range(5)]
    with open(path, "wb") as fh:
        fh.write(encode(good[0]).encode())
        fh.write(b"Traceback (most recent call last):\n")
        fh.write(encode(good[1]).encode())
        fh.write(b'{"v":1,"kind":"step"}\n')  # no task, no time
        fh.write(b"\xff\xfe\xfd not utf-8\n")
        fh.write(b'{"v":1,"kind":"info","task":"worker:0","t":1,"message":"' + b"x" * 1_000_000 + b'"}\n')
        fh.write(encode(good[2]).encode())
        fh.write(b"\n\n")
        fh.write(encode(good[3]).encode())
        fh.write(b"x" * (3 * MAX_LINE_BYTES + 17) + b"\n")  # over-long in several reads
        fh.write(encode(good[4]).encode())
        fh.write(encode(step(99)).encode()[:40])  # truncated last line (a writer killed mid-line)
    stats = ReadStats()
    got = read_file(path, stats)
    assert got == good
    assert stats.good == 5
    assert stats.bad == 6  # traceback, incomplete event, non-UTF-8, 1 MB line, over-long line, truncated tail
    assert all(len(s) <= 200 for s in stats.bad_samples)


def test_read_file_over_long_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode(step(1)).encode() + b"{" + b"9" * (2 * MAX_LINE_BYTES))
    stats = ReadStats()
    assert [e["step"] for e in read_file(path, stats)] == [1]
    assert stats.bad == 1


def test_read_file_line_of_exactly_the_limit(tmp_path: Path) -> None:
    event = make("info", "worker:0", message="")
    event["message"] = "m" * (MAX_LINE_BYTES - len(encode(event).rstrip("\n")))
    line = encode(event)
    assert len(line.encode()) == MAX_LINE_BYTES + 1  # the newline is not counted
    path = tmp_path / "events.jsonl"
    path.write_text(line + line.rstrip("\n") + "m\n" + encode(step(2)), encoding="utf-8")
    stats = ReadStats()
    got = read_file(path, stats)
    assert [e["kind"] for e in got] == ["info", "step"]
    assert stats.bad == 1


def test_read_file_missing_or_a_folder_reads_as_empty(tmp_path: Path) -> None:
    stats = ReadStats()
    assert read_file(tmp_path / "nope.jsonl", stats) == []
    assert stats.good == 0 and stats.bad == 0
    assert read_file(tmp_path) == []


def test_event_writer_appends_and_flushes(tmp_path: Path) -> None:
    path = tmp_path / "task" / "events.jsonl"
    writer = EventWriter(path)
    writer.write(step(1))
    assert read_file(path) == [step(1) | {"t": read_file(path)[0]["t"]}]  # flushed before close
    writer.write_line(encode(step(2)).rstrip("\n"))
    writer.write_line("not an event")
    writer.close()
    writer.write(step(3))  # after close: ignored, no error
    writer.close()
    stats = ReadStats()
    assert [e["step"] for e in read_file(path, stats)] == [1, 2]
    assert stats.bad == 1
    again = EventWriter(path)
    again.write(step(4))
    again.close()
    assert [e["step"] for e in read_file(path)] == [1, 2, 4]


def test_encoded_floats_stay_exact() -> None:
    for value in (0.1, 1e-300, 123456789.123456789, -0.0, 5e-324):
        back = decode(encode(step(loss=value)))
        assert back is not None and back["loss"] == value
        assert math.copysign(1, back["loss"]) == math.copysign(1, value)


# -- commands to supervisors


def test_commands_are_versioned_json_lines_read_strictly() -> None:
    line = events.make_command("stop", state="finished", reason="", grace_s=3.0)
    assert line.endswith("\n") and events.decode_command(line) == {"v": 1, "command": "stop", "state": "finished",
                                                                   "reason": "", "grace_s": 3.0}
    assert events.decode_command(events.make_command("restart", task="worker:1", reason="hung"))["task"] == "worker:1"
    assert events.decode_command(events.make_command("signal", task="worker:1", signal="SIGKILL")) is not None
    bad = ["stop", "restart worker:1", '{"v": 2, "command": "stop"}', '{"v": 1, "command": "format"}',
           '{"v": 1, "command": "restart"}', '{"v": 1, "command": "restart", "task": 3}',
           '{"v": 1, "command": "stop", "extra": 1}', '{"v": true, "command": "stop"}', "[]", b"\xff\xfe",
           '{"v": 1, "command": "stop", "grace_s": true}']
    assert [events.decode_command(b) for b in bad] == [None] * len(bad)
    with pytest.raises(ValueError, match="unknown command"):
        events.make_command("reboot")


def test_the_event_docs_are_generated_from_the_records() -> None:
    from engine.contract import records
    from tests.conftest import ROOT

    assert (ROOT / "docs" / "events.md").read_text(encoding="utf-8") == records.markdown(), \
        "regenerate: python -m engine.contract.records > docs/events.md"


def test_a_declared_field_of_the_wrong_type_is_refused() -> None:
    assert decode(encode(make("eval", "chief:0", step=3, loss=0.5, examples=10))) is not None
    assert decode(encode(make("eval", "chief:0", step=3, loss="low"))) is None
    assert decode(encode(make("eval", "chief:0", loss=0.5))) is None  # its step is required
    assert decode(encode(make("status", "worker:0", state="running", pid=True))) is None
    assert decode(encode(make("info", "worker:0", message="hi", training=[1]))) is None


def test_metrics_are_a_bounded_mapping_of_numbers() -> None:
    ok = make("step", "worker:0", replica=0, step=1, loss=1.0, metrics={"accuracy": 0.5, "auc": None})
    assert decode(encode(ok)) == ok
    for bad in ({"accuracy": "high"}, [0.5], {f"m{i}": 1.0 for i in range(65)}, {"": 1.0}, {"x": True}):
        assert decode(encode(make("step", "worker:0", replica=0, step=1, metrics=bad))) is None, bad
