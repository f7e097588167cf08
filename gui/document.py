"""The edited document: a run config plus where each host box sits on the canvas.

Every cluster edit of the app is a pure function here (old document in, new one
out), so the controller can push before/after snapshots onto its undo stack and
the rules (unique names, task indices 0..n-1 per role, fixes for a parallelism
mode) are tested without any widget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.contract import config as config_mod
from engine.contract.config import HOST_KINDS, ROLES, Cluster, Host, RunConfig, Slurm, Task

# Geometry of a host box on the canvas (scene units): the canvas draws with these, the auto layout
# places hosts with them.
CHIP_W = 122.0
CHIP_H = 40.0
PAD = 10.0
COLUMNS = 2
HEADER_H = 42.0
GPU_ROW_H = 24.0
HOST_W = PAD + COLUMNS * (CHIP_W + PAD)
HOST_GAP_X = 36.0
HOST_GAP_Y = 30.0
HOSTS_PER_ROW = 4

Position = tuple[float, float]


def host_height(tasks: int) -> float:
    """Height of a host box holding ``tasks`` chips."""
    rows = max(1, (tasks + COLUMNS - 1) // COLUMNS)
    return HEADER_H + GPU_ROW_H + rows * (CHIP_H + PAD) + PAD


def auto_layout(cluster: Cluster) -> tuple[Position, ...]:
    """Where each host goes when the user has not placed it: rows of up to four, each row below the
    tallest host of the row above."""
    positions: list[Position] = []
    y = 0.0
    hosts = cluster.hosts
    for start in range(0, len(hosts), HOSTS_PER_ROW):
        row = hosts[start:start + HOSTS_PER_ROW]
        for k in range(len(row)):
            positions.append((k * (HOST_W + HOST_GAP_X), y))
        y += max(host_height(len(h.tasks)) for h in row) + HOST_GAP_Y
    return tuple(positions)


@dataclass(frozen=True)
class Document:
    """A config and the canvas position of each of its hosts (one per host, same order)."""

    config: RunConfig = field(default_factory=config_mod.default_config)
    layout: tuple[Position, ...] = ()

    @staticmethod
    def of(config: RunConfig) -> Document:
        return Document(config, auto_layout(config.cluster))

    def with_cluster(self, cluster: Cluster, layout: tuple[Position, ...] | None = None) -> Document:
        """The document with ``cluster``: a layout the user never changed follows the new cluster; hosts
        without a position get their automatic one."""
        new = config_mod.replace(self.config, cluster=cluster)
        auto = auto_layout(cluster)
        if layout is None:
            layout = auto if self.layout == auto_layout(self.config.cluster) else self.layout
        if len(layout) != len(cluster.hosts):
            layout = tuple(layout[:len(cluster.hosts)]) + auto[len(layout):]
        return Document(new, layout)


# --------------------------------------------------------------------------- cluster rules


def renumber(cluster: Cluster) -> Cluster:
    """Task indices 0..n-1 per role, in the order the tasks appear on the canvas."""
    counters: dict[str, int] = {}
    hosts = []
    for h in cluster.hosts:
        tasks = []
        for t in h.tasks:
            index = counters.get(t.role, 0)
            counters[t.role] = index + 1
            tasks.append(t if t.index == index else config_mod.replace(t, index=index))
        hosts.append(config_mod.replace(h, tasks=tuple(tasks)))
    return Cluster(hosts=tuple(hosts))


def close_gap(cluster: Cluster, role: str, index: int) -> Cluster:
    """After ``role:index`` left the cluster: the tasks of ``role`` above it move down by one, the rest keep
    their names (the user did not touch them)."""
    return Cluster(hosts=tuple(
        config_mod.replace(h, tasks=tuple(config_mod.replace(t, index=t.index - 1) if t.role == role and t.index > index else t
                                   for t in h.tasks))
        for h in cluster.hosts))


def unique_host_name(cluster: Cluster, base: str = "host") -> str:
    names = {h.name for h in cluster.hosts}
    if base not in names and base != "host":
        return base
    n = len(cluster.hosts)
    while f"{base}{n}" in names:
        n += 1
    return f"{base}{n}"


def _replace_host(cluster: Cluster, i: int, host: Host) -> Cluster:
    hosts = list(cluster.hosts)
    hosts[i] = host
    return Cluster(hosts=tuple(hosts))


# --------------------------------------------------------------------------- edits


def add_host(doc: Document, position: Position | None = None, name: str | None = None,
             kind: str = "machine") -> Document:
    """One more host: a machine (localhost, no GPU) or, ``kind='slurm'``, a Slurm group of one node."""
    if kind not in HOST_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(HOST_KINDS)}, got {kind!r}")
    cluster = doc.config.cluster
    if kind == "slurm":
        host = Host(name=name or unique_host_name(cluster, "slurm"), address="localhost", gpus=0, kind="slurm",
                    slurm=Slurm())
    else:
        host = Host(name=name or unique_host_name(cluster), address="localhost", gpus=0)
    grown = Cluster(hosts=cluster.hosts + (host,))
    if position is None:
        return doc.with_cluster(grown)
    return doc.with_cluster(grown, doc.layout + (position,))


def remove_host(doc: Document, i: int) -> Document:
    hosts = list(doc.config.cluster.hosts)
    gone = hosts.pop(i)
    layout = list(doc.layout)
    del layout[i]
    cluster = Cluster(hosts=tuple(hosts))
    for t in sorted(gone.tasks, key=lambda t: -t.index):
        cluster = close_gap(cluster, t.role, t.index)
    if doc.layout == auto_layout(doc.config.cluster):
        return doc.with_cluster(cluster, auto_layout(cluster))
    return doc.with_cluster(cluster, tuple(layout))


def update_host(doc: Document, i: int, **changes: object) -> Document:
    cluster = doc.config.cluster
    return doc.with_cluster(_replace_host(cluster, i, config_mod.replace(cluster.hosts[i], **changes)))


def set_host_kind(doc: Document, i: int, kind: str) -> Document:
    """Host ``i`` as a machine or a Slurm group; its GPUs carry over (a machine's GPUs become the group's
    GPUs per node and back), its name, tasks and python stay."""
    if kind not in HOST_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(HOST_KINDS)}, got {kind!r}")
    host = doc.config.cluster.hosts[i]
    if host.kind == kind:
        return doc
    if kind == "slurm":
        slurm = host.slurm or Slurm(gpus_per_node=max(0, host.gpus))
        new = config_mod.replace(host, kind="slurm", slurm=slurm, gpus=0)
    else:
        gpus = host.slurm.gpus_per_node if host.slurm is not None else host.gpus
        new = config_mod.replace(host, kind="machine", slurm=None, gpus=gpus)
    return doc.with_cluster(_replace_host(doc.config.cluster, i, new))


def update_slurm(doc: Document, i: int, **changes: object) -> Document:
    """Change fields of the slurm block of host ``i`` (a Slurm group), e.g. ``nodes=2, partition='debug'``."""
    host = doc.config.cluster.hosts[i]
    if not host.is_slurm:
        raise ValueError(f"cluster.hosts[{i}].kind: expected 'slurm' to edit its slurm block, got {host.kind!r}")
    slurm = config_mod.replace(host.slurm or Slurm(), **changes)
    return doc.with_cluster(_replace_host(doc.config.cluster, i, config_mod.replace(host, slurm=slurm)))


def move_host(doc: Document, i: int, position: Position) -> Document:
    layout = list(doc.layout)
    layout[i] = (float(position[0]), float(position[1]))
    return Document(doc.config, tuple(layout))


def add_task(doc: Document, i: int, role: str = "worker") -> Document:
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    cluster = doc.config.cluster
    host = cluster.hosts[i]
    host = config_mod.replace(host, tasks=host.tasks + (Task(role=role, index=len(cluster.tasks_of(role))),))
    return doc.with_cluster(_replace_host(cluster, i, host))


def remove_task(doc: Document, i: int, j: int) -> Document:
    cluster = doc.config.cluster
    host = cluster.hosts[i]
    tasks = list(host.tasks)
    gone = tasks.pop(j)
    cluster = _replace_host(cluster, i, config_mod.replace(host, tasks=tuple(tasks)))
    return doc.with_cluster(close_gap(cluster, gone.role, gone.index))


def update_task(doc: Document, i: int, j: int, **changes: object) -> Document:
    cluster = doc.config.cluster
    host = cluster.hosts[i]
    tasks = list(host.tasks)
    old = tasks[j]
    if "role" in changes and changes["role"] != old.role:
        # the task takes the next index of its new role; its old role closes the gap
        changes = {**changes, "index": len(cluster.tasks_of(str(changes["role"])))}
    tasks[j] = config_mod.replace(old, **changes)
    cluster = _replace_host(cluster, i, config_mod.replace(host, tasks=tuple(tasks)))
    if tasks[j].role != old.role:
        cluster = close_gap(cluster, old.role, old.index)
    return doc.with_cluster(cluster)


def move_task(doc: Document, i: int, j: int, k: int) -> Document:
    """Move task ``j`` of host ``i`` to the end of host ``k``; every task keeps its name."""
    if i == k:
        return doc
    hosts = list(doc.config.cluster.hosts)
    src = list(hosts[i].tasks)
    task = src.pop(j)
    hosts[i] = config_mod.replace(hosts[i], tasks=tuple(src))
    hosts[k] = config_mod.replace(hosts[k], tasks=hosts[k].tasks + (task,))
    return doc.with_cluster(Cluster(hosts=tuple(hosts)))


# --------------------------------------------------------------------------- parallelism


def cluster_fix(config: RunConfig, mode: str, from_mode: str = "") -> tuple[Cluster, list[str]]:
    """The cluster ``mode`` needs and what changed, in words (no change: same cluster, no words).

    async needs exactly one chief, at least one worker and one ps; data and model use no ps,
    and model no chief either (its chief becomes a worker). Leaving async for data drops the
    chief that coordinated (it would train as one more replica) when workers are left to train.
    """
    cluster = config.cluster
    changes: list[str] = []
    hosts = [list(h.tasks) for h in cluster.hosts]
    if not hosts:
        return cluster, changes

    def count(role: str) -> int:
        return sum(1 for ts in hosts for t in ts if t.role == role)

    if mode == "async":
        chiefs = [(i, j) for i, ts in enumerate(hosts) for j, t in enumerate(ts) if t.role == "chief"]
        for i, j in chiefs[1:]:
            hosts[i][j] = config_mod.replace(hosts[i][j], role="worker")
            changes.append("turn the extra chief tasks into workers")
        if not chiefs:
            hosts[0].insert(0, Task(role="chief"))
            changes.append(f"add a chief task to host {cluster.hosts[0].name!r}")
        if count("worker") == 0:
            hosts[0].append(Task(role="worker"))
            changes.append(f"add a worker task to host {cluster.hosts[0].name!r}")
        if count("ps") == 0:
            hosts[0].append(Task(role="ps"))
            changes.append(f"add a ps task to host {cluster.hosts[0].name!r}")
    else:
        ps = count("ps")
        if ps:
            hosts = [[t for t in ts if t.role != "ps"] for ts in hosts]
            changes.append(f"remove the {ps} ps task{'s' if ps > 1 else ''}")
        if mode == "data" and from_mode == "async" and count("chief") and count("worker"):
            hosts = [[t for t in ts if t.role != "chief"] for ts in hosts]
            changes.append("remove the chief task (it coordinated the async run; in data mode it would train "
                           "as one more replica)")
        if mode == "model" and count("chief"):
            hosts = [[config_mod.replace(t, role="worker") if t.role == "chief" else t for t in ts] for ts in hosts]
            changes.append("turn the chief task into a worker")
        if count("chief") + count("worker") == 0:
            hosts[0].append(Task(role="worker"))
            changes.append(f"add a worker task to host {cluster.hosts[0].name!r}")
    if not changes:
        return cluster, []
    fixed = Cluster(hosts=tuple(config_mod.replace(h, tasks=tuple(ts)) for h, ts in zip(cluster.hosts, hosts, strict=True)))
    return renumber(fixed), list(dict.fromkeys(changes))


def mesh_fix(config: RunConfig) -> tuple[int, int]:
    """A DTensor mesh (batch, model) matching the worker devices, keeping the model axis if it fits."""
    devices = sum(config.devices_of(h, t) for h, t in config.trainer_tasks()) or 1
    extra = math.prod(size for _, size in config.parallelism.mesh_axes)  # the named axes stay as they are
    if devices % extra == 0:
        devices //= extra
    model = config.parallelism.mesh_model
    if model < 1 or devices % model or any(w % model for w in config.model.hidden):
        model = 1
    return max(1, devices // model), model


def mode_fix(config: RunConfig, mode: str) -> tuple[RunConfig, list[str]]:
    """``config`` switched to parallelism ``mode`` with the cluster (and, for model, the mesh) it needs,
    and what changed, in words."""
    switched = config_mod.replace(config, parallelism=config_mod.replace(config.parallelism, mode=mode))
    cluster, changes = cluster_fix(switched, mode, from_mode=config.parallelism.mode)
    new = config_mod.replace(switched, cluster=cluster)
    if mode == "model":
        batch, model = mesh_fix(new)
        p = new.parallelism
        if (batch, model) != (p.mesh_batch, p.mesh_model):
            changes.append(f"set the mesh to batch {batch} x model {model} (the {batch * model} worker devices)")
            new = config_mod.replace(new, parallelism=config_mod.replace(p, mesh_batch=batch, mesh_model=model))
    return new, changes
