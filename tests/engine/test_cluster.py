"""From a drawn cluster to ports, TF_CONFIG, GPU ids and DTensor variables."""

from __future__ import annotations

import itertools
import json
import socket

import pytest

from engine.contract.config import Cluster, Host, Parallelism, RunConfig, Task, Training, validate
from engine.contract.plan import (
    cluster_spec,
    connect_address,
    dtensor_env,
    free_port,
    gpu_assignment,
    plan_tasks,
    resolve_ports,
    tf_config,
    tf_config_json,
)
from engine.contract.task_plan import TaskPlan, intra_op_threads, share_cores


def data_2workers(ports: tuple[int | None, int | None] = (None, None)) -> Cluster:
    return Cluster(hosts=(Host(name="local", tasks=(Task("worker", 0, ports[0]), Task("worker", 1, ports[1]))),))


def async_cluster() -> Cluster:
    """chief + 2 workers + 2 ps + an evaluator, listed out of index order over two hosts."""
    a = Host(name="a", address="localhost", gpus=2,
             tasks=(Task("worker", 1, 6001), Task("chief", 0, 6000), Task("ps", 1, 6004)))
    b = Host(name="b", address="gpu-box.lan", gpus=2,
             tasks=(Task("ps", 0, 6003), Task("worker", 0, 6002), Task("evaluator", 0, 6005)))
    return Cluster(hosts=(a, b))


def task(cluster: Cluster, name: str) -> Task:
    return next(t for _, t in cluster.tasks() if t.name == name)


# --------------------------------------------------------------------------- ports


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_resolve_ports_fills_auto_ports_with_distinct_free_ports() -> None:
    cluster = Cluster(hosts=(
        Host(name="a", tasks=(Task("chief", 0), Task("worker", 0), Task("worker", 1, 23456), Task("ps", 0))),
        Host(name="b", tasks=(Task("ps", 1), Task("evaluator", 0))),
    ))
    resolved = resolve_ports(cluster)
    ports = [t.port for _, t in resolved.tasks()]
    assert all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
    assert len(set(ports)) == len(ports)
    assert task(resolved, "worker:1").port == 23456
    # everything else is kept as it was
    assert [(h.name, [(t.role, t.index) for t in h.tasks]) for h in resolved.hosts] == \
        [(h.name, [(t.role, t.index) for t in h.tasks]) for h in cluster.hosts]
    assert cluster.hosts[0].tasks[0].port is None, "the input is not changed"


def test_resolve_ports_skips_repeats_and_fixed_ports() -> None:
    # a picker that hands out a fixed port and repeats itself
    offered = iter([5000, 5000, 5001, 5001, 5000, 5002, 5003])
    cluster = Cluster(hosts=(Host(tasks=(Task("worker", 0), Task("worker", 1, 5001), Task("worker", 2),
                                         Task("worker", 3))),))
    resolved = resolve_ports(cluster, pick=lambda: next(offered))
    assert [t.port for _, t in resolved.tasks()] == [5000, 5001, 5002, 5003]


def test_resolve_ports_keeps_a_fully_fixed_cluster() -> None:
    cluster = async_cluster()
    assert resolve_ports(cluster, pick=lambda: pytest.fail("no port should be picked")) == cluster


def test_cluster_spec_needs_resolved_ports() -> None:
    with pytest.raises(ValueError, match="worker:0 has no port; call resolve_ports first"):
        cluster_spec(data_2workers())


# --------------------------------------------------------------------------- TF_CONFIG


def test_data_parallel_spec_and_tf_config() -> None:
    cluster = data_2workers((7001, 7000))
    assert cluster_spec(cluster) == {"worker": ["127.0.0.1:7001", "127.0.0.1:7000"]}
    config = tf_config(cluster, task(cluster, "worker:1"))
    assert config == {"cluster": {"worker": ["127.0.0.1:7001", "127.0.0.1:7000"]},
                      "task": {"type": "worker", "index": 1}}
    assert json.loads(tf_config_json(cluster, task(cluster, "worker:0"))) == {
        "cluster": {"worker": ["127.0.0.1:7001", "127.0.0.1:7000"]}, "task": {"type": "worker", "index": 0}}


def test_spec_is_ordered_by_task_index_not_by_listing() -> None:
    cluster = Cluster(hosts=(Host(name="h", tasks=(Task("worker", 2, 9002), Task("worker", 0, 9000))),
                             Host(name="g", address="127.0.0.1", tasks=(Task("worker", 1, 9001),))))
    assert cluster_spec(cluster) == {"worker": ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002"]}


def test_async_spec_excludes_the_evaluator() -> None:
    cluster = async_cluster()
    spec = cluster_spec(cluster)
    assert spec == {
        "chief": ["127.0.0.1:6000"],
        "worker": ["gpu-box.lan:6002", "127.0.0.1:6001"],
        "ps": ["gpu-box.lan:6003", "127.0.0.1:6004"],
    }
    for name in ("chief:0", "worker:0", "worker:1", "ps:0", "ps:1", "evaluator:0"):
        t = task(cluster, name)
        config = json.loads(tf_config_json(cluster, t))
        assert config["cluster"] == spec
        assert config["task"] == {"type": t.role, "index": t.index}
    assert tf_config(cluster, task(cluster, "evaluator:0"))["task"] == {"type": "evaluator", "index": 0}


def test_connect_address() -> None:
    assert connect_address(Host(address="localhost")) == "127.0.0.1"
    assert connect_address(Host(address=" LocalHost ")) == "127.0.0.1"
    assert connect_address(Host(address="::1")) == "127.0.0.1"
    assert connect_address(Host(address=" 10.1.2.3 ")) == "10.1.2.3"


# --------------------------------------------------------------------------- GPUs


def test_gpu_assignment_splits_a_hosts_gpus_over_its_trainers() -> None:
    host = Host(gpus=4, tasks=(Task("chief", 0), Task("ps", 0), Task("worker", 0), Task("evaluator", 0)))
    assert gpu_assignment(host) == {"chief:0": [0, 1], "ps:0": [], "worker:0": [2, 3], "evaluator:0": []}


def test_gpu_assignment_single_trainer_gets_every_gpu() -> None:
    assert gpu_assignment(Host(gpus=2, tasks=(Task("worker", 0),))) == {"worker:0": [0, 1]}


def test_gpu_assignment_without_gpus_or_trainers() -> None:
    assert gpu_assignment(Host(gpus=0, tasks=(Task("worker", 0), Task("worker", 1)))) == {"worker:0": [],
                                                                                           "worker:1": []}
    assert gpu_assignment(Host(gpus=2, tasks=(Task("ps", 0),))) == {"ps:0": []}


def test_gpu_assignment_never_repeats_or_exceeds_ids() -> None:
    for gpus, trainers in itertools.product(range(0, 9), range(1, 5)):
        host = Host(gpus=gpus, tasks=tuple(Task("worker", i) for i in range(trainers)))
        ids = [g for lst in gpu_assignment(host).values() for g in lst]
        assert len(ids) == len(set(ids))
        assert all(0 <= g < gpus for g in ids)


def async_config() -> RunConfig:
    config = RunConfig(name="async", cluster=async_cluster(), parallelism=Parallelism(mode="async"),
                       training=Training(global_batch_size=64))
    assert validate(config) == []
    return config


def test_plan_tasks_env_for_async() -> None:
    plans = {p.name: p for p in plan_tasks(async_config())}
    assert set(plans) == {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1", "evaluator:0"}
    # host a: the async chief coordinates and trains nothing, so worker:1 gets both GPUs; ps:1 none
    assert plans["worker:1"].gpu_ids == (0, 1) and plans["worker:1"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plans["chief:0"].gpu_ids == () and plans["chief:0"].env["CUDA_VISIBLE_DEVICES"] == ""
    # host b: worker:0 is its only trainer
    assert plans["worker:0"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plans["worker:0"].host == "b" and plans["worker:0"].devices == 2
    for name in ("ps:0", "ps:1", "evaluator:0"):
        assert plans[name].gpu_ids == ()
        assert plans[name].env["CUDA_VISIBLE_DEVICES"] == "", "an empty list hides every GPU from the task"
        assert plans[name].devices == 0
    for name, plan in plans.items():
        assert plan.env["CLUSTERDECK_TASK"] == name
        assert json.loads(plan.env["TF_CONFIG"])["task"] == {"type": plan.role, "index": plan.index}
        assert "DTENSOR_CLIENT_ID" not in plan.env
        assert TaskPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_plan_tasks_for_data_parallel_without_gpus() -> None:
    config = RunConfig(cluster=data_2workers((7000, 7001)))
    plans = plan_tasks(config)
    assert [p.name for p in plans] == ["worker:0", "worker:1"]
    for p in plans:
        assert p.env["CUDA_VISIBLE_DEVICES"] == ""
        assert p.env["CLUSTERDECK_DEVICES"] == "1" and p.devices == 1
        assert p.port in (7000, 7001)


# --------------------------------------------------------------------------- DTensor


def test_dtensor_env_for_two_workers() -> None:
    cluster = data_2workers((7100, 7101))
    assert dtensor_env(cluster, task(cluster, "worker:0")) == {
        "DTENSOR_CLIENT_ID": "0",
        "DTENSOR_NUM_CLIENTS": "2",
        "DTENSOR_JOB_NAME": "worker",
        "DTENSOR_JOBS": "127.0.0.1:7100,127.0.0.1:7101",
    }
    assert dtensor_env(cluster, task(cluster, "worker:1"))["DTENSOR_CLIENT_ID"] == "1"


def test_dtensor_env_single_client_needs_nothing() -> None:
    cluster = Cluster(hosts=(Host(tasks=(Task("worker", 0, 7100),)),))
    assert dtensor_env(cluster, cluster.hosts[0].tasks[0]) == {}


def test_plan_tasks_in_model_mode_carries_dtensor_env() -> None:
    config = RunConfig(cluster=data_2workers((7200, 7201)), parallelism=Parallelism(mode="model", mesh_batch=1,
                                                                                    mesh_model=2))
    assert validate(config) == []
    plans = plan_tasks(config)
    assert [p.env["DTENSOR_CLIENT_ID"] for p in plans] == ["0", "1"]
    assert {p.env["DTENSOR_JOBS"] for p in plans} == {"127.0.0.1:7200,127.0.0.1:7201"}


@pytest.mark.parametrize(("tasks", "cores", "threads"), [(1, 8, 8), (2, 2, 1), (2, 8, 4), (3, 8, 2), (4, 2, 1),
                                                          (8, 64, 8), (0, 4, 4)])
def test_tasks_on_one_host_split_its_cores_at_least_one_thread_each(tasks: int, cores: int, threads: int) -> None:
    assert intra_op_threads(tasks, cores) == threads


def _plans(mode: str, roles: tuple[str, ...]) -> list[TaskPlan]:
    counts: dict[str, int] = {}
    tasks = []
    for role in roles:
        tasks.append(Task(role, counts.get(role, 0), 7300 + len(tasks)))
        counts[role] = counts.get(role, 0) + 1
    config = RunConfig(cluster=Cluster(hosts=(Host(tasks=tuple(tasks)),)), parallelism=Parallelism(mode=mode))
    return plan_tasks(config)


def test_the_tasks_that_train_are_marked_in_their_plans() -> None:
    assert [p.trains for p in _plans("data", ("chief", "worker", "evaluator"))] == [True, True, False]
    assert [p.trains for p in _plans("async", ("chief", "worker", "worker", "ps"))] == [False, True, True, False]
    plan = _plans("data", ("worker",))[0]
    assert TaskPlan.from_dict(plan.to_dict()) == plan


def test_training_tasks_get_cores_of_their_own_and_keep_the_hosts_inter_op_pool() -> None:
    shares = share_cores(_plans("data", ("worker", "worker")), [0, 1])
    assert {n: s.cores for n, s in shares.items()} == {"worker:0": (0,), "worker:1": (1,)}
    assert all(s.env == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"} for s in shares.values())
    # an allowed set that is not 0..n-1 (a Slurm step's CPUs, a taskset), split in order
    shares = share_cores(_plans("data", ("worker", "worker")), [9, 3, 5, 7])
    assert [s.cores for s in shares.values()] == [(3, 5), (7, 9)]
    assert shares["worker:0"].env["TF_NUM_INTRAOP_THREADS"] == "2"


def test_serving_tasks_stay_free_and_too_many_trainers_are_not_pinned() -> None:
    shares = share_cores(_plans("async", ("chief", "worker", "worker", "ps")), [0, 1])
    assert {n: s.cores for n, s in shares.items()} == {"chief:0": (), "worker:0": (0,), "worker:1": (1,), "ps:0": ()}
    assert shares["ps:0"].env == {"TF_NUM_INTRAOP_THREADS": "1"}  # the even share, TensorFlow's own inter-op pool
    # more trainers than cores, or a single one: nothing to pin
    assert all(s.cores == () for s in share_cores(_plans("data", ("worker",) * 3), [0, 1]).values())
    assert all(s.cores == () for s in share_cores(_plans("data", ("worker", "evaluator")), [0, 1, 2, 3]).values())
    # 8 cores, 2 trainers and a ps: 4 cores each, the ps free with the even share
    shares = share_cores(_plans("async", ("worker", "worker", "ps")), range(8))
    assert [s.cores for s in shares.values()] == [(0, 1, 2, 3), (4, 5, 6, 7), ()]
    assert shares["ps:0"].env == {"TF_NUM_INTRAOP_THREADS": "2"}
