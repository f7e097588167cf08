"""Does a config fit this machine? Memory, CPUs and fixed ports, checked before any task starts.

A config can be valid and still unable to run here: ``model.hidden: [1000000, 1000000, 1000000]``
asks for trillions of parameters, 2,048 local workers for thousands of TensorFlow processes, and a
fixed port may be held by another program. Each of those used to fail far into a run, blaming a
task for "Tensor Size Mismatch" or "Could not start gRPC server"; here they are refused before the
launch with the field to change.

- **Memory**: :func:`estimate` counts the parameters of the built-in models from their sizes and
  the data shape (the same layers ``engine.runtime.models`` builds), multiplies by what each task
  keeps (weights, gradients, the optimizer's slots; copies per device), adds activations of a
  per-replica batch, in-memory synthetic data and a TensorFlow process each, then a safety factor.
  The tasks of this machine's hosts together must fit in the memory available now (psutil); where
  NVML sees GPUs, the model's share of a GPU task is held against that GPU's free memory instead.
  A user's own model (``model.name: script``) has unknown size: only its data is counted.
- **CPUs**: more local tasks than CPUs is a warning (:func:`warnings`; the run is slower), more
  than :data:`OVERSUBSCRIBE_LIMIT` per CPU is refused unless ``training.allow_oversubscribe: true``.
- **Ports**: a fixed ``port`` of a task on this machine is bound briefly (never listened on) unless
  the run will be isolated in its own network namespace, where this machine's ports do not matter.

Only the hosts that are this machine are checked: remote machines are not measured from here.
"""

from __future__ import annotations

import errno
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from engine.contract.config import (
    IMAGE_MODELS,
    TOKEN_MODELS,
    TRAINER_ROLES,
    Host,
    Problem,
    RunConfig,
    Task,
)
from engine.contract.task_plan import cpus

#: Estimates are multiplied by this before they are held against what the machine has.
SAFETY_FACTOR = 1.25
#: What one TensorFlow process takes before it holds any model (a low figure: TF alone is 300-400 MB here).
TASK_BASELINE_BYTES = 150 * 1024 * 1024
#: Local tasks per CPU above which a run is refused without ``training.allow_oversubscribe``.
OVERSUBSCRIBE_LIMIT = 4
FLOAT_BYTES = 4
#: Optimizer state per parameter, as Keras keeps it.
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "rmsprop": 1}


@dataclass
class Estimate:
    """Bytes each local task would hold, by the config field they grow with."""

    parameters: int | None  # None: a user's model, of unknown size
    terms: list[tuple[str, int]]  # (field, parameters) of the model's layers
    by_field: dict[str, int] = field(default_factory=dict)  # bytes over all local tasks
    device_bytes: dict[str, int] = field(default_factory=dict)  # task -> bytes of model on its devices
    host_bytes: dict[str, int] = field(default_factory=dict)  # task -> bytes in this machine's memory
    tasks: int = 0

    @property
    def total(self) -> int:
        return sum(self.host_bytes.values())


# --------------------------------------------------------------------------- the model's size


def _dense(fan_in: int, widths: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(field, parameters) of a stack of dense layers fed ``fan_in`` values."""
    out = []
    for name, width in widths:
        out.append((name, fan_in * width + width))
        fan_in = width
    return out


def _widths(config: RunConfig, fan_in: int) -> list[tuple[str, int]]:
    """The dense layers after the feature extractor: hidden widths, then the logits."""
    m, d = config.model, config.data
    layers = [("model.hidden", w) for w in m.hidden]
    last = m.hidden[-1] if m.hidden else fan_in
    layers.append(("data.classes" if d.classes > last else "model.hidden", d.classes))
    return layers


def parameter_terms(config: RunConfig) -> list[tuple[str, int]] | None:
    """The parameters of the built-in model, as (the field each layer grows with, count); None for a script."""
    m, d = config.model, config.data
    values = math.prod(d.shape)
    if m.name == "mlp":
        terms = _dense(values, _widths(config, values))
        if terms:  # the first layer grows with whichever of its two sides is larger
            first = m.hidden[0] if m.hidden else d.classes
            terms[0] = ("data.shape" if values > first else terms[0][0], terms[0][1])
        return terms
    if m.name in TOKEN_MODELS:
        table = ("model.vocab_size" if m.vocab_size >= m.embed_dim else "model.embed_dim", m.vocab_size * m.embed_dim)
        if m.name == "embedding":
            return [table, *_dense(m.embed_dim, _widths(config, m.embed_dim))]
        length = d.shape[0] if d.shape else 1
        e = m.embed_dim
        blocks = [("data.shape", length * e), ("model.embed_dim", 4 * (e * e + e) + 4 * e)]  # positions, attention
        mlp = [("model.hidden", w) for w in (m.hidden or (4 * e,))] + [("model.embed_dim", e)]
        return [table, *blocks, *_dense(e, mlp), *_dense(e, [("data.classes", d.classes)])]
    if m.name in IMAGE_MODELS:
        channels = d.shape[2] if len(d.shape) == 3 else 1
        if m.name == "cnn":
            convs = 9 * channels * 32 + 32 + 9 * 32 * 64 + 64
            features = 64
        else:
            convs = 9 * channels * 16 + 9 * 16 * 16 * 2 + 9 * 16 * 32 + 9 * 32 * 32 + 16 * 32 \
                + 9 * 32 * 64 + 9 * 64 * 64 + 32 * 64 + 2 * (16 * 3 + 32 * 2 + 64 * 2)
            features = 64
        return [("model.name", convs), *_dense(features, _widths(config, features))]
    return None


def activation_values(config: RunConfig) -> int:
    """Values one example keeps alive through a training step (forward outputs), roughly."""
    m, d = config.model, config.data
    values = math.prod(d.shape)
    if m.name in TOKEN_MODELS:
        length = d.shape[0] if d.shape else 1
        e = m.embed_dim
        if m.name == "embedding":
            return length * e + sum(m.hidden) + d.classes
        return length * (8 * e + sum(m.hidden or (4 * e,))) + m.heads * length * length + d.classes
    if m.name in IMAGE_MODELS:
        height, width = d.shape[0], d.shape[1] if len(d.shape) > 1 else 1
        per_pixel = 60 if m.name == "cnn" else 224
        return values + height * width * per_pixel + sum(m.hidden) + d.classes
    return values + sum(m.hidden) + d.classes


def _data_bytes(config: RunConfig) -> int:
    """Synthetic examples live in each trainer's memory twice (numpy, then tf.data's copy)."""
    d = config.data
    if d.source != "synthetic":
        return 0
    per_value = 8 if config.model.name in TOKEN_MODELS else FLOAT_BYTES
    return 2 * d.size * math.prod(d.shape) * per_value


def _model_copies(config: RunConfig, host: Host, task: Task) -> float:
    """How many sets of the whole model's weights, gradients and optimizer slots a task holds."""
    mode = config.parallelism.mode
    devices = config.devices_of(host, task)
    if mode == "model":
        if task.role not in TRAINER_ROLES:
            return 0.0
        total = sum(config.devices_of(h, t) for h, t in config.trainer_tasks()) or 1
        return config.parallelism.mesh_batch * devices / total
    if mode == "async":
        if task.role == "ps":
            return 1.0 / max(1, len(config.cluster.tasks_of("ps")))
        return 0.0
    if task.role in TRAINER_ROLES:
        return float(devices)
    return 0.0


def estimate(config: RunConfig) -> Estimate:
    """What the tasks of this machine's hosts would hold, by task and by field."""
    terms = parameter_terms(config)
    params = sum(n for _, n in terms) if terms is not None else None
    est = Estimate(parameters=params, terms=terms or [])
    t = config.training
    slots = OPTIMIZER_SLOTS.get(t.optimizer, 2)
    replicas = max(1, config.num_replicas())
    per_replica = math.ceil(t.global_batch_size / replicas)
    # activations grow with the batch and the example: an unusually large batch is named, else the data's shape
    act_field = "training.global_batch_size" if per_replica > 1024 else "data.shape"

    def add(key: str, amount: float) -> None:
        est.by_field[key] = est.by_field.get(key, 0) + int(amount)

    for i, host in enumerate(config.cluster.hosts):
        if not host.is_local:
            continue
        for task in host.tasks:
            est.tasks += 1
            device = 0.0
            if params is not None:
                full_sets = _model_copies(config, host, task)
                model_bytes = params * FLOAT_BYTES * (full_sets * (2 + slots))
                # async workers and the chief, and every evaluator, hold the weights (and workers the gradients)
                if config.parallelism.mode == "async" and task.role in ("worker", "chief"):
                    model_bytes += params * FLOAT_BYTES * (2 if task.role == "worker" else 1)
                if task.role == "evaluator":
                    model_bytes += params * FLOAT_BYTES
                device += model_bytes
                for name, n in est.terms:
                    add(name, model_bytes * n / max(1, params))
            host_only = float(TASK_BASELINE_BYTES)
            add(f"cluster.hosts[{i}].tasks", TASK_BASELINE_BYTES)
            if task.role in TRAINER_ROLES:
                acts = per_replica * config.devices_of(host, task) * activation_values(config) * FLOAT_BYTES * 3
                device += acts
                add(act_field, acts)
                data = _data_bytes(config)
                host_only += data
                add("data.shape" if math.prod(config.data.shape) > config.data.size else "data.size", data)
            est.device_bytes[task.name] = int(device * SAFETY_FACTOR)
            est.host_bytes[task.name] = int((device + host_only) * SAFETY_FACTOR)
    return est


# --------------------------------------------------------------------------- memory


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**6 else f"{n:.3g}".replace("e+", "e")


def _field_value(config: RunConfig, name: str) -> str:
    values: dict[str, Callable[[], Any]] = {
        "model.hidden": lambda: list(config.model.hidden),
        "model.vocab_size": lambda: config.model.vocab_size,
        "model.embed_dim": lambda: config.model.embed_dim,
        "model.name": lambda: repr(config.model.name),
        "data.shape": lambda: list(config.data.shape),
        "data.classes": lambda: config.data.classes,
        "data.size": lambda: config.data.size,
        "training.global_batch_size": lambda: config.training.global_batch_size,
    }
    if name in values:
        text = str(values[name]())
        return text if len(text) <= 60 else text[:57] + "..."
    return ""


def _gpu_free() -> list[int] | None:
    """Free bytes of each GPU NVML sees, or None without NVML or GPUs."""
    from engine.control.gpu import GpuSampler

    sampler = GpuSampler()
    try:
        if not sampler.available:
            return None
        return [s.mem_total_bytes - s.mem_used_bytes for s in sampler.sample()]
    finally:
        sampler.close()


def memory_problems(config: RunConfig, *, available: int | None = None, gpu_free: list[int] | None = None,
                    measure_gpus: bool = True) -> list[Problem]:
    """The local tasks' estimated memory against what this machine has free now (a refusal naming the field).

    ``available`` (bytes) and ``gpu_free`` (bytes per GPU) replace the measured figures in tests;
    ``measure_gpus=False`` with no ``gpu_free`` means: no GPUs here.
    """
    est = estimate(config)
    if not est.tasks:
        return []
    gpus: list[int] | None = None
    if any(h.is_local and h.gpus > 0 for h in config.cluster.hosts):
        gpus = gpu_free if gpu_free is not None else _gpu_free() if measure_gpus else None
    need = est.total
    kind = config.model.name
    params = _count(est.parameters) if est.parameters is not None else "an unknown number of"
    if gpus:
        # the model's share lives on the GPUs: held against the smallest free GPU, per device of each task
        smallest = min(gpus)
        for host in config.cluster.hosts:
            if not host.is_local or host.gpus <= 0:
                continue
            for task in host.tasks:
                per_device = est.device_bytes.get(task.name, 0) / max(1, config.devices_of(host, task))
                if per_device > smallest:
                    name = _largest_model_field(est)
                    return [_refusal(config, name, f"{task.name} needs about {_size(per_device)} on each of its "
                                                   f"GPUs for the {kind} model of {params} parameters, but a GPU "
                                                   f"here has {_size(smallest)} free")]
        need = sum(est.host_bytes[t] - est.device_bytes[t] for t in est.host_bytes)
    free = available if available is not None else int(psutil.virtual_memory().available)
    if need <= free:
        return []
    name = max(est.by_field, key=lambda k: est.by_field[k])
    parts = [f"{est.tasks} local task{'s' if est.tasks != 1 else ''}"]
    if est.parameters is not None:
        parts.append(f"the {kind} model's {params} parameters with their gradients and optimizer "
                     f"({config.training.optimizer}) state in each task that trains it")
    return [_refusal(config, name, f"the run needs about {_size(need)} of memory on this machine "
                                   f"({', '.join(parts)}), but {_size(free)} is available")]


def _largest_model_field(est: Estimate) -> str:
    model_fields = [name for name, _ in est.terms]
    return max(model_fields, key=lambda k: est.by_field.get(k, 0)) if model_fields else "model.name"


def _refusal(config: RunConfig, name: str, why: str) -> Problem:
    value = _field_value(config, name)
    if name.startswith("cluster.hosts"):
        return Problem(name, f"{why}; expected fewer tasks on this machine")
    got = f" (got {value})" if value else ""
    return Problem(name, f"{why}; expected a smaller {name}{got}")


# --------------------------------------------------------------------------- CPUs


def cpu_count() -> int:
    """How many CPUs this process may run on (its affinity), not the machine's total."""
    return len(cpus())


def _local_tasks(config: RunConfig) -> tuple[int, int]:
    """(count of tasks on this machine's hosts, index of the first such host)."""
    hosts = [(i, h) for i, h in enumerate(config.cluster.hosts) if h.is_local]
    return sum(len(h.tasks) for _, h in hosts), (hosts[0][0] if hosts else 0)


def cpu_problems(config: RunConfig, *, cpus: int | None = None) -> list[Problem]:
    """A refusal where the local tasks outnumber the CPUs more than :data:`OVERSUBSCRIBE_LIMIT` times."""
    cpus = cpus or cpu_count()
    tasks, first = _local_tasks(config)
    limit = OVERSUBSCRIBE_LIMIT * cpus
    if tasks <= limit or config.training.allow_oversubscribe:
        return []
    return [Problem(f"cluster.hosts[{first}].tasks",
                    f"{tasks} tasks would run on this machine's {cpus} CPU{'s' if cpus != 1 else ''} (more than "
                    f"{OVERSUBSCRIBE_LIMIT} per CPU); expected at most {limit}, or training.allow_oversubscribe: "
                    f"true to run them anyway")]


def warnings(config: RunConfig, *, cpus: int | None = None) -> list[Problem]:
    """What does not stop a launch but should be said: more local tasks than CPUs (they share them)."""
    cpus = cpus or cpu_count()
    tasks, first = _local_tasks(config)
    if tasks <= cpus or cpu_problems(config, cpus=cpus):
        return []
    return [Problem(f"cluster.hosts[{first}].tasks",
                    f"{tasks} tasks share this machine's {cpus} CPU{'s' if cpus != 1 else ''}: each runs slower "
                    f"than it would alone, and step times say more about the sharing than about the cluster")]


# --------------------------------------------------------------------------- ports


def will_be_isolated(config: RunConfig) -> bool:
    """The launcher's own decision: an all-local run in a private network namespace where allowed."""
    from engine.control import netns

    if os.environ.get("CLUSTERDECK_NETNS", "1") == "0" or not config.cluster.is_local:
        return False
    return netns.available()[0]


def port_in_use(port: int) -> str:
    """Why ``port`` cannot be bound on this machine ("" when it can): it is bound, never listened on."""
    probes: list[tuple[socket.AddressFamily, str]] = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        probes.append((socket.AF_INET6, "::"))
    for family, address in probes:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no such address family here
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to reuse
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "is already in use on this machine"
            if exc.errno == errno.EACCES:
                return "cannot be used on this machine without special privileges (permission denied)"
        finally:
            sock.close()
    return ""


def port_problems(config: RunConfig, *, isolated: bool | None = None) -> list[Problem]:
    """Fixed ports of tasks on this machine that another program holds (skipped for an isolated run)."""
    fixed = [(i, j, task.port) for i, host in enumerate(config.cluster.hosts) if host.is_local
             for j, task in enumerate(host.tasks) if task.port is not None]
    if not fixed or (will_be_isolated(config) if isolated is None else isolated):
        return []
    problems = []
    for i, j, port in fixed:
        why = port_in_use(port)
        if why:
            problems.append(Problem(f"cluster.hosts[{i}].tasks[{j}].port", f"{port} {why}; expected a free port, "
                                                                            f"or 'auto'"))
    return problems


def check(config: RunConfig, *, isolated: bool | None = None) -> list[Problem]:
    """Every refusal of this module: memory, CPUs and fixed ports on this machine."""
    return memory_problems(config) + cpu_problems(config) + port_problems(config, isolated=isolated)
