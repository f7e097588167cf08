"""Reliability, round three: every file the user names is opened by its type (no FIFO hangs, ``/dev/zero`` is not
"a folder") and parsed without tracebacks; each case of this family with its expected message, checked before
launch, as ``clusterdeck validate`` and ``clusterdeck run`` show it."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import replace
from tests.conftest import PRESETS
from tests.engine.test_cli import cli, no_traceback


def _varint(v: int) -> bytes:
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _record(example: bytes) -> bytes:
    return struct.pack("<Q", len(example)) + b"\0" * 4 + example + b"\0" * 4


def _make(kind: str, where: Path) -> tuple[str, str]:
    """(data.source, data.path) of one hostile case, made in ``where``."""
    rng = np.random.default_rng(0)
    if kind == "fifo-tfrecord":
        os.mkfifo(where / "pipe.tfrecord")
        return "tfrecord", str(where / "pipe.tfrecord")
    if kind == "fifo-npz":
        os.mkfifo(where / "pipe.npz")
        return "npz", str(where / "pipe.npz")
    if kind == "fifo-in-tfrecord-folder":  # skipped (not a regular file), so the folder holds none
        (where / "recs").mkdir()
        os.mkfifo(where / "recs" / "a.tfrecord")
        return "tfrecord", str(where / "recs")
    if kind.startswith("dev-zero-"):
        return kind[len("dev-zero-"):].replace("-", "_"), "/dev/zero"
    if kind == "corrupt-tfrecord":
        (where / "bad.tfrecord").write_bytes(bytes(range(256)) * 20)
        return "tfrecord", str(where / "bad.tfrecord")
    if kind == "tfrecord-bad-floats":
        flist = _field(2, _field(1, b"\0\0\x80"))  # 3 bytes of floats
        entry = _field(1, b"x") + _field(2, flist)
        (where / "f.tfrecord").write_bytes(_record(_field(1, _field(1, entry))) * 3)
        return "tfrecord", str(where / "f.tfrecord")
    if kind == "string-labels":
        np.savez(where / "s.npz", x=rng.normal(size=(256, 784)).astype("float32"), y=np.array(["cat"] * 256))
        return "npz", str(where / "s.npz")
    if kind == "empty-npz":
        np.savez(where / "e.npz", x=np.zeros((0, 784), "float32"), y=np.zeros((0,), "int64"))
        return "npz", str(where / "e.npz")
    if kind == "images-of-text":
        for c in "ab":
            (where / "imgs" / c).mkdir(parents=True)
            for i in range(80):
                (where / "imgs" / c / f"{i}.png").write_text("not an image at all")
        return "image_folder", str(where / "imgs")
    if kind == "fifo-among-images":
        png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
        for c in "ab":
            (where / "imgs" / c).mkdir(parents=True)
            for i in range(80):
                (where / "imgs" / c / f"{i}.png").write_bytes(png)
        os.mkfifo(where / "imgs" / "a" / "00.png")
        return "image_folder", str(where / "imgs")
    raise AssertionError(kind)


#: The family: case -> (field named, words the message must hold)
CASES = {
    "fifo-tfrecord": ("data.path", "is a FIFO (named pipe), not a regular file"),
    "fifo-npz": ("data.path", "is a FIFO (named pipe), not a regular file"),
    "fifo-in-tfrecord-folder": ("data.path", "is a folder without TFRecord files"),
    "dev-zero-npz": ("data.path", "is a character device, not a regular file"),
    "dev-zero-csv": ("data.path", "is a character device, not a regular file"),
    "dev-zero-tfrecord": ("data.path", "is a character device, not a regular file"),
    "dev-zero-image-folder": ("data.path", "is a character device; expected a folder"),
    "corrupt-tfrecord": ("data.path", "expected a TFRecord file"),
    "tfrecord-bad-floats": ("data.path", "is not a tf.train.Example (a float list of 3 bytes"),
    "string-labels": ("data.path", "must be whole class ids; got 'cat' (text)"),
    "empty-npz": ("data.size", "has 0 examples"),
    "images-of-text": ("data.path", "0.png' is not an image (it starts with 'not an i')"),
    "fifo-among-images": ("data.path", "00.png' is a FIFO (named pipe); expected an image file"),
}


def _config(source: str, path: str) -> config_mod.RunConfig:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    shape = (32, 32, 3) if source == "image_folder" else (784,)
    return replace(cfg, data=replace(cfg.data, source=source, path=path, shape=shape, size=4096))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_hostile_data_file_is_refused_naming_the_file_and_field(case: str, tmp_path: Path) -> None:
    source, path = _make(case, tmp_path)
    field, words = CASES[case]
    problems = datasets.check(_config(source, path))
    assert problems, f"{case}: accepted"
    assert problems[0].field == field and words in problems[0].message, problems[0]


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_fifo_as_data_hangs_neither_validate_nor_run(command: str, tmp_path: Path) -> None:
    source, path = _make("fifo-tfrecord", tmp_path)
    preset = tmp_path / "fifo.yaml"
    config_mod.save(_config(source, path), preset)
    args = [command, str(preset)] + (["--out", str(tmp_path / "runs")] if command == "run" else [])
    out = cli(tmp_path, *args, timeout=60)
    no_traceback(out)
    assert out.returncode != 0 and "is a FIFO (named pipe), not a regular file" in out.stdout + out.stderr
