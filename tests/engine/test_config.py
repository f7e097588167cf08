"""The config model: YAML round-trips, one precise problem per invalid field, and no crash on any input."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.contract import config as config_mod
from engine.contract.config import (
    Cluster,
    ConfigError,
    Data,
    Host,
    Model,
    Parallelism,
    Problem,
    RunConfig,
    Task,
    Training,
    default_config,
    dumps,
    from_dict,
    load,
    loads,
    save,
    to_dict,
    validate,
)

PRESETS = Path(__file__).resolve().parents[2] / "presets"
PRESET_FILES = sorted(PRESETS.glob("*.yaml"))


# --------------------------------------------------------------------------- helpers


def workers(n: int, *, start_port: int | None = None) -> tuple[Task, ...]:
    return tuple(Task("worker", i, None if start_port is None else start_port + i) for i in range(n))


def async_cluster() -> Cluster:
    """chief + 2 workers + 2 ps + evaluator over two hosts, some ports fixed."""
    a = Host(name="a", address="localhost", gpus=2,
             tasks=(Task("chief", 0, 7000), Task("worker", 0), Task("ps", 0, 7001)))
    b = Host(name="b", address="10.0.0.2", gpus=0, ssh_user="tf", ssh_port=2222, python="/opt/venv/bin/python",
             tasks=(Task("worker", 1, 7000), Task("ps", 1), Task("evaluator", 0)))
    return Cluster(hosts=(a, b))


VARIED: dict[str, RunConfig] = {
    "default": default_config(),
    "data-fixed-ports": RunConfig(
        name="fixed ports",
        cluster=Cluster(hosts=(Host(name="local", tasks=workers(3, start_port=23456)),)),
        training=Training(global_batch_size=96, steps=10),
    ),
    "data-gpus": RunConfig(
        name="gpus",
        cluster=Cluster(hosts=(Host(name="box", address="127.0.0.1", gpus=4, tasks=workers(2)),)),
        training=Training(global_batch_size=64, steps=5, optimizer="adam", learning_rate=1e-4),
    ),
    "data-epochs": RunConfig(
        name="epochs",
        cluster=Cluster(hosts=(Host(tasks=(Task("chief", 0), Task("worker", 0))),)),
        data=Data(shape=(28, 28), classes=3, size=1000),
        training=Training(global_batch_size=20, steps=None, epochs=3, seed=0, checkpoint_every=7, restarts=2,
                          metrics_hz=2.5, optimizer="rmsprop"),
    ),
    "async": RunConfig(
        name="async-ps",
        cluster=async_cluster(),
        parallelism=Parallelism(mode="async", partitioner="fixed", shards=4),
        data=Data(shape=(16,)),
        model=Model(name="embedding", hidden=(128, 64)),
        training=Training(global_batch_size=64, steps=50, optimizer="momentum", steps_per_execution=8),
    ),
    "async-min-size": RunConfig(
        name="async-min-size",
        cluster=async_cluster(),
        parallelism=Parallelism(mode="async", partitioner="min_size", min_shard_bytes=4096),
        data=Data(shape=(16,)),
        model=Model(name="embedding"),
        training=Training(global_batch_size=64, steps=None, epochs=1),
    ),
    "model": RunConfig(
        name="model",
        cluster=Cluster(hosts=(Host(tasks=workers(2)),)),
        parallelism=Parallelism(mode="model", mesh_batch=1, mesh_model=2, collective_timeout_s=30.0),
        model=Model(hidden=(256, 128)),
        training=Training(global_batch_size=32, steps=20, optimizer="adamw"),
    ),
    "model-gpus": RunConfig(
        name="model-gpus",
        cluster=Cluster(hosts=(Host(gpus=4, tasks=workers(2, start_port=30000)),)),
        parallelism=Parallelism(mode="model", mesh_batch=2, mesh_model=2),
        model=Model(hidden=()),
        training=Training(global_batch_size=64, steps=1),
    ),
}


def problems_of(exc: pytest.ExceptionInfo[ConfigError]) -> list[Problem]:
    return exc.value.problems


def assert_problem(error: ConfigError, field: str, *parts: str) -> Problem:
    """The problem of ``error`` at exactly ``field`` whose message holds every part."""
    at_field = [p for p in error.problems if p.field == field]
    assert at_field, f"no problem at {field!r}; got {[str(p) for p in error.problems]}"
    for p in at_field:
        if all(part in p.message for part in parts):
            return p
    raise AssertionError(f"no problem at {field!r} mentions {parts}; got {[str(p) for p in at_field]}")


def base_dict() -> dict[str, Any]:
    """A valid config as plain data: two local workers, data parallel."""
    return to_dict(default_config())


def two_hosts() -> dict[str, Any]:
    d = base_dict()
    d["cluster"]["hosts"] = [
        {"name": "a", "address": "localhost", "gpus": 0, "tasks": [{"role": "worker", "index": 0}]},
        {"name": "b", "address": "10.0.0.2", "gpus": 0, "tasks": [{"role": "worker", "index": 1}]},
    ]
    return d


def async_dict() -> dict[str, Any]:
    d = to_dict(VARIED["async"])
    assert from_dict(d) == VARIED["async"]
    return d


def model_dict() -> dict[str, Any]:
    d = to_dict(VARIED["model"])
    assert from_dict(d) == VARIED["model"]
    return d


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("preset", PRESET_FILES, ids=lambda p: p.stem)
def test_presets_round_trip_through_files_and_text(preset: Path, tmp_path: Path) -> None:
    config = load(preset)
    assert validate(config) == []
    assert config.name == preset.stem

    out = tmp_path / "copy.yaml"
    save(config, out)
    assert load(out) == config
    assert loads(dumps(config)) == config
    assert not list(tmp_path.glob(".*.tmp")), "save leaves no temporary file behind"

    plain = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert plain == to_dict(config)
    assert plain["schema"] == config_mod.SCHEMA_VERSION


def test_presets_are_found() -> None:
    assert {p.stem for p in PRESET_FILES} >= {"data-2workers", "data-1worker-2gpus"}


@pytest.mark.parametrize("name", sorted(VARIED))
def test_varied_configs_round_trip(name: str, tmp_path: Path) -> None:
    config = VARIED[name]
    assert validate(config) == [], [str(p) for p in validate(config)]
    text = dumps(config)
    assert loads(text) == config
    path = tmp_path / f"{name}.yaml"
    save(config, path)
    assert load(path) == config
    assert from_dict(to_dict(config)) == config
    assert yaml.safe_load(text) == to_dict(config)


def test_round_trip_keeps_what_matters() -> None:
    config = loads(dumps(VARIED["async"]))
    assert [t.name for _, t in config.cluster.tasks()] == ["chief:0", "worker:0", "ps:0", "worker:1", "ps:1",
                                                          "evaluator:0"]
    assert [t.port for _, t in config.cluster.tasks()] == [7000, None, 7001, 7000, None, None]
    assert config.cluster.hosts[1].ssh_port == 2222 and config.cluster.hosts[1].python == "/opt/venv/bin/python"
    epochs = loads(dumps(VARIED["data-epochs"])).training
    assert epochs.steps is None and epochs.epochs == 3
    assert "steps" not in yaml.safe_load(dumps(VARIED["data-epochs"]))["training"]


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("garbage: [", encoding="utf-8")
    save(VARIED["model"], path)
    assert load(path) == VARIED["model"]


def test_task_index_defaults_count_per_role() -> None:
    d = base_dict()
    d["cluster"]["hosts"][0]["tasks"] = [{"role": "worker"}, {"role": "ps"}, {"role": "worker"}, {}]
    d["parallelism"] = {"mode": "async"}
    d["cluster"]["hosts"][0]["tasks"].append({"role": "chief"})
    config = from_dict(d, check=False)
    assert [t.name for _, t in config.cluster.tasks()] == ["worker:0", "ps:0", "worker:1", "worker:2", "chief:0"]


def test_derived_figures() -> None:
    assert default_config().num_replicas() == 2
    assert VARIED["data-gpus"].num_replicas() == 4
    assert VARIED["async"].num_replicas() == 2
    assert VARIED["model-gpus"].num_replicas() == 2
    epochs = VARIED["data-epochs"]
    assert epochs.total_steps() == math.ceil(1000 / 20) * 3
    h = VARIED["async"].cluster.hosts[0]
    # the async chief coordinates and trains nothing: the worker gets both GPUs
    assert [VARIED["async"].devices_of(h, t) for t in h.tasks] == [1, 2, 0]


names = st.text(min_size=1, max_size=30).filter(lambda s: s.strip() != "")


@settings(max_examples=60, deadline=None)
@given(
    name=names,
    host_name=names,
    lr=st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False).filter(lambda x: x > 0),
    seed=st.integers(0, 2**31 - 1),
    port=st.none() | st.integers(1, 65535),
    path=st.text(max_size=40),
    hz=st.floats(min_value=0.001, max_value=1000),
)
def test_round_trip_for_generated_values(name: str, host_name: str, lr: float, seed: int, port: int | None,
                                         path: str, hz: float) -> None:
    config = RunConfig(
        name=name,
        cluster=Cluster(hosts=(Host(name=host_name, tasks=(Task("worker", 0, port),)),)),
        data=Data(path=path),
        training=Training(learning_rate=lr, seed=seed, metrics_hz=hz),
    )
    assert validate(config) == []
    assert loads(dumps(config)) == config


# --------------------------------------------------------------------------- invalid configs


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets ``a.b[1].c`` to ``value``."""

    def mutate(d: dict[str, Any]) -> None:
        node: Any = d
        parts = path.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        last = parts[-1]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _steps(*mutations: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        for m in mutations:
            m(d)

    return mutate


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        node: Any = d
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]

    return mutate


def _tasks(*tasks: Any) -> Callable[[dict[str, Any]], None]:
    return _set("cluster.hosts[0].tasks", list(tasks))


#: (id, base, mutation, field, message parts)
INVALID_DICTS: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None], str, tuple[str, ...]]] = [
    ("negative gpus", two_hosts, _set("cluster.hosts[1].gpus", -2),
     "cluster.hosts[1].gpus", ("expected an integer >= 0, got -2",)),
    ("too many gpus", base_dict, _set("cluster.hosts[0].gpus", 65),
     "cluster.hosts[0].gpus", ("expected an integer <= 64, got 65",)),
    ("string for gpus", base_dict, _set("cluster.hosts[0].gpus", "2"),
     "cluster.hosts[0].gpus", ("expected an integer from 0 to 64, got '2'",)),
    ("float for gpus", base_dict, _set("cluster.hosts[0].gpus", 1.5),
     "cluster.hosts[0].gpus", ("expected an integer from 0 to 64, got 1.5",)),
    ("bool for steps", base_dict, _set("training.steps", True),
     "training.steps", ("expected an integer from 1 to 1000000000, got True",)),
    ("bool for batch", base_dict, _set("training.global_batch_size", False),
     "training.global_batch_size", ("expected an integer from 1 to 1000000, got False",)),
    ("list for a mapping", base_dict, _set("parallelism", [1, 2]),
     "parallelism", ("expected a mapping of fields, got [1, 2]",)),
    ("string for a mapping", base_dict, _set("training", "fast"),
     "training", ("expected a mapping of fields, got 'fast'",)),
    ("hosts not a list", base_dict, _set("cluster.hosts", {"name": "a"}),
     "cluster.hosts", ("expected a list of hosts, got {'name': 'a'}",)),
    ("tasks not a list", base_dict, _set("cluster.hosts[0].tasks", "worker"),
     "cluster.hosts[0].tasks", ("expected a list of tasks, got 'worker'",)),
    ("task not a mapping", base_dict, _tasks({"role": "worker", "index": 0}, "worker:1"),
     "cluster.hosts[0].tasks[1]", ("expected a mapping of fields, got 'worker:1'",)),
    ("unknown top-level field", base_dict, _set("clusters", {}),
     "clusters", ("unknown field", "'cluster'")),
    ("unknown nested field", base_dict, _set("training.stesp", 10),
     "training.stesp", ("unknown field", "'steps'")),
    ("unknown task field", base_dict, _set("cluster.hosts[0].tasks[0].gpu", 1),
     "cluster.hosts[0].tasks[0].gpu", ("unknown field", "'role'", "'port'")),
    ("non-string key", base_dict, _set("data.7", 1),
     "data.7", ("unknown field",)),
    ("unknown role", base_dict, _set("cluster.hosts[0].tasks[0].role", "master"),
     "cluster.hosts[0].tasks[0].role", ("expected one of 'chief', 'worker', 'ps', 'evaluator', got 'master'",)),
    ("unknown mode", base_dict, _set("parallelism.mode", "pipeline"),
     "parallelism.mode", ("expected one of 'data', 'model', 'async', got 'pipeline'",)),
    ("unknown optimizer", base_dict, _set("training.optimizer", "lbfgs"),
     "training.optimizer", ("got 'lbfgs'", "'adam'")),
    ("duplicate host names", two_hosts, _set("cluster.hosts[1].name", "a"),
     "cluster.hosts[1].name", ("expected a unique host name, got 'a' (also cluster.hosts[0])",)),
    ("empty host name", base_dict, _set("cluster.hosts[0].name", "  "),
     "cluster.hosts[0].name", ("expected a non-empty string, got ''",)),
    ("address with spaces", base_dict, _set("cluster.hosts[0].address", "my host"),
     "cluster.hosts[0].address", ("expected a host name or IP address, got 'my host'",)),
    ("no hosts", base_dict, _set("cluster.hosts", []),
     "cluster.hosts", ("expected at least one host, got none",)),
    ("duplicate task index", base_dict, _set("cluster.hosts[0].tasks[1].index", 0),
     "cluster.hosts[0].tasks[1].index", ("worker indices must be 0..1 with no repeat", "got worker:0",
                                         "[0, 0]")),
    ("non-contiguous task index", base_dict, _set("cluster.hosts[0].tasks[1].index", 2),
     "cluster.hosts[0].tasks[1].index", ("worker indices must be 0..1", "got worker:2", "[0, 2]")),
    ("negative task index", base_dict, _set("cluster.hosts[0].tasks[0].index", -1),
     "cluster.hosts[0].tasks[0].index", ("expected an integer >= 0, got -1",)),
    ("port out of range", base_dict, _set("cluster.hosts[0].tasks[0].port", 70000),
     "cluster.hosts[0].tasks[0].port", ("expected 'auto' or an integer from 1 to 65535, got 70000",)),
    ("port zero", base_dict, _set("cluster.hosts[0].tasks[0].port", 0),
     "cluster.hosts[0].tasks[0].port", ("expected 'auto' or an integer from 1 to 65535, got 0",)),
    ("port as text", base_dict, _set("cluster.hosts[0].tasks[0].port", "5000"),
     "cluster.hosts[0].tasks[0].port", ("got '5000'",)),
    ("duplicate port on one address", base_dict,
     _steps(_set("cluster.hosts[0].tasks[0].port", 5000), _set("cluster.hosts[0].tasks[1].port", 5000)),
     "cluster.hosts[0].tasks[1].port", ("port 5000 on localhost is already used by worker:0",)),
    ("duplicate port, localhost and 127.0.0.1", two_hosts,
     _steps(_set("cluster.hosts[1].address", "127.0.0.1"), _set("cluster.hosts[0].tasks[0].port", 5000),
            _set("cluster.hosts[1].tasks[0].port", 5000)),
     "cluster.hosts[1].tasks[0].port", ("port 5000 on 127.0.0.1 is already used by worker:0",)),
    ("ssh port zero", base_dict, _set("cluster.hosts[0].ssh_port", 0),
     "cluster.hosts[0].ssh_port", ("expected an integer >= 1, got 0",)),
    ("gpus not split evenly", base_dict, _set("cluster.hosts[0].gpus", 3),
     "cluster.hosts[0].gpus", ("3 GPUs cannot be split evenly over the 2 chief/worker tasks", "multiple of 2")),
    ("two chiefs", base_dict, _tasks({"role": "chief", "index": 0}, {"role": "chief", "index": 1}),
     "cluster", ("expected at most one chief task, got 2",)),
    ("negative batch", base_dict, _set("training.global_batch_size", -4),
     "training.global_batch_size", ("expected an integer >= 1, got -4",)),
    ("zero batch", base_dict, _set("training.global_batch_size", 0),
     "training.global_batch_size", ("expected an integer >= 1, got 0",)),
    ("batch not divisible by replicas", base_dict, _set("training.global_batch_size", 127),
     "training.global_batch_size", ("127 is not divisible by the 2 replicas; expected a multiple of 2",)),
    ("batch not divisible by emulated gpus", base_dict,
     _steps(_set("cluster.hosts[0].gpus", 4), _set("training.global_batch_size", 130)),
     "training.global_batch_size", ("130 is not divisible by the 4 replicas",)),
    ("both steps and epochs", base_dict, _set("training.epochs", 2),
     "training", ("expected either steps or epochs, got both (steps=200, epochs=2)",)),
    ("zero steps", base_dict, _set("training.steps", 0),
     "training.steps", ("expected an integer >= 1, got 0",)),
    ("zero epochs", base_dict, _steps(_del("training.steps"), _set("training.epochs", 0)),
     "training.epochs", ("expected an integer >= 1, got 0",)),
    ("zero learning rate", base_dict, _set("training.learning_rate", 0),
     "training.learning_rate", ("expected a number > 0, got 0",)),
    ("nan learning rate", base_dict, _set("training.learning_rate", float("nan")),
     "training.learning_rate", ("expected a number > 0, got nan",)),
    ("text learning rate", base_dict, _set("training.learning_rate", "0.1"),
     "training.learning_rate", ("expected a number > 0, got '0.1'",)),
    ("huge integer learning rate", base_dict, _set("training.learning_rate", 10**400),
     "training.learning_rate", ("expected a number > 0",)),
    ("integer too long to print", base_dict, _set("cluster.hosts[0].gpus", 10**5000),
     "cluster.hosts[0].gpus", ("expected an integer <= 64, got <an integer of about 5000 digits>",)),
    ("zero metrics rate", base_dict, _set("training.metrics_hz", 0),
     "training.metrics_hz", ("expected a number > 0, got 0",)),
    ("negative collective timeout", base_dict, _set("parallelism.collective_timeout_s", -1),
     "parallelism.collective_timeout_s", ("expected a number >= 0, got -1",)),
    ("zero steps per execution", async_dict, _set("training.steps_per_execution", 0),
     "training.steps_per_execution", ("expected an integer >= 1, got 0",)),
    ("steps per execution past the cap", async_dict, _set("training.steps_per_execution", 1001),
     "training.steps_per_execution", ("expected an integer <= 1000, got 1001",)),
    ("steps per execution in model mode", base_dict, _steps(_set("training.steps_per_execution", 8),
                                                            _set("parallelism.mode", "model")),
     "training.steps_per_execution", ("applies to parallelism 'data' and 'async' only",
                                      "expected 1 for mode 'model', got 8")),
    ("too many restarts", base_dict, _set("training.restarts", 101),
     "training.restarts", ("expected an integer <= 100, got 101",)),
    ("data mode with ps tasks", base_dict, _tasks({"role": "worker", "index": 0}, {"role": "ps", "index": 0}),
     "cluster", ("parallelism 'data' does not use ps tasks (found 1)",)),
    ("data mode without trainers", base_dict, _tasks({"role": "evaluator", "index": 0}),
     "cluster", ("parallelism 'data' needs at least one worker (or chief) task",)),
    ("async without ps", base_dict,
     _steps(_set("parallelism.mode", "async"),
            _tasks({"role": "chief", "index": 0}, {"role": "worker", "index": 0}, {"role": "worker", "index": 1})),
     "cluster", ("parallelism 'async' needs at least one ps task",)),
    ("async without chief", async_dict, _set("cluster.hosts[0].tasks[0].role", "evaluator"),
     "cluster", ("parallelism 'async' needs exactly one chief task (the coordinator), got 0",)),
    ("async without worker", base_dict,
     _steps(_set("parallelism.mode", "async"), _tasks({"role": "chief", "index": 0}, {"role": "ps", "index": 0})),
     "cluster", ("parallelism 'async' needs at least one worker task",)),
    ("async too many shards", async_dict, _set("parallelism.partitioner.shards", 129),
     "parallelism.partitioner.shards", ("expected at most 128 shards, got 129",)),
    ("unknown partitioner", async_dict, _set("parallelism.partitioner.kind", "axis"),
     "parallelism.partitioner.kind", ("got 'axis'",)),
    ("model mesh not matching devices", model_dict, _set("parallelism.mesh.batch", 2),
     "parallelism.mesh", ("2 x 2 = 4", "the 2 devices")),
    ("model mesh not matching gpus", model_dict,
     _steps(_set("cluster.hosts[0].gpus", 6), _set("parallelism.mesh.model", 4)),
     "parallelism.mesh", ("1 x 4 = 4", "the 6 devices")),
    ("hidden not divisible by mesh model axis", model_dict, _set("model.hidden", [256, 255]),
     "model.hidden[1]", ("255 is not divisible by the mesh 'model' axis size 2",)),
    ("model mode with ps", model_dict, _set("cluster.hosts[0].tasks[1]", {"role": "ps", "index": 0}),
     "cluster", ("parallelism 'model' does not use ps tasks (found 1)",)),
    ("zero mesh axis", model_dict, _set("parallelism.mesh.model", 0),
     "parallelism.mesh.model", ("expected an integer >= 1, got 0",)),
    ("schema version mismatch", base_dict, _set("schema", 2),
     "schema", ("expected 1", "got 2")),
    ("schema as bool", base_dict, _set("schema", True),
     "schema", ("expected 1", "got True")),
    ("shape with zero", base_dict, _set("data.shape", [784, 0]),
     "data.shape", ("expected a list of integers from 1 to 1000000, got [784, 0]",)),
    ("one class", base_dict, _set("data.classes", 1),
     "data.classes", ("expected an integer >= 2, got 1",)),
    ("data smaller than a batch", base_dict, _set("data.size", 64),
     "data.size", ("64 examples are fewer than one global batch (128)",)),
    ("unknown data source", base_dict, _set("data.source", "imagenet"),
     "data.source", ("expected one of 'synthetic', 'digits'", "got 'imagenet'")),
    ("hidden as text", base_dict, _set("model.hidden", "wide"),
     "model.hidden", ("expected a list of integers from 1 to 1000000, got 'wide'",)),
    ("empty run name", base_dict, _set("name", ""),
     "name", ("expected a non-empty string, got ''",)),
    ("over-long run name", base_dict, _set("name", "x" * 5000),
     "name", ("expected at most 4096 characters, got 5000",)),
]


@pytest.mark.parametrize(("base", "mutate", "field", "parts"), [case[1:] for case in INVALID_DICTS],
                         ids=[case[0] for case in INVALID_DICTS])
def test_invalid_config_names_field_and_value(base: Callable[[], dict[str, Any]],
                                              mutate: Callable[[dict[str, Any]], None],
                                              field: str, parts: tuple[str, ...]) -> None:
    d = copy.deepcopy(base())
    from_dict(copy.deepcopy(d))  # the base itself is valid: the mutation alone is at fault
    mutate(d)
    with pytest.raises(ConfigError) as exc:
        from_dict(d)
    assert_problem(exc.value, field, *parts)
    for p in exc.value.problems:
        assert p.message.strip()


def test_message_form_is_field_colon_expectation() -> None:
    d = two_hosts()
    d["cluster"]["hosts"][1]["gpus"] = -2
    with pytest.raises(ConfigError) as exc:
        from_dict(d)
    assert [str(p) for p in exc.value.problems] == ["cluster.hosts[1].gpus: expected an integer >= 0, got -2"]
    assert str(exc.value) == "cluster.hosts[1].gpus: expected an integer >= 0, got -2"


def test_every_problem_is_listed_once_with_its_source() -> None:
    d = base_dict()
    d["training"]["steps"] = -1
    d["data"]["classes"] = "ten"
    d["colour"] = "blue"
    with pytest.raises(ConfigError) as exc:
        from_dict(d, source="my.yaml")
    fields = [p.field for p in exc.value.problems]
    assert sorted(fields) == ["colour", "data.classes", "training.steps"]
    text = str(exc.value)
    assert text.startswith("my.yaml: 3 problems in the config:\n")
    assert "  - training.steps: expected an integer >= 1, got -1" in text.splitlines()


def test_mesh_message_names_both_numbers() -> None:
    d = model_dict()
    d["parallelism"]["mesh"] = {"batch": 3, "model": 2}
    with pytest.raises(ConfigError) as exc:
        from_dict(d)
    p = assert_problem(exc.value, "parallelism.mesh")
    assert "6" in p.message and "2 devices" in p.message


def test_validate_checks_configs_built_in_code() -> None:
    bad = RunConfig(
        name=" ",
        cluster=Cluster(hosts=(Host(name="h", gpus=-1, tasks=(Task("boss", -3, 99999),)),)),
        parallelism=Parallelism(mode="tensor"),
        data=Data(source="x", shape=(), classes=0),
        model=Model(name="vgg", hidden=(0,)),
        training=Training(global_batch_size=0, steps=None, epochs=None, optimizer="x", learning_rate=-1.0,
                          checkpoint_every=-1, restarts=-1),
    )
    fields = {p.field for p in validate(bad)}
    assert fields >= {
        "name", "cluster.hosts[0].gpus", "cluster.hosts[0].tasks[0].role", "cluster.hosts[0].tasks[0].index",
        "cluster.hosts[0].tasks[0].port", "parallelism.mode", "data.source", "data.shape", "data.classes",
        "model.name", "model.hidden", "training.global_batch_size", "training.steps", "training.optimizer",
        "training.learning_rate", "training.checkpoint_every", "training.restarts",
    }
    assert all(p.message for p in validate(bad))


# --------------------------------------------------------------------------- invalid text and files


INVALID_TEXT: list[tuple[str, str, tuple[str, ...]]] = [
    ("malformed YAML", "name: run\ncluster: [unclosed\n", ("not valid YAML at line 3, column 1",)),
    ("bad indentation", "name: run\n  cluster: x\n", ("not valid YAML at line 2, column 10",)),
    ("tab indentation", "name: run\ntraining:\n\tsteps: 3\n", ("not valid YAML at line 3",)),
    ("empty file", "", ("the file is empty",)),
    ("comments only", "# nothing here\n", ("the file is empty",)),
    ("top-level list", "- name: run\n- x\n", ("expected a mapping of config sections at the top, got [",)),
    ("top-level scalar", "42\n", ("expected a mapping of config sections at the top, got 42",)),
    ("impossible date", "name: 2001-02-30\n", ("not valid YAML", "day is out of range")),
    ("bad explicit int", "name: !!int abc\n", ("not valid YAML",)),
    ("unsafe tag", "name: !!python/object:os.system x\n", ("not valid YAML",)),
    ("integer too long", "training:\n  steps: " + "9" * 5000 + "\n", ("not valid YAML",)),
    ("nested too deeply", "name: " + "[" * 5000 + "]" * 5000 + "\n", ("not valid YAML",)),
]


@pytest.mark.parametrize(("text", "parts"), [c[1:] for c in INVALID_TEXT], ids=[c[0] for c in INVALID_TEXT])
def test_invalid_text_is_a_config_error(text: str, parts: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as exc:
        loads(text, source="t.yaml")
    assert_problem(exc.value, "", *parts)
    assert str(exc.value).startswith("t.yaml: ")


def test_yaml_aliases_do_not_blow_up_messages() -> None:
    layers = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        layers.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    text = "\n".join(layers) + "\nname: *a9\n"
    with pytest.raises(ConfigError) as exc:
        loads(text)
    # refused before anything is built: the alias bomb would expand to billions of values
    p = assert_problem(exc.value, "a4", "holds more than 20,000 values once its aliases (*name) are expanded")
    assert len(p.message) < 120
    small = "a0: &a0 [x, x]\nname: *a0\n"  # a harmless alias still reads, and the field is still named
    with pytest.raises(ConfigError) as exc:
        loads(small)
    assert_problem(exc.value, "name", "expected a string, got [")


def test_self_referencing_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as exc:
        loads("name: &a [1, *a]\n")
    assert_problem(exc.value, "name[1]", "refers to a value that contains it")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert exc.value.source == str(path)
    assert_problem(exc.value, "", "no such file")
    assert str(exc.value) == f"{path}: no such file"


def test_folder_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path)
    assert_problem(exc.value, "", "is a folder; expected a YAML file")


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert_problem(exc.value, "", "not UTF-8 text")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_bytes(b"")
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert_problem(exc.value, "", "the file is empty")


def test_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * (config_mod.MAX_CONFIG_BYTES + 10) + b"\n")
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert_problem(exc.value, "", "larger than 4 MiB")


def test_invalid_field_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(dumps(default_config()).replace("gpus: 0", "gpus: -2"), encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert str(exc.value) == f"{path}: cluster.hosts[0].gpus: expected an integer >= 0, got -2"


def test_check_false_skips_whole_config_rules() -> None:
    d = base_dict()
    d["training"]["global_batch_size"] = 127
    config = from_dict(d, check=False)
    assert config.training.global_batch_size == 127
    assert [p.field for p in validate(config)] == ["training.global_batch_size"]


def test_counts_of_invalid_cases() -> None:
    # the issue asks for at least 20 distinct invalid configs; keep the table growing, never shrinking
    assert len(INVALID_DICTS) + len(INVALID_TEXT) >= 30


# --------------------------------------------------------------------------- any input: a config or a ConfigError


FIELD_NAMES = ["schema", "name", "cluster", "hosts", "tasks", "role", "index", "port", "gpus", "address",
               "parallelism", "mode", "mesh", "batch", "model", "partitioner", "kind", "shards", "data", "shape",
               "classes", "size", "hidden", "training", "steps", "epochs", "global_batch_size", "learning_rate",
               "metrics_hz", "optimizer", "steps_per_execution"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1, 2, 65535, 65536, 2**31])
    # integers past float range and past what Python prints (built lazily: hypothesis reprs its strategies)
    | st.sampled_from([400, -400, 5000, -5000]).map(lambda e: (1 if e > 0 else -1) * 10 ** abs(e))
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["auto", "worker", "ps", "chief", "evaluator", "data", "model", "async", "sgd", "mlp",
                       "synthetic", "fixed", "", " "])
)
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=8) | st.integers(-3, 3) | st.booleans() | st.none()
yamlish = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
                       max_leaves=20)


def _accepts_or_config_error(call: Callable[[], RunConfig]) -> None:
    try:
        config = call()
    except ConfigError as exc:
        assert exc.problems, "a ConfigError lists at least one problem"
        for p in exc.problems:
            assert isinstance(p.field, str)
            assert isinstance(p.message, str) and p.message.strip(), p
        assert str(exc)
    else:
        assert isinstance(config, RunConfig)
        assert validate(config) == []
        assert loads(dumps(config)) == config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=yamlish)
def test_any_data_gives_a_config_or_a_config_error(raw: Any) -> None:
    _accepts_or_config_error(lambda: from_dict(raw))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _mutated(d: dict[str, Any], path: tuple[Any, ...], action: str, value: Any, key: Any) -> Any:
    if not path:
        return value if action == "replace" else d
    parent: Any = d
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent[last], dict):
        parent[last][key] = value
    elif action == "add" and isinstance(parent[last], list):
        parent[last].append(value)
    return d


PRESET_DICTS = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in PRESET_FILES] + [
    to_dict(c) for c in VARIED.values()
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_presets_give_a_config_or_a_config_error(data: st.DataObject) -> None:
    d = copy.deepcopy(data.draw(st.sampled_from(PRESET_DICTS)))
    for _ in range(data.draw(st.integers(1, 3))):
        if not isinstance(d, dict):
            break
        path = data.draw(st.sampled_from(_paths(d)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        d = _mutated(d, path, action, data.draw(yamlish), data.draw(keys))
    _accepts_or_config_error(lambda: from_dict(d))
    try:
        text = yaml.safe_dump(d)
    except (yaml.YAMLError, ValueError):
        return  # e.g. an int too long to write: not a config file anyone can have
    _accepts_or_config_error(lambda: loads(text))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200) | st.builds(lambda a, b: a + b, st.sampled_from(
    [dumps(default_config()), "name: run\n", "cluster:\n  hosts:\n  - ", "training: {steps: "]), st.text(max_size=40)))
def test_any_text_gives_a_config_or_a_config_error(text: str) -> None:
    _accepts_or_config_error(lambda: loads(text))


# --------------------------------------------------------------------------- hostile presets (issue 17)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("ssh_host", "-oProxyCommand=touch${IFS}/tmp/x",
     "cluster.hosts[0].ssh_host: expected a host name (letters, digits, '.', '-', '_', not starting with '-'; "
     "optionally user@ before it), got '-oProxyCommand=touch${IFS}/tmp/x'"),
    ("address", "-oProxyCommand=x",
     "cluster.hosts[0].address: expected a host name or IP address, got '-oProxyCommand=x'; a host name holds "
     "letters, digits, '.', '-', '_', not starting with '-'"),
    ("ssh_user", "-oProxyCommand=x",
     "cluster.hosts[0].ssh_user: expected a user name (letters, digits, '.', '_', '-', '@', not starting with '-'), "
     "got '-oProxyCommand=x'"),
    ("python", "python3\nid", "cluster.hosts[0].python: expected a Python command without control characters, "
                              "got 'python3\\nid'"),
])
def test_host_fields_that_reach_ssh_are_host_names(key: str, value: str, expected: str) -> None:
    host = {"name": "box", "address": "10.0.0.2", "tasks": [{"role": "worker"}], key: value}
    with pytest.raises(ConfigError) as exc:
        from_dict({"cluster": {"hosts": [host]}})
    assert [str(p) for p in exc.value.problems] == [expected]


@pytest.mark.parametrize("good", ["gpu-box.lan", "node_7", "10.0.0.2", "::1", "fe80::1%eth0", "ana@gpubox"])
def test_real_host_names_stay_valid(good: str) -> None:
    host = Host(name="b", address=good.split("@")[-1], ssh_host=good, ssh_user="ana.b", tasks=workers(1))
    assert [p for p in validate(RunConfig(cluster=Cluster(hosts=(host,)))) if "hosts[0]" in p.field] == []


def test_duplicate_keys_are_refused_naming_key_and_lines() -> None:
    with pytest.raises(ConfigError) as exc:
        loads("name: a\ntraining:\n  steps: 10\n  steps: 1000000\n", source="p.yaml")
    assert str(exc.value) == ("p.yaml: training.steps: duplicate key 'steps' at line 4 (first at line 3); "
                              "expected each key once")
    # a key merged in (<<) and then set again is YAML's override, not a duplicate; a small alias still reads
    config = loads("name: a\ncluster:\n  hosts:\n  - &h {name: a, tasks: [{role: worker}]}\n  - {<<: *h, name: b}\n")
    assert [h.name for h in config.cluster.hosts] == ["a", "b"] and len(config.cluster.tasks()) == 2


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
def test_a_fifo_and_a_device_are_not_read(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as exc:
        load(fifo)  # would block forever on open() or read() without the type check
    assert str(exc.value) == f"{fifo}: not a regular file (a FIFO); expected a YAML file"
    with pytest.raises(ConfigError) as exc:
        load("/dev/zero")  # would grow without end
    assert str(exc.value) == "/dev/zero: not a regular file (a character device); expected a YAML file"


def test_the_byte_cap_holds_while_reading(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"name: a\n" + b"#" * 100 + b"\n")
    assert config_mod.read_capped(path, limit=200) == path.read_bytes()
    with pytest.raises(ConfigError, match="larger than"):
        config_mod.read_capped(path, limit=50)


def test_allow_oversubscribe_reads_and_round_trips() -> None:
    d = base_dict()
    d["training"]["allow_oversubscribe"] = True
    config = from_dict(d)
    assert config.training.allow_oversubscribe is True
    assert loads(dumps(config)) == config
    assert "allow_oversubscribe" not in dumps(default_config())  # written only when set
    d["training"]["allow_oversubscribe"] = "yes"
    with pytest.raises(ConfigError) as exc:
        from_dict(d)
    assert_problem(exc.value, "training.allow_oversubscribe", "expected true or false, got 'yes'")


def test_steps_per_execution_reads_and_round_trips() -> None:
    d = async_dict()
    d["training"]["steps_per_execution"] = 16
    config = from_dict(d)
    assert config.training.steps_per_execution == 16
    assert yaml.safe_load(dumps(config))["training"]["steps_per_execution"] == 16
    assert loads(dumps(config)) == config
    assert "steps_per_execution" not in dumps(default_config())  # written only when set
    d["training"]["steps_per_execution"] = "16"
    with pytest.raises(ConfigError) as exc:
        from_dict(d)
    assert_problem(exc.value, "training.steps_per_execution", "expected an integer", "got '16'")


@pytest.mark.parametrize("mode", ["data", "model", "async"])
def test_training_for_mode_keeps_only_what_the_mode_takes(mode: str) -> None:
    grouped = Training(steps_per_execution=8)
    taken = grouped.for_mode(mode)
    grouping = mode in ("data", "async")
    assert taken.steps_per_execution == (8 if grouping else 1)
    assert taken is grouped if grouping else taken == config_mod.replace(grouped, steps_per_execution=1)
    plain = Training()
    assert plain.for_mode(mode) is plain  # nothing to change: the same object (callers test identity)
    d = async_dict()
    d["training"]["steps_per_execution"] = 8
    d["parallelism"]["mode"] = mode
    if mode == "async":
        from_dict(d)
    elif mode == "data":  # refused for its ps and chief tasks, not for the groups
        assert not [p for p in validate(from_dict(d, check=False)) if p.field == "training.steps_per_execution"]
    else:
        with pytest.raises(ConfigError) as exc:
            from_dict(d)
        assert_problem(exc.value, "training.steps_per_execution", f"expected 1 for mode {mode!r}, got 8")


# --------------------------------------------------------------------------- fields declared once


def test_the_yaml_keeps_its_shape_fields_at_their_default_are_left_out_where_they_were() -> None:
    written = to_dict(default_config())
    assert list(written) == ["schema", "name", "cluster", "parallelism", "data", "model", "training"]
    assert list(written["cluster"]["hosts"][0]) == ["name", "address", "gpus", "tasks"]
    assert written["cluster"]["hosts"][0]["tasks"][0] == {"role": "worker", "index": 0, "port": "auto"}
    assert written["parallelism"] == {"mode": "data", "mesh": {"batch": 1, "model": 2},
                                      "partitioner": {"kind": "none", "shards": 2, "min_shard_bytes": 262144},
                                      "collective_timeout_s": 0.0}
    assert list(written["data"]) == ["source", "shape", "classes", "size", "path"]
    assert list(written["model"]) == ["name", "hidden", "vocab_size", "embed_dim", "heads"]
    assert list(written["training"]) == ["global_batch_size", "optimizer", "learning_rate", "seed",
                                         "checkpoint_every", "restarts", "metrics_hz", "steps"]
    axes = config_mod.replace(default_config().parallelism, mesh_axes=(("feature", 2),))
    assert list(to_dict(config_mod.replace(default_config(), parallelism=axes))["parallelism"]["mesh"]) == [
        "batch", "feature", "model"]


def test_validate_applies_the_declared_bounds_the_loader_reads_with() -> None:
    cfg = default_config()
    big = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=config_mod.MAX_STEPS + 1))
    assert [str(p) for p in validate(big)] == ["training.steps: expected an integer <= 1000000000, got 1000000001"]
    part = config_mod.replace(cfg.parallelism, min_shard_bytes=config_mod.MAX_SHARD_BYTES + 1)
    assert [p.field for p in validate(config_mod.replace(cfg, parallelism=part))] == [
        "parallelism.partitioner.min_shard_bytes"]
    assert config_mod.field_problems(cfg) == []


def test_field_spec_maps_yaml_paths_and_attributes() -> None:
    spec = config_mod.field_spec("parallelism.mesh.batch")
    assert spec.attr == "parallelism.mesh_batch" and (spec.minimum, spec.maximum) == (1, 4096)
    assert config_mod.field_spec("parallelism.mesh_batch") is spec
    assert spec.applies_to(config_mod.replace(default_config(), parallelism=Parallelism(mode="model")))
    assert not spec.applies_to(default_config())
    host = config_mod.field_spec("cluster.hosts[].slurm.nodes")
    assert host.applies_to(Host(kind="slurm")) and not host.applies_to(Host())
    assert config_mod.attribute_path("parallelism.partitioner.kind") == "parallelism.partitioner"
