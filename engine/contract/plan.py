"""From a drawn cluster to what TensorFlow needs: ports, ``TF_CONFIG``, device assignment."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.contract.config import Cluster, Host, RunConfig, Task, gpu_roles, replace, split_gpus
from engine.contract.task_plan import CUDA_ORDER, CUDA_ORDER_ENV, TaskPlan

#: Roles that appear in the TF cluster spec (the evaluator is a side-car, outside it).
CLUSTER_ROLES = ("chief", "worker", "ps")


def primary_roles(mode: str) -> tuple[str, ...]:
    """Roles whose tasks finish by themselves, ending the run (ps servers never do)."""
    if mode == "async":
        return ("chief",)
    if mode == "data":
        return ("chief", "worker", "evaluator")  # the evaluator finishes after the final checkpoint
    return ("chief", "worker")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve_ports(cluster: Cluster, pick: Callable[[], int] = free_port) -> Cluster:
    """A copy of ``cluster`` with every ``auto`` port replaced by a free one."""
    taken = {t.port for _, t in cluster.tasks() if t.port is not None}
    hosts = []
    for h in cluster.hosts:
        tasks = []
        for t in h.tasks:
            if t.port is None:
                port = pick()
                while port in taken:
                    port = pick()
                taken.add(port)
                t = replace(t, port=port)
            tasks.append(t)
        hosts.append(replace(h, tasks=tuple(tasks)))
    return Cluster(hosts=tuple(hosts))


def connect_address(host: Host) -> str:
    """The address other tasks dial: loopback for local hosts (IPv4, as TF's server listens)."""
    return "127.0.0.1" if host.is_local else host.address.strip()


def cluster_spec(cluster: Cluster, placement: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """TF's cluster spec: ``{"worker": ["host:port", ...], ...}``, ordered by task index.

    ``placement`` names the node of each task of a Slurm group (see :func:`slurm_placement`).
    """
    spec: dict[str, list[tuple[int, str]]] = {}
    for h, t in cluster.tasks():
        if t.role in CLUSTER_ROLES:
            if t.port is None:
                raise ValueError(f"task {t.name} has no port; call resolve_ports first")
            spec.setdefault(t.role, []).append((t.index, f"{task_address(h, t, placement)}:{t.port}"))
    return {role: [addr for _, addr in sorted(entries)] for role, entries in spec.items()}


def task_address(host: Host, task: Task, placement: Mapping[str, str] | None = None) -> str:
    """The address other tasks dial to reach ``task``: its Slurm node (from ``placement``, or the address
    of a group already split into its nodes), else its host's."""
    if host.is_slurm:
        return (placement or {}).get(task.name) or host.address.strip()
    return connect_address(host)


def tf_config(cluster: Cluster, task: Task, placement: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``TF_CONFIG`` of one task (a dict; ``json.dumps`` it for the environment)."""
    return {"cluster": cluster_spec(cluster, placement), "task": {"type": task.role, "index": task.index}}


def tf_config_json(cluster: Cluster, task: Task, placement: Mapping[str, str] | None = None) -> str:
    return json.dumps(tf_config(cluster, task, placement), sort_keys=True)


# --------------------------------------------------------------------------- Slurm allocations


def slurm_tasks_per_node(host: Host) -> int:
    """The most tasks any node of a Slurm group runs (``--ntasks-per-node`` of its allocation)."""
    return max((len(group) for group in host.node_tasks()), default=0) or 1


def slurm_placement(host: Host, nodes: Sequence[str]) -> dict[str, str]:
    """Task name -> node of the allocation, as TensorFlow's ``SlurmClusterResolver`` places tasks: the
    drawn tasks in order, in blocks over the nodes in the allocation's order (``scontrol show hostnames``)."""
    groups = host.node_tasks()
    if len(nodes) < len(groups):
        raise ValueError(f"Slurm group {host.name!r} needs {len(groups)} node(s); the allocation has {len(nodes)}")
    return {t.name: nodes[n] for n, group in enumerate(groups) for t in group}


def bind_ports(cluster: Cluster, ports: Mapping[str, int]) -> Cluster:
    """A copy of ``cluster`` whose ``auto`` ports named in ``ports`` (chosen on the tasks' nodes) are fixed."""
    hosts = []
    for h in cluster.hosts:
        tasks = tuple(replace(t, port=ports[t.name]) if t.port is None and t.name in ports else t for t in h.tasks)
        hosts.append(replace(h, tasks=tasks))
    return Cluster(hosts=tuple(hosts))


def node_gpu_ids(allocated: Sequence[int], local_ids: Sequence[int]) -> list[int]:
    """The node's GPU ids of a task, from the GPUs Slurm gave the step (``CUDA_VISIBLE_DEVICES`` of the
    step, in order) and the task's share of them (0-based, as :func:`split_gpus` gives): the local
    rank's slice, as ``SlurmClusterResolver`` binds GPUs. Without a list from Slurm the ids stay local."""
    if not allocated:
        return list(local_ids)
    return [allocated[i] for i in local_ids if 0 <= i < len(allocated)]


def gpu_assignment(host: Host, mode: str = "data") -> dict[str, list[int]]:
    """GPU ids of ``host`` given to each of its tasks in parallelism ``mode`` (:func:`split_gpus`: evenly
    over the tasks that train; ps, evaluator and the async chief get none)."""
    return split_gpus(host, mode)


def plan_tasks(config: RunConfig, placement: Mapping[str, str] | None = None) -> list[TaskPlan]:
    """One :class:`TaskPlan` per task; ports must be resolved already (and Slurm tasks placed on nodes)."""
    plans = []
    cluster = config.cluster
    for h in cluster.hosts:
        gpus: dict[str, list[int]] = {}
        for group in h.node_tasks():  # a Slurm group splits the GPUs of each node over that node's tasks
            if group:
                gpus.update(gpu_assignment(h.node_of(group[0]), config.parallelism.mode))
        for t in h.tasks:
            ids = gpus.get(t.name, [])
            env = {
                "TF_CONFIG": tf_config_json(cluster, t, placement),
                # ps/evaluator tasks see no GPU; trainers see only theirs
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids),
                "CLUSTERDECK_TASK": t.name,
                "CLUSTERDECK_DEVICES": str(config.devices_of(h, t)),
                # CUDA counts GPUs in PCI bus order, as NVML's figures are matched (engine.control.gpu)
                CUDA_ORDER_ENV: CUDA_ORDER,
            }
            if config.parallelism.mode == "model" and t.role == "worker":
                env.update(dtensor_env(cluster, t, placement))
            plans.append(TaskPlan(name=t.name, role=t.role, index=t.index, host=h.name, port=t.port,
                                  gpu_ids=tuple(ids), devices=config.devices_of(h, t), env=env,
                                  trains=t.role in gpu_roles(config.parallelism.mode)))
    return plans


def dtensor_env(cluster: Cluster, task: Task, placement: Mapping[str, str] | None = None) -> dict[str, str]:
    """DTensor multi-client variables: one client per worker task."""
    workers = cluster_spec(cluster, placement).get("worker", [])
    if len(workers) <= 1:
        return {}
    return {
        "DTENSOR_CLIENT_ID": str(task.index),
        "DTENSOR_NUM_CLIENTS": str(len(workers)),
        "DTENSOR_JOB_NAME": "worker",
        "DTENSOR_JOBS": ",".join(workers),
    }
