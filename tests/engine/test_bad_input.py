"""Bad input, generated: at least 1,000 malformed configs and YAML files, garbage event streams.

Every malformed config must be rejected with a ConfigError whose problem names the
field that was broken; nothing may raise anything else, hang or crash a reader.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import ConfigError
from engine.control.launcher import Run
from tests.conftest import PRESETS

# every field spelled out, so each can be broken
VALID = config_mod.to_dict(config_mod.load(PRESETS / "data-2workers.yaml"))

# (path in the YAML mapping, field path the message must name, values that are wrong there)

FIELDS: list[tuple[tuple[Any, ...], str, list[Any]]] = [
    (("cluster", "hosts", 0, "gpus"), "cluster.hosts[0].gpus", [-1, -2, 65, "two", 1.5, True, [2]]),
    (("cluster", "hosts", 0, "name"), "cluster.hosts[0].name", ["", "   ", 5, [], {"x": 1}]),
    (("cluster", "hosts", 0, "address"), "cluster.hosts[0].address", ["", 7, ["a"], "has space"]),
    (("cluster", "hosts", 0, "ssh_port"), "cluster.hosts[0].ssh_port", [0, 70000, "22", False]),
    (("cluster", "hosts", 0, "tasks", 0, "role"), "cluster.hosts[0].tasks[0].role", ["boss", "", 3, ["worker"]]),
    (("cluster", "hosts", 0, "tasks", 0, "port"), "cluster.hosts[0].tasks[0].port", [0, -5, 70000, "any", 1.5, True]),
    (("cluster", "hosts", 0, "tasks", 1, "index"), "cluster.hosts[0].tasks[1].index", [-1, "one", 2.5, 7]),
    (("cluster", "hosts"), "cluster.hosts", ["local", 3, {"name": "x"}, []]),
    (("parallelism", "mode"), "parallelism.mode", ["sync", "", 1, ["data"]]),
    (("parallelism", "mesh", "batch"), "parallelism.mesh.batch", [0, -1, "2", 1.5]),
    (("parallelism", "partitioner", "kind"), "parallelism.partitioner.kind", ["even", 2, True]),
    (("parallelism", "collective_timeout_s"), "parallelism.collective_timeout_s", [-1, "soon", float("nan")]),
    (("data", "source"), "data.source", ["imagenet-download", 4, ""]),
    (("data", "shape"), "data.shape", [[0], [-3], "784", [1.5], [True]]),
    (("data", "classes"), "data.classes", [1, 0, -4, "ten"]),
    (("data", "size"), "data.size", [0, -1, "big", 3]),
    (("model", "name"), "model.name", ["gpt", 1, ""]),
    (("model", "hidden"), "model.hidden", [[0], [-1], "256", [256.5]]),
    (("training", "global_batch_size"), "training.global_batch_size", [0, -128, "128", 127, 1.0, True]),
    (("training", "steps"), "training.steps", [0, -1, "many", 2.5]),
    (("training", "optimizer"), "training.optimizer", ["lamb", 3, ""]),
    (("training", "learning_rate"), "training.learning_rate", [0, -0.1, "fast", float("inf"), True]),
    (("training", "seed"), "training.seed", [-1, "x", 2**40]),
    (("training", "checkpoint_every"), "training.checkpoint_every", [-1, "often"]),
    (("training", "restarts"), "training.restarts", [-1, 1000, "twice"]),
    (("training", "metrics_hz"), "training.metrics_hz", [0, -5, "max"]),
    (("schema",), "schema", [2, 0, "1", True]),
]


def put(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS).flatmap(lambda f: st.tuples(st.just(f), st.sampled_from(f[2]))),
       st.sampled_from(["dict", "yaml"]))
def test_a_broken_field_is_rejected_naming_that_field(case: Any, via: str) -> None:
    (path, field, _), value = case
    data = copy.deepcopy(VALID)
    put(data, path, value)
    try:
        if via == "dict":
            config_mod.from_dict(data)
        else:
            config_mod.loads(yaml.safe_dump(data, allow_unicode=True))
    except ConfigError as exc:
        named = [p.field for p in exc.problems]
        assert any(f == field or f.startswith(field + ".") or f.startswith(field + "[") for f in named) or (
            field.endswith(("tasks[1].index", "tasks[0].port")) and any(f.startswith("cluster") for f in named)
        ), f"{field}={value!r}: problems name {named}: {exc}"
        assert all(p.message for p in exc.problems)
        return
    raise AssertionError(f"{field}={value!r} was accepted")


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                         st.text(max_size=20))
yaml_values = st.recursive(yaml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["cluster", "parallelism", "data", "model", "training", "name", "extra"]), yaml_values)
def test_any_section_replaced_by_junk_gives_a_config_error_or_a_config(section: str, junk: Any) -> None:
    data = copy.deepcopy(VALID)
    data[section] = junk
    try:
        text = yaml.safe_dump(data)
    except yaml.YAMLError:
        return
    try:
        config_mod.loads(text)
    except ConfigError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(yaml.safe_dump(VALID))), st.text(max_size=30), st.booleans())
def test_truncated_or_spliced_yaml_files_never_raise_anything_else(tmp_path_factory: Any, cut: int, splice: str,
                                                                   write_file: bool) -> None:
    text = yaml.safe_dump(VALID)
    broken = text[:cut] + splice + text[cut:cut + 40]
    try:
        if write_file:
            path = Path(tmp_path_factory.mktemp("yaml")) / "preset.yaml"
            path.write_text(broken, encoding="utf-8")
            config_mod.load(path)
        else:
            config_mod.loads(broken)
    except ConfigError as exc:
        assert str(exc)


# ---------------------------------------------------------------- event streams


class _FakeProc:
    def wait(self, timeout: float | None = None) -> int:
        return 0


class _FakeSupervisor:
    proc = _FakeProc()
    generation = 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.just(b'{"v":1,"kind":"step","task":"worker:0","t":1.0,"replica":0,"step":1,"loss":0.5'),  # truncated
    st.just(b"x" * (events.MAX_LINE_BYTES + 10)),  # very long
    st.just(events.encode(events.make("step", "worker:0", replica=0, step=3, loss=0.1)).encode()),
), max_size=30))
def test_launcher_reader_counts_and_skips_garbage(chunks: list[bytes]) -> None:
    good = sum(1 for c in chunks if c.startswith(b'{"v":1,"kind":"step"') and c.endswith(b"\n"))
    stream = io.BytesIO(b"".join(c if c.endswith(b"\n") else c + b"\n" for c in chunks))
    run = Run(config_mod.default_config())
    run._read(_FakeSupervisor(), stream)  # type: ignore[arg-type]
    got = []
    while not run.core.queue.empty():
        item = run.core.queue.get()
        if isinstance(item, list):  # one list of (event, line) per read of the pipe
            got += [e for e, _ in item]
        elif isinstance(item, dict):
            got.append(item)
    assert all(events.decode(events.encode(e)) is not None for e in got)  # only events the decoder accepts
    assert len([e for e in got if e["kind"] == "step"]) >= good


def test_supervisor_relays_good_lines_and_counts_bad_ones() -> None:
    from engine.contract.task_plan import TaskPlan
    from engine.control.supervisor import Supervisor, TaskProcess

    out = io.BytesIO()
    plan = TaskPlan(name="worker:0", role="worker", index=0, host="local", port=1, gpu_ids=(), devices=1, env={})
    sup = Supervisor({"run_dir": str(Path("/tmp") / "cd-bad-input"), "tasks": [plan.to_dict()]}, out=out)
    tp = TaskProcess(plan)
    good = events.encode(events.make("step", "worker:9", replica=0, step=1, loss=1.0)).encode()
    for line in tp.lines.feed(b"garbage\n" + good + b"\xff\xfe\n" + b'{"v":1,"kind":"nope"}\n' + good[:20]):
        sup.relay(tp, line)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert len(lines) == 1 and lines[0]["task"] == "worker:0"  # re-labelled: a task speaks for itself only
    assert sup.stats.bad == 3
    rest = tp.lines.feed(good[20:])  # a half line waits for the rest
    assert rest == [good]


def test_yaml_is_only_ever_read_with_safe_load() -> None:
    out = subprocess.run(["grep", "-rnE", r"yaml\.(load|unsafe_load|full_load)\(", "engine", "gui"],
                         capture_output=True, text=True, cwd=PRESETS.parent)
    assert out.stdout == "", out.stdout


def test_no_shell_true_anywhere() -> None:
    out = subprocess.run(["grep", "-rn", "shell=True", "engine", "gui", "bench", "scripts"],
                         capture_output=True, text=True, cwd=PRESETS.parent)
    assert out.stdout == "", out.stdout


# ---------------------------------------------------------------- host names that reach ssh (issue 17)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["address", "ssh_host", "ssh_user"]),
       st.text(min_size=1, max_size=30).filter(lambda s: s.strip() != "" and (s.strip()[0] == "-" or any(
           c.isspace() or ord(c) < 32 or c in ";|&$`'\"()<>*?!{}[]\\/," for c in s.strip()))))
def test_a_host_field_with_an_option_or_shell_text_is_refused(key: str, value: str) -> None:
    data = copy.deepcopy(VALID)
    data["cluster"]["hosts"][0][key] = value
    try:
        config_mod.from_dict(data)
    except ConfigError as exc:
        assert any(p.field == f"cluster.hosts[0].{key}" for p in exc.problems), str(exc)
        return
    raise AssertionError(f"{key}={value!r} was accepted")
