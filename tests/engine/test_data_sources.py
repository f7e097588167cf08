"""Data sources: the shipped digits, Keras' local cache, the user's .npz/.csv/TFRecord/image folder.

Up-front checks (engine.contract.datasets, no TensorFlow) name the file and the problem; each source
also trains for a few steps in real task processes.
"""

from __future__ import annotations

import gzip
import math
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import Cluster, ConfigError, Data, Host, Model, Problem, RunConfig, Task, Training, replace
from engine.control import preflight
from engine.control.launcher import Run
from tests.conftest import ROOT

# --------------------------------------------------------------------------- helpers


def make_config(source: str = "synthetic", shape: tuple[int, ...] = (784,), classes: int = 10, size: int = 8192,
                path: str | Path = "", model: str = "mlp", workers: int = 1, gpus: int = 0, steps: int = 8,
                batch: int = 32, **extra: Any) -> RunConfig:
    data_fields = {k: v for k, v in extra.items() if k in ("x_key", "y_key", "x_dtype")}
    model_fields = {k: v for k, v in extra.items() if k in ("hidden", "vocab_size", "embed_dim", "heads", "script")}
    host = Host(name="local", gpus=gpus, tasks=tuple(Task("worker", i) for i in range(workers)))
    return RunConfig(
        name=f"{source}-{model}",
        cluster=Cluster(hosts=(host,)),
        data=Data(source=source, shape=shape, classes=classes, size=size, path=str(path), **data_fields),
        model=Model(name=model, **{"hidden": (32,), **model_fields}),
        training=Training(global_batch_size=batch, steps=steps, learning_rate=0.05, metrics_hz=1e6),
    )


def only_problem(problems: list[Problem], field: str, *parts: str) -> Problem:
    assert problems, "expected a problem, got none"
    matching = [p for p in problems if p.field == field and all(part in p.message for part in parts)]
    assert matching, f"no problem at {field!r} mentions {parts}; got {[str(p) for p in problems]}"
    return matching[0]


def run_to_end(config: RunConfig, runs_root: Path, timeout: float = 90) -> list[dict[str, Any]]:
    assert config_mod.validate(config) == [], [str(p) for p in config_mod.validate(config)]
    assert datasets.check(config) == [], [str(p) for p in datasets.check(config)]
    run = Run(config, runs_root=runs_root)
    seen: list[dict[str, Any]] = []
    run.add_listener(seen.append)
    run.start()
    state = run.wait(timeout)
    assert state == "finished", run.state.summary()
    steps = [e for e in seen if e["kind"] == "step"]
    assert steps and max(e["step"] for e in steps) == config.training.steps
    assert all(e["loss"] is not None and math.isfinite(e["loss"]) for e in steps)
    return steps


def write_npz(path: Path, n: int = 256, shape: tuple[int, ...] = (6, 6), classes: int = 4, seed: int = 0,
              **arrays: np.ndarray) -> Path:
    rng = np.random.default_rng(seed)
    base = {"x": rng.standard_normal((n, *shape)).astype(np.float32),
            "y": rng.integers(0, classes, n).astype(np.int64)}
    base.update(arrays)
    np.savez(path, **base)
    return path


def write_csv(path: Path, rows: int = 96, features: int = 5, classes: int = 3, label: str = "label") -> Path:
    rng = np.random.default_rng(1)
    header = [f"f{i}" for i in range(features)]
    header.insert(2, label)  # the label column need not be the last
    lines = [",".join(header)]
    for _ in range(rows):
        values = [f"{v:.4f}" for v in rng.standard_normal(features)]
        values.insert(2, str(int(rng.integers(0, classes))))
        lines.append(",".join(values))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# Keras' cache formats, tiny: what keras.datasets.<name>.load_data() leaves under $KERAS_HOME/datasets


def fake_mnist(home: Path, n: int = 256) -> None:
    rng = np.random.default_rng(2)
    (home / "datasets").mkdir(parents=True, exist_ok=True)
    np.savez(home / "datasets" / "mnist.npz",
             x_train=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), y_train=rng.integers(0, 10, n, dtype=np.uint8),
             x_test=rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), y_test=rng.integers(0, 10, 40, dtype=np.uint8))


def fake_fashion_mnist(home: Path, n: int = 128) -> None:
    rng = np.random.default_rng(3)
    folder = home / "datasets" / "fashion-mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", n), ("t10k", 32)):
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress(struct.pack(">II", 2049, count) + labels.tobytes()))
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes()))


def fake_cifar10(home: Path, per_batch: int = 32) -> None:
    rng = np.random.default_rng(4)
    folder = home / "datasets" / "cifar-10-batches-py-target" / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=4))


FAKES = {"mnist": fake_mnist, "fashion_mnist": fake_fashion_mnist, "cifar10": fake_cifar10}


@pytest.fixture
def keras_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "keras-home"
    home.mkdir()
    monkeypatch.setenv("KERAS_HOME", str(home))
    return home


def png_bytes(pixels: np.ndarray) -> bytes:
    """A grey (h, w) or RGB (h, w, 3) uint8 image as PNG, written with zlib alone."""
    h, w = pixels.shape[:2]
    colour = 0 if pixels.ndim == 2 else 2
    raw = b"".join(b"\x00" + pixels[row].tobytes() for row in range(h))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_image_folder(root: Path, classes: int = 3, per_class: int = 16, size: int = 10) -> Path:
    rng = np.random.default_rng(5)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"{i}.png").write_bytes(png_bytes(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)))
    return root


def write_tfrecord(path: Path, n: int = 96, length: int = 12, classes: int = 3, vocab: int = 50,
                   label_of: Any = None, x_name: str = "tokens", floats: bool = False) -> Path:
    import tensorflow as tf

    rng = np.random.default_rng(6)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(n):
            x = rng.integers(0, vocab, length)
            y = int(rng.integers(0, classes)) if label_of is None else label_of(i)
            xf = tf.train.Feature(float_list=tf.train.FloatList(value=x.astype(float))) if floats else \
                tf.train.Feature(int64_list=tf.train.Int64List(value=x))
            example = tf.train.Example(features=tf.train.Features(feature={
                x_name: xf, "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))}))
            writer.write(example.SerializeToString())
    return path


# --------------------------------------------------------------------------- shipped data


def test_digits_ship_inside_the_engine_package_small_and_documented() -> None:
    path = datasets.DIGITS_PATH
    assert path.is_file() and path.relative_to(ROOT / "engine")
    assert path.stat().st_size < 1024 * 1024
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    assert "Licence" in readme and "CC BY 4.0" in readme and "scikit-learn" in readme
    cfg = make_config("digits", shape=(8, 8, 1), size=5000)
    train = datasets.load_arrays(cfg)
    assert train.x.shape == (1497, 8, 8) and train.y.shape == (1497,)
    assert set(np.unique(train.y)) == set(range(10)) and train.x.max() == 16
    x, y = datasets.prepare(cfg, train)
    assert x.shape == (1497, 8, 8, 1) and x.dtype == np.float32 and 0.0 <= x.min() and x.max() == 1.0
    assert y.dtype == np.int32
    xe, _ = datasets.prepare(cfg, datasets.load_arrays(cfg, "eval"), "eval")
    assert xe.shape == (300, 8, 8, 1)
    # held out: no test image is a training image
    assert not {r.tobytes() for r in xe} & {r.tobytes() for r in x}
    assert datasets.check(cfg) == []


def test_digits_shape_must_hold_64_values() -> None:
    problems = config_mod.validate(make_config("digits", shape=(784,)))
    only_problem(problems, "data.shape", "'digits' examples are 8 x 8 = 64 values", "got [784]")


# --------------------------------------------------------------------------- Keras' cache, never a download


@pytest.mark.parametrize("source", ["mnist", "fashion_mnist", "cifar10"])
def test_keras_data_set_not_cached_says_where_it_looked(source: str, keras_home: Path) -> None:
    shape = (32, 32, 3) if source == "cifar10" else (28, 28)
    problems = datasets.check(make_config(source, shape=shape, model="cnn"))
    p = only_problem(problems, "data.source", f"{source!r} is not in Keras' local cache", str(keras_home),
                     "never downloads")
    assert str(keras_home / "datasets") in p.message
    assert not any((keras_home / "datasets").rglob("*")), "the check must not create or fetch anything"


@pytest.mark.parametrize("source", ["mnist", "fashion_mnist", "cifar10"])
def test_fake_keras_caches_read_in_keras_formats(source: str, keras_home: Path) -> None:
    FAKES[source](keras_home)
    shape = (32, 32, 3) if source == "cifar10" else (28, 28, 1)
    cfg = make_config(source, shape=shape, model="cnn")
    assert datasets.check(cfg) == []
    x, y = datasets.prepare(cfg, datasets.load_arrays(cfg))
    assert x.shape[1:] == shape and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1.0
    assert y.min() >= 0 and y.max() < 10
    xe, _ = datasets.prepare(cfg, datasets.load_arrays(cfg, "eval"), "eval")
    assert 0 < len(xe) < len(x)
    if source == "cifar10":  # channels last, as keras.datasets.cifar10 gives them
        raw = pickle.loads((keras_home / "datasets" / "cifar-10-batches-py-target" / "cifar-10-batches-py"
                            / "data_batch_1").read_bytes())[b"data"][0]
        assert np.allclose(x[0, 0, 0] * 255, [raw[0], raw[1024], raw[2048]], atol=1e-3)


def test_keras_cache_too_small_for_the_global_batch(keras_home: Path) -> None:
    fake_mnist(keras_home, n=20)
    problems = datasets.check(make_config("mnist", shape=(784,), batch=32))
    only_problem(problems, "data.size", "mnist.npz", "has 20 examples", "fewer than one global batch (32)")


def test_cifar_pickles_cannot_run_code(keras_home: Path) -> None:
    fake_cifar10(keras_home)
    target = keras_home / "datasets" / "cifar-10-batches-py-target" / "cifar-10-batches-py" / "data_batch_2"
    target.write_bytes(b"cos\nsystem\n(S'echo unsafe'\ntR.")
    problems = datasets.check(make_config("cifar10", shape=(32, 32, 3), model="cnn"))
    only_problem(problems, "data.source", "data_batch_2", "refusing to load os.system")


# --------------------------------------------------------------------------- the user's .npz


def npz_case(tmp: Path, name: str) -> tuple[RunConfig, str, tuple[str, ...]]:
    f = tmp / "data.npz"
    base = dict(shape=(36,), classes=4, path=f)
    if name == "missing file":
        return make_config("npz", **base), "data.path", (f"{str(f)!r}: no such file",)
    if name == "missing key":
        write_npz(f)
        return make_config("npz", x_key="images", **base), "data.x_key", (str(f), "has no array 'images'",
                                                                          "expected one of 'x', 'y'")
    if name == "wrong shape":
        write_npz(f, shape=(5, 5))
        return make_config("npz", **base), "data.shape", (str(f), "shape [5, 5] = 25 values",
                                                          "expected 36 values", "data.shape [36]")
    if name == "label out of range":
        y = np.zeros(256, dtype=np.int64)
        y[37] = 12
        write_npz(f, y=y)
        return make_config("npz", **base), "data.classes", (str(f), "label 12", "(example 37)",
                                                            "expected labels from 0 to 3")
    if name == "negative label":
        y = np.zeros(256, dtype=np.int64)
        y[5] = -1
        write_npz(f, y=y)
        return make_config("npz", **base), "data.classes", ("label -1", "(example 5)")
    if name == "fractional label":
        write_npz(f, y=np.full(256, 1.5))
        return make_config("npz", **base), "data.path", (str(f), "must be whole class ids", "1.5")
    if name == "too small for the global batch":
        write_npz(f, n=20)
        return make_config("npz", batch=32, **base), "data.size", (str(f), "has 20 examples",
                                                                   "fewer than one global batch (32)")
    if name == "inputs and labels differ in length":
        write_npz(f, y=np.zeros(200, dtype=np.int64))
        return make_config("npz", **base), "data.path", ("256 examples in 'x' but 200 in 'y'",)
    if name == "token id beyond the vocabulary":
        write_npz(f, x=np.full((256, 36), 7, dtype=np.int32))
        cfg = make_config("npz", model="embedding", vocab_size=5, **base)
        return cfg, "model.vocab_size", (str(f), "token id 7", "expected ids from 0 to 4")
    if name == "not an npz file":
        f.write_text("hello", encoding="utf-8")
        return make_config("npz", **base), "data.path", (str(f), "cannot be read as .npz")
    if name == "epochs longer than the file":
        write_npz(f, n=100)
        cfg = make_config("npz", size=8192, **base)
        cfg = replace(cfg, training=replace(cfg.training, steps=None, epochs=2))
        return cfg, "data.size", ("has 100 examples", "expected data.size at most 100")
    raise AssertionError(name)


NPZ_CASES = ["missing file", "missing key", "wrong shape", "label out of range", "negative label", "fractional label",
             "too small for the global batch", "inputs and labels differ in length",
             "token id beyond the vocabulary", "not an npz file", "epochs longer than the file"]


@pytest.mark.parametrize("case", NPZ_CASES)
def test_bad_npz_named_with_its_problem(case: str, tmp_path: Path) -> None:
    cfg, field, parts = npz_case(tmp_path, case)
    assert config_mod.validate(cfg) == []  # nothing wrong in the config itself: only the file tells
    only_problem(datasets.check(cfg), field, *parts)
    # the same message fails a task that starts anyway (a file changed after the check, a remote host)
    with pytest.raises(ConfigError) as exc:
        datasets.require(cfg)
    assert any(p.field == field for p in exc.value.problems)


def test_npz_good_file_reshaped_and_test_split_used_for_eval(tmp_path: Path) -> None:
    f = write_npz(tmp_path / "d.npz", shape=(6, 6), x_test=np.ones((10, 6, 6), np.float32),
                  y_test=np.zeros(10, np.int64))
    cfg = make_config("npz", shape=(6, 6, 1), classes=4, size=100, path=f, model="cnn")
    assert datasets.check(cfg) == []
    x, y = datasets.prepare(cfg, datasets.load_arrays(cfg))
    assert x.shape == (100, 6, 6, 1) and y.shape == (100,)  # data.size caps the examples used
    xe, ye = datasets.prepare(cfg, datasets.load_arrays(cfg, "eval"), "eval")
    assert xe.shape == (10, 6, 6, 1) and float(xe.mean()) == 1.0


def test_remote_clusters_are_not_checked_against_local_files(tmp_path: Path) -> None:
    cfg = make_config("npz", shape=(36,), path=tmp_path / "absent.npz")
    remote = Cluster(hosts=(Host(name="far", address="10.1.2.3", tasks=(Task("worker", 0),)),))
    assert datasets.check(replace(cfg, cluster=remote)) == []
    assert datasets.check(replace(cfg, cluster=remote), here=True)


# --------------------------------------------------------------------------- the user's .csv


def test_csv_reads_features_around_the_named_label_column(tmp_path: Path) -> None:
    f = write_csv(tmp_path / "d.csv", rows=40)
    cfg = make_config("csv", shape=(5,), classes=3, path=f, y_key="label", batch=8)
    assert datasets.check(cfg) == []
    raw = datasets.load_arrays(cfg)
    text = f.read_text().splitlines()
    first = [float(v) for v in text[1].split(",")]
    assert raw.y[0] == first[2] and list(raw.x[0]) == pytest.approx(first[:2] + first[3:])


@pytest.mark.parametrize(("case", "field", "parts"), [
    ("no such column", "data.y_key", ("has no column 'target'", "'f0', 'f1', 'label'")),
    ("not a number", "data.path", ("line 3, column 'f1'", "expected a number, got 'abc'")),
    ("short row", "data.path", ("line 4 has 5 values; expected 6",)),
    ("wrong feature count", "data.shape", ("has shape [5] = 5 values", "expected 8 values")),
    ("label out of range", "data.classes", ("label 2 in column 'label'", "expected labels from 0 to 1")),
    ("too small", "data.size", ("has 40 examples", "fewer than one global batch (64)")),
    ("empty", "data.path", ("is empty; expected a header row",)),
])
def test_bad_csv_named_with_its_problem(case: str, field: str, parts: tuple[str, ...], tmp_path: Path) -> None:
    f = write_csv(tmp_path / "d.csv", rows=40)
    cfg = make_config("csv", shape=(5,), classes=3, path=f, y_key="label", batch=8)
    lines = f.read_text().splitlines()
    if case == "no such column":
        cfg = replace(cfg, data=replace(cfg.data, y_key="target"))
    elif case == "not a number":
        cells = lines[2].split(",")
        cells[1] = "abc"
        lines[2] = ",".join(cells)
    elif case == "short row":
        lines[3] = ",".join(lines[3].split(",")[:5])
    elif case == "wrong feature count":
        cfg = replace(cfg, data=replace(cfg.data, shape=(8,)))
    elif case == "label out of range":
        cfg = replace(cfg, data=replace(cfg.data, classes=2))
    elif case == "too small":
        cfg = replace(cfg, training=replace(cfg.training, global_batch_size=64), data=replace(cfg.data, size=64))
    elif case == "empty":
        lines = []
    f.write_text("\n".join(lines) + "\n" if lines else "", encoding="utf-8")
    p = only_problem(datasets.check(cfg), field, *parts)
    assert str(f) in p.message


# --------------------------------------------------------------------------- TFRecord files


def test_tfrecord_parsed_without_tensorflow_like_tensorflow_writes_it(tmp_path: Path) -> None:
    f = write_tfrecord(tmp_path / "d.tfrecord", n=5, length=4, label_of=lambda i: i % 3)
    records = list(datasets.read_tfrecords(f))
    assert len(records) == 5
    parsed = datasets.parse_example(records[4])
    assert parsed["label"] == ("int64", [1])
    kind, values = parsed["tokens"]
    assert kind == "int64" and len(values) == 4 and all(0 <= v < 50 for v in values)
    g = write_tfrecord(tmp_path / "f.tfrecord", n=1, length=3, floats=True)
    assert datasets.parse_example(next(datasets.read_tfrecords(g)))["tokens"][0] == "float32"


@pytest.mark.parametrize(("case", "field", "parts"), [
    ("missing file", "data.path", ("no such file; expected a TFRecord file",)),
    ("missing feature", "data.x_key", ("record 0 has no feature 'ids'", "'label', 'tokens'")),
    ("wrong length", "data.shape", ("feature 'tokens' has 12 values; expected 16",)),
    ("wrong type", "data.x_dtype", ("feature 'tokens' is a int64 list; expected float32",)),
    ("label out of range", "data.classes", ("record 7: label 9 in feature 'label'", "expected labels from 0 to 2")),
    ("too small", "data.size", ("has 96 examples", "fewer than one global batch (128)")),
    ("truncated", "data.path", ("ends inside a record",)),
])
def test_bad_tfrecord_named_with_its_problem(case: str, field: str, parts: tuple[str, ...], tmp_path: Path) -> None:
    f = tmp_path / "d.tfrecord"
    cfg = make_config("tfrecord", shape=(12,), classes=3, path=f, model="transformer", x_key="tokens",
                      y_key="label", vocab_size=50, embed_dim=16, heads=2)
    if case != "missing file":
        write_tfrecord(f, label_of=(lambda i: 9 if i == 7 else 0) if case == "label out of range" else None)
    if case == "missing feature":
        cfg = replace(cfg, data=replace(cfg.data, x_key="ids"))
    elif case == "wrong length":
        cfg = replace(cfg, data=replace(cfg.data, shape=(16,)))
    elif case == "wrong type":
        cfg = replace(cfg, data=replace(cfg.data, x_dtype="float32"))
    elif case == "too small":
        cfg = replace(cfg, training=replace(cfg.training, global_batch_size=128))
    elif case == "truncated":
        f.write_bytes(f.read_bytes()[:-7])
    p = only_problem(datasets.check(cfg), field, *parts)
    assert str(f) in p.message


def test_tfrecord_records_past_the_parsed_ones_are_counted_not_read(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    f = write_tfrecord(tmp_path / "d.tfrecord", n=96, label_of=lambda i: 9 if i == 50 else 0)
    assert [len(r) > 0 for r in datasets.read_tfrecords(f, read=10)] == [True] * 10 + [False] * 86
    cfg = make_config("tfrecord", shape=(12,), classes=3, path=f, model="transformer", x_key="tokens",
                      y_key="label", vocab_size=50, embed_dim=16, heads=2, batch=128)
    monkeypatch.setattr(datasets, "TFRECORD_PARSED", 10)
    # record 50's bad label lies past the parsed ones; the count still sees all 96
    assert [p.field for p in datasets.check(cfg)] == ["data.size"]
    only_problem(datasets.check(cfg), "data.size", "has 96 examples")
    monkeypatch.setattr(datasets, "TFRECORD_PARSED", 100)
    only_problem(datasets.check(cfg), "data.classes", "record 50: label 9")


# --------------------------------------------------------------------------- image folders


@pytest.mark.parametrize(("case", "field", "parts"), [
    ("missing folder", "data.path", ("no such folder",)),
    ("more class folders than classes", "data.classes", ("has 3 class folders", "at most data.classes = 2")),
    ("too few images", "data.size", ("has 48 examples", "fewer than one global batch (64)")),
    ("no subfolders", "data.path", ("has no subfolders",)),
    ("no images", "data.path", ("holds no images",)),
])
def test_bad_image_folder_named_with_its_problem(case: str, field: str, parts: tuple[str, ...],
                                                 tmp_path: Path) -> None:
    root = tmp_path / "images"
    cfg = make_config("image_folder", shape=(10, 10, 3), classes=3, path=root, model="cnn")
    if case == "more class folders than classes":
        write_image_folder(root)
        cfg = replace(cfg, data=replace(cfg.data, classes=2))
    elif case == "too few images":
        write_image_folder(root)
        cfg = replace(cfg, training=replace(cfg.training, global_batch_size=64))
    elif case == "no subfolders":
        root.mkdir()
    elif case == "no images":
        (root / "a").mkdir(parents=True)
        (root / "a" / "notes.txt").write_text("x")
    p = only_problem(datasets.check(cfg), field, *parts)
    assert str(root) in p.message


def test_image_folder_shape_needs_channels() -> None:
    problems = config_mod.validate(make_config("image_folder", shape=(10, 10), path="/x", model="cnn"))
    only_problem(problems, "data.shape", "[height, width, channels]", "got [10, 10]")


# --------------------------------------------------------------------------- config rules


@pytest.mark.parametrize(("changes", "field", "parts"), [
    ({"source": "npz", "path": ""}, "data.path", ("source 'npz' reads a .npz file", "expected its path, got ''")),
    ({"source": "image_folder", "path": " "}, "data.path", ("one subfolder of images per class",)),
    ({"source": "mnist", "shape": (784,), "classes": 5}, "data.classes", ("'mnist' has 10 classes",)),
])
def test_config_rules_of_sources(changes: dict[str, Any], field: str, parts: tuple[str, ...]) -> None:
    cfg = make_config()
    only_problem(config_mod.validate(replace(cfg, data=replace(cfg.data, **changes))), field, *parts)


def test_token_models_refuse_image_sources_and_every_mode_reads_every_source() -> None:
    problems = config_mod.validate(make_config("digits", shape=(64,), model="embedding"))
    only_problem(problems, "data.source", "model 'embedding' reads token ids but source 'digits' holds images")
    chief = Host(name="local", tasks=(Task("chief", 0), Task("worker", 0), Task("ps", 0)))
    for source, path in (("digits", ""), ("npz", "/d/x.npz"), ("csv", "/d/x.csv"), ("tfrecord", "/d/x.tfrecord"),
                         ("script", "/d/s.py")):
        cfg = make_config(source, shape=(64,), path=path)
        async_cfg = replace(cfg, cluster=Cluster(hosts=(chief,)), parallelism=replace(cfg.parallelism, mode="async"))
        assert [p for p in config_mod.validate(async_cfg) if p.field == "data.source"] == [], source


def test_new_data_fields_round_trip_and_stay_out_of_plain_configs(tmp_path: Path) -> None:
    cfg = make_config("tfrecord", shape=(12,), path="/data/x.tfrecord", x_key="tokens", y_key="label",
                      x_dtype="int64", model="transformer", embed_dim=16, heads=2)
    assert config_mod.loads(config_mod.dumps(cfg)) == cfg
    plain = config_mod.to_dict(make_config())
    assert set(plain["data"]) == {"source", "shape", "classes", "size", "path"}
    assert "script" not in plain["model"]
    with pytest.raises(ConfigError) as exc:
        config_mod.from_dict({**plain, "data": {**plain["data"], "x_dtype": "float16"}})
    only_problem(exc.value.problems, "data.x_dtype", "expected one of 'auto', 'float32', 'int64', got 'float16'")


def test_relative_paths_become_absolute_against_a_base(tmp_path: Path) -> None:
    cfg = make_config("npz", shape=(36,), path="data/x.npz", script="m.py")
    out = datasets.absolute_paths(cfg, tmp_path)
    assert out.data.path == str(tmp_path / "data" / "x.npz") and out.model.script == str(tmp_path / "m.py")
    assert datasets.absolute_paths(make_config()) == make_config()


def test_preflight_checks_files_and_starts_nothing_without_a_script(tmp_path: Path) -> None:
    cfg = make_config("npz", shape=(36,), path=tmp_path / "gone.npz")
    only_problem(preflight.preflight(cfg), "data.path", "no such file")
    assert preflight.preflight(make_config()) == []


# --------------------------------------------------------------------------- sharding (in this process)


def test_each_input_pipeline_reads_its_own_shard_of_a_file(tmp_path: Path) -> None:
    import tensorflow as tf

    from engine.runtime import data as data_mod

    n = 64
    x = np.arange(n, dtype=np.float32)[:, None].repeat(4, axis=1)
    f = write_npz(tmp_path / "idx.npz", x=x, y=np.zeros(n, np.int64))
    cfg = make_config("npz", shape=(4,), classes=2, path=f, batch=16)
    seen = []
    for pipeline in (0, 1):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        ds = data_mod.make_dataset(cfg, ctx)
        first_epoch = [row for xb, _ in ds.take(n // 2 // 8) for row in xb.numpy()[:, 0]]
        assert len(first_epoch) == n // 2  # per-replica batches of 16 / 2
        seen.append({int(v) for v in first_epoch})
    assert not seen[0] & seen[1], "the two input pipelines must not share examples"
    assert seen[0] | seen[1] == set(range(n))


# --------------------------------------------------------------------------- real runs, one per source



@pytest.mark.cluster
def test_digits_train_a_cnn_on_two_replicas(runs_root: Path) -> None:
    steps = run_to_end(make_config("digits", shape=(8, 8, 1), size=1497, model="cnn", gpus=2), runs_root)
    assert {e["replica"] for e in steps} == {0, 1}


@pytest.mark.cluster
def test_cached_mnist_trains_an_mlp_on_two_workers(keras_home: Path, runs_root: Path) -> None:
    fake_mnist(keras_home)
    steps = run_to_end(make_config("mnist", shape=(784,), workers=2, steps=6), runs_root)
    last = {e["replica"]: e["loss"] for e in steps if e["step"] == 6}
    assert set(last) == {0, 1} and last[0] != last[1], "each worker reads its own shard"


@pytest.mark.cluster
def test_cached_fashion_mnist_trains_a_resnet(keras_home: Path, runs_root: Path) -> None:
    fake_fashion_mnist(keras_home)
    run_to_end(make_config("fashion_mnist", shape=(28, 28), model="resnet", hidden=(), steps=4, batch=16), runs_root)


@pytest.mark.cluster
def test_cached_cifar10_trains_a_cnn(keras_home: Path, runs_root: Path) -> None:
    fake_cifar10(keras_home)
    run_to_end(make_config("cifar10", shape=(32, 32, 3), model="cnn", steps=4, batch=16), runs_root)


@pytest.mark.cluster
def test_npz_token_ids_train_the_embedding_model(tmp_path: Path, runs_root: Path) -> None:
    rng = np.random.default_rng(7)
    f = write_npz(tmp_path / "tokens.npz", x=rng.integers(0, 100, (256, 16)).astype(np.int32),
                  y=rng.integers(0, 4, 256))
    run_to_end(make_config("npz", shape=(16,), classes=4, path=f, model="embedding", vocab_size=100,
                           embed_dim=16), runs_root)


@pytest.mark.cluster
def test_csv_trains_an_mlp(tmp_path: Path, runs_root: Path) -> None:
    f = write_csv(tmp_path / "table.csv", rows=96)
    run_to_end(make_config("csv", shape=(5,), classes=3, path=f, y_key="label", gpus=2), runs_root)


@pytest.mark.cluster
def test_tfrecord_token_ids_train_the_transformer(tmp_path: Path, runs_root: Path) -> None:
    f = write_tfrecord(tmp_path / "tokens.tfrecord")
    run_to_end(make_config("tfrecord", shape=(12,), classes=3, path=f, model="transformer", x_key="tokens",
                           y_key="label", vocab_size=50, embed_dim=16, heads=2, steps=6), runs_root)


@pytest.mark.cluster
def test_image_folder_trains_a_cnn(tmp_path: Path, runs_root: Path) -> None:
    root = write_image_folder(tmp_path / "images")
    run_to_end(make_config("image_folder", shape=(10, 10, 3), classes=3, path=root, model="cnn", steps=5,
                           batch=16), runs_root)


@pytest.mark.cluster
def test_digits_train_the_model_parallel_mlp_on_a_mesh(runs_root: Path) -> None:
    cfg = config_mod.load(ROOT / "presets" / "model-2x2.yaml")
    cfg = replace(cfg, data=replace(cfg.data, source="digits", shape=(64,), size=1497),
                  model=replace(cfg.model, hidden=(32,)),
                  training=replace(cfg.training, steps=4, global_batch_size=32, checkpoint_every=0, metrics_hz=1e6))
    steps = run_to_end(cfg, runs_root)
    assert {e["replica"] for e in steps} == {0, 1}


@pytest.mark.cluster
def test_launcher_refuses_a_missing_file_before_any_process_starts(tmp_path: Path, runs_root: Path) -> None:
    cfg = make_config("npz", shape=(36,), path=tmp_path / "gone.npz")
    run = Run(cfg, runs_root=runs_root)
    try:
        with pytest.raises(ConfigError) as exc:
            run.start()
    finally:
        if run.started:
            run.stop()
    only_problem(exc.value.problems, "data.path", str(tmp_path / "gone.npz"), "no such file")
    assert not runs_root.exists() or not any(runs_root.iterdir())
