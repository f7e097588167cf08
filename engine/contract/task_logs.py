"""A task's log: TensorFlow's start-up noise told apart from what the user needs to read."""

from __future__ import annotations

import os
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
