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
import reprlib
import shlex
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SCHEMA_VERSION = 1

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
#: Which parallelism modes read each data source (the app offers a source only in these modes). Every
#: runtime reads its examples through ``engine.runtime.data.make_dataset``: the data-parallel one per
#: input pipeline, the async one per worker (``ClusterCoordinator.create_per_worker_dataset``), the
#: model-parallel one as global batches; a user's ``make_dataset(input_context, config)`` gets the
#: input context of each (``None`` in model mode).
DATA_SOURCE_MODES: dict[str, tuple[str, ...]] = {source: MODES for source in DATA_SOURCES}


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Task:
    """One TensorFlow task: a process running as ``role:index``."""

    role: str = "worker"
    index: int = 0
    port: int | None = None  # None means: pick a free port at launch

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


#: Kinds of host group: one machine (this one, or reached over SSH), or nodes allocated by Slurm.
HOST_KINDS = ("machine", "slurm")
#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
#: A memory size as Slurm reads it: a number of megabytes, or with a unit K, M, G or T.
SLURM_MEMORY = re.compile(r"^\d+[KMGT]?$")


@dataclass(frozen=True)
class Slurm:
    """Where and how a Slurm host group is allocated (``salloc``) and its supervisors started (``srun``).

    Empty strings leave Slurm's defaults (the default partition, its time limit, the user's account).
    """

    partition: str = ""
    nodes: int = 1
    gpus_per_node: int = 0  # --gres=gpu:N
    cpus_per_task: int = 1
    mem_per_task: str = ""  # e.g. '4G'; --mem of a node is this times its tasks
    time_limit: str = ""  # Slurm's format, e.g. '30' (minutes), '2:00:00', '1-00:00:00'
    account: str = ""
    qos: str = ""
    sbatch_options: tuple[str, ...] = ()  # extra options of the allocation (salloc reads sbatch's options)
    srun_options: tuple[str, ...] = ()  # extra options of each supervisor's srun step


@dataclass(frozen=True)
class Host:
    """A machine of the cluster and the tasks placed on it (or, ``kind: slurm``, a group of Slurm nodes)."""

    name: str = "local"
    address: str = "localhost"
    gpus: int = 0
    tasks: tuple[Task, ...] = ()
    ssh_user: str = ""
    ssh_port: int = 22
    python: str = "python3"
    ssh_host: str = ""  # the name ssh dials (an alias of ~/.ssh/config); default: the address
    kind: str = "machine"
    slurm: Slurm | None = None  # kind 'slurm': the allocation

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
    hosts: tuple[Host, ...] = ()

    def tasks(self) -> list[tuple[Host, Task]]:
        return [(h, t) for h in self.hosts for t in h.tasks]

    def tasks_of(self, role: str) -> list[Task]:
        return sorted((t for _, t in self.tasks() if t.role == role), key=lambda t: t.index)

    @property
    def is_local(self) -> bool:
        return all(h.is_local for h in self.hosts)


@dataclass(frozen=True)
class Parallelism:
    mode: str = "data"
    # model parallelism: the DTensor mesh (batch x model)
    mesh_batch: int = 1
    mesh_model: int = 2
    # more named mesh axes, in order between 'batch' and 'model' (e.g. (("feature", 2),)): YAML
    # ``mesh: {batch: 2, feature: 2, model: 2}``; a sharded script names them in its layouts
    mesh_axes: tuple[tuple[str, int], ...] = ()
    # async: how variables are sharded over the ps tasks
    partitioner: str = "none"
    shards: int = 2
    min_shard_bytes: int = 256 * 1024
    # synchronous modes: seconds before a stuck collective fails the run (0: TF's default)
    collective_timeout_s: float = 0.0

    def mesh_dims(self) -> list[tuple[str, int]]:
        """The DTensor mesh's named axes in order: ``batch``, the extra axes, ``model``."""
        return [(MESH_BATCH, self.mesh_batch), *self.mesh_axes, (MESH_MODEL, self.mesh_model)]

    def mesh_devices(self) -> int:
        """Devices the mesh spans: the product of its axes' sizes."""
        return math.prod(size for _, size in self.mesh_dims())


@dataclass(frozen=True)
class Data:
    """Where examples come from (``source``) and what one looks like.

    ``shape`` is the shape the model sees (a file's examples are reshaped to it: the number of values must
    match); ``size`` is the number of synthetic examples, and for every other source the most examples used.
    """

    source: str = "synthetic"
    shape: tuple[int, ...] = (784,)
    classes: int = 10
    size: int = 8192
    path: str = ""  # file sources: the .npz/.csv/TFRecord file, the image folder or the user's script
    x_key: str = "x"  # npz: the array of inputs; tfrecord: the feature of inputs
    y_key: str = "y"  # npz: the array of labels; csv: the label column; tfrecord: the label feature
    x_dtype: str = "auto"  # tfrecord: the inputs' feature type (auto: int64 for token models, else float32)


@dataclass(frozen=True)
class Model:
    name: str = "mlp"
    hidden: tuple[int, ...] = (256,)  # widths of the dense layers (transformer: its MLP block)
    vocab_size: int = 1000  # token models: ids are 0..vocab_size-1
    embed_dim: int = 64  # token models: embedding width
    heads: int = 4  # transformer: attention heads
    script: str = ""  # name 'script': the user's Python file defining build_model(config)


@dataclass(frozen=True)
class Training:
    global_batch_size: int = 128
    steps: int | None = 200
    epochs: int | None = None
    optimizer: str = "sgd"
    learning_rate: float = 0.05
    seed: int = 42
    checkpoint_every: int = 0  # steps; 0 = only at the end
    restarts: int = 0
    metrics_hz: float = 20.0  # at most this many step events per replica per second
    # run even where the local tasks outnumber this machine's CPUs many times over (see engine.control.machine_fit)
    allow_oversubscribe: bool = False
    # a run with no step for this long fails naming the task that hangs (async: the worker is
    # restarted); the first step gets 3x as long; 0 = never
    progress_timeout_s: float = 60.0
    # data and async: training steps per function (Keras' steps_per_execution): one dispatch (async: one
    # schedule from the chief) per this many steps; figures and stops come per such group
    steps_per_execution: int = 1

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

    split: float = 0.0  # fraction of the examples held out (0: none), below 1
    path: str = ""  # a file of the data source's kind holding the held-out examples
    every: int = 0  # steps between two evaluations (0: no validation in the loop)
    batches: int = 0  # global batches per evaluation (0: every held-out example once)

    @property
    def enabled(self) -> bool:
        return self.every > 0 and (self.split > 0 or bool(self.path.strip()))


@dataclass(frozen=True)
class Program:
    """The user's own training program, started unchanged in every chief and worker task (the ps tasks
    run the standard ``tf.distribute.Server``); ClusterDeck writes each task's ``TF_CONFIG``."""

    script: str = ""  # the Python file to run
    args: tuple[str, ...] = ()  # its command-line arguments


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    cluster: Cluster = field(default_factory=Cluster)
    parallelism: Parallelism = field(default_factory=Parallelism)
    data: Data = field(default_factory=Data)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    validation: Validation = field(default_factory=Validation)
    program: Program | None = None  # set: the tasks run this program instead of ClusterDeck's loop

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


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


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


class _ShortRepr(reprlib.Repr):
    """``repr`` bounded in depth and width, so hostile input (huge ints, deep or aliased YAML) shows briefly."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = 60
        self.maxother = 60

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:  # more digits than Python converts to text
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"


_short_repr = _ShortRepr()


def _show(value: Any) -> str:
    try:
        text = _short_repr.repr(value)
    except Exception:  # noqa: BLE001 - a value's own __repr__ may fail; the message must not
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


# --------------------------------------------------------------------------- parsing


class _Reader:
    """Reads typed fields out of an untrusted mapping, noting problems with their path."""

    def __init__(self, data: Any, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems = problems
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.fail("", f"expected a mapping of fields, got {_show(data)}")
            data = {}
        self.data: Mapping[Any, Any] = data
        self.seen: set[str] = set()

    def where(self, key: str) -> str:
        if not key:
            return self.path
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.where(key), message))

    def items(self, key: str, what: str, most: int, most_what: str) -> list[Any]:
        """The list under ``key`` (missing: empty), cut to its first ``most`` items; a non-list or a longer
        list is a problem naming the field."""
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"expected a list of {what}, got {_show(value)}")
            return []
        if len(value) > most:
            self.fail(key, f"expected at most {most} {most_what}, got {len(value)}")
        return value[:most]

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def int(self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(key, f"expected {_int_range(minimum, maximum)}, got {_show(value)}")
        elif minimum is not None and value < minimum:
            self.fail(key, f"expected an integer >= {minimum}, got {_show(value)}")
        elif maximum is not None and value > maximum:
            self.fail(key, f"expected an integer <= {maximum}, got {_show(value)}")
        else:
            return int(value)
        return default

    def float(self, key: str, default: float, *, minimum: float | None = None, above: float | None = None) -> float:
        value = self.raw(key)
        if value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _is_finite(value)
        if ok and (minimum is None or value >= minimum) and (above is None or value > above):
            return float(value)
        if above is not None:
            want = f"a number > {above:g}"
        elif minimum is not None:
            want = f"a number >= {minimum:g}"
        else:
            want = "a finite number"
        self.fail(key, f"expected {want}, got {_show(value)}")
        return default

    def str(self, key: str, default: str, *, choices: Sequence[str] | None = None, nonempty: bool = False) -> str:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            want = f"one of {_choices(choices)}" if choices else "a string"
            self.fail(key, f"expected {want}, got {_show(value)}")
            return default
        if choices is not None and value not in choices:
            self.fail(key, f"expected one of {_choices(choices)}, got {_show(value)}")
            return default
        if nonempty and not value.strip():
            self.fail(key, "expected a non-empty string, got ''")
            return default
        if len(value) > 4096:
            self.fail(key, f"expected at most 4096 characters, got {len(value)}")
            return default
        return value

    # below the methods named int and str, annotations name the builtins explicitly
    def ints(self, key: builtins.str, default: tuple[builtins.int, ...], *, minimum: builtins.int = 1,
             maximum: builtins.int = 10**6, min_len: builtins.int = 1) -> tuple[builtins.int, ...]:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if (
            isinstance(value, (list, tuple))
            and min_len <= len(value) <= 64
            and all(isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum for v in value)
        ):
            return tuple(int(v) for v in value)
        self.fail(key, f"expected a list of {'at least ' + str(min_len) + ' ' if min_len > 1 else ''}"
                       f"integers from {minimum} to {maximum}, got {_show(value)}")
        return default

    def child(self, key: builtins.str) -> _Reader:
        self.seen.add(key)
        return _Reader(self.data.get(key), self.where(key), self.problems)

    def finish(self, allowed: Iterable[builtins.str]) -> None:
        allowed = set(allowed) | self.seen
        for key in self.data:
            if not isinstance(key, str) or key not in allowed:
                self.fail(_key_text(key), f"unknown field (expected one of {_choices(sorted(allowed))})")


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else _show(key)


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def _choices(choices: Sequence[str] | None) -> str:
    return ", ".join(repr(c) for c in (choices or ()))


def _parse_task(r: _Reader, fallback_index: int) -> Task:
    role = r.str("role", "worker", choices=ROLES)
    index = r.int("index", fallback_index, minimum=0, maximum=9999)
    port_raw = r.raw("port")
    port: int | None = None
    if port_raw is None or port_raw == "auto":
        port = None
    elif isinstance(port_raw, int) and not isinstance(port_raw, bool) and 1 <= port_raw <= 65535:
        port = port_raw
    else:
        r.fail("port", f"expected 'auto' or an integer from 1 to 65535, got {_show(port_raw)}")
    r.finish(("role", "index", "port"))
    return Task(role=role, index=index, port=port)


def _parse_cluster(r: _Reader) -> Cluster:
    raw_hosts = r.items("hosts", "hosts", MAX_HOSTS, "hosts")
    hosts: list[Host] = []
    role_counts: dict[str, int] = {}
    for i, raw_host in enumerate(raw_hosts):
        h = _Reader(raw_host, f"{r.where('hosts')}[{i}]", r.problems)
        name = h.str("name", f"host{i}", nonempty=True)
        address = h.str("address", "localhost", nonempty=True)
        gpus = h.int("gpus", 0, minimum=0, maximum=64)
        ssh_user = h.str("ssh_user", "")
        ssh_port = h.int("ssh_port", 22, minimum=1, maximum=65535)
        python = h.str("python", "python3", nonempty=True)
        ssh_host = h.str("ssh_host", "")
        raw_tasks = h.items("tasks", "tasks", MAX_TASKS_PER_HOST, "tasks on one host")
        tasks: list[Task] = []
        for j, raw_task in enumerate(raw_tasks):
            tr = _Reader(raw_task, f"{h.where('tasks')}[{j}]", r.problems)
            role_guess = raw_task.get("role") if isinstance(raw_task, Mapping) else None
            role_key = role_guess if isinstance(role_guess, str) else "worker"
            task = _parse_task(tr, role_counts.get(role_key, 0))
            role_counts[task.role] = role_counts.get(task.role, 0) + 1
            tasks.append(task)
        kind = h.str("kind", "machine", choices=HOST_KINDS)
        slurm = _parse_slurm(h.child("slurm")) if kind == "slurm" else None
        if kind != "slurm" and h.has("slurm"):
            h.fail("slurm", f"only a host of kind 'slurm' has a slurm block; expected kind: slurm, got {kind!r}")
        h.finish(("name", "address", "gpus", "tasks", "ssh_user", "ssh_port", "python", "ssh_host", "kind",
                  "slurm"))
        hosts.append(Host(name=name, address=address, gpus=gpus, tasks=tuple(tasks),
                          ssh_user=ssh_user, ssh_port=ssh_port, python=python, ssh_host=ssh_host,
                          kind=kind, slurm=slurm))
    r.finish(("hosts",))
    return Cluster(hosts=tuple(hosts))


def _parse_options(r: _Reader, key: str) -> tuple[str, ...]:
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


def _parse_slurm(r: _Reader) -> Slurm:
    d = Slurm()
    partition = r.str("partition", d.partition)
    nodes = r.int("nodes", d.nodes, minimum=1, maximum=4096)
    gpus_per_node = r.int("gpus_per_node", d.gpus_per_node, minimum=0, maximum=64)
    cpus_per_task = r.int("cpus_per_task", d.cpus_per_task, minimum=1, maximum=4096)
    mem_raw = r.raw("mem_per_task")
    mem = d.mem_per_task
    if isinstance(mem_raw, int) and not isinstance(mem_raw, bool) and mem_raw > 0:
        mem = str(mem_raw)  # megabytes, as Slurm reads a bare number
    elif isinstance(mem_raw, str) and SLURM_MEMORY.match(mem_raw.strip().upper()):
        mem = mem_raw.strip().upper()
    elif mem_raw not in (None, ""):
        r.fail("mem_per_task", f"expected a memory size such as 4G, 512M or a number of megabytes, got "
                               f"{_show(mem_raw)}")
    time_raw = r.raw("time_limit")
    time_limit = d.time_limit
    if isinstance(time_raw, int) and not isinstance(time_raw, bool) and time_raw > 0:
        time_limit = str(time_raw)  # minutes
    elif isinstance(time_raw, str) and SLURM_TIME.match(time_raw.strip()):
        time_limit = time_raw.strip()
    elif time_raw not in (None, ""):
        r.fail("time_limit", "expected a Slurm time limit: minutes, 'MM:SS', 'HH:MM:SS' or 'D-HH:MM:SS', got "
                             f"{_show(time_raw)}")
    slurm = Slurm(partition=partition.strip(), nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task,
                  mem_per_task=mem, time_limit=time_limit, account=r.str("account", d.account).strip(),
                  qos=r.str("qos", d.qos).strip(), sbatch_options=_parse_options(r, "sbatch_options"),
                  srun_options=_parse_options(r, "srun_options"))
    for key in ("partition", "account", "qos"):
        value = getattr(slurm, key)
        if value and not re.fullmatch(r"[A-Za-z0-9_.,:+-]+", value):
            r.fail(key, f"expected a Slurm name (letters, digits, '_', '-', '.'), got {_show(value)}")
    r.finish(("partition", "nodes", "gpus_per_node", "cpus_per_task", "mem_per_task", "time_limit", "account",
              "qos", "sbatch_options", "srun_options"))
    return slurm


def _parse_parallelism(r: _Reader) -> Parallelism:
    d = Parallelism()
    mode = r.str("mode", d.mode, choices=MODES)
    mesh = r.child("mesh")
    mesh_batch = mesh.int("batch", d.mesh_batch, minimum=1, maximum=4096)
    mesh_model = mesh.int("model", d.mesh_model, minimum=1, maximum=4096)
    axes: list[tuple[str, int]] = []
    for key in list(mesh.data):
        if key in ("batch", "model"):
            continue
        if not isinstance(key, str) or not _AXIS_NAME.fullmatch(key):
            mesh.fail(_key_text(key), "expected a mesh axis name (lower-case letters, digits, '_') with its size, "
                                      "e.g. feature: 2")
            mesh.seen.add(key) if isinstance(key, str) else None
            continue
        if len(axes) >= MAX_MESH_AXES:
            mesh.fail(key, f"expected at most {MAX_MESH_AXES} axes besides 'batch' and 'model'")
            continue
        axes.append((key, mesh.int(key, 1, minimum=1, maximum=4096)))
    mesh.finish(("batch", "model", *(name for name, _ in axes)))
    part = r.child("partitioner")
    kind = part.str("kind", d.partitioner, choices=PARTITIONERS)
    shards = part.int("shards", d.shards, minimum=1, maximum=1024)
    min_shard_bytes = part.int("min_shard_bytes", d.min_shard_bytes, minimum=1, maximum=2**40)
    part.finish(("kind", "shards", "min_shard_bytes"))
    timeout = r.float("collective_timeout_s", d.collective_timeout_s, minimum=0)
    r.finish(("mode", "mesh", "partitioner", "collective_timeout_s"))
    return Parallelism(mode=mode, mesh_batch=mesh_batch, mesh_model=mesh_model, mesh_axes=tuple(axes),
                       partitioner=kind,
                       shards=shards, min_shard_bytes=min_shard_bytes, collective_timeout_s=timeout)


def _parse_data(r: _Reader) -> Data:
    d = Data()
    data = Data(
        source=r.str("source", d.source, choices=DATA_SOURCES),
        shape=r.ints("shape", d.shape, minimum=1),
        classes=r.int("classes", d.classes, minimum=2, maximum=1_000_000),
        size=r.int("size", d.size, minimum=1, maximum=100_000_000),
        path=r.str("path", d.path),
        x_key=r.str("x_key", d.x_key, nonempty=True),
        y_key=r.str("y_key", d.y_key, nonempty=True),
        x_dtype=r.str("x_dtype", d.x_dtype, choices=TFRECORD_DTYPES),
    )
    r.finish(("source", "shape", "classes", "size", "path", "x_key", "y_key", "x_dtype"))
    return data


def _parse_model(r: _Reader) -> Model:
    d = Model()
    model = Model(name=r.str("name", d.name, choices=MODELS),
                  hidden=r.ints("hidden", d.hidden, minimum=1, min_len=0),
                  vocab_size=r.int("vocab_size", d.vocab_size, minimum=2, maximum=10_000_000),
                  embed_dim=r.int("embed_dim", d.embed_dim, minimum=1, maximum=65_536),
                  heads=r.int("heads", d.heads, minimum=1, maximum=1024),
                  script=r.str("script", d.script))
    r.finish(("name", "hidden", "vocab_size", "embed_dim", "heads", "script"))
    return model


def _parse_flag(r: _Reader, key: str, default: bool) -> bool:
    value = r.raw(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        r.fail(key, f"expected true or false, got {_show(value)}")
        return default
    return value


def _parse_training(r: _Reader) -> Training:
    d = Training()
    steps: int | None = r.int("steps", 0, minimum=1, maximum=MAX_STEPS) if r.has("steps") else None
    epochs: int | None = r.int("epochs", 0, minimum=1, maximum=1_000_000) if r.has("epochs") else None
    if steps == 0:
        steps = d.steps
    if epochs == 0:
        epochs = None
    if steps is None and epochs is None:
        steps = d.steps
    training = Training(
        global_batch_size=r.int("global_batch_size", d.global_batch_size, minimum=1, maximum=1_000_000),
        steps=steps,
        epochs=epochs,
        optimizer=r.str("optimizer", d.optimizer, choices=OPTIMIZERS),
        learning_rate=r.float("learning_rate", d.learning_rate, above=0),
        seed=r.int("seed", d.seed, minimum=0, maximum=2**31 - 1),
        checkpoint_every=r.int("checkpoint_every", d.checkpoint_every, minimum=0, maximum=MAX_STEPS),
        restarts=r.int("restarts", d.restarts, minimum=0, maximum=100),
        metrics_hz=r.float("metrics_hz", d.metrics_hz, above=0),
        allow_oversubscribe=_parse_flag(r, "allow_oversubscribe", d.allow_oversubscribe),
        progress_timeout_s=r.float("progress_timeout_s", d.progress_timeout_s, minimum=0),
        steps_per_execution=r.int("steps_per_execution", d.steps_per_execution, minimum=1,
                                  maximum=MAX_STEPS_PER_EXECUTION),
    )
    r.finish(("global_batch_size", "steps", "epochs", "optimizer", "learning_rate", "seed",
              "checkpoint_every", "restarts", "metrics_hz", "progress_timeout_s", "steps_per_execution"))
    return training


def _parse_validation(r: _Reader) -> Validation:
    d = Validation()
    validation = Validation(split=r.float("split", d.split, minimum=0), path=r.str("path", d.path),
                            every=r.int("every", d.every, minimum=0, maximum=MAX_STEPS),
                            batches=r.int("batches", d.batches, minimum=0, maximum=1_000_000))
    if validation.split >= 1:
        r.fail("split", f"expected a fraction of the examples from 0 to below 1, got {validation.split:g}")
    r.finish(("split", "path", "every", "batches"))
    return validation


def _parse_program(r: _Reader) -> Program:
    script = r.str("script", "", nonempty=True)
    if not r.has("script"):
        r.fail("script", "expected the path of your training program (a Python file), got nothing")
    args = r.raw("args")
    words: tuple[str, ...] = ()
    if isinstance(args, str):
        try:
            words = tuple(shlex.split(args))
        except ValueError as exc:
            r.fail("args", f"expected arguments a shell can split, got {_show(args)} ({exc})")
    elif isinstance(args, list) and len(args) <= 1024 and all(isinstance(a, (str, int, float)) and
                                                              not isinstance(a, bool) for a in args):
        words = tuple(str(a) for a in args)
    elif args is not None:
        r.fail("args", f"expected a list of at most 1024 arguments, e.g. ['--epochs', '3'], got {_show(args)}")
    r.finish(("script", "args"))
    return Program(script=script, args=words)


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
    config = RunConfig(
        name=r.str("name", "run", nonempty=True),
        cluster=_parse_cluster(r.child("cluster")),
        parallelism=_parse_parallelism(r.child("parallelism")),
        data=_parse_data(r.child("data")),
        model=_parse_model(r.child("model")),
        training=_parse_training(r.child("training")),
        validation=_parse_validation(r.child("validation")),
        program=_parse_program(r.child("program")) if r.has("program") else None,
    )
    r.finish(("schema", "name", "cluster", "parallelism", "data", "model", "training", "validation", "program"))
    if problems:
        raise ConfigError(problems, source)
    if check:
        problems = validate(config)
        if problems:
            raise ConfigError(problems, source)
    return config


def to_dict(config: RunConfig) -> dict[str, Any]:
    """A plain mapping that :func:`from_dict` reads back to an equal config."""
    p, t = config.parallelism, config.training
    training: dict[str, Any] = {
        "global_batch_size": t.global_batch_size,
        "optimizer": t.optimizer,
        "learning_rate": t.learning_rate,
        "seed": t.seed,
        "checkpoint_every": t.checkpoint_every,
        "restarts": t.restarts,
        "metrics_hz": t.metrics_hz,
    }
    if t.progress_timeout_s != Training.progress_timeout_s:
        training["progress_timeout_s"] = t.progress_timeout_s
    if t.steps_per_execution != Training.steps_per_execution:
        training["steps_per_execution"] = t.steps_per_execution
    if t.allow_oversubscribe:
        training["allow_oversubscribe"] = True
    if t.steps is not None:
        training["steps"] = t.steps
    if t.epochs is not None:
        training["epochs"] = t.epochs
    hosts = []
    for h in config.cluster.hosts:
        host: dict[str, Any] = {"name": h.name, "address": h.address, "gpus": h.gpus}
        if h.ssh_user:
            host["ssh_user"] = h.ssh_user
        if h.ssh_port != 22:
            host["ssh_port"] = h.ssh_port
        if h.python != "python3":
            host["python"] = h.python
        if h.ssh_host:
            host["ssh_host"] = h.ssh_host
        if h.kind != "machine":
            host["kind"] = h.kind
        if h.slurm is not None:
            host["slurm"] = _slurm_dict(h.slurm)
        host["tasks"] = [{"role": x.role, "index": x.index, "port": "auto" if x.port is None else x.port}
                         for x in h.tasks]
        hosts.append(host)
    out: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "name": config.name,
        "cluster": {"hosts": hosts},
        "parallelism": {
            "mode": p.mode,
            "mesh": dict(p.mesh_dims()),
            "partitioner": {"kind": p.partitioner, "shards": p.shards, "min_shard_bytes": p.min_shard_bytes},
            "collective_timeout_s": p.collective_timeout_s,
        },
        "data": _data_dict(config.data),
        "model": _model_dict(config.model),
        "training": training,
    }
    v = config.validation
    if v != Validation():
        out["validation"] = {"split": v.split, "path": v.path, "every": v.every, "batches": v.batches}
    if config.program is not None:
        out["program"] = {"script": config.program.script, "args": list(config.program.args)}
    return out


def _slurm_dict(s: Slurm) -> dict[str, Any]:
    out: dict[str, Any] = {"partition": s.partition, "nodes": s.nodes, "gpus_per_node": s.gpus_per_node,
                           "cpus_per_task": s.cpus_per_task}
    for key in ("mem_per_task", "time_limit", "account", "qos"):
        if getattr(s, key):
            out[key] = getattr(s, key)
    for key in ("sbatch_options", "srun_options"):
        if getattr(s, key):
            out[key] = list(getattr(s, key))
    return out


def _data_dict(d: Data) -> dict[str, Any]:
    out: dict[str, Any] = {"source": d.source, "shape": list(d.shape), "classes": d.classes, "size": d.size,
                           "path": d.path}
    # fields of file sources only where they differ from the default: configs of other sources stay short
    default = Data()
    for key in ("x_key", "y_key", "x_dtype"):
        if getattr(d, key) != getattr(default, key):
            out[key] = getattr(d, key)
    return out


def _model_dict(m: Model) -> dict[str, Any]:
    out: dict[str, Any] = {"name": m.name, "hidden": list(m.hidden), "vocab_size": m.vocab_size,
                           "embed_dim": m.embed_dim, "heads": m.heads}
    if m.script:
        out["script"] = m.script
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
        if not value.strip() or Path(value).expanduser().is_absolute():
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
    _validate_cluster(config, add)
    _validate_mode(config, add)
    _validate_training(config, add)
    _validate_data_model(config, add)
    _validate_validation_program(config, add)
    return problems


#: Tasks one host may hold, and tasks in all: far beyond a real cluster drawn here, and they keep a bad
#: preset (or an alias bomb) from starting thousands of processes.
MAX_TASKS_PER_HOST = 256
MAX_TASKS = 1024
MAX_HOSTS = 256
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
    if h.kind not in HOST_KINDS:
        add(f"{where}.kind", f"expected one of {_choices(HOST_KINDS)}, got {_show(h.kind)}")
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
    if s.nodes < 1:
        add(f"{where}.slurm.nodes", f"expected an integer >= 1, got {s.nodes}")
    elif len(h.tasks) < s.nodes:
        add(f"{where}.slurm.nodes", f"{s.nodes} nodes for {len(h.tasks)} task(s) would leave a node idle; expected "
                                    f"at most {max(1, len(h.tasks))} (tasks fill the nodes in drawn order, "
                                    f"{'one' if not h.tasks else -(-len(h.tasks) // s.nodes)} per node)")
    if s.gpus_per_node < 0:
        add(f"{where}.slurm.gpus_per_node", f"expected an integer >= 0, got {s.gpus_per_node}")
    if s.cpus_per_task < 1:
        add(f"{where}.slurm.cpus_per_task", f"expected an integer >= 1, got {s.cpus_per_task}")
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
        if h.gpus < 0:
            add(f"{where}.gpus", f"expected an integer >= 0, got {h.gpus}")
        owners = gpu_roles(config.parallelism.mode)
        trainers = sum(1 for t in h.tasks if t.role in owners)
        if h.gpus > 0 and trainers > 1 and h.gpus % trainers:
            who = "worker" if owners == ("worker",) else "chief/worker"
            add(f"{where}.gpus", f"{h.gpus} GPUs cannot be split evenly over the {trainers} {who} tasks "
                                 f"of host {h.name!r}; expected a multiple of {trainers}")
        for j, t in enumerate(h.tasks):
            tw = f"{where}.tasks[{j}]"
            if t.role not in ROLES:
                add(f"{tw}.role", f"expected one of {_choices(ROLES)}, got {_show(t.role)}")
            if t.index < 0:
                add(f"{tw}.index", f"expected an integer >= 0, got {t.index}")
            if t.port is not None:
                if not 1 <= t.port <= 65535:
                    add(f"{tw}.port", f"expected 'auto' or an integer from 1 to 65535, got {t.port}")
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
    if mode not in MODES:
        add("parallelism.mode", f"expected one of {_choices(MODES)}, got {_show(mode)}")
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
    if t.global_batch_size < 1:
        add("training.global_batch_size", f"expected an integer >= 1, got {t.global_batch_size}")
    if t.steps is not None and t.epochs is not None:
        add("training", f"expected either steps or epochs, got both (steps={t.steps}, epochs={t.epochs})")
    if t.steps is None and t.epochs is None:
        add("training.steps", "expected steps or epochs, got neither")
    if t.steps is not None and t.steps < 1:
        add("training.steps", f"expected an integer >= 1, got {t.steps}")
    if t.epochs is not None and t.epochs < 1:
        add("training.epochs", f"expected an integer >= 1, got {t.epochs}")
    if not (t.learning_rate > 0 and math.isfinite(t.learning_rate)):
        add("training.learning_rate", f"expected a number > 0, got {t.learning_rate}")
    if t.optimizer not in OPTIMIZERS:
        add("training.optimizer", f"expected one of {_choices(OPTIMIZERS)}, got {_show(t.optimizer)}")
    if t.checkpoint_every < 0:
        add("training.checkpoint_every", f"expected an integer >= 0, got {t.checkpoint_every}")
    if t.restarts < 0:
        add("training.restarts", f"expected an integer >= 0, got {t.restarts}")
    if not 1 <= t.steps_per_execution <= MAX_STEPS_PER_EXECUTION:
        add("training.steps_per_execution",
            f"expected an integer from 1 to {MAX_STEPS_PER_EXECUTION}, got {t.steps_per_execution}")
    elif t.for_mode(config.parallelism.mode) is not t:
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
    if d.source not in DATA_SOURCES:
        add("data.source", f"expected one of {_choices(DATA_SOURCES)}, got {_show(d.source)}")
    if d.classes < 2:
        add("data.classes", f"expected an integer >= 2, got {d.classes}")
    shape_ok = bool(d.shape) and all(s >= 1 for s in d.shape)
    if not shape_ok:
        add("data.shape", f"expected a list of integers >= 1, got {list(d.shape)}")
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
    if d.source in DATA_SOURCE_MODES and mode in MODES and mode not in DATA_SOURCE_MODES[d.source]:
        add("data.source", f"source {d.source!r} is read in parallelism {_choices(DATA_SOURCE_MODES[d.source])} "
                           f"only; got parallelism {mode!r}")
    if m.name not in MODELS:
        add("model.name", f"expected one of {_choices(MODELS)}, got {_show(m.name)}")
    if any(h < 1 for h in m.hidden):
        add("model.hidden", f"expected a list of integers >= 1, got {list(m.hidden)}")
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
    if not 0 <= v.split < 1:
        add("validation.split", f"expected a fraction of the examples from 0 to below 1, got {v.split:g}")
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
