"""Reliability, round three: ``clusterdeck export --image`` copies into the image's build folder exactly the files
the run reads, never a folder named by a field the run does not use, never credentials, never through a link out
of the folder or round a loop of links; a failure midway (a real full disk) leaves no partial export, and the
export says what it copied and its size."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from engine.contract import config as config_mod
from engine.contract.config import ConfigError, replace
from engine.control import export
from tests.engine.test_cli import cli, no_traceback
from tests.engine.test_data_sources import png_bytes

PNG = png_bytes(np.zeros((10, 10, 3), np.uint8))


def _config(source: str = "synthetic", path: str = "", **model: Any) -> config_mod.RunConfig:
    raw = {"name": "export", "cluster": {"hosts": [
        {"name": "a", "address": "10.0.0.1", "tasks": [{"role": "worker", "index": 0}]},
        {"name": "b", "address": "10.0.0.2", "tasks": [{"role": "worker", "index": 1}]}]},
        "data": {"source": source, "path": path, "shape": [10, 10, 3] if source == "image_folder" else [784],
                 "classes": 2, "size": 64},
        "model": {"name": "mlp", **model}, "training": {"global_batch_size": 8, "steps": 10}}
    return config_mod.from_dict(raw)


def _home(where: Path, loop: bool = False) -> Path:
    """A home folder: keys, a .netrc, two class folders of images (a loop of links in each) and, with
    ``loop``, a link to itself (home/loop/loop/... for ever)."""
    home = where / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (home / ".ssh" / "key.png").write_bytes(PNG)  # an image, but in a hidden folder: no class of its own
    (home / ".netrc").write_text("machine example.com login me password secret\n")
    if loop:
        (home / "loop").symlink_to(".")
    for c in ("cats", "dogs"):
        (home / c).mkdir()
        for i in range(3):
            (home / c / f"{i}.png").write_bytes(PNG)
        (home / c / "notes.txt").write_text("not read by the run\n")
        (home / c / "deeper").mkdir()
        (home / c / "deeper" / "x.png").write_bytes(PNG)
        (home / c / "deeper" / "up").symlink_to("..")  # a loop inside a class folder
    return home


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def test_a_folder_named_by_a_field_the_run_does_not_read_is_never_copied(tmp_path: Path) -> None:
    home = _home(tmp_path, loop=True)
    cfg = _config("synthetic", str(home))  # data.path left in a config whose source reads no file
    cfg = replace(cfg, model=replace(cfg.model, script=str(home / ".ssh" / "id_rsa")))  # model.name is mlp
    out = tmp_path / "out"
    report = export.write_export_report(cfg, out, image="img:1")
    assert report.skipped == [] and report.copied == []
    assert not (out / "user").exists() and not (out / export.IMAGE_FILES_NOTE).exists()
    assert "COPY user/" not in (out / "Dockerfile").read_text()
    assert not any(".ssh" in f or ".netrc" in f or "home" in f for f in _files_under(out))


def test_an_image_folder_in_a_home_copies_its_images_alone_and_says_what_and_how_much(tmp_path: Path) -> None:
    home = _home(tmp_path)
    out = tmp_path / "out"
    report = export.write_export_report(_config("image_folder", str(home)), out, image="img:1")
    assert report.skipped == []
    assert _files_under(out / "user" / "home") == sorted(
        f"{c}/{name}" for c in ("cats", "dogs") for name in ("0.png", "1.png", "2.png", "deeper/x.png"))
    (copy,) = report.copied
    assert copy.field == "data.path" and copy.size == 8 * len(PNG)
    assert copy.describe() == f"user/home: 8 files, {8 * len(PNG)} bytes, from data.path {str(home)!r}"
    note = (out / export.IMAGE_FILES_NOTE).read_text()
    assert copy.describe() in note and "user/home/cats/deeper/x.png" in note
    assert out / export.IMAGE_FILES_NOTE in report.paths and out / "user" / "home" in report.paths
    manifest = yaml.safe_load((out / "tfjob.yaml").read_text())
    env = {e["name"]: e["value"] for e in manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert config_mod.loads(env["CLUSTERDECK_CONFIG"]).data.path == f"{export.IMAGE_USER_DIR}/home"
    # a link of the home to itself is a class the run reads (Keras follows a class folder's link): through
    # it, the run would read .ssh's image, so the export is refused naming it
    (home / "loop").symlink_to(".")
    _refused(_config("image_folder", str(home)), tmp_path / "again", str(home / "loop" / ".ssh" / "key.png"),
             "inside .ssh/, a folder of credentials")


def test_a_tfrecord_folder_copies_its_records_alone(tmp_path: Path) -> None:
    recs = tmp_path / "recs"
    recs.mkdir()
    for name in ("a.tfrecord", "b.tfrec"):
        (recs / name).write_bytes(b"\0" * 100)
    (recs / ".env").write_text("TOKEN=secret\n")  # not a record: never read, never copied
    (recs / "README").write_text("about the records\n")
    report = export.write_export_report(_config("tfrecord", str(recs)), tmp_path / "out", image="img:1")
    assert _files_under(tmp_path / "out" / "user" / "recs") == ["a.tfrecord", "b.tfrec"]
    assert report.copied[0].describe().startswith("user/recs: 2 files, 200 bytes")


def _refused(cfg: config_mod.RunConfig, out: Path, *words: str) -> str:
    with pytest.raises(export.UnsafeCopy) as exc:
        export.write_export_report(cfg, out, image="img:1")
    assert not out.exists(), "a refused export wrote something"
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name], "a temporary folder was left behind"
    message = str(exc.value)
    for w in words:
        assert w in message, message
    return message


@pytest.mark.parametrize("name, words", [
    (".ssh/data.npz", "inside .ssh/, a folder of credentials"),
    (".aws/credentials", "inside .aws/, a folder of credentials"),
    ("keys/id_ed25519", "named as an SSH key"),
    ("server.pem", "a .pem file holds a key or certificate"),
    (".netrc", ".netrc holds credentials"),
])
def test_credentials_are_never_copied_into_an_image(tmp_path: Path, name: str, words: str) -> None:
    secret = tmp_path / name
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(b"secret")
    message = _refused(_config("npz", str(secret)), tmp_path / "out", "data.path", str(secret), words)
    assert message.startswith("export: data.path:") and "looks like a secret" in message
    # through a link named innocently: the file it leads to is what would be copied
    link = tmp_path / "data.npz"
    link.symlink_to(secret)
    _refused(_config("npz", str(link)), tmp_path / "out", f"(through a link, {str(secret)!r})", words)
    # a script model's file, too
    _refused(_config(path="", name="script", script=str(secret)), tmp_path / "out", "model.script", words)


def test_a_link_leading_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "private.png"
    outside.parent.mkdir()
    outside.write_bytes(PNG)
    imgs = tmp_path / "imgs"
    (imgs / "a").mkdir(parents=True)
    (imgs / "a" / "0.png").write_bytes(PNG)
    (imgs / "a" / "1.png").symlink_to(outside)
    _refused(_config("image_folder", str(imgs)), tmp_path / "out", "data.path", str(imgs / "a" / "1.png"),
             f"leads to {str(outside)!r} through a symbolic link, outside {str(imgs)!r}")
    (imgs / "a" / "1.png").unlink()
    (imgs / "b").symlink_to(outside.parent)  # a class folder that is a link out
    _refused(_config("image_folder", str(imgs)), tmp_path / "out", str(imgs / "b" / "private.png"), "outside")
    (imgs / "b").unlink()
    (imgs / "b").symlink_to("a")  # a link inside the folder is fine: its files are copied as files
    export.write_export_report(_config("image_folder", str(imgs)), tmp_path / "out", image="img:1")
    assert _files_under(tmp_path / "out" / "user" / "imgs") == ["a/0.png", "b/0.png"]
    assert not (tmp_path / "out" / "user" / "imgs" / "b").is_symlink()


def test_a_loop_of_links_is_refused_never_followed(tmp_path: Path) -> None:
    (tmp_path / "x.npz").symlink_to("y.npz")
    (tmp_path / "y.npz").symlink_to("x.npz")
    _refused(_config("npz", str(tmp_path / "x.npz")), tmp_path / "out", "data.path", "is a loop of symbolic links")
    imgs = tmp_path / "imgs"
    (imgs / "a").mkdir(parents=True)
    (imgs / "a" / "0.png").write_bytes(PNG)
    (imgs / "a" / "loop.png").symlink_to("loop.png")
    _refused(_config("image_folder", str(imgs)), tmp_path / "out", str(imgs / "a" / "loop.png"), "loop")


def test_a_missing_file_skips_the_tfjob_alone(tmp_path: Path) -> None:
    report = export.write_export_report(_config("npz", str(tmp_path / "gone.npz")), tmp_path / "out", image="i:1")
    assert [p.field for p in report.skipped] == ["data.path"] and "does not exist" in report.skipped[0].message
    assert (tmp_path / "out" / "config.yaml").is_file() and not (tmp_path / "out" / "user").exists()


def test_a_full_disk_midway_leaves_no_partial_export(tiny_tmpfs: Path, tmp_path: Path) -> None:
    data = tmp_path / "big.npz"
    data.write_bytes(os.urandom(3 << 20))  # more than the 1 MiB disk holds
    out = tiny_tmpfs / "out"
    with pytest.raises(OSError) as exc:
        export.write_export_report(_config("npz", str(data)), out, image="img:1")
    assert "No space left" in str(exc.value)
    assert list(tiny_tmpfs.iterdir()) == [], "a partial export or its temporary folder was left"


def test_an_export_into_an_existing_folder_replaces_what_it_writes_and_keeps_the_rest(tmp_path: Path) -> None:
    imgs = tmp_path / "imgs"
    (imgs / "a").mkdir(parents=True)
    (imgs / "a" / "0.png").write_bytes(PNG)
    out = tmp_path / "out"
    (out / "user" / "imgs" / "a").mkdir(parents=True)
    (out / "user" / "imgs" / "a" / "stale.png").write_bytes(PNG)  # from an earlier export: no longer read
    (out / "mine.txt").write_text("the user's own\n")
    export.write_export_report(_config("image_folder", str(imgs)), out, image="img:1")
    assert _files_under(out / "user") == ["imgs/a/0.png"]
    assert (out / "mine.txt").read_text() == "the user's own\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "a temporary folder was left"


def test_the_command_refuses_a_secret_naming_it_and_lists_what_it_copied(tmp_path: Path) -> None:
    home = _home(tmp_path)
    preset = tmp_path / "leak.yaml"
    config_mod.save(_config("npz", str(home / ".ssh" / "id_rsa")), preset)
    out = cli(tmp_path, "export", str(preset), "--out", str(tmp_path / "x"), "--image", "img:1")
    no_traceback(out)
    assert out.returncode == 2 and "data.path" in out.stderr and "looks like a secret" in out.stderr, out.stderr
    assert not (tmp_path / "x").exists()
    config_mod.save(_config("image_folder", str(home)), preset)
    out = cli(tmp_path, "export", str(preset), "--out", str(tmp_path / "y"), "--image", "img:1")
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "y" / export.IMAGE_FILES_NOTE) in out.stdout.splitlines()
    assert "user/home: 8 files" in (tmp_path / "y" / export.IMAGE_FILES_NOTE).read_text()


def test_an_unsafe_copy_is_a_config_error_for_every_caller() -> None:
    assert issubclass(export.UnsafeCopy, ConfigError)  # the app and the command already show ConfigError


def test_the_held_out_file_and_a_program_are_copied_and_named_where_the_image_holds_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name in ("train.npz", "held.npz"):
        np.savez(tmp_path / name, x=rng.random((64, 784), dtype=np.float32), y=rng.integers(0, 2, 64))
    cfg = _config("npz", str(tmp_path / "train.npz"))
    cfg = replace(cfg, validation=replace(cfg.validation, path=str(tmp_path / "held.npz"), every=5))
    report = export.write_export_report(cfg, tmp_path / "out", image="img:1")
    assert [(c.field, c.target) for c in report.copied] == [("data.path", "user/train.npz"),
                                                            ("validation.path", "user/held.npz")]
    inside = export.config_in_image(cfg)
    assert (inside.data.path, inside.validation.path) == (f"{export.IMAGE_USER_DIR}/train.npz",
                                                           f"{export.IMAGE_USER_DIR}/held.npz")
    program = tmp_path / "train.py"
    program.write_text("print('training')\n")
    with_program = replace(cfg, program=config_mod.Program(script=str(program)))
    report = export.write_export_report(with_program, tmp_path / "program", image="img:1")
    assert [c.field for c in report.copied] == ["program.script"]  # the program reads no data.* of ClusterDeck's
    assert export.config_in_image(with_program).program.script == f"{export.IMAGE_USER_DIR}/train.py"  # type: ignore[union-attr]
