"""The examples of a task process: generated, shipped, cached by Keras, or read from the user's files.

Nothing downloads. :func:`make_dataset` is what every strategy calls: one input
pipeline's stream, batched per replica and sharded per input pipeline.
The numpy-readable sources (digits, the Keras sets, ``.npz``, ``.csv``) are read by
:mod:`engine.contract.datasets`, which also checks them before launch; TFRecord files and
image folders are read by TensorFlow here; ``script`` calls the user's
``make_dataset(input_context, config)``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from engine.contract import datasets
from engine.contract.config import TOKEN_MODELS, ConfigError, Problem, RunConfig
from engine.runtime import user_script

#: Sources read with numpy (engine.contract.datasets.load_arrays).
NUMPY_SOURCES = ("digits", "mnist", "fashion_mnist", "cifar10", "npz", "csv")


def synthetic_arrays(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """A learnable classification task: Gaussian inputs labelled by a fixed random teacher.

    ``split="eval"`` draws fresh inputs labelled by the same teacher (held-out data).
    """
    d = config.data
    seed = config.training.seed
    features = int(np.prod(d.shape))
    teacher = np.random.default_rng([seed, 0]).standard_normal((features, d.classes), dtype=np.float32)
    size = d.size if split == "train" else max(config.training.global_batch_size, min(d.size, 2048))
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    x = rng.standard_normal((size, *d.shape), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((size, d.classes), dtype=np.float32)
    y = np.argmax(x.reshape(size, -1) @ teacher + noise, axis=1)
    return x, y.astype(np.int32)


def synthetic_tokens(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Token sequences for the token models: each class favours its own slice of the vocabulary."""
    d, m = config.data, config.model
    seed = config.training.seed
    length = int(d.shape[0])
    size = d.size if split == "train" else max(config.training.global_batch_size, min(d.size, 2048))
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    y = rng.integers(0, d.classes, size=size)
    # half the tokens come from the class's own band of ids, half from anywhere
    band = max(1, m.vocab_size // d.classes)
    own = (y[:, None] * band + rng.integers(0, band, size=(size, length))) % m.vocab_size
    anywhere = rng.integers(0, m.vocab_size, size=(size, length))
    x = np.where(rng.random((size, length)) < 0.5, own, anywhere)
    return x.astype(np.int32), y.astype(np.int32)


def arrays(config: RunConfig, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The examples of this config as numpy arrays (the evaluator's held-out set with ``split="eval"``).

    Token ids (int32) for token models, float32 inputs of ``data.shape`` otherwise; int32 labels.
    Sources read by TensorFlow (TFRecord, image folders, the user's script) give their first
    examples, at most :data:`engine.contract.datasets.EVAL_EXAMPLES` for ``eval``.
    """
    source = config.data.source
    if split in ("train", "held_out") and source in ("synthetic", *NUMPY_SOURCES):
        x, y = _all_arrays(config, "train")
        every = holdout_every(config)
        if not every:
            return (x, y) if split == "train" else (x[:0], y[:0])
        held = np.arange(len(y)) % every == every - 1
        keep = held if split == "held_out" else ~held
        return x[keep], y[keep]
    if source == "synthetic" or source in NUMPY_SOURCES:
        return _all_arrays(config, split)
    limit = config.data.size if split == "train" else datasets.EVAL_EXAMPLES
    if source == "script":
        # the script batches (global batches without an input context): undo it to count examples
        ds = user_script.make_dataset(config, None).unbatch()
    else:
        ds = examples(config)
    xs, ys = [], []
    for x, y in ds.take(limit).batch(512).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ConfigError([Problem("data.path", f"{config.data.path!r} gave no examples")])
    return np.concatenate(xs), np.concatenate(ys).reshape(-1).astype(np.int32)


def _all_arrays(config: RunConfig, split: str) -> tuple[np.ndarray, np.ndarray]:
    source = config.data.source
    if source == "synthetic":
        if config.model.name in TOKEN_MODELS:
            return synthetic_tokens(config, split)
        return synthetic_arrays(config, split)
    try:
        return datasets.prepare(config, datasets.load_arrays(config, split), split)
    except datasets.DataFileError as exc:
        raise ConfigError([exc.problem]) from None


def holdout_every(config: RunConfig) -> int:
    """``validation.split`` as a rule on example positions: every k-th example (k = round(1 / split), at least
    2) is held out of training for validation; 0 where nothing is held out. A rule on positions, not a
    count, so that streams of unknown length (TFRecord files, image folders) split the same way."""
    split = config.validation.split
    return max(2, round(1 / split)) if split > 0 else 0


def _split(ds: tf.data.Dataset, config: RunConfig, held_out: bool) -> tf.data.Dataset:
    every = holdout_every(config)
    if not every:
        return ds.take(0) if held_out else ds
    k = tf.constant(every, tf.int64)
    picked = ds.enumerate().filter(lambda i, _: tf.equal(i % k, k - 1) if held_out else tf.not_equal(i % k, k - 1))
    return picked.map(lambda _, example: example)


def validation_dataset(config: RunConfig) -> tf.data.Dataset:
    """The held-out examples in global batches (the last one may be smaller), at most
    ``validation.batches`` of them: ``validation.path`` (a file of the data source's kind), the examples
    ``validation.split`` keeps out of training, or a script's ``make_validation_dataset(config)``."""
    v = config.validation
    batch = config.training.global_batch_size
    if config.data.source == "script":
        ds = user_script.make_validation_dataset(config)
    else:
        if v.path.strip():
            held = dataclasses.replace(config, data=dataclasses.replace(config.data, path=v.path),
                                       validation=dataclasses.replace(v, split=0.0, path=""))
            ds = examples(held)
        elif config.data.source in ("synthetic", *NUMPY_SOURCES):
            ds = tf.data.Dataset.from_tensor_slices(arrays(config, "held_out"))
        else:
            ds = _split(_examples_all(config), config, held_out=True)
        ds = ds.batch(batch)
    return ds.take(v.batches) if v.batches else ds


def examples(config: RunConfig) -> tf.data.Dataset:
    """The training examples, one ``(x, y)`` pair at a time, at most ``data.size`` of them.

    Files are checked first (:mod:`engine.contract.datasets`): a bad one fails the task with the same
    message the launcher gives before a launch.
    """
    source = config.data.source
    if source == "synthetic" or source in NUMPY_SOURCES:
        x, y = arrays(config)
        return tf.data.Dataset.from_tensor_slices((x, y))
    return _split(_examples_all(config), config, held_out=False)


def _examples_all(config: RunConfig) -> tf.data.Dataset:
    """The examples of a source TensorFlow reads (TFRecord, image folder), held-out ones included."""
    source = config.data.source
    if source == "tfrecord":
        datasets.require(config)
        return _tfrecord_examples(config).take(config.data.size)
    if source == "image_folder":
        datasets.require(config)
        return _image_folder_examples(config).take(config.data.size)
    raise ValueError(f"data.source: {source!r} has no examples of its own (the user's script batches them)")


def _tfrecord_examples(config: RunConfig) -> tf.data.Dataset:
    d = config.data
    files = [str(f) for f in datasets.tfrecord_files(d.path)]
    x_dtype = tf.int64 if datasets.tfrecord_x_dtype(config) == "int64" else tf.float32
    spec = {d.x_key: tf.io.FixedLenFeature([math.prod(d.shape)], x_dtype),
            d.y_key: tf.io.FixedLenFeature([], tf.int64)}
    token = config.model.name in TOKEN_MODELS
    shape = tuple(d.shape)

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ex = tf.io.parse_single_example(record, spec)
        x = tf.reshape(ex[d.x_key], shape)
        x = tf.cast(x, tf.int32 if token else tf.float32)
        return x, tf.cast(ex[d.y_key], tf.int32)

    # files in a fixed order: every input pipeline sees the same stream and keeps its own shard of it
    return tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _image_folder_examples(config: RunConfig) -> tf.data.Dataset:
    import keras

    d = config.data
    height, width, channels = d.shape
    ds = keras.utils.image_dataset_from_directory(
        str(datasets.resolve_path(d.path)), labels="inferred", label_mode="int",
        color_mode={1: "grayscale", 3: "rgb", 4: "rgba"}[channels], batch_size=None,
        image_size=(height, width), shuffle=False, verbose=False)
    return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, tf.cast(y, tf.int32)))


def make_dataset(config: RunConfig, input_context: tf.distribute.InputContext | None = None,
                 examples_folder: str | None = None) -> tf.data.Dataset:
    """The training stream of one input pipeline, batched per replica, repeated forever.

    With several input pipelines (several workers) each reads its own shard. With source
    ``script`` the user's ``make_dataset(input_context, config)`` shards and batches itself.
    ``examples_folder``: read the numpy-made examples from the files :func:`write_examples` wrote
    there instead of embedding them in the pipeline (a pipeline traced on one task and run on
    others carries its constants along).
    """
    if config.data.source == "script":
        return user_script.make_dataset(config, input_context).repeat()
    if examples_folder is not None and config.data.source in ("synthetic", *NUMPY_SOURCES):
        ds = read_examples(config, examples_folder)
    else:
        ds = examples(config)
    batch = config.training.global_batch_size
    if input_context is not None:
        if isinstance(input_context.input_pipeline_id, tf.Tensor) or input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    if config.data.source not in ("synthetic", *NUMPY_SOURCES):
        ds = ds.cache()  # decoded once, then shuffled from memory each epoch
    buffer = min(config.data.size, 10_000)
    ds = ds.shuffle(buffer, seed=config.training.seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def sample_batch(config: RunConfig, rows: int) -> tuple[tf.Tensor, ...]:
    """One batch of the run's data, of ``rows`` examples where the source batches for ClusterDeck: what
    an unbuilt model and a compiled model's loss and metrics are built with, before the first step."""
    if config.data.source == "script":
        context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                             num_replicas_in_sync=max(1, config.training.global_batch_size // rows))
        ds = user_script.make_dataset(config, context)
    else:
        ds = examples(config).batch(rows)
    for batch in ds.take(1):
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    raise ConfigError([Problem("data.path" if config.data.source in ("script", "tfrecord", "image_folder") else
                               "data.source", "the data gave no examples")])


def _examples_dtype(config: RunConfig) -> tf.DType:
    return tf.int32 if config.model.name in TOKEN_MODELS else tf.float32


def write_examples(config: RunConfig, folder: str | os.PathLike[str]) -> Path:
    """Write the numpy-made training examples (synthetic or read with numpy) as raw arrays into
    ``folder`` (``x.bin``, ``y.bin``); atomic, so tasks sharing the folder may all write it."""
    x, y = arrays(config)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.int32 if _examples_dtype(config) == tf.int32 else np.float32
    for name, array in (("x.bin", np.ascontiguousarray(x, dtype=dtype)),
                        ("y.bin", np.ascontiguousarray(y, dtype=np.int32).reshape(-1))):
        tmp = out / f".{name}.{os.getpid()}.tmp"
        array.tofile(tmp)
        os.replace(tmp, out / name)
    return out


def read_examples(config: RunConfig, folder: str) -> tf.data.Dataset:
    """The examples :func:`write_examples` wrote into ``folder`` (read where the pipeline runs; a
    relative folder is relative to that task's working folder, its run folder)."""
    shape = tuple(int(d) for d in config.data.shape)
    x = tf.reshape(tf.io.decode_raw(tf.io.read_file(f"{folder}/x.bin"), _examples_dtype(config)), (-1, *shape))
    y = tf.io.decode_raw(tf.io.read_file(f"{folder}/y.bin"), tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y))
