"""A task's log: TensorFlow's start-up noise told apart from what the user needs to read; its size bounded
(:func:`cap_log`) and its lines bounded as they are read (:class:`LineTail`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

NOISE_PREFIXES = ("WARNING: All log messages before absl", "I0000 ", "W0000 ", "E0000 ")


def is_noise(line: str) -> bool:
    """TensorFlow start-up chatter (oneDNN, absl, cpu feature guard, cuda probing)."""
    text = line.strip()
    if not text:
        return True
    if text.startswith(NOISE_PREFIXES):
        return True
    markers = ("oneDNN custom operations", "cpu_feature_guard", "To enable the following instructions",
               "rebuild TensorFlow with the appropriate compiler flags", "Unable to register cu",
               "computation placer already registered", "could not find cuda drivers",
               "cuda_executor", "TF-TRT Warning", "port.cc:", "cudart_stub", "cuInit",
               "Created device /job:", "onednn", "AVX2 AVX512", "absl::InitializeLog")
    return any(m in text for m in markers)


def log_tail(path: Path, lines: int = 20) -> list[str]:
    """The last meaningful lines of a task log, TensorFlow start-up noise left out."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    kept = [x.rstrip()[:300] for x in text.splitlines() if not is_noise(x)][-lines:]
    # keep the event well under the reader's line limit, whatever the characters
    while kept and sum(len(x.encode("utf-8")) for x in kept) > 16 * 1024:
        kept.pop(0)
    return kept


# -- bounded logs: a task printing without pause must not fill the disk

#: A task's ``log.txt`` is cut when it passes this size …
LOG_CAP_BYTES = 64 * 1024 * 1024
#: … keeping its first bytes (the start-up, the first errors) …
LOG_HEAD_BYTES = 4 * 1024 * 1024
#: … and its latest bytes, with a line saying how much was left out between them.
LOG_TAIL_BYTES = 4 * 1024 * 1024
CUT_MARK = b"--- clusterdeck: log cut here: "


def cap_log(path: Path, cap: int = LOG_CAP_BYTES, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES) -> int:
    """Cut ``path`` where it passed ``cap`` bytes: keep its first ``head`` bytes, a line saying what was left out,
    and its last ``tail`` bytes; returns the bytes left out (0: nothing cut).

    The task keeps writing through its own descriptor, opened for appending (``O_APPEND``): after the file is
    truncated its next writes land at the new end, so the file is bounded without the task knowing. Never
    follows a symbolic link (a planted one is left alone)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= cap:
            return 0
        size = info.st_size
        latest = os.pread(fd, tail, size - tail)
        cut_at = latest.find(b"\n")  # start the kept tail at a line (a line of a progress bar: at a \r)
        if cut_at < 0:
            cut_at = latest.find(b"\r")
        latest = latest[cut_at + 1:] if 0 <= cut_at < len(latest) - 1 else latest
        dropped = size - head - len(latest)
        os.ftruncate(fd, head)
        mark = CUT_MARK + f"{dropped} bytes left out (the log passed {cap // (1024 * 1024)} MiB: its first " \
            f"{head // (1024 * 1024)} MiB and its latest output are kept) ---\n".encode()
        os.write(fd, b"\n" + mark + latest)  # one write: appended whole, before what the task writes next
        return dropped
    except OSError:
        return 0
    finally:
        os.close(fd)


#: The longest line a log view holds (a progress bar redrawn with ``\r`` for hours is one "line").
MAX_LOG_LINE = 64 * 1024


class LineTail:
    """Splits a log's bytes, as they come, into lines: at ``\\n``, and a line redrawn with ``\\r`` (a progress bar)
    is its last drawing; a partial line is held to :data:`MAX_LOG_LINE` bytes (the rest of it is dropped and
    the line says so), so a 290 MB log of ``\\r`` alone costs 64 KiB, not its size."""

    def __init__(self, limit: int = MAX_LOG_LINE) -> None:
        self.limit = limit
        self.partial = b""
        self.cut = 0  # bytes of the current line dropped

    def feed(self, data: bytes) -> list[str]:
        parts = (self.partial + data).split(b"\n")
        self.partial = parts.pop()
        lines = [self._text(raw) for raw in parts]
        if b"\r" in self.partial:  # a redrawn line: only its latest drawing matters
            self.partial = self.partial.rsplit(b"\r", 1)[1] if not self.partial.endswith(b"\r") else \
                self.partial.rstrip(b"\r").rsplit(b"\r", 1)[-1]
        if len(self.partial) > self.limit:
            self.cut += len(self.partial) - self.limit
            self.partial = self.partial[-self.limit:]
        return lines

    def _text(self, raw: bytes) -> str:
        raw = raw.rstrip(b"\r")
        if b"\r" in raw:
            raw = raw.rsplit(b"\r", 1)[-1]
        if len(raw) > self.limit:
            self.cut += len(raw) - self.limit
            raw = raw[-self.limit:]
        text = raw.decode("utf-8", "replace")
        if self.cut:
            text = f"[{self.cut} bytes of this line left out] {text}"
            self.cut = 0
        return text
