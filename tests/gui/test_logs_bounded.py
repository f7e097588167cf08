"""The app's log tail stays small on a huge log of progress bars (a line redrawn with \r, never ended)."""

from __future__ import annotations

from pathlib import Path

from gui.logs import LogTail


def test_a_huge_carriage_return_log_costs_kilobytes(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    bar = b"".join(b"\r%d%% [" % i + b"#" * 200 + b"]" for i in range(100))
    with open(log, "wb") as fh:
        fh.write(b"started\n")
        for _ in range(2000):  # ~4 MB of one line redrawn, never ended
            fh.write(bar)
    tail = LogTail(log)
    lines = []
    for _ in range(10):
        lines += tail.poll()
    assert [text for _, text in lines] == ["started"]
    assert len(tail.splitter.partial) <= 64 * 1024
    with open(log, "ab") as fh:
        fh.write(b"\ndone\n")
    assert [text for _, text in tail.poll()][-1] == "done"
