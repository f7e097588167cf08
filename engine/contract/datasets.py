"""Data files on the control side: find them, read them with numpy, check them before any process starts.

Every source but ``synthetic`` reads something from disk: the digits shipped with
ClusterDeck, a data set in Keras' local download cache, or the user's ``.npz``,
``.csv``, TFRecord file or image folder. :func:`check` reads them the way the
task processes will and names the file and the problem (missing, wrong shape,
labels out of range, fewer examples than one global batch) so that a launch
fails in a second instead of inside a TensorFlow process. :func:`preflight`
adds the check of the user's script (in a subprocess: the script imports TensorFlow).

This module imports no TensorFlow: numpy, csv, gzip, zipfile and the standard library only.
The task processes use :func:`load_arrays` for every source that numpy can read.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import pickle
import stat
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from engine.contract import resources
from engine.contract.config import (
    FILE_SOURCES,
    KERAS_SOURCES,
    KNOWN_DATA,
    TOKEN_MODELS,
    ConfigError,
    Problem,
    RunConfig,
    replace,
)

#: The UCI handwritten digits (8x8, 10 classes), shipped inside the package; see resources_data/README.md.
DIGITS_PATH = resources.bundled_data("digits.npz")
#: Examples the evaluator reads at most.
EVAL_EXAMPLES = 2048
#: File types ``keras.utils.image_dataset_from_directory`` reads.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
#: TFRecord files: a single file, or every file with one of these endings in a folder.
TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfrec")
#: Records parsed in full by the up-front check (the rest are only counted).
TFRECORD_PARSED = 20_000

_FASHION_FILES = ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                  "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


class DataFileError(ValueError):
    """A data file cannot be used; ``problem`` names the field and the file."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def _fail(field: str, message: str) -> DataFileError:
    return DataFileError(Problem(field, message))


# --------------------------------------------------------------------------- paths


def resolve_path(path: str, base: str | os.PathLike[str] | None = None) -> Path:
    """``path`` with ``~`` expanded, relative to ``base`` (default: the current folder).

    ``~user/...`` of a user this machine does not know stays as written (never read relative to the current
    folder): the readers then say whose home it names (:func:`unknown_home`), never raise."""
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and unknown_home(p) is None:
        p = Path(base if base is not None else os.getcwd()) / p
    return p


def unknown_home(path: str | os.PathLike[str]) -> str | None:
    """The user named by a ``~user/...`` that could not be expanded (no such user here), or None."""
    text = os.fspath(path)
    if not text.startswith("~"):
        return None
    return text[1:].split(os.sep, 1)[0] or "(you: no home folder is known)"


def _nothing_there(p: Path, what: str, noun: str = "file") -> str:
    """The message for a path where there is nothing: whose unknown home it names, or no such file."""
    user = unknown_home(p)
    if user is not None:
        return f"{str(p)!r} names the home folder of {user!r}, a user this machine does not know; expected {what}"
    return f"{str(p)!r}: no such {noun}; expected {what}"


def absolute_paths(config: RunConfig, base: str | os.PathLike[str] | None = None) -> RunConfig:
    """The config with ``data.path``, ``validation.path`` and ``model.script`` made absolute against ``base``.

    Task processes run in the run folder: a relative path must be resolved where the user wrote it
    (the launcher's folder, or the folder of the config file) before the config is handed to them.
    """
    d, m, v = config.data, config.model, config.validation
    data = replace(d, path=str(resolve_path(d.path, base))) if d.path.strip() else d
    model = replace(m, script=str(resolve_path(m.script, base))) if m.script.strip() else m
    validation = replace(v, path=str(resolve_path(v.path, base))) if v.path.strip() else v
    if data is d and model is m and validation is v:
        return config
    return replace(config, data=data, model=model, validation=validation)


def keras_home() -> Path:
    """Keras' folder (``$KERAS_HOME``, else ``~/.keras``, or ``/tmp/.keras`` where home is read-only)."""
    env = os.environ.get("KERAS_HOME")
    if env:
        return Path(os.path.expanduser(env))
    home = os.path.expanduser("~")
    if not os.access(home, os.W_OK):
        home = "/tmp"
    return Path(home) / ".keras"


def keras_cache_files(source: str) -> list[Path]:
    """The files of a Keras data set in the local cache, where ``keras.datasets`` would have put them."""
    datasets = keras_home() / "datasets"
    if source == "mnist":
        return [datasets / "mnist.npz"]
    if source == "fashion_mnist":
        return [datasets / "fashion-mnist" / name for name in _FASHION_FILES]
    if source == "cifar10":
        # Keras 3 extracts into '<fname>/cifar-10-batches-py'; older versions straight into 'cifar-10-batches-py'
        for folder in (datasets / "cifar-10-batches-py-target" / "cifar-10-batches-py",
                       datasets / "cifar-10-batches-py"):
            if (folder / "data_batch_1").exists():
                return [folder / name for name in (*_CIFAR_TRAIN, "test_batch")]
        return [datasets / "cifar-10-batches-py-target" / "cifar-10-batches-py" / name
                for name in (*_CIFAR_TRAIN, "test_batch")]
    raise ValueError(f"data.source: {source!r} is not a Keras data set")


def _keras_not_cached(source: str, missing: Path) -> DataFileError:
    return _fail("data.source", f"{source!r} is not in Keras' local cache: expected {missing}. ClusterDeck never "
                                f"downloads data; run keras.datasets.{source}.load_data() once on a machine with "
                                f"network access and copy {keras_home() / 'datasets'} here, or point KERAS_HOME "
                                f"at a folder that holds it")


# --------------------------------------------------------------------------- reading with numpy


@dataclass(frozen=True)
class Arrays:
    """Examples as read from their file, before reshaping: ``x`` (n, ...) and ``y`` (n,)."""

    x: np.ndarray
    y: np.ndarray
    file: str  # what to name in a message
    x_name: str = "inputs"
    y_name: str = "labels"
    scale: float = 1.0  # pixels: divide by this for inputs in [0, 1]


def load_arrays(config: RunConfig, split: str = "train") -> Arrays:
    """The raw arrays of a numpy-readable source (``digits``, the Keras sets, ``npz``, ``csv``).

    ``split="eval"`` is the source's test split where it has one (``x_test``/``y_test`` in a
    user's ``.npz`` too), otherwise the training examples themselves. Raises :class:`DataFileError`.
    """
    d = config.data
    source = d.source
    if source == "digits":
        return _load_npz_pair(DIGITS_PATH, "x_train" if split == "train" else "x_test",
                              "y_train" if split == "train" else "y_test", scale=16.0)
    if source == "mnist":
        path = keras_cache_files("mnist")[0]
        if not path.is_file():
            raise _keras_not_cached(source, path)
        suffix = "train" if split == "train" else "test"
        return _load_npz_pair(path, f"x_{suffix}", f"y_{suffix}", scale=255.0)
    if source == "fashion_mnist":
        files = keras_cache_files(source)
        for f in files:
            if not f.is_file():
                raise _keras_not_cached(source, f)
        labels, images = (files[0], files[1]) if split == "train" else (files[2], files[3])
        return _load_idx_pair(images, labels)
    if source == "cifar10":
        files = keras_cache_files(source)
        for f in files:
            if not f.is_file():
                raise _keras_not_cached(source, f)
        return _load_cifar(files[:5] if split == "train" else files[5:])
    if source == "npz":
        path = _existing_file(d.path, "a .npz file of arrays")
        if split != "train":
            names = _npz_names(path)
            if f"{d.x_key}_test" in names and f"{d.y_key}_test" in names:
                return _load_npz_pair(path, f"{d.x_key}_test", f"{d.y_key}_test")
        return _load_npz_pair(path, d.x_key, d.y_key, x_field="data.x_key", y_field="data.y_key")
    if source == "csv":
        return _load_csv(_existing_file(d.path, "a .csv file with a header row"), d.y_key)
    raise ValueError(f"data.source: {source!r} is not read with numpy")


def prepare(config: RunConfig, arrays: Arrays, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Checked arrays as the model reads them: inputs reshaped to ``data.shape`` (float32, pixels in [0, 1];
    int32 token ids for token models), int32 labels; at most ``data.size`` training examples."""
    problems = check_arrays(config, arrays, sizes=split == "train")
    if problems:
        raise DataFileError(problems[0])
    d = config.data
    limit = d.size if split == "train" else EVAL_EXAMPLES
    n = min(len(arrays.y), limit)
    x = arrays.x[:n]
    if config.model.name in TOKEN_MODELS:
        x = x.astype(np.int32)
    else:
        x = x.astype(np.float32)
        if arrays.scale != 1.0:
            x /= np.float32(arrays.scale)
    return x.reshape((n, *d.shape)), arrays.y[:n].reshape(n).astype(np.int32)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (``a FIFO (named pipe)``, ``a character device``)."""
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def _mode(p: Path) -> int | None:
    """``p``'s file type and mode (a symbolic link followed), or None where there is nothing (or a dangling link)."""
    if unknown_home(p) is not None:  # never a folder named '~user' in the current one
        return None
    try:
        return os.stat(p).st_mode
    except OSError:
        return None


def _existing_file(path: str, what: str, field: str = "data.path") -> Path:
    """``path`` resolved, where it is a regular file: a FIFO, a device, a socket or a folder is refused by its
    type before anything opens it (a FIFO would block the reader for ever, ``/dev/zero`` never ends)."""
    p = resolve_path(path)
    mode = _mode(p)
    if mode is None:
        raise _fail(field, _nothing_there(p, what))
    if not stat.S_ISREG(mode):
        raise _fail(field, f"{str(p)!r} is {file_kind(mode)}, not a regular file; expected {what}")
    return p


def open_regular(path: Path, field: str = "data.path", what: str = "a regular file") -> IO[bytes]:
    """``path`` opened for reading where it is a regular file (checked on the descriptor, opened without
    blocking: a FIFO put there after a check cannot hang the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _fail(field, f"{str(path)!r} cannot be opened ({exc.strerror or exc}); expected {what}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _fail(field, f"{str(path)!r} is {file_kind(mode)}, not a regular file; expected {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _npz_names(path: Path) -> list[str]:
    try:
        with np.load(path, allow_pickle=False) as f:
            return list(f.files)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise _fail("data.path", f"{str(path)!r} cannot be read as .npz ({_reason(exc)}); expected a file "
                                 f"written by numpy.savez") from None


def _load_npz_pair(path: Path, x_key: str, y_key: str, *, scale: float = 1.0, x_field: str = "data.path",
                   y_field: str = "data.path") -> Arrays:
    try:
        with np.load(path, allow_pickle=False) as f:
            names = list(f.files)
            for key, field in ((x_key, x_field), (y_key, y_field)):
                if key not in names:
                    raise _fail(field, f"{str(path)!r} has no array {key!r}; expected one of "
                                       f"{', '.join(repr(n) for n in names) or '(none: the file is empty)'}")
            x, y = f[x_key], f[y_key]
    except DataFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise _fail("data.path", f"{str(path)!r} cannot be read as .npz ({_reason(exc)}); expected a file "
                                 f"written by numpy.savez") from None
    return Arrays(x, y, str(path), repr(x_key), repr(y_key), scale)


def _load_idx_pair(images: Path, labels: Path) -> Arrays:
    """The gzip'd IDX files of (Fashion-)MNIST, read as ``keras.datasets.fashion_mnist`` reads them."""
    try:
        with gzip.open(labels, "rb") as fh:
            y = np.frombuffer(fh.read(), np.uint8, offset=8)
        with gzip.open(images, "rb") as fh:
            raw = np.frombuffer(fh.read(), np.uint8, offset=16)
    except (OSError, EOFError, ValueError) as exc:
        raise _fail("data.source", f"{str(images.parent)!r}: the cached files cannot be read ({_reason(exc)})") \
            from None
    if raw.size != len(y) * 28 * 28:
        raise _fail("data.source", f"{str(images)!r} holds {raw.size} pixels for {len(y)} labels; expected "
                                   f"{len(y)} images of 28 x 28")
    return Arrays(raw.reshape(len(y), 28, 28), y, str(images), scale=255.0)


_NUMPY_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """CIFAR's batches are pickles: load numpy arrays and plain values, never code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _load_cifar(files: list[Path]) -> Arrays:
    xs, ys = [], []
    for path in files:
        try:
            with open(path, "rb") as fh:
                batch = _ArraysOnlyUnpickler(fh, encoding="bytes").load()
            data = np.asarray(batch[b"data"], dtype=np.uint8)
            labels = np.asarray(batch[b"labels"])
            xs.append(data.reshape(len(data), 3, 32, 32).transpose(0, 2, 3, 1))
            ys.append(labels)
        except (OSError, EOFError, ValueError, KeyError, TypeError, pickle.UnpicklingError) as exc:
            raise _fail("data.source", f"{str(path)!r}: the cached CIFAR-10 batch cannot be read "
                                       f"({_reason(exc)})") from None
    return Arrays(np.concatenate(xs), np.concatenate(ys), str(files[0].parent), scale=255.0)


def _load_csv(path: Path, label_column: str) -> Arrays:
    """A CSV file with a header row: numpy's fast reader, and where it fails a pass that names the bad cell."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = [h.strip() for h in next(csv.reader(fh), [])]
        if header and label_column in header:
            table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64, encoding="utf-8-sig")
            if table.shape[1] == len(header) or table.size == 0:
                li = header.index(label_column)
                x = np.delete(table, li, axis=1) if table.size else np.zeros((0, len(header) - 1))
                return Arrays(x, table[:, li] if table.size else np.zeros(0), str(path), "the feature columns",
                              f"column {label_column!r}")
    except (ValueError, OSError, UnicodeDecodeError, csv.Error):
        pass  # the careful pass below says what is wrong, and where
    return _load_csv_checked(path, label_column)


def _load_csv_checked(path: Path, label_column: str) -> Arrays:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header:
                raise _fail("data.path", f"{str(path)!r} is empty; expected a header row naming the columns")
            header = [h.strip() for h in header]
            if label_column not in header:
                raise _fail("data.y_key", f"{str(path)!r} has no column {label_column!r}; expected the label "
                                          f"column among {', '.join(repr(h) for h in header[:20])}")
            li = header.index(label_column)
            rows: list[list[float]] = []
            labels: list[float] = []
            for line_no, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise _fail("data.path", f"{str(path)!r} line {line_no} has {len(row)} values; expected "
                                             f"{len(header)} (one per column of the header)")
                values = []
                for col, cell in enumerate(row):
                    try:
                        value = float(cell)
                    except ValueError:
                        raise _fail("data.path", f"{str(path)!r} line {line_no}, column {header[col]!r}: "
                                                 f"expected a number, got {cell[:40]!r}") from None
                    if col == li:
                        labels.append(value)
                    else:
                        values.append(value)
                rows.append(values)
    except DataFileError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _fail("data.path", f"{str(path)!r} cannot be read as CSV ({_reason(exc)})") from None
    x = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(header) - 1)
    return Arrays(x, np.asarray(labels, dtype=np.float64), str(path), "the feature columns",
                  f"column {label_column!r}")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


# --------------------------------------------------------------------------- checks


def check_arrays(config: RunConfig, arrays: Arrays, *, sizes: bool = True) -> list[Problem]:
    """Shape, labels and (with ``sizes``) the number of examples read from a file, against the config."""
    d, m = config.data, config.model
    f = repr(arrays.file)
    x, y = arrays.x, arrays.y
    want = math.prod(d.shape)
    if x.ndim < 1 or y.ndim < 1:
        return [Problem("data.path", f"{f}: {arrays.x_name} and {arrays.y_name} must be arrays with one "
                                     f"example per row; got shapes {list(x.shape)} and {list(y.shape)}")]
    if y.ndim > 2 or (y.ndim == 2 and y.shape[1] != 1):
        return [Problem("data.path", f"{f}: expected one class id per example in {arrays.y_name}, got an "
                                     f"array of shape {list(y.shape)}")]
    if len(x) != len(y):
        return [Problem("data.path", f"{f} has {len(x)} examples in {arrays.x_name} but {len(y)} in "
                                     f"{arrays.y_name}; expected as many of each")]
    per_example = list(x.shape[1:])
    values = math.prod(per_example)
    if values != want:
        return [Problem("data.shape", f"{f}: each example of {arrays.x_name} has shape {per_example} = {values} "
                                      f"values; expected {want} values to match data.shape {list(d.shape)}")]
    bad_values = _value_problem(arrays)
    if bad_values is not None:
        return [bad_values]
    problems: list[Problem] = []
    n = len(y)
    labels = y.reshape(n)
    if n and not np.issubdtype(labels.dtype, np.integer):
        if not np.issubdtype(labels.dtype, np.number) or not np.all(np.isfinite(labels)) \
                or not np.all(labels == np.round(labels)):
            bad = _first(~np.isfinite(labels) | (labels != np.round(labels))) if \
                np.issubdtype(labels.dtype, np.number) else 0
            value = labels[bad].item() if hasattr(labels[bad], "item") else labels[bad]
            kind = "" if np.issubdtype(labels.dtype, np.number) else f" ({labels.dtype.kind == 'U' and 'text' or labels.dtype})"
            return [Problem("data.path", f"{f}: labels in {arrays.y_name} must be whole class ids; got "
                                         f"{value!r}{kind} (example {bad})")]
    if n:
        low, high = labels.min(), labels.max()
        if low < 0 or high >= d.classes:
            bad = _first((labels < 0) | (labels >= d.classes))
            problems.append(Problem("data.classes", f"{f}: label {_num(labels[bad])} in {arrays.y_name} (example "
                                                    f"{bad}) is out of range; expected labels from 0 to "
                                                    f"{d.classes - 1} (data.classes {d.classes})"))
    if m.name in TOKEN_MODELS and x.size:
        if not np.issubdtype(x.dtype, np.integer) and not np.all(x == np.round(x)):
            problems.append(Problem("data.path", f"{f}: model {m.name!r} reads token ids; {arrays.x_name} holds "
                                                 f"{x.dtype} values that are not whole numbers"))
        elif x.min() < 0 or x.max() >= m.vocab_size:
            bad = _first(((x < 0) | (x >= m.vocab_size)).reshape(n, -1).any(axis=1))
            problems.append(Problem("model.vocab_size", f"{f}: example {bad} of {arrays.x_name} holds token id "
                                                        f"{_num(x.min() if x.min() < 0 else x.max())}; expected ids "
                                                        f"from 0 to {m.vocab_size - 1} (model.vocab_size "
                                                        f"{m.vocab_size})"))
    if sizes:
        problems += _size_problems(config, n, f)
    return problems


def _example_text(arrays: Arrays, example: int) -> str:
    """``example 3``, and for a CSV file the line it came from (the header is line 1)."""
    if arrays.x_name == "the feature columns":
        return f"example {example} (line {example + 2} if no line is blank)"
    return f"example {example}"


def _value_problem(arrays: Arrays) -> Problem | None:
    """Inputs that are not finite real numbers (text, objects, complex numbers, NaN, ±inf): named with the
    file and the first bad example, since training on them "finishes" with a meaningless loss or fails
    deep inside a task."""
    x, f = arrays.x, repr(arrays.file)
    kind = x.dtype
    if not (np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.floating) or np.issubdtype(kind, np.bool_)):
        first = x.reshape(-1)[0] if x.size else None
        shown = repr(first.item() if isinstance(first, np.generic) else first)[:40]
        label = {"U": "text", "S": "bytes", "O": "Python object", "c": "complex"}.get(kind.kind, "non-numeric")
        return Problem("data.path", f"{f}: {arrays.x_name} of example 0 starts with {shown}, {label} values "
                                    f"({kind}); expected real numbers (integers or floats)")
    if not np.issubdtype(kind, np.floating) or not x.size:
        return None
    flat = x.reshape(len(x), -1)
    bad_rows = ~np.isfinite(flat).all(axis=1)
    if not bad_rows.any():
        return None
    row = _first(bad_rows)
    col = _first(~np.isfinite(flat[row]))
    value = float(flat[row, col])
    where = f"value {col} of {_example_text(arrays, row)}" if flat.shape[1] > 1 else _example_text(arrays, row)
    return Problem("data.path", f"{f}: {where} in {arrays.x_name} is {value} ({int(bad_rows.sum())} example(s) "
                                f"hold such values); expected finite numbers")


def _size_problems(config: RunConfig, available: int, where: str) -> list[Problem]:
    batch = config.training.global_batch_size
    used = min(available, config.data.size)
    if used < batch:
        return [Problem("data.size", f"{where} has {available} examples"
                                     f"{f' (data.size uses {used})' if used < available else ''}, fewer than one "
                                     f"global batch ({batch}); expected at least {batch}")]
    if config.training.epochs is not None and config.data.size > available:
        return [Problem("data.size", f"{where} has {available} examples; with training.epochs an epoch is "
                                     f"data.size = {config.data.size} examples, so expected data.size at most "
                                     f"{available}")]
    return []


def _first(mask: Any) -> int:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else 0


def _num(value: Any) -> str:
    v = float(value)
    return str(int(v)) if v.is_integer() else f"{v:g}"


def check(config: RunConfig, *, here: bool = False) -> list[Problem]:
    """Every problem of the config's data files that can be found without TensorFlow. Empty: ready.

    Reads this machine's files: for a cluster with remote hosts it checks nothing (unless ``here``),
    and the task processes check their own copies when they start, with the same messages.
    """
    source = config.data.source
    if source == "synthetic" or source == "script" or not (here or config.cluster.is_local):
        return []
    try:
        if source in KNOWN_DATA or source in ("npz", "csv"):
            problems = check_arrays(config, load_arrays(config, "train"))
        elif source == "tfrecord":
            problems = check_tfrecord(config)
        elif source == "image_folder":
            problems = check_image_folder(config)
        else:
            problems = []
    except DataFileError as exc:
        problems = [exc.problem]
    if problems or not config.validation.path.strip() or source not in FILE_SOURCES:
        return problems
    return check_held_out(config)


def check_held_out(config: RunConfig) -> list[Problem]:
    """The problems of ``validation.path``, the held-out examples' file, read as the tasks read it (a file of
    ``data.source``'s kind), named by ``validation.path``: a FIFO, ``/dev/zero``, text or NaN there is refused
    before launch as it is in ``data.path``. Fewer examples than a global batch are fine (the last held-out
    batch may be smaller); none at all is not."""
    v = config.validation
    held = replace(config, data=replace(config.data, path=v.path), validation=replace(v, path="", split=0.0))
    source = config.data.source
    try:
        if source in ("npz", "csv"):
            arrays = load_arrays(held, "train")
            problems = check_arrays(held, arrays, sizes=False)
            count, where = len(arrays.y), repr(arrays.file)
        elif source == "tfrecord":
            problems = check_tfrecord(held)
            count = sum(1 for f in tfrecord_files(v.path) for _ in read_tfrecords(f, read=0))
            where = repr(str(resolve_path(v.path)))
        elif source == "image_folder":
            problems = check_image_folder(held)
            count, where = sum(n for _, n in image_folder_classes(v.path)), repr(str(resolve_path(v.path)))
        else:
            return []
    except DataFileError as exc:
        problems, count, where = [exc.problem], 1, ""
    problems = [p for p in problems if p.field != "data.size"]  # a small held-out file is fine
    if not problems and count == 0:
        problems = [Problem("validation.path", f"{where} has no examples; expected held-out examples to evaluate")]
    return [Problem("validation.path", p.message) if p.field == "data.path" else p for p in problems]


def require(config: RunConfig) -> None:
    """Raise :class:`ConfigError` with the problems of :func:`check` (used inside task processes)."""
    problems = check(config, here=True)
    if problems:
        raise ConfigError(problems)


# --------------------------------------------------------------------------- TFRecord


def tfrecord_files(path: str) -> list[Path]:
    """The TFRecord files of ``data.path``: the file itself, or a folder's files ending in .tfrecord(s)/.tfrec."""
    p = resolve_path(path)
    mode = _mode(p)
    if mode is not None and not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
        raise _fail("data.path", f"{str(p)!r} is {file_kind(mode)}, not a regular file; expected a TFRecord file "
                                 "(or a folder of them)")
    if mode is not None and stat.S_ISDIR(mode):
        # regular files only (is_file follows links and is False for a FIFO or a device)
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TFRECORD_EXTENSIONS))
        if not files:
            raise _fail("data.path", f"{str(p)!r} is a folder without TFRecord files; expected files ending in "
                                     f"{', '.join(TFRECORD_EXTENSIONS)}")
        return files
    if mode is None:
        raise _fail("data.path", _nothing_there(p, "a TFRecord file (or a folder of them)"))
    return [p]


def tfrecord_x_dtype(config: RunConfig) -> str:
    if config.data.x_dtype != "auto":
        return config.data.x_dtype
    return "int64" if config.model.name in TOKEN_MODELS else "float32"


def read_tfrecords(path: Path, read: int | None = None) -> Iterator[bytes]:
    """The records of one TFRecord file (length-prefixed frames; the CRCs are not verified here).

    After ``read`` records the rest are only counted: they come as empty ``bytes``.
    """
    with open_regular(path, what="a TFRecord file") as fh:
        size = os.fstat(fh.fileno()).st_size
        count = 0
        while True:
            head = fh.read(12)
            if not head:
                return
            if len(head) < 12:
                raise _fail("data.path", f"{str(path)!r} ends inside a record header; expected a TFRecord file")
            (length,) = struct.unpack("<Q", head[:8])
            if length > 1 << 30:
                raise _fail("data.path", f"{str(path)!r} has a record of {length} bytes; expected a TFRecord file")
            if read is not None and count >= read:
                fh.seek(length + 4, os.SEEK_CUR)
                if fh.tell() > size:
                    raise _fail("data.path", f"{str(path)!r} ends inside a record; expected a TFRecord file")
                data = b""
            else:
                data = fh.read(length)
                if len(data) < length or len(fh.read(4)) < 4:
                    raise _fail("data.path", f"{str(path)!r} ends inside a record; expected a TFRecord file")
            count += 1
            yield data


def check_tfrecord(config: RunConfig) -> list[Problem]:
    """Count the records and parse them as ``tf.train.Example`` with the config's feature spec."""
    d, m = config.data, config.model
    files = tfrecord_files(d.path)
    want = math.prod(d.shape)
    dtype = tfrecord_x_dtype(config)
    count = 0
    problems: list[Problem] = []
    for path in files:
        f = repr(str(path))
        for record in read_tfrecords(path, read=max(0, TFRECORD_PARSED - count)):
            count += 1
            if count > TFRECORD_PARSED or problems:
                continue
            try:
                features = parse_example(record)
            except (ValueError, struct.error) as exc:  # a corrupted record: named, never a traceback
                return [Problem("data.path", f"{f} record {count - 1} is not a tf.train.Example ({exc})")]
            where = f"{f} record {count - 1}"
            for key, field in ((d.x_key, "data.x_key"), (d.y_key, "data.y_key")):
                if key not in features:
                    return [Problem(field, f"{where} has no feature {key!r}; expected one of "
                                           f"{', '.join(repr(k) for k in sorted(features)) or '(none)'}")]
            kind, x = features[d.x_key]
            if kind != dtype:
                return [Problem("data.x_dtype", f"{where}: feature {d.x_key!r} is a {kind} list; expected {dtype} "
                                                f"(data.x_dtype {d.x_dtype!r})")]
            if len(x) != want:
                return [Problem("data.shape", f"{where}: feature {d.x_key!r} has {len(x)} values; expected {want} "
                                              f"to match data.shape {list(d.shape)}")]
            if kind == "float32" and not all(math.isfinite(v) for v in x):
                col = next(i for i, v in enumerate(x) if not math.isfinite(v))
                return [Problem("data.path", f"{where}: feature {d.x_key!r} holds {x[col]} at value {col}; "
                                             f"expected finite numbers")]
            kind, y = features[d.y_key]
            if kind != "int64" or len(y) != 1:
                return [Problem("data.y_key", f"{where}: feature {d.y_key!r} is {len(y)} {kind} value(s); "
                                              f"expected one int64 class id")]
            if not 0 <= int(y[0]) < d.classes:
                problems.append(Problem("data.classes", f"{where}: label {int(y[0])} in feature {d.y_key!r} is out "
                                                        f"of range; expected labels from 0 to {d.classes - 1} "
                                                        f"(data.classes {d.classes})"))
            elif m.name in TOKEN_MODELS and len(x) and (min(x) < 0 or max(x) >= m.vocab_size):
                problems.append(Problem("model.vocab_size", f"{where}: feature {d.x_key!r} holds token id "
                                                            f"{min(x) if min(x) < 0 else max(x)}; expected ids from "
                                                            f"0 to {m.vocab_size - 1} (model.vocab_size "
                                                            f"{m.vocab_size})"))
    where = repr(str(files[0])) if len(files) == 1 else f"{str(resolve_path(d.path))!r} ({len(files)} files)"
    return problems + _size_problems(config, count, where)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _proto_fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i:i + length], i + length
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_example(record: bytes) -> dict[str, tuple[str, list[Any]]]:
    """A serialized ``tf.train.Example`` as ``{feature: (kind, values)}``, kind one of bytes, float32, int64."""
    out: dict[str, tuple[str, list[Any]]] = {}
    for number, wire, features in _proto_fields(record):
        if number != 1 or wire != 2:
            continue
        for n2, w2, entry in _proto_fields(features):
            if n2 != 1 or w2 != 2:
                continue
            key, feature = "", b""
            for n3, w3, part in _proto_fields(entry):
                if n3 == 1 and w3 == 2:
                    key = part.decode("utf-8", "replace")
                elif n3 == 2 and w3 == 2:
                    feature = part
            kind, values = "bytes", []
            for n4, w4, lst in _proto_fields(feature):
                if w4 != 2:
                    continue
                kind = {1: "bytes", 2: "float32", 3: "int64"}.get(n4, "bytes")
                for n5, w5, item in _proto_fields(lst):
                    if n5 != 1:
                        continue
                    if kind == "float32":
                        if (w5 == 2 and len(item) % 4) or (w5 != 2 and len(item) != 4):
                            raise ValueError(f"a float list of {len(item)} bytes, not whole 4-byte floats")
                        values += list(struct.unpack(f"<{len(item) // 4}f", item))
                    elif kind == "int64":
                        if w5 == 2:
                            j = 0
                            while j < len(item):
                                x, j = _varint(item, j)
                                values.append(_signed64(x))
                        elif isinstance(item, int):
                            values.append(_signed64(item))
                        else:
                            raise ValueError(f"an int64 list holding {len(item)} raw bytes")
                    else:
                        values.append(item)
            out[key] = (kind, values)
    return out


# --------------------------------------------------------------------------- image folders


def image_folder_classes(path: str) -> list[tuple[str, int]]:
    """``(class folder, image count)`` in label order (sorted names, as Keras infers labels)."""
    return [(sub.name, len(files)) for sub, files in _image_files(path)]


def image_folder_files(path: str) -> list[tuple[Path, list[Path]]]:
    """Each class folder of an image folder (sorted) with the image files Keras reads in it (by extension,
    whatever their type), as ``image_dataset_from_directory`` finds them: hidden folders (``.ssh``) are no
    class, and no folder inside a class is entered through a symbolic link (so a loop of links is never
    walked)."""
    return _image_files(path)


def _image_files(path: str) -> list[tuple[Path, list[Path]]]:
    """Each class folder (sorted, hidden ones left out as Keras leaves them) with its image files (by
    extension, whatever their type)."""
    p = resolve_path(path)
    mode = _mode(p)
    if mode is None:
        raise _fail("data.path", _nothing_there(p, "a folder with one subfolder of images per class", "folder"))
    if not stat.S_ISDIR(mode):
        what = "a file" if stat.S_ISREG(mode) else file_kind(mode)
        raise _fail("data.path", f"{str(p)!r} is {what}; expected a folder with one subfolder of images per class")
    return [(sub, [Path(root) / n for root, _, names in os.walk(sub) for n in sorted(names)
                   if n.lower().endswith(IMAGE_EXTENSIONS)])
            for sub in sorted(s for s in p.iterdir() if s.is_dir() and not s.name.startswith("."))]


#: The first bytes of each image format the image-folder reader decodes (TensorFlow's decode_image).
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
#: At most this many image files are opened to check their type (the rest by name and type only).
IMAGE_FILES_CHECKED = 20_000


def _image_file_problem(files: list[Path]) -> Problem | None:
    """The first image file that is not a regular file, or whose bytes are no image (text saved as .png)."""
    for i, f in enumerate(files):
        mode = _mode(f)
        if mode is None or not stat.S_ISREG(mode):
            what = "a dangling link" if mode is None else file_kind(mode)
            return Problem("data.path", f"{str(f)!r} is {what}; expected an image file")
        if i >= IMAGE_FILES_CHECKED:
            continue
        try:
            with open_regular(f, what="an image file") as fh:
                head = fh.read(16)
        except DataFileError as exc:
            return exc.problem
        if not head.startswith(IMAGE_MAGIC):
            sample = head[:8].decode("ascii", "replace").encode("unicode_escape").decode("ascii")
            return Problem("data.path", f"{str(f)!r} is not an image (it starts with {sample!r}); expected a PNG, "
                                        "JPEG, GIF or BMP file")
    return None


def check_image_folder(config: RunConfig) -> list[Problem]:
    d = config.data
    folder = repr(str(resolve_path(d.path)))
    found = _image_files(d.path)
    classes = [(sub.name, len(files)) for sub, files in found]
    if not classes:
        return [Problem("data.path", f"{folder} has no subfolders; expected one subfolder of images per class")]
    if len(classes) > d.classes:
        return [Problem("data.classes", f"{folder} has {len(classes)} class folders, so labels go up to "
                                        f"{len(classes) - 1}; expected at most data.classes = {d.classes} folders")]
    total = sum(n for _, n in classes)
    if total == 0:
        return [Problem("data.path", f"{folder} holds no images; expected files ending in "
                                     f"{', '.join(IMAGE_EXTENSIONS)} in its class subfolders")]
    bad = _image_file_problem([f for _, files in found for f in files])
    if bad is not None:
        return [bad]
    return _size_problems(config, total, folder)


def describe(config: RunConfig) -> str:
    """One line naming where this config's examples come from (for logs and the GUI)."""
    d = config.data
    if d.source in FILE_SOURCES:
        return f"{d.source} {d.path}"
    if d.source in KERAS_SOURCES:
        return f"{d.source} from {keras_home() / 'datasets'}"
    return d.source
