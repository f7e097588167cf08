"""The one config model of a run: cluster, parallelism, data, model, training.

Plain frozen dataclasses hold the values; :func:`from_dict` parses untrusted
input (YAML, the GUI) and :func:`validate` checks a config as a whole. Every
problem names the field, the value and what was expected, e.g.
``cluster.hosts[1].gpus: expected an integer >= 0, got -2``.

This module imports no TensorFlow and no Qt: the GUI, the CLI and the task
processes all share it.
"""

from __future__ import annotations

import builtins
import dataclasses
import ipaddress
import math
import os
import re
import shlex
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from engine.contract.fields import (
    CustomReader,
    CustomWriter,
    FieldSpec,
    Problem,
    _choices,
    _key_text,
    _Reader,
    _show,
    check_fields,
    read_fields,
    section,
    spec,
    walk,
    write_fields,
)

SCHEMA_VERSION = 1
_T = TypeVar("_T")

ROLES = ("chief", "worker", "ps", "evaluator")
TRAINER_ROLES = ("chief", "worker")
MODES = ("data", "model", "async")
#: The DTensor mesh's first axis (the batch is split over it) and last (layers' parameters are split over it).
MESH_BATCH = "batch"
MESH_MODEL = "model"
#: Extra named mesh axes a config may add between them.
MAX_MESH_AXES = 4
_AXIS_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop")
PARTITIONERS = ("none", "min_size", "fixed")
#: What a NaN or infinite loss does (``training.on_nan``).
NAN_POLICIES = ("fail", "warn")
#: Where examples come from: generated, shipped with ClusterDeck, Keras' local cache, the user's files or script.
DATA_SOURCES = ("synthetic", "digits", "mnist", "fashion_mnist", "cifar10", "npz", "csv", "tfrecord",
                "image_folder", "script")
#: Data sets read from Keras' download cache (``$KERAS_HOME/datasets``); ClusterDeck never downloads them.
KERAS_SOURCES = ("mnist", "fashion_mnist", "cifar10")
#: Sources read from ``data.path`` (a file, a folder or the user's script).
FILE_SOURCES = ("npz", "csv", "tfrecord", "image_folder", "script")
#: Sources of images (pixels, not token ids).
IMAGE_SOURCES = ("digits", "mnist", "fashion_mnist", "cifar10", "image_folder")
#: Fixed figures of the data sets ClusterDeck knows: (shape of one example, classes).
KNOWN_DATA: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((8, 8), 10),
    "mnist": ((28, 28), 10),
    "fashion_mnist": ((28, 28), 10),
    "cifar10": ((32, 32, 3), 10),
}
#: The dtype of TFRecord input features: ``auto`` is int64 for token models, float32 otherwise.
TFRECORD_DTYPES = ("auto", "float32", "int64")
MODELS = ("mlp", "cnn", "resnet", "embedding", "transformer", "script")
#: Models that read token ids (1-D sequences of integers below ``model.vocab_size``).
TOKEN_MODELS = ("embedding", "transformer")
#: Models that read images: ``data.shape`` is [height, width] or [height, width, channels].
IMAGE_MODELS = ("cnn", "resnet")
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1", "")
#: Upper bound of step counts: far beyond any real run, and it keeps every figure printable.
MAX_STEPS = 10**9
#: Training steps one scheduled function may run (``training.steps_per_execution``).
MAX_STEPS_PER_EXECUTION = 1000
#: The parallelism modes that run steps in groups (``training.steps_per_execution`` > 1).
STEPS_PER_EXECUTION_MODES = ("data", "async")

#: Which parallelism modes each model supports (the app offers a model only in these modes). The
#: async runtime trains any Keras model (the embedding one with its table sharded over the ps tasks);
#: the model-parallel runtime only models built from sharded blocks (engine.runtime.sharded).
MODEL_MODES: dict[str, tuple[str, ...]] = {
    "mlp": ("data", "model", "async"),
    "cnn": ("data", "async"),
    "resnet": ("data", "async"),
    "embedding": ("data", "model", "async"),
    "transformer": ("data", "model", "async"),
    # parallelism 'model' calls the script's build_sharded_model(config, mesh) (engine.runtime.sharded)
    "script": ("data", "model", "async"),
}


# --------------------------------------------------------------------------- model


#: Tasks one host may hold, and tasks in all: far beyond a real cluster drawn here, and they keep a bad
#: preset (or an alias bomb) from starting thousands of processes.
MAX_TASKS_PER_HOST = 256
MAX_TASKS = 1024
MAX_HOSTS = 256
#: Largest GPU count of a host or a Slurm node, and the largest size of a mesh axis or a Slurm count.
MAX_GPUS = 64
MAX_MESH_AXIS = 4096
#: Largest minimum shard size of the 'min_size' partitioner (1 TiB).
MAX_SHARD_BYTES = 2**40


def _machine(h: Host) -> bool:
    return h.kind != "slurm"


def _slurm(h: Host) -> bool:
    return h.kind == "slurm"


def _mode_is(*modes: str) -> Callable[[RunConfig], bool]:
    return lambda c: c.parallelism.mode in modes


@dataclass(frozen=True)
class Task:
    """One TensorFlow task: a process running as ``role:index``."""

    role: str = spec("worker", choices=ROLES, help="chief coordinates (async) or trains; workers train; ps hold "
                     "variables (async); the evaluator evaluates checkpoints")
    index: int = spec(0, minimum=0, maximum=9999,
                      help="Task indices are numbered 0..n-1 per role, in canvas order")
    # None means: pick a free port at launch
    port: int | None = spec(None, kind="custom", parse="port", minimum=1, maximum=65535,
                            help="The task's gRPC port; 'auto' picks a free one at launch",
                            schema={"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 1, "maximum": 65535},
                                              {"type": "null"}]})

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


#: Kinds of host group: one machine (this one, or reached over SSH), or nodes allocated by Slurm.
HOST_KINDS = ("machine", "slurm")
#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
#: A memory size as Slurm reads it: a number of megabytes, or with a unit K, M, G or T.
SLURM_MEMORY = re.compile(r"^\d+[KMGT]?$")
_SLURM_TEXT: dict[str, Any] = {"type": ["string", "integer", "null"]}
_OPTIONS: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                                  "maxItems": 64}, {"type": "null"}]}


@dataclass(frozen=True)
class Slurm:
    """Where and how a Slurm host group is allocated (``salloc``) and its supervisors started (``srun``).

    Empty strings leave Slurm's defaults (the default partition, its time limit, the user's account).
    """

    partition: str = spec("", strip=True, applies=_slurm, when="kind: slurm",
                          help="The Slurm partition the nodes are allocated in (--partition); empty: the "
                               "cluster's default partition")
    nodes: int = spec(1, minimum=1, maximum=4096, applies=_slurm, when="kind: slurm",
                      help="Nodes to allocate (--nodes); the tasks fill them in drawn order, ceil(tasks / nodes) "
                           "per node, one supervisor per node")
    gpus_per_node: int = spec(0, minimum=0, maximum=MAX_GPUS, applies=_slurm, when="kind: slurm",  # --gres=gpu:N
                              help="GPUs asked on each node (--gres=gpu:N), split evenly over the node's "
                                   "chief/worker tasks; 0: CPU only")
    cpus_per_task: int = spec(1, minimum=1, maximum=4096, applies=_slurm, when="kind: slurm",
                              help="CPUs for each task (--cpus-per-task)")
    # e.g. '4G'; --mem of a node is this times its tasks
    mem_per_task: str = spec("", kind="custom", parse="slurm_memory", write="changed", schema=_SLURM_TEXT,
                             applies=_slurm, when="kind: slurm",
                             help="Memory for each task, e.g. 4G or 512M (a bare number is megabytes); a node asks "
                                  "for this times its tasks (--mem). Empty: Slurm's default")
    # Slurm's format, e.g. '30' (minutes), '2:00:00', '1-00:00:00'
    time_limit: str = spec("", kind="custom", parse="slurm_time", write="changed", schema=_SLURM_TEXT,
                           applies=_slurm, when="kind: slurm",
                           help="The job's time limit (--time): minutes (30), HH:MM:SS (00:30:00) or D-HH:MM:SS; "
                                "Slurm ends the job there and the run fails with TIMEOUT. Empty: the partition's "
                                "limit")
    account: str = spec("", strip=True, write="changed", applies=_slurm, when="kind: slurm",
                        help="The account the job is charged to (--account); empty: your default")
    qos: str = spec("", strip=True, write="changed", applies=_slurm, when="kind: slurm",
                    help="The quality of service of the job (--qos); empty: the default")
    # extra options of the allocation (salloc reads sbatch's options)
    sbatch_options: tuple[str, ...] = spec((), kind="custom", parse="options", write="changed", schema=_OPTIONS,
                                           applies=_slurm, when="kind: slurm",
                                           help="Extra options of the allocation, as a shell reads them (salloc "
                                                "takes sbatch's options), e.g. --constraint=a100 --exclusive")
    # extra options of each supervisor's srun step
    srun_options: tuple[str, ...] = spec((), kind="custom", parse="options", write="changed", schema=_OPTIONS,
                                         applies=_slurm, when="kind: slurm",
                                         help="Extra options of each node's srun step, as a shell reads them, "
                                              "e.g. --cpu-bind=cores")
    # options that run programs (--prolog, --task-prolog, ...) are refused unless the user opts in here, in a
    # field of its own that is shown before every launch (SECURITY.md: a shared preset cannot slip them in)
    allow_program_options: bool = spec(False, write="changed", applies=_slurm, when="kind: slurm",
                                       help="Let sbatch/srun options that run programs (--prolog, --task-prolog, "
                                            "--epilog) through; shown before every launch")


@dataclass(frozen=True)
class Host:
    """A machine of the cluster and the tasks placed on it (or, ``kind: slurm``, a group of Slurm nodes)."""

    name: str = spec("local", nonempty=True, help="A unique name for this host (or Slurm group)")
    address: str = spec("localhost", nonempty=True, applies=_machine, when="kind: machine",
                        help="Host name or IP address the tasks are reached at (localhost runs here)")
    gpus: int = spec(0, minimum=0, maximum=MAX_GPUS, applies=_machine, when="kind: machine",
                     help="GPUs of this host, split evenly over its chief/worker tasks (emulated as CPU devices "
                          "where there is no GPU)")
    tasks: tuple[Task, ...] = section(Task, "tasks", many=True, default=())
    ssh_user: str = spec("", write="changed", applies=_machine, when="kind: machine",
                         help="The user to log in as over SSH; empty: ssh's default")
    ssh_port: int = spec(22, minimum=1, maximum=65535, write="changed", applies=_machine, when="kind: machine",
                         help="The SSH port of this host (22 unless its sshd listens elsewhere)")
    python: str = spec("python3", nonempty=True, write="changed",
                       help="The Python on this host (for a Slurm group: on its nodes) that has ClusterDeck and "
                            "TensorFlow installed (local tasks use the app's own Python)")
    # the name ssh dials (an alias of ~/.ssh/config); default: the address
    ssh_host: str = spec("", write="changed", applies=_machine, when="kind: machine",
                         help="The name ssh dials for this host (an alias of ~/.ssh/config works); empty: the "
                              "address. Set it to run a host over SSH.")
    kind: str = spec("machine", choices=HOST_KINDS, write="changed",
                     help="Machine: this computer, or one reached over SSH.\nSlurm group: nodes Slurm allocates "
                          "(salloc), one supervisor per node started by srun; the tasks fill the nodes in drawn "
                          "order")
    slurm: Slurm | None = section(Slurm, "slurm", default=None)  # kind 'slurm': the allocation

    @property
    def is_local(self) -> bool:
        """This machine: a loopback address and no SSH target (never a Slurm group)."""
        if self.kind == "slurm":
            return False
        return not self.ssh_host.strip() and self.address.strip().lower() in LOCAL_ADDRESSES

    @property
    def is_slurm(self) -> bool:
        return self.kind == "slurm"

    def node_tasks(self) -> list[tuple[Task, ...]]:
        """The tasks of each node: one group for a machine; for Slurm, the drawn tasks in order, in
        blocks of ``ceil(tasks / nodes)`` (Slurm's default block distribution, which TensorFlow's
        ``SlurmClusterResolver`` assumes)."""
        if self.kind != "slurm" or self.slurm is None:
            return [self.tasks]
        nodes = max(1, self.slurm.nodes)
        per = max(1, -(-len(self.tasks) // nodes))
        return [self.tasks[i * per:(i + 1) * per] for i in range(nodes)]

    def node_of(self, task: Task) -> Host:
        """The machine ``task`` runs on, as a host of its own: for Slurm, one node of the group with
        its tasks and ``gpus_per_node`` GPUs (and no ``slurm`` block); a machine is itself."""
        if self.kind != "slurm" or self.slurm is None:
            return self
        group = next((g for g in self.node_tasks() if task in g), (task,))
        return dataclasses.replace(self, gpus=self.slurm.gpus_per_node, tasks=group, slurm=None)

    @property
    def ssh_target(self) -> str:
        return self.ssh_host.strip() or self.address.strip()


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[Host, ...] = section(Host, "hosts", many=True, default=())

    def tasks(self) -> list[tuple[Host, Task]]:
        return [(h, t) for h in self.hosts for t in h.tasks]

    def tasks_of(self, role: str) -> list[Task]:
        return sorted((t for _, t in self.tasks() if t.role == role), key=lambda t: t.index)

    @property
    def is_local(self) -> bool:
        return all(h.is_local for h in self.hosts)


@dataclass(frozen=True)
class Parallelism:
    """How training is spread: the mode, the DTensor mesh (model), the ps partitioner (async). The attributes
    are flat; the YAML nests ``mesh:`` and ``partitioner:`` (each field's ``key``)."""

    mode: str = spec("data", choices=MODES, help="How training is spread over the cluster")
    # model parallelism: the DTensor mesh (batch x model)
    mesh_batch: int = spec(1, key="mesh.batch", minimum=1, maximum=MAX_MESH_AXIS, applies=_mode_is("model"),
                           when="parallelism.mode: model", help="Mesh size along the batch axis")
    mesh_model: int = spec(2, key="mesh.model", minimum=1, maximum=MAX_MESH_AXIS, applies=_mode_is("model"),
                           when="parallelism.mode: model",
                           help="Mesh size along the model axis (hidden sizes must divide by it)")
    # more named mesh axes, in order between 'batch' and 'model' (e.g. (("feature", 2),)): YAML
    # ``mesh: {batch: 2, feature: 2, model: 2}``; a sharded script names them in its layouts
    mesh_axes: tuple[tuple[str, int], ...] = spec(
        (), kind="custom", key="mesh", parse="mesh_axes", applies=_mode_is("model"), when="parallelism.mode: model",
        minimum=1, maximum=MAX_MESH_AXIS,
        schema={"type": "object", "propertyNames": {"pattern": f"^{_AXIS_NAME.pattern}$"},
                "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_MESH_AXIS},
                "maxProperties": 2 + MAX_MESH_AXES},
        help=f"Extra named mesh axes between batch and model, e.g. feature: 2; your sharded script names them in "
             f"its layouts (at most {MAX_MESH_AXES}). batch × axes × model must equal the devices")
    # async: how variables are sharded over the ps tasks
    partitioner: str = spec("none", key="partitioner.kind", choices=PARTITIONERS, applies=_mode_is("async"),
                            when="parallelism.mode: async",
                            help="How variables are sharded over the ps tasks: none, by minimum shard size, or a "
                                 "fixed number of shards")
    shards: int = spec(2, key="partitioner.shards", minimum=1, maximum=1024,
                       applies=lambda c: c.parallelism.mode == "async" and c.parallelism.partitioner == "fixed",
                       when="parallelism.mode: async, partitioner.kind: fixed",
                       help="Number of shards (partitioner 'fixed')")
    min_shard_bytes: int = spec(
        256 * 1024, key="partitioner.min_shard_bytes", minimum=1, maximum=MAX_SHARD_BYTES,
        applies=lambda c: c.parallelism.mode == "async" and c.parallelism.partitioner == "min_size",
        when="parallelism.mode: async, partitioner.kind: min_size", help="Smallest shard in bytes (partitioner 'min_size')")
    # synchronous modes: seconds before a stuck collective fails the run (0: TF's default)
    collective_timeout_s: float = spec(0.0, minimum=0, editor_max=3600, applies=_mode_is("data", "model"),
                                       when="parallelism.mode: data or model",
                                       help="Seconds before a stuck collective fails a synchronous run (0: "
                                            "TensorFlow's default)")

    def mesh_dims(self) -> list[tuple[str, int]]:
        """The DTensor mesh's named axes in order: ``batch``, the extra axes, ``model``."""
        return [(MESH_BATCH, self.mesh_batch), *self.mesh_axes, (MESH_MODEL, self.mesh_model)]

    def mesh_devices(self) -> int:
        """Devices the mesh spans: the product of its axes' sizes."""
        return math.prod(size for _, size in self.mesh_dims())


def _source_in(*sources: str) -> Callable[[RunConfig], bool]:
    return lambda c: c.data.source in sources


def _model_in(*models: str) -> Callable[[RunConfig], bool]:
    return lambda c: c.model.name in models


@dataclass(frozen=True)
class Data:
    """Where examples come from (``source``) and what one looks like.

    ``shape`` is the shape the model sees (a file's examples are reshaped to it: the number of values must
    match); ``size`` is the number of synthetic examples, and for every other source the most examples used.
    """

    source: str = spec("synthetic", choices=DATA_SOURCES, help="Where examples come from")
    shape: tuple[int, ...] = spec((784,), help="Shape of one example, e.g. 784 or 28, 28")
    classes: int = spec(10, minimum=2, maximum=1_000_000, help="Number of classes")
    size: int = spec(8192, minimum=1, maximum=100_000_000,
                     help="Examples in the synthetic data set; for other sources the most examples used")
    # file sources: the .npz/.csv/TFRecord file, the image folder or the user's script
    path: str = spec("", applies=_source_in(*FILE_SOURCES), when=f"data.source: {' | '.join(FILE_SOURCES)}",
                     help="The data file or folder (.npz, .csv, TFRecord, an image folder, or your Python script "
                          "defining make_dataset)")
    x_key: str = spec("x", nonempty=True, write="changed", applies=_source_in("npz", "tfrecord"),
                      when="data.source: npz | tfrecord",
                      help="npz: the array of inputs; TFRecord: the feature of inputs")
    y_key: str = spec("y", nonempty=True, write="changed", applies=_source_in("npz", "csv", "tfrecord"),
                      when="data.source: npz | csv | tfrecord",
                      help="npz: the array of labels; csv: the label column; TFRecord: the label feature")
    x_dtype: str = spec("auto", choices=TFRECORD_DTYPES, write="changed", applies=_source_in("tfrecord"),
                        when="data.source: tfrecord",
                        help="TFRecord: the inputs' feature type (auto: int64 for token models, else float32)")


@dataclass(frozen=True)
class Model:
    name: str = spec("mlp", choices=MODELS, help="The model to train")
    # widths of the dense layers (transformer: its MLP block)
    hidden: tuple[int, ...] = spec((256,), min_len=0, applies=_model_in("mlp", "cnn", "resnet", "embedding", "transformer"),
                                   when="model.name: not script (a script builds its own layers)",
                                   help="Hidden layer widths, e.g. 256, 128")
    vocab_size: int = spec(1000, minimum=2, maximum=10_000_000, applies=_model_in(*TOKEN_MODELS),
                           when="model.name: embedding | transformer",
                           help="Token models: ids run from 0 to vocab size - 1")
    embed_dim: int = spec(64, minimum=1, maximum=65_536, applies=_model_in(*TOKEN_MODELS),
                          when="model.name: embedding | transformer", help="Token models: embedding width")
    heads: int = spec(4, minimum=1, maximum=1024, applies=_model_in("transformer"), when="model.name: transformer",
                      help="Transformer: attention heads (must divide the embed dim)")
    script: str = spec("", write="changed", applies=_model_in("script"), when="model.name: script",
                       help="Your Python file defining build_model(config) (and optionally make_dataset and loss); "
                            "it runs only because you chose it")


@dataclass(frozen=True)
class Training:
    # The fields' order is the order the YAML writes them in.
    global_batch_size: int = spec(128, minimum=1, maximum=1_000_000,
                                  help="Examples per step over all replicas (must divide by the number of replicas)")
    optimizer: str = spec("sgd", choices=OPTIMIZERS, help="The optimizer")
    learning_rate: float = spec(0.05, above=0, editor_min=0.00001, editor_max=10.0,
                                help="Learning rate of the optimizer")
    seed: int = spec(42, minimum=0, maximum=2**31 - 1, help="Random seed (data and initial weights)")
    checkpoint_every: int = spec(0, minimum=0, maximum=MAX_STEPS,  # steps; 0 = only at the end
                                 help="Save a checkpoint every N steps (0: only at the end)")
    restarts: int = spec(0, minimum=0, maximum=100,
                         help="How often a failed run restarts from its last checkpoint before giving up")
    metrics_hz: float = spec(20.0, above=0,  # at most this many step events per replica per second
                             help="At most this many step events per replica per second")
    # a run with no step for this long fails naming the task that hangs (async: the worker is
    # restarted); the first step gets 3x as long; 0 = never
    progress_timeout_s: float = spec(60.0, minimum=0, write="changed",
                                     help="Seconds without a step before the run fails naming the task that hangs "
                                          "(async: the worker is restarted); the first step gets 3x as long; 0: never")
    # a NaN or infinite loss fails the run naming the replica and step (Keras' TerminateOnNaN), or is warned of
    on_nan: str = spec("fail", choices=NAN_POLICIES, write="changed",
                       help="A NaN or infinite loss: fail the run naming the replica and step ('fail'), or warn "
                            "once and go on ('warn')")
    # data and async: training steps per function (Keras' steps_per_execution): one dispatch (async: one
    # schedule from the chief) per this many steps; figures and stops come per such group
    steps_per_execution: int = spec(
        1, minimum=1, maximum=MAX_STEPS_PER_EXECUTION, write="changed", applies=_mode_is(*STEPS_PER_EXECUTION_MODES),
        when="parallelism.mode: data | async",
        help="Data and async: training steps run by one function (Keras' steps_per_execution; async: per function "
             "the chief schedules on a worker). More steps per function: less Python work per step, figures and "
             "stops per group of steps")
    # run even where the local tasks outnumber this machine's CPUs many times over (see engine.control.machine_fit)
    allow_oversubscribe: bool = spec(False, write="changed",
                                     help="Run even where the local tasks outnumber this machine's CPUs many times over")
    steps: int | None = spec(200, kind="int", parse="steps", minimum=1, maximum=MAX_STEPS, write="set",
                             help="Training steps", schema={"type": ["integer", "null"], "minimum": 1,
                                                            "maximum": MAX_STEPS})
    epochs: int | None = spec(None, kind="int", minimum=1, maximum=1_000_000, write="set",
                              help="Passes over the data set (instead of steps)")

    def for_mode(self, mode: str) -> Training:
        """These settings as parallelism ``mode`` takes them: ``steps_per_execution`` back to 1 in a mode
        other than those of :data:`STEPS_PER_EXECUTION_MODES`; ``self`` where nothing changes."""
        if mode not in STEPS_PER_EXECUTION_MODES and self.steps_per_execution != 1:
            return dataclasses.replace(self, steps_per_execution=1)
        return self


@dataclass(frozen=True)
class Validation:
    """Held-out examples evaluated while training: a ``split`` of the data source's examples (kept out of
    training), or a ``path`` of the same kind as ``data.path``; every ``every`` steps (0: never)."""

    split: float = spec(0.0, minimum=0, below=1, editor_max=0.95,  # fraction held out (0: none), below 1
                        wording="a fraction of the examples from 0 to below 1",
                        help="Fraction of the data's examples held out of training and evaluated instead (0: none), "
                             "e.g. 0.1")
    # a file of the data source's kind holding the held-out examples
    path: str = spec("", applies=lambda c: c.data.source in FILE_SOURCES and c.data.source != "script",
                     when="data.source: a file source other than script",
                     help="A file of held-out examples, of the same kind as the data file (instead of a split)")
    every: int = spec(0, minimum=0, maximum=MAX_STEPS,  # steps between two evaluations (0: none in the loop)
                      help="Evaluate the held-out examples every N training steps (0: never in the training loop; "
                           "an evaluator task still can)")
    batches: int = spec(0, minimum=0, maximum=1_000_000,  # global batches per evaluation (0: every example once)
                        applies=lambda c: c.validation.every > 0 or bool(c.cluster.tasks_of("evaluator")),
                        when="validation.every > 0 or an evaluator task",
                        help="Global batches per evaluation (0: every held-out example once)")

    @property
    def enabled(self) -> bool:
        return self.every > 0 and (self.split > 0 or bool(self.path.strip()))


@dataclass(frozen=True)
class Program:
    """The user's own training program, started unchanged in every chief and worker task (the ps tasks
    run the standard ``tf.distribute.Server``); ClusterDeck writes each task's ``TF_CONFIG``."""

    script: str = spec("", nonempty=True, parse="program_script", kind="str",
                       help="Your training program (a Python file); it runs in every chief and worker task with "
                            "the run folder as its working folder")
    args: tuple[str, ...] = spec((), kind="custom", parse="args",
                                 help="Command-line arguments of your program, as a shell splits them, e.g. "
                                      "--epochs 3 --name 'my run'",
                                 schema={"anyOf": [{"type": "string"}, {"type": "array", "maxItems": 1024,
                                                                        "items": {"type": ["string", "number"]}},
                                                   {"type": "null"}]})


@dataclass(frozen=True)
class RunConfig:
    name: str = spec("run", nonempty=True, help="Name of the run (its folder is named after it)")
    cluster: Cluster = section(Cluster, "cluster", default_factory=Cluster)
    parallelism: Parallelism = section(Parallelism, "parallelism", default_factory=Parallelism)
    data: Data = section(Data, "data", default_factory=Data)
    model: Model = section(Model, "model", default_factory=Model)
    training: Training = section(Training, "training", default_factory=Training)
    validation: Validation = section(Validation, "validation", default_factory=Validation)
    # set: the tasks run this program instead of ClusterDeck's loop
    program: Program | None = section(Program, "program", default=None)

    # -- derived figures (used by the launcher, the CLI and the GUI)

    def trainer_tasks(self) -> list[tuple[Host, Task]]:
        return [(h, t) for h, t in self.cluster.tasks() if t.role in TRAINER_ROLES]

    def devices_of(self, host: Host, task: Task) -> int:
        """Accelerators (real or emulated) given to one task; at least 1 for a trainer."""
        if task.role not in TRAINER_ROLES:
            return 0
        host = host.node_of(task)  # a Slurm group's GPUs are per node
        owners = gpu_roles(self.parallelism.mode)
        sharers = sum(1 for t in host.tasks if t.role in owners)
        if host.gpus <= 0 or sharers == 0 or task.role not in owners:
            return 1
        return max(1, host.gpus // sharers)

    def num_replicas(self) -> int:
        if self.parallelism.mode == "async":
            return len(self.cluster.tasks_of("worker"))
        if self.parallelism.mode == "model":
            return max(1, self.parallelism.mesh_batch)
        return sum(self.devices_of(h, t) for h, t in self.trainer_tasks())

    def total_steps(self) -> int:
        t = self.training
        if t.steps is not None:
            return t.steps
        per_epoch = max(1, math.ceil(self.data.size / max(1, t.global_batch_size)))
        return per_epoch * (t.epochs or 1)


def gpu_roles(mode: str) -> tuple[str, ...]:
    """The roles that split a host's GPUs: chief and workers, but in async mode the workers only
    (the async chief coordinates and runs no training step)."""
    return ("worker",) if mode == "async" else TRAINER_ROLES


def split_gpus(host: Host, mode: str) -> dict[str, list[int]]:
    """GPU ids of ``host`` given to each of its tasks, split evenly over the tasks of :func:`gpu_roles`;
    the other tasks get none, so they never grab a GPU's memory."""
    if host.is_slurm and host.slurm is not None:  # each node splits its own GPUs
        split: dict[str, list[int]] = {}
        for group in host.node_tasks():
            if group:
                split.update(split_gpus(host.node_of(group[0]), mode))
        return split
    owners = [t for t in host.tasks if t.role in gpu_roles(mode)]
    result: dict[str, list[int]] = {t.name: [] for t in host.tasks}
    if host.gpus <= 0 or not owners:
        return result
    per = max(1, host.gpus // len(owners))
    for i, t in enumerate(owners):
        result[t.name] = [g for g in range(i * per, (i + 1) * per) if g < host.gpus]
    return result


def default_config() -> RunConfig:
    """Two local workers, data parallel, synthetic data and the 784-256-10 MLP."""
    host = Host(name="local", tasks=(Task("worker", 0), Task("worker", 1)))
    return RunConfig(name="data-2workers", cluster=Cluster(hosts=(host,)))


# --------------------------------------------------------------------------- errors


class ConfigError(ValueError):
    """Raised with every problem found; ``str()`` lists one per line."""

    def __init__(self, problems: Sequence[Problem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        lines = [str(p) for p in self.problems]
        if len(lines) == 1:
            text = head + lines[0]
        else:
            text = head + f"{len(lines)} problems in the config:\n" + "\n".join(f"  - {x}" for x in lines)
        super().__init__(text)


# --------------------------------------------------------------------------- the declared fields

#: Every declared field of a config, by YAML path (``[]`` marks a list's items: ``cluster.hosts[].gpus``).
FIELDS: dict[str, FieldSpec] = {s.path: s for s in walk(RunConfig)}
_BY_ATTR: dict[str, FieldSpec] = {s.attr: s for s in FIELDS.values() if "[]" not in s.path}


def field_spec(path: str) -> FieldSpec:
    """The declaration of one field: by YAML path (``training.steps``, ``parallelism.partitioner.shards``,
    ``cluster.hosts[].slurm.nodes``) or by attribute path (``parallelism.shards``). Its ``help``, bounds
    (``minimum``, ``maximum``; ``low``/``high`` for editors), ``choices`` and ``applies_to(config)``."""
    found = FIELDS.get(path) or _BY_ATTR.get(path)
    if found is None:
        raise KeyError(f"path: expected a declared config field, got {path!r}")
    return found


def attribute_path(path: str) -> str:
    """The attribute path of a field named by YAML or attribute path (``parallelism.partitioner.kind`` ->
    ``parallelism.partitioner``)."""
    return field_spec(path).attr


# --------------------------------------------------------------------------- parsing


def _read_port(r: _Reader, key: str, s: FieldSpec, default: Any) -> int | None:
    raw = r.raw(key)
    if raw is None or raw == "auto":
        return None
    if isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= 65535:
        return raw
    r.fail(key, f"expected 'auto' or an integer from 1 to 65535, got {_show(raw)}")
    return default


def _read_options(r: _Reader, key: str, s: FieldSpec, default: Any) -> tuple[str, ...]:
    """Extra command-line options: a list of words, or one string split as a shell would."""
    value = r.raw(key)
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            r.fail(key, f"expected options a shell can split, got {_show(value)} ({exc})")
            return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 64:
        r.fail(key, f"expected a list of at most 64 option strings, e.g. ['--constraint=a100'], got {_show(value)}")
        return ()
    if value and not value[0].startswith("-"):
        r.fail(key, f"expected options starting with '-', e.g. ['--constraint=a100'], got {_show(value[0])}")
        return ()
    return tuple(value)


def _read_slurm_memory(r: _Reader, key: str, s: FieldSpec, default: Any) -> str:
    raw = r.raw(key)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return str(raw)  # megabytes, as Slurm reads a bare number
    if isinstance(raw, str) and SLURM_MEMORY.match(raw.strip().upper()):
        return raw.strip().upper()
    if raw not in (None, ""):
        r.fail(key, f"expected a memory size such as 4G, 512M or a number of megabytes, got {_show(raw)}")
    return default  # type: ignore[no-any-return]


def _read_slurm_time(r: _Reader, key: str, s: FieldSpec, default: Any) -> str:
    raw = r.raw(key)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return str(raw)  # minutes
    if isinstance(raw, str) and SLURM_TIME.match(raw.strip()):
        return raw.strip()
    if raw not in (None, ""):
        r.fail(key, "expected a Slurm time limit: minutes, 'MM:SS', 'HH:MM:SS' or 'D-HH:MM:SS', got "
                    f"{_show(raw)}")
    return default  # type: ignore[no-any-return]


def _read_mesh_axes(r: _Reader, key: str, s: FieldSpec, default: Any) -> tuple[tuple[str, int], ...]:
    """The mesh's keys besides ``batch`` and ``model``: extra named axes with their sizes, in order."""
    mesh = r.child(key)
    axes: list[tuple[str, int]] = []
    for name in list(mesh.data):
        if name in (MESH_BATCH, MESH_MODEL):
            continue
        if not isinstance(name, str) or not _AXIS_NAME.fullmatch(name):
            mesh.fail(_key_text(name), "expected a mesh axis name (lower-case letters, digits, '_') with its size, "
                                       "e.g. feature: 2")
            if isinstance(name, str):
                mesh.seen.add(name)
            continue
        if len(axes) >= MAX_MESH_AXES:
            mesh.fail(name, f"expected at most {MAX_MESH_AXES} axes besides 'batch' and 'model'")
            continue
        axes.append((name, mesh.int(name, 1, minimum=1, maximum=MAX_MESH_AXIS)))
    return tuple(axes)


def _read_steps(r: _Reader, key: str, s: FieldSpec, default: Any) -> int | None:
    """Steps, unless epochs are given instead (neither: the default steps)."""
    if not r.has(key):
        r.raw(key)
        return None if r.has("epochs") else default  # type: ignore[no-any-return]
    return r.value(key, s, default)  # type: ignore[no-any-return]


def _read_program_script(r: _Reader, key: str, s: FieldSpec, default: Any) -> str:
    if not r.has(key):
        r.fail(key, "expected the path of your training program (a Python file), got nothing")
    return r.value(key, s, default)  # type: ignore[no-any-return]


def _read_args(r: _Reader, key: str, s: FieldSpec, default: Any) -> tuple[str, ...]:
    args = r.raw(key)
    if isinstance(args, str):
        try:
            return tuple(shlex.split(args))
        except ValueError as exc:
            r.fail(key, f"expected arguments a shell can split, got {_show(args)} ({exc})")
    elif isinstance(args, list) and len(args) <= 1024 and all(isinstance(a, (str, int, float)) and
                                                              not isinstance(a, bool) for a in args):
        return tuple(str(a) for a in args)
    elif args is not None:
        r.fail(key, f"expected a list of at most 1024 arguments, e.g. ['--epochs', '3'], got {_show(args)}")
    return ()


#: The readers of the fields whose YAML is special (each field names its own in ``parse``).
_READERS: dict[str, CustomReader] = {
    "port": _read_port, "options": _read_options, "slurm_memory": _read_slurm_memory,
    "slurm_time": _read_slurm_time, "mesh_axes": _read_mesh_axes, "steps": _read_steps,
    "program_script": _read_program_script, "args": _read_args,
}
#: ... and their writers, where the YAML differs from the attribute.
_WRITERS: dict[str, CustomWriter] = {
    "port": lambda port, _task: "auto" if port is None else port,
    "mesh_axes": lambda _axes, p: dict(p.mesh_dims()),
}


def _read(cls: type[_T], r: _Reader, **defaults: Any) -> _T:
    return cls(**read_fields(cls, r, _READERS, defaults=defaults))


def _parse_host(h: _Reader, i: int, role_counts: dict[str, int]) -> Host:
    values = read_fields(Host, h, _READERS, defaults={"name": f"host{i}"})
    raw_tasks = h.items("tasks", "tasks", MAX_TASKS_PER_HOST, "tasks on one host")
    tasks: list[Task] = []
    for j, raw_task in enumerate(raw_tasks):
        tr = _Reader(raw_task, f"{h.where('tasks')}[{j}]", h.problems)
        role_guess = raw_task.get("role") if isinstance(raw_task, Mapping) else None
        role_key = role_guess if isinstance(role_guess, str) else "worker"
        task = _read(Task, tr, index=role_counts.get(role_key, 0))
        role_counts[task.role] = role_counts.get(task.role, 0) + 1
        tasks.append(task)
    kind = values["kind"]
    slurm = _parse_slurm(h.child("slurm")) if kind == "slurm" else None
    if kind != "slurm" and h.has("slurm"):
        h.fail("slurm", f"only a host of kind 'slurm' has a slurm block; expected kind: slurm, got {kind!r}")
    return Host(**values, tasks=tuple(tasks), slurm=slurm)


def _parse_cluster(r: _Reader) -> Cluster:
    raw_hosts = r.items("hosts", "hosts", MAX_HOSTS, "hosts")
    role_counts: dict[str, int] = {}
    hosts = [_parse_host(_Reader(raw, f"{r.where('hosts')}[{i}]", r.problems), i, role_counts)
             for i, raw in enumerate(raw_hosts)]
    r.finish(("hosts",))
    return Cluster(hosts=tuple(hosts))


def _parse_slurm(r: _Reader) -> Slurm:
    slurm = _read(Slurm, r)
    for key in ("partition", "account", "qos"):
        value = getattr(slurm, key)
        if value and not re.fullmatch(r"[A-Za-z0-9_.,:+-]+", value):
            r.fail(key, f"expected a Slurm name (letters, digits, '_', '-', '.'), got {_show(value)}")
    return slurm


def from_dict(raw: Any, *, source: str = "", check: bool = True) -> RunConfig:
    """Parse an untrusted mapping (e.g. from YAML) into a :class:`RunConfig`.

    Raises :class:`ConfigError` listing every problem; with ``check`` the
    whole-config rules of :func:`validate` apply too.
    """
    problems: list[Problem] = []
    r = _Reader(raw, "", problems)
    if isinstance(raw, Mapping) and "schema" in raw:
        schema = r.raw("schema")
        if not isinstance(schema, int) or isinstance(schema, bool) or schema != SCHEMA_VERSION:
            r.fail("schema", f"expected {SCHEMA_VERSION} (the version this ClusterDeck reads), got {_show(schema)}")
    top = read_fields(RunConfig, r, _READERS, extra_keys=("schema",))
    config = RunConfig(
        **top,
        cluster=_parse_cluster(r.child("cluster")),
        parallelism=_read(Parallelism, r.child("parallelism")),
        data=_read(Data, r.child("data")),
        model=_read(Model, r.child("model")),
        training=_read(Training, r.child("training")),
        validation=_read(Validation, r.child("validation")),
        program=_read(Program, r.child("program")) if r.has("program") else None,
    )
    if problems:
        raise ConfigError(problems, source)
    if check:
        problems = validate(config)
        if problems:
            raise ConfigError(problems, source)
    return config


def to_dict(config: RunConfig) -> dict[str, Any]:
    """A plain mapping that :func:`from_dict` reads back to an equal config."""
    hosts = []
    for h in config.cluster.hosts:
        host = write_fields(h, _WRITERS)
        if h.slurm is not None:
            host["slurm"] = write_fields(h.slurm, _WRITERS)
        host["tasks"] = [write_fields(t, _WRITERS) for t in h.tasks]
        hosts.append(host)
    out: dict[str, Any] = {"schema": SCHEMA_VERSION, **write_fields(config, _WRITERS), "cluster": {"hosts": hosts}}
    for name in ("parallelism", "data", "model", "training"):
        out[name] = write_fields(getattr(config, name), _WRITERS)
    if config.validation != Validation():  # a config without validation stays short
        out["validation"] = write_fields(config.validation, _WRITERS)
    if config.program is not None:
        out["program"] = write_fields(config.program, _WRITERS)
    return out


def dumps(config: RunConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)


#: Values a config's YAML may hold once its aliases are expanded: a real config holds a few hundred.
MAX_YAML_VALUES = 20_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _YamlRefused(Exception):
    """YAML that parses but is refused before it is built (an alias bomb, a duplicate key)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (plain values only) whose documents are checked before they are built.

    Composing stops after :data:`MAX_YAML_VALUES` nodes: a 4 MiB file of a million tiny values is
    refused in a second or two instead of being parsed in full (pure-Python PyYAML: ~10 s per 100,000).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.composed += 1
        if self.composed > MAX_YAML_VALUES:
            raise _YamlRefused(Problem("", f"holds more than {MAX_YAML_VALUES:,} values; expected a ClusterDeck "
                                           f"config (a few hundred)"))
        return super().compose_node(parent, index)  # type: ignore[no-any-return]


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, builtins.int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else builtins.str(key)


def _check_nodes(root: yaml.Node) -> None:
    """Refuse duplicate keys, self-referencing aliases and more than :data:`MAX_YAML_VALUES` values.

    Aliases share one node, so the walk counts each node's expanded size once (memoised by id): an
    8 KB alias bomb that would build a million tasks is refused here in microseconds, before any of it is built.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def walk(node: yaml.Node, path: str) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            line = node.start_mark.line + 1 if node.start_mark is not None else 0
            raise _YamlRefused(Problem(path, f"an alias at line {line} refers to a value that contains it; "
                                             "expected plain values (no recursive &anchor/*alias)"))
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                total += walk(child, _key_path(path, i))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[builtins.str, builtins.str], int] = {}
            for key_node, value_node in node.value:
                name: Any = "<key>"
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    name = key_node.value
                    line = key_node.start_mark.line + 1
                    ident = (key_node.tag, key_node.value)
                    if ident in first:
                        raise _YamlRefused(Problem(_key_path(path, name), f"duplicate key {name!r} at line {line} "
                                                   f"(first at line {first[ident]}); expected each key once"))
                    first[ident] = line
                total += walk(key_node, path) + walk(value_node, _key_path(path, name))
        open_nodes.discard(key)
        sizes[key] = total
        if total > MAX_YAML_VALUES:
            raise _YamlRefused(Problem(path, f"holds more than {MAX_YAML_VALUES:,} values once its aliases "
                                             f"(*name) are expanded; expected a ClusterDeck config"))
        return total

    walk(root, "")


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing duplicate keys, recursive aliases and alias bombs first."""
    loader = ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def loads(text: str, *, source: str = "", check: bool = True) -> RunConfig:
    try:
        raw = parse_yaml(text)
    except _YamlRefused as exc:
        raise ConfigError([exc.problem], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([Problem("", f"not valid YAML{where}: {reason}")], source) from None
    except RecursionError:
        raise ConfigError([Problem("", "not valid YAML: nested too deeply")], source) from None
    except (ValueError, OverflowError, TypeError) as exc:
        # a well-formed scalar PyYAML cannot build, e.g. ``2001-02-30`` or ``!!int abc``
        raise ConfigError([Problem("", f"not valid YAML: {str(exc).splitlines()[0][:200]}")], source) from None
    if raw is None:
        raise ConfigError([Problem("", "the file is empty; expected a ClusterDeck config mapping")], source)
    if not isinstance(raw, Mapping):
        raise ConfigError([Problem("", f"expected a mapping of config sections at the top, got {_show(raw)}")],
                          source)
    return from_dict(raw, source=source, check=check)


MAX_CONFIG_BYTES = 4 * 1024 * 1024

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str:
    kind = next((what for test, what in _FILE_KINDS if test(mode)), "not a plain file")
    return f"not a regular file ({kind}); expected a YAML file"


def read_capped(path: Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else a :class:`ConfigError` naming ``path``.

    The file type is checked before the file is opened (a FIFO would block, ``/dev/zero`` never ends),
    and again on the open descriptor (opened non-blocking, so a FIFO swapped in meanwhile cannot block);
    at most ``limit + 1`` bytes are read, so a file that grows while it is read is refused too.
    """
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(path)
    if not stat.S_ISREG(mode):
        raise ConfigError([Problem("", _not_regular(mode))], str(path))
    too_big = ConfigError([Problem("", f"the file is larger than {limit // 1024 // 1024} MiB; "
                                       "expected a small YAML config")], str(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([Problem("", _not_regular(info.st_mode))], str(path))
        if info.st_size > limit:
            raise too_big
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise too_big
    return b"".join(chunks)


def load(path: str | os.PathLike[str], *, check: bool = True) -> RunConfig:
    """Read a YAML config file; any problem (unreadable, malformed, invalid) is a :class:`ConfigError`."""
    p = Path(path)
    try:
        text = read_capped(p).decode("utf-8")
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError([Problem("", "no such file")], str(p)) from None
    except IsADirectoryError:
        raise ConfigError([Problem("", "is a folder; expected a YAML file")], str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError([Problem("", "not UTF-8 text; expected a YAML file")], str(p)) from None
    except OSError as exc:
        raise ConfigError([Problem("", f"cannot be read: {exc.strerror or exc}")], str(p)) from None
    return relative_to_folder(loads(text, source=str(p), check=check), p.parent)


def relative_to_folder(config: RunConfig, folder: str | os.PathLike[str]) -> RunConfig:
    """The config with a relative ``data.path`` and ``model.script`` made absolute against ``folder``.

    :func:`load` calls it with the file's own folder: a preset names its files relative to where the
    preset lies, so it works whatever folder ClusterDeck is started in (and a bundled preset finds the
    bundled example script in every install layout). Absolute paths and ``~/...`` are kept as written.
    """
    base = Path(os.path.abspath(folder))

    def anchored(value: str) -> str:
        # "~" and "~user" paths are their own anchor (and "~nosuchuser" is reported where it is read, never raised)
        if not value.strip() or value.startswith("~") or Path(value).is_absolute():
            return value
        return os.path.normpath(base / value)

    data = replace(config.data, path=anchored(config.data.path))
    model = replace(config.model, script=anchored(config.model.script))
    validation = replace(config.validation, path=anchored(config.validation.path))
    program = replace(config.program, script=anchored(config.program.script)) if config.program else None
    if data == config.data and model == config.model and validation == config.validation and \
            program == config.program:
        return config
    return replace(config, data=data, model=model, validation=validation, program=program)


def save(config: RunConfig, path: str | os.PathLike[str]) -> None:
    """Write atomically: a crash mid-save never leaves half a preset."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(dumps(config), encoding="utf-8")
    os.replace(tmp, p)


# --------------------------------------------------------------------------- validation


def validate(config: RunConfig) -> list[Problem]:
    """Every whole-config rule, in one place. An empty list means: ready to launch."""
    problems: list[Problem] = []

    def add(where: str, message: str) -> None:
        problems.append(Problem(where, message))

    if not config.name.strip():
        add("name", "expected a non-empty string, got ''")
    _check_declared(config, add)
    _validate_cluster(config, add)
    _validate_mode(config, add)
    _validate_training(config, add)
    _validate_data_model(config, add)
    _validate_validation_program(config, add)
    return problems


_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
_USER_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@$-]{0,127}")
HOST_NAME_RULE = "letters, digits, '.', '-', '_', not starting with '-'"


def is_host_name(value: str) -> bool:
    """A DNS name, an ``~/.ssh/config`` alias or an IP address: nothing ssh or a shell reads as an option."""
    if _HOST_NAME.fullmatch(value):
        return True
    _, percent, scope = value.partition("%")  # an IPv6 zone: an interface name
    if percent and not _HOST_NAME.fullmatch(scope):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _has_control(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


def field_problems(config: RunConfig) -> list[Problem]:
    """Every declared field outside its declared bounds or choices (the bounds :func:`from_dict` reads with);
    part of :func:`validate`."""
    problems: list[Problem] = []
    _check_declared(config, lambda where, message: problems.append(Problem(where, message)))
    return problems


def _check_declared(config: RunConfig, add: Any) -> None:
    for name in ("parallelism", "data", "model", "training", "validation"):
        check_fields(getattr(config, name), name, add)
    for i, h in enumerate(config.cluster.hosts):
        check_fields(h, f"cluster.hosts[{i}]", add)
        if h.slurm is not None:
            check_fields(h.slurm, f"cluster.hosts[{i}].slurm", add)
        for j, t in enumerate(h.tasks):
            check_fields(t, f"cluster.hosts[{i}].tasks[{j}]", add)
            if t.port is not None and not 1 <= t.port <= 65535:
                add(f"cluster.hosts[{i}].tasks[{j}].port", f"expected 'auto' or an integer from 1 to 65535, got {t.port}")


def _validate_host_names(h: Host, where: str, add: Any) -> None:
    """Names that reach ssh's command line or TF_CONFIG: host names, not options or shell text."""
    address = h.address.strip()
    if not address or not is_host_name(address):
        add(f"{where}.address", f"expected a host name or IP address, got {_show(h.address)}; a host name holds "
                                f"{HOST_NAME_RULE}")
    ssh_host = h.ssh_host.strip()
    if ssh_host:
        user, at, name = ssh_host.rpartition("@")
        if not is_host_name(name) or (at and not _USER_NAME.fullmatch(user)):
            add(f"{where}.ssh_host", f"expected a host name ({HOST_NAME_RULE}; optionally user@ before it), "
                                     f"got {_show(h.ssh_host)}")
    if h.ssh_user and not _USER_NAME.fullmatch(h.ssh_user):
        add(f"{where}.ssh_user", f"expected a user name (letters, digits, '.', '_', '-', '@', not starting with '-'), "
                                 f"got {_show(h.ssh_user)}")
    if _has_control(h.python) or not h.python.strip():
        add(f"{where}.python", f"expected a Python command without control characters, got {_show(h.python)}")


def _validate_slurm(h: Host, where: str, owners: tuple[str, ...], add: Any) -> None:
    """A Slurm group: its kind and block agree, GPUs asked per node, every node gets a task."""
    if h.kind not in HOST_KINDS:  # said by the declared choices
        return
    if h.kind != "slurm":
        add(f"{where}.slurm", f"only a host of kind 'slurm' has a slurm block; expected kind: slurm, got {h.kind!r}")
        return
    s = h.slurm
    if s is None:
        add(f"{where}.slurm", "a host of kind 'slurm' needs a slurm block (partition, nodes, ...); got none")
        return
    if h.gpus:
        add(f"{where}.gpus", f"a Slurm group asks for GPUs per node with slurm.gpus_per_node; expected 0 here, "
                             f"got {h.gpus}")
    if 1 <= s.nodes and len(h.tasks) < s.nodes:
        add(f"{where}.slurm.nodes", f"{s.nodes} nodes for {len(h.tasks)} task(s) would leave a node idle; expected "
                                    f"at most {max(1, len(h.tasks))} (tasks fill the nodes in drawn order, "
                                    f"{'one' if not h.tasks else -(-len(h.tasks) // s.nodes)} per node)")
    if s.mem_per_task and not SLURM_MEMORY.match(s.mem_per_task):
        add(f"{where}.slurm.mem_per_task", f"expected a memory size such as 4G, got {_show(s.mem_per_task)}")
    if s.time_limit and not SLURM_TIME.match(s.time_limit):
        add(f"{where}.slurm.time_limit", f"expected a Slurm time limit such as 30 or 2:00:00, got "
                                         f"{_show(s.time_limit)}")
    if s.gpus_per_node > 0:
        for n, group in enumerate(h.node_tasks()):
            sharers = sum(1 for t in group if t.role in owners)
            if sharers > 1 and s.gpus_per_node % sharers:
                add(f"{where}.slurm.gpus_per_node", f"{s.gpus_per_node} GPUs per node cannot be split evenly over "
                                                    f"the {sharers} GPU tasks of node {n} "
                                                    f"({', '.join(t.name for t in group)}); expected a multiple of "
                                                    f"{sharers}")
                break


def _validate_cluster(config: RunConfig, add: Any) -> None:
    cluster = config.cluster
    if not cluster.hosts:
        add("cluster.hosts", "expected at least one host, got none")
        return
    names: dict[str, int] = {}
    endpoints: dict[tuple[str, int], str] = {}
    for i, h in enumerate(cluster.hosts):
        where = f"cluster.hosts[{i}]"
        if not h.name.strip():
            add(f"{where}.name", "expected a non-empty string, got ''")
        elif h.name in names:
            add(f"{where}.name", f"expected a unique host name, got {h.name!r} (also cluster.hosts[{names[h.name]}])")
        else:
            names[h.name] = i
        _validate_host_names(h, where, add)
        if h.kind != "machine" or h.slurm is not None:
            _validate_slurm(h, where, gpu_roles(config.parallelism.mode), add)
        if len(h.tasks) > MAX_TASKS_PER_HOST:
            add(f"{where}.tasks", f"expected at most {MAX_TASKS_PER_HOST} tasks on one host, got {len(h.tasks)}")
        owners = gpu_roles(config.parallelism.mode)
        trainers = sum(1 for t in h.tasks if t.role in owners)
        if h.gpus > 0 and trainers > 1 and h.gpus % trainers:
            who = "worker" if owners == ("worker",) else "chief/worker"
            add(f"{where}.gpus", f"{h.gpus} GPUs cannot be split evenly over the {trainers} {who} tasks "
                                 f"of host {h.name!r}; expected a multiple of {trainers}")
        for j, t in enumerate(h.tasks):
            tw = f"{where}.tasks[{j}]"
            if t.port is not None:
                key = (_canonical_address(h.address), t.port)
                if h.is_slurm:  # the nodes are known once allocated: tasks of one node must differ
                    node = next((n for n, g in enumerate(h.node_tasks()) if t in g), 0)
                    key = (f"slurm node {node} of {h.name!r}", t.port)
                if key in endpoints:
                    add(f"{tw}.port", f"port {t.port} on {h.address} is already used by {endpoints[key]}")
                else:
                    endpoints[key] = t.name
    for role in ROLES:
        placed = [(i, j, t) for i, h in enumerate(cluster.hosts) for j, t in enumerate(h.tasks) if t.role == role]
        indices = sorted(t.index for _, _, t in placed)
        if indices != list(range(len(placed))):
            seen: set[int] = set()
            for i, j, t in placed:
                if t.index in seen or t.index >= len(placed):
                    add(f"cluster.hosts[{i}].tasks[{j}].index",
                        f"{role} indices must be 0..{len(placed) - 1} with no repeat, got {role}:{t.index} "
                        f"(all {role} indices: {indices})")
                    break
                seen.add(t.index)
    if len(cluster.hosts) > MAX_HOSTS:
        add("cluster.hosts", f"expected at most {MAX_HOSTS} hosts, got {len(cluster.hosts)}")
    total = sum(len(h.tasks) for h in cluster.hosts)
    if total > MAX_TASKS:
        add("cluster", f"expected at most {MAX_TASKS} tasks in all, got {total}")
    for role in ("chief", "evaluator"):
        n = len(cluster.tasks_of(role))
        if n > 1:
            add("cluster", f"expected at most one {role} task, got {n}")


def _canonical_address(address: str) -> str:
    a = address.strip().lower()
    return "127.0.0.1" if a in LOCAL_ADDRESSES else a


def _validate_mode(config: RunConfig, add: Any) -> None:
    mode = config.parallelism.mode
    cluster = config.cluster
    count = {role: len(cluster.tasks_of(role)) for role in ROLES}
    if mode not in MODES:  # said by the declared choices
        return
    if mode == "data":
        if count["chief"] + count["worker"] == 0:
            add("cluster", "parallelism 'data' needs at least one worker (or chief) task")
        if count["ps"]:
            add("cluster", f"parallelism 'data' does not use ps tasks (found {count['ps']}); "
                           "remove them or choose parallelism 'async'")
    elif mode == "async":
        if count["chief"] != 1:
            add("cluster", f"parallelism 'async' needs exactly one chief task (the coordinator), got {count['chief']}")
        if count["worker"] == 0:
            add("cluster", "parallelism 'async' needs at least one worker task")
        if count["ps"] == 0:
            add("cluster", "parallelism 'async' needs at least one ps task")
        p = config.parallelism
        if p.partitioner != "none" and config.model.name != "embedding":
            add("parallelism.partitioner.kind", f"partitioner {p.partitioner!r} shards only the 'embedding' model's table "
                                                "over the ps tasks: Keras 3 cannot differentiate through the sharded "
                                                f"variables of other models; expected 'none' for model "
                                                f"{config.model.name!r} (its variables are placed whole, round-robin "
                                                "over the ps tasks)")
        if p.partitioner == "fixed" and count["ps"] and p.shards > count["ps"] * 64:
            add("parallelism.partitioner.shards", f"expected at most {count['ps'] * 64} shards, got {p.shards}")
    elif mode == "model":
        if count["worker"] == 0:
            add("cluster", "parallelism 'model' needs at least one worker task (one DTensor client each)")
        for role in ("chief", "ps", "evaluator"):
            if count[role]:
                add("cluster", f"parallelism 'model' does not use {role} tasks (found {count[role]}); remove them")
        p = config.parallelism
        devices = sum(config.devices_of(h, t) for h, t in config.trainer_tasks())
        if devices and p.mesh_devices() != devices:
            names = " x ".join(name for name, _ in p.mesh_dims())
            sizes = " x ".join(str(size) for _, size in p.mesh_dims())
            add("parallelism.mesh", f"{names} = {sizes} = {p.mesh_devices()} does not match the {devices} devices "
                                    "of the worker tasks")
    if config.model.name in MODEL_MODES and mode not in MODEL_MODES[config.model.name]:
        add("model.name", f"model {config.model.name!r} supports parallelism "
                          f"{_choices(MODEL_MODES[config.model.name])}, not {mode!r}")


def _validate_training(config: RunConfig, add: Any) -> None:
    t = config.training
    if t.steps is not None and t.epochs is not None:
        add("training", f"expected either steps or epochs, got both (steps={t.steps}, epochs={t.epochs})")
    if t.steps is None and t.epochs is None:
        add("training.steps", "expected steps or epochs, got neither")
    if 1 <= t.steps_per_execution <= MAX_STEPS_PER_EXECUTION and t.for_mode(config.parallelism.mode) is not t:
        add("training.steps_per_execution",
            f"applies to parallelism {' and '.join(map(repr, STEPS_PER_EXECUTION_MODES))} only (one function "
            f"per group of steps); expected 1 for mode {config.parallelism.mode!r}, got {t.steps_per_execution}")
    replicas = config.num_replicas()
    if t.global_batch_size >= 1 and replicas > 1 and t.global_batch_size % replicas:
        add("training.global_batch_size", f"{t.global_batch_size} is not divisible by the {replicas} replicas; "
                                          f"expected a multiple of {replicas}")


_SOURCE_READS = {
    "npz": "a .npz file of arrays",
    "csv": "a .csv file with a header row",
    "tfrecord": "a TFRecord file (or a folder of them)",
    "image_folder": "a folder with one subfolder of images per class",
    "script": "a Python file defining make_dataset(input_context, config)",
}


def _validate_data_model(config: RunConfig, add: Any) -> None:
    """Rules of data and model readable from the config alone; files are checked by ``engine.contract.datasets``."""
    d, m = config.data, config.model
    mode = config.parallelism.mode
    shape_ok = bool(d.shape) and all(s >= 1 for s in d.shape)  # a bad shape is said by its declared bounds
    if d.size < config.training.global_batch_size:
        add("data.size", f"{d.size} examples are fewer than one global batch "
                         f"({config.training.global_batch_size}); expected at least that many")
    if d.source in FILE_SOURCES and not d.path.strip():
        add("data.path", f"source {d.source!r} reads {_SOURCE_READS[d.source]}; expected its path, got ''")
    if d.source in KNOWN_DATA and shape_ok:
        known, classes = KNOWN_DATA[d.source]
        values = math.prod(known)
        if math.prod(d.shape) != values:
            dims = " x ".join(str(n) for n in known)
            add("data.shape", f"{d.source!r} examples are {dims} = {values} values; expected a shape of {values} "
                              f"values, e.g. {[values]} or {list(known) if len(known) == 3 else [*known, 1]}, "
                              f"got {list(d.shape)}")
        if d.classes < classes:
            add("data.classes", f"{d.source!r} has {classes} classes (labels 0 to {classes - 1}); expected at least "
                                f"{classes}, got {d.classes}")
    if d.source == "image_folder" and shape_ok and (len(d.shape) != 3 or d.shape[2] not in (1, 3, 4)):
        add("data.shape", f"source 'image_folder' resizes images to [height, width, channels] with 1, 3 or 4 "
                          f"channels; got {list(d.shape)}")
    if m.name == "script" and not m.script.strip():
        builder = "build_sharded_model(config, mesh)" if mode == "model" else "build_model(config)"
        add("model.script", f"model 'script' is built by a Python file defining {builder}; "
                            "expected its path, got ''")
    if m.name in TOKEN_MODELS:
        if len(d.shape) != 1:
            add("data.shape", f"model {m.name!r} reads token sequences; expected one dimension (the sequence "
                              f"length), got {list(d.shape)}")
        if d.source in IMAGE_SOURCES:
            add("data.source", f"model {m.name!r} reads token ids but source {d.source!r} holds images; expected "
                               f"one of 'synthetic', 'npz', 'csv', 'tfrecord', 'script', got {d.source!r}")
        if m.name == "transformer" and m.heads >= 1 and m.embed_dim % m.heads:
            add("model.embed_dim", f"{m.embed_dim} is not divisible by the {m.heads} attention heads")
    if m.name in IMAGE_MODELS and len(d.shape) not in (2, 3):
        add("data.shape", f"model {m.name!r} reads images; expected [height, width] or [height, width, channels], "
                          f"got {list(d.shape)}")
    if config.parallelism.mode == "model":
        axis = config.parallelism.mesh_model
        if axis > 0:
            # a script's own layers are checked when its build_sharded_model runs (engine.runtime.sharded)
            for i, width in enumerate(m.hidden if m.name != "script" else ()):
                if width % axis:
                    add(f"model.hidden[{i}]", f"{width} is not divisible by the mesh 'model' axis size {axis}")
            if m.name == "embedding" and m.vocab_size % axis:
                add("model.vocab_size", f"{m.vocab_size} is not divisible by the mesh 'model' axis size {axis}")
            if m.name == "transformer" and m.heads % axis:
                add("model.heads", f"{m.heads} is not divisible by the mesh 'model' axis size {axis}")


def _validate_validation_program(config: RunConfig, add: Any) -> None:
    v = config.validation
    if v.every and not (v.split > 0 or v.path.strip()):
        add("validation.every", f"validation every {v.every} steps needs held-out examples; expected "
                                "validation.split > 0 or validation.path, got neither")
    if (v.split > 0 or v.path.strip()) and not v.every and not config.cluster.tasks_of("evaluator"):
        add("validation.every", "held-out examples are set but never evaluated; expected validation.every > 0 "
                                "(steps between evaluations) or an evaluator task")
    if v.path.strip() and config.data.source in ("synthetic", "digits", *KERAS_SOURCES, "script"):
        add("validation.path", f"source {config.data.source!r} has no files; expected validation.split instead, "
                               f"got path {_show(v.path)}")
    if config.program is not None and not config.program.script.strip():
        add("program.script", "expected the path of your training program (a Python file), got ''")


def replace(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace``, re-exported so callers need not import dataclasses."""
    return dataclasses.replace(obj, **changes)
