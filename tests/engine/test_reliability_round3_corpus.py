"""Reliability, round three, as a corpus: every family of the round has cases with the message each must give.

``tests/engine/corpus/round3/*.yaml`` are presets, one defect each. Their first lines say the family
(``# family:``), the field the refusal must name (``# expect:``), what it must say (``# says:``), the hostile files
made beside them at test time (``# make:``, recipes of :data:`RECIPES`: FIFOs, corrupted records, links, loops,
keys), whether the case is ``clusterdeck export --image`` (``# export: image``) rather than a launch, and, for a
case still mishandled in a file this corpus does not own, why (``# open:``: the case is an expected failure, strict,
so its fix is noticed). ``catalogue.yaml`` names each family's cases, the presets here and in
``corpus/presets`` and the tests that need real processes (checked to be there, still asserting their words).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from engine.contract import config as config_mod
from engine.contract.config import ConfigError
from engine.control import export
from tests.engine.test_adversarial import CORPUS, assert_refused, refusals
from tests.engine.test_data_sources import png_bytes

ROOT = Path(__file__).resolve().parents[2]
ROUND3 = Path(__file__).resolve().parent / "corpus" / "round3"
CASES = sorted(ROUND3.glob("*--*.yaml"))
CASE_TIMEOUT = 20

#: The families of the round (each must have a case).
FAMILIES = {"partial-stop", "nan-loss", "tiny-metrics-hz", "huge-logs", "fifo-data-path", "slurm-program-options",
            "python-not-an-interpreter", "precreated-run-folder", "export-folder-or-link-loop",
            "rich-markup-run-name", "nosuchuser-paths", "corrupted-tfrecord", "string-labels", "int8-inputs",
            "image-folder-of-text", "dev-zero-data-path", "empty-dataset", "warm-start-template-stopped"}


# --------------------------------------------------------------------------- hostile files, made at test time


def _varint(v: int) -> bytes:
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        if not v:
            return out + bytes([b])
        out += bytes([b | 0x80])


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _record(example: bytes) -> bytes:
    return struct.pack("<Q", len(example)) + b"\0" * 4 + example + b"\0" * 4


def _images(folder: Path) -> None:
    png = png_bytes(np.zeros((10, 10, 3), np.uint8))
    for c in "ab":
        (folder / "images" / c).mkdir(parents=True, exist_ok=True)
        for i in range(20):
            (folder / "images" / c / f"{i}.png").write_bytes(png)


def _fifo(folder: Path) -> None:
    for name in ("pipe.npz", "pipe.tfrecord", "pipe.py"):
        os.mkfifo(folder / name)
    (folder / "records").mkdir()
    os.mkfifo(folder / "records" / "a.tfrecord")
    if (folder / "images").is_dir():
        os.mkfifo(folder / "images" / "a" / "00.png")


def _good_npz(folder: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(folder / "good.npz", x=rng.random((64, 4), dtype=np.float32), y=rng.integers(0, 3, 64))


def _corrupt(folder: Path) -> None:
    (folder / "bad.tfrecord").write_bytes(bytes(range(256)) * 20)
    floats = _field(2, _field(1, b"\0\0\x80"))  # a float list of 3 bytes
    entry = _field(1, b"x") + _field(2, floats)
    (folder / "floats.tfrecord").write_bytes(_record(_field(1, _field(1, entry))) * 3)


def _labels(folder: Path) -> None:
    np.savez(folder / "text-labels.npz", x=np.zeros((64, 4), np.float32), y=np.array(["cat"] * 64))


def _int8(folder: Path) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 64).astype(np.int8)
    y[0] = -5
    np.savez(folder / "int8-labels.npz", x=rng.random((64, 4), dtype=np.float32), y=y)
    tokens = rng.integers(0, 100, (64, 4)).astype(np.int8)
    tokens[0, 0] = -128
    np.savez(folder / "int8-tokens.npz", x=tokens, y=rng.integers(0, 3, 64))


def _empty(folder: Path) -> None:
    np.savez(folder / "empty.npz", x=np.zeros((0, 4), np.float32), y=np.zeros((0,), np.int64))
    (folder / "empty.tfrecord").write_bytes(b"")
    for c in "ab":
        (folder / "no-images" / c).mkdir(parents=True)
        (folder / "no-images" / c / "notes.txt").write_text("no image here\n")


def _text_images(folder: Path) -> None:
    for c in "ab":
        (folder / "text-images" / c).mkdir(parents=True)
        for i in range(20):
            (folder / "text-images" / c / f"{i}.png").write_text("not an image at all")


def _secret(folder: Path) -> None:
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "keys").mkdir()
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (home / ".ssh" / "key.png").write_bytes(png_bytes(np.zeros((10, 10, 3), np.uint8)))
    np.savez(home / ".ssh" / "data.npz", x=np.zeros((64, 4), np.float32), y=np.zeros(64, np.int64))
    (home / "keys" / "id_ed25519").write_text("a,b,c,d,y\n" + "0,0,0,0,0\n" * 64)
    (home / ".netrc").write_text("machine example.com login me password secret\n")


def _home_loop(folder: Path) -> None:
    png = png_bytes(np.zeros((10, 10, 3), np.uint8))
    for c in ("cats", "dogs"):
        (folder / "home" / c).mkdir(parents=True)
        for i in range(8):
            (folder / "home" / c / f"{i}.png").write_bytes(png)
    (folder / "home" / "loop").symlink_to(".")


def _link_out(folder: Path) -> None:
    (folder / "outside").mkdir()
    (folder / "outside" / "private.png").write_bytes(png_bytes(np.zeros((10, 10, 3), np.uint8)))
    (folder / "images" / "a" / "1.png").unlink()
    (folder / "images" / "a" / "1.png").symlink_to(folder / "outside" / "private.png")


def _loop(folder: Path) -> None:
    (folder / "loop-a.npz").symlink_to("loop-b.npz")
    (folder / "loop-b.npz").symlink_to("loop-a.npz")


RECIPES: dict[str, Callable[[Path], None]] = {
    "images": _images, "fifo": _fifo, "good-npz": _good_npz, "corrupt": _corrupt, "labels": _labels,
    "int8": _int8, "empty": _empty, "text-images": _text_images, "secret": _secret, "home-loop": _home_loop,
    "link-out": _link_out, "loop": _loop,
}


# --------------------------------------------------------------------------- the cases


def _headers(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^# (\w+): ?(.*)$", text, re.M)}


def _param(path: Path) -> object:
    open_why = _headers(path).get("open")
    marks = [pytest.mark.xfail(strict=True, reason=f"open: {open_why}")] if open_why else []
    return pytest.param(path, id=path.stem, marks=marks)


def _made(path: Path, tmp_path: Path) -> Path:
    """The case copied into a folder of its own, with the files its ``# make:`` line asks for."""
    folder = tmp_path / "case"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    for recipe in filter(None, (r.strip() for r in _headers(path).get("make", "").split(","))):
        RECIPES[recipe](folder)
    return folder / path.name


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize("path", [_param(p) for p in CASES])
def test_a_round3_case_is_refused_naming_its_field(path: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_NETNS", "0")
    headers = _headers(path)
    preset = _made(path, tmp_path)
    started = time.monotonic()
    if headers.get("export") == "image":
        out = tmp_path / "export"
        with pytest.raises(ConfigError) as exc:
            export.write_export_report(config_mod.load(preset), out, image="img:1")
        problems = exc.value.problems
        assert not out.exists(), "a refused export wrote something"
    else:
        problems = refusals(preset)
    assert_refused(problems, headers["expect"], headers["says"], path.name)
    assert time.monotonic() - started < 10


def test_every_case_says_its_family_and_what_it_expects() -> None:
    assert len(CASES) >= 25
    for path in CASES:
        headers = _headers(path)
        assert {"family", "expect", "says"} <= set(headers), path.name
        assert headers["family"] in FAMILIES, f"{path.name}: unknown family {headers['family']!r}"
        assert all(r.strip() in RECIPES for r in headers.get("make", "").split(",") if r.strip()), path.name
        config_text = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(config_text, dict) and "cluster" in config_text, path.name


def _test_source(ref: str) -> str:
    file, _, name = ref.partition("::")
    tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"{ref}: no such test"
    return ast.get_source_segment((ROOT / file).read_text(encoding="utf-8"), found[0]) or ""


def test_every_family_of_the_round_has_cases_with_their_messages() -> None:
    catalogue = yaml.safe_load((ROUND3 / "catalogue.yaml").read_text(encoding="utf-8"))["families"]
    assert set(catalogue) == FAMILIES
    for family, entries in catalogue.items():
        assert entries, family
        for entry in entries:
            if "presets" in entry:
                matched = list(ROUND3.glob(entry["presets"] + ".yaml")) + list(CORPUS.glob(entry["presets"] + ".yaml"))
                assert matched, f"{family}: no preset matches {entry['presets']!r}"
            else:
                source = _test_source(entry["test"])
                if entry.get("says"):
                    words = entry["says"]
                    module = (ROOT / entry["test"].partition("::")[0]).read_text(encoding="utf-8")
                    assert words in source or words in module, f"{family}: {entry['test']} no longer says {words!r}"
    by_family = {_headers(p)["family"] for p in CASES}
    assert by_family <= FAMILIES
