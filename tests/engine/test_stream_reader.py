"""The one reader of event streams (engine.contract.events.StreamDecoder): the launcher and the supervisor use it."""

from __future__ import annotations

import inspect

from engine.contract import events
from engine.contract.run_folder import MAX_LINE_BYTES


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
