"""The one reader of event streams (engine.contract.events.StreamDecoder): the launcher and the supervisor use it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from engine.contract import events
from engine.contract.run_folder import MAX_LINE_BYTES, OVERLONG


def _line(step: int) -> bytes:
    return events.encode(events.make("step", "worker:0", replica=0, step=step, loss=0.5)).encode()


def test_events_come_with_their_raw_lines_across_chunks() -> None:
    decoder = events.StreamDecoder()
    lines = [_line(1), _line(2), _line(3)]
    data = b"".join(lines)
    got = decoder.feed(data[:10]) + decoder.feed(data[10:70]) + decoder.feed(data[70:]) + decoder.finish()
    assert [e["step"] for e, _ in got] == [1, 2, 3]
    assert [raw for _, raw in got] == lines
    assert decoder.stats.good == 3 and decoder.stats.bad == 0


def test_bad_and_overlong_lines_are_counted_blank_ones_ignored() -> None:
    stats = events.ReadStats()
    decoder = events.StreamDecoder(stats)
    got = decoder.feed(b"garbage\n\n   \n" + b"x" * (MAX_LINE_BYTES + 5) + b"\n" + _line(7) + b'{"v":1,"kind":"nope"}\n')
    assert [e["step"] for e, _ in got] == [7]
    assert stats.bad == 3 and stats.good == 1
    assert "over-long line" in stats.bad_samples


def test_the_last_line_without_a_newline_is_read_at_the_end() -> None:
    decoder = events.StreamDecoder()
    assert decoder.feed(_line(4).rstrip(b"\n")) == []
    assert [e["step"] for e, _ in decoder.finish()] == [4]
    assert decoder.finish() == []


def test_the_launcher_and_the_supervisor_share_it() -> None:
    from engine.control import launcher, supervisor

    for module in (launcher, supervisor):
        source = inspect.getsource(module)
        assert "StreamDecoder" in source
        assert "events.decode(" not in source, module.__name__  # no second copy of the decoding loop


# --------------------------------------------------------------- a relay passes its task's own samples on undecoded

NAMES = ["worker:0", "chief:0", "ps:12", 'odd "quoted" name', "tâche:0", "evaluator:0"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind, fields", [
    ("step", {"replica": 3, "step": 17, "loss": 0.25, "examples_per_sec": 812.5, "metrics": {"accuracy": 0.5}}),
    ("device", {"cpu_percent": 91.0, "rss_bytes": 123456789, "pid": 4242, "gpu_util": None}),
])
def test_the_emitters_sample_lines_begin_with_the_tasks_prefix(name: str, kind: str, fields: dict[str, Any]) -> None:
    line = events.encode(events.make(kind, name, **fields)).encode()  # what engine.runtime.emitter writes
    prefixes = events.sample_prefixes(name)
    assert line.startswith(prefixes) and events.own_sample(line, prefixes)
    assert not events.own_sample(line, events.sample_prefixes(name + "x"))
    assert not events.own_sample(line, events.sample_prefixes("w"))


def _own(**fields: Any) -> bytes:
    return events.encode(events.make("step", "worker:0", t=1.0, replica=0, step=1, loss=0.5, **fields)).encode()


@pytest.mark.parametrize("line", [
    _own().replace(b'"task":"worker:0"', b'"task":"worker:1"'),  # another task
    _own().replace(b'{"v":1,', b'{"v": 1,'),  # odd spacing
    _own().replace(b'"kind":"step",', b'"kind": "step",'),
    b" " + _own(),
    _own().replace(b'{"v":1,', b'{"v":2,'),  # an unknown version
    _own().replace(b'{"v":1,', b'{"v":1.0,'),
    _own().replace(b'"kind":"step"', b'"kind":"eval"'),  # not a sample
    events.encode(events.make("status", "worker:0", t=1.0, state="failed", reason="boom")).encode(),
    events.encode(events.make("info", "worker:0", t=1.0, message="hello")).encode(),
    _own()[:-1],  # no newline: the last line of an ended stream
    _own()[:-12] + b"\n",  # truncated
    _own()[:-1] + b"\r\n",
    _own()[:-2] + b',"task":"worker:1"}\n',  # JSON's last key wins: it would name another task
    _own()[:-2] + b',"task" :"worker:1"}\n',
    _own()[:-2] + b',"\\u0074ask":"worker:1"}\n',  # spelled with an escape
    _own()[:-2] + b',"kind":"status","state":"failed"}\n',  # it would be a terminal status
    _own()[:-2] + b',"v":2}\n',
    _own(metrics={"task": 1.0}),  # a metric of that name: decoded, as before
    OVERLONG,
    b"",
    b"\n",
])
def test_any_other_line_is_not_an_own_sample(line: bytes) -> None:
    assert not events.own_sample(line, events.sample_prefixes("worker:0"))


def test_relayed_gives_own_samples_undecoded_and_decodes_the_rest() -> None:
    stats = events.ReadStats()
    decoder = events.StreamDecoder(stats, own=events.sample_prefixes("worker:0"))
    own, device = _own(), events.encode(events.make("device", "worker:0", cpu_percent=1.0, pid=1)).encode()
    other = _own().replace(b'"worker:0"', b'"worker:1"')
    status = events.encode(events.make("status", "worker:0", state="failed", reason="boom")).encode()
    spaced = b'{"v": 1, "kind": "step", "task": "worker:0", "t": 1.0, "replica": 0, "step": 2}\n'
    data = (own + other + b"garbage\n" + status + device + own + b"\n" + device + spaced
            + b"x" * (MAX_LINE_BYTES + 5) + b"\n\n" + own[:30])
    got = decoder.relayed(decoder.lines.feed(data))
    assert [(e is None, raw) for e, raw in got] == [(True, own), (False, other), (False, status),
                                                   (True, device + own + device), (False, spaced)]  # in a row: joined
    assert [e["task"] for e, _ in got if e is not None] == ["worker:1", "worker:0", "worker:0"]  # as decoded
    assert stats.good == 7 and stats.bad == 2  # the garbage and the over-long line
    assert decoder.relayed(decoder.lines.finish()) == [] and stats.bad == 3  # the half line left at the end
    assert events.StreamDecoder().relayed([own]) == [(events.decode(own), own)]  # no task of its own: decoded


def test_a_bad_own_sample_is_counted_by_its_reader() -> None:
    """The relay does not check the fields of an own sample: the launcher's decoder does, and counts it."""
    bad = _own().replace(b'"replica":0', b'"replica":-1')
    relay = events.StreamDecoder(own=events.sample_prefixes("worker:0"))
    assert relay.relayed([bad]) == [(None, bad)]
    launcher = events.StreamDecoder()
    assert launcher.feed(bad) == [] and launcher.stats.bad == 1
