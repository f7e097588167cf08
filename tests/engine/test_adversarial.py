"""The adversarial corpus: bad presets that must each be refused, naming the field, within seconds.

Three sources, counted in SECURITY.md:

- ``tests/engine/corpus/presets/*.yaml``: hand-written presets, one defect each, by family
  (injected host names, duplicate keys, recursive aliases, unknown keys, missing files, bad data
  files, impossible meshes, configs that do not fit this machine, absurd counts, malformed YAML).
  Each file says in its first lines which field the refusal must name (``# expect:``) and what
  the message must say (``# says:``). Data files they read are written by :func:`corpus_dir`.
- :data:`GENERATED`: every field of a preset given wrong types and out-of-range values.
- :data:`SPECIAL`: presets that can only be made at test time: a FIFO, ``/dev/zero``, a folder,
  a socket, a file over 4 MiB, an alias bomb that would build a million tasks, a fixed port held
  by another program.

Each case goes through what ``clusterdeck run`` does before it starts a process
(:func:`engine.contract.config.load`, then :func:`engine.control.preflight.preflight`) under a
per-case timeout, and must end in problems, never a traceback or a hang. A few cases are also run
as the user runs them: the ``clusterdeck`` command in a subprocess, with a fake ``ssh`` on ``PATH``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import ConfigError, Problem
from engine.control import machine_fit, preflight

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus" / "presets"
CORPUS_FILES = sorted(CORPUS.glob("*.yaml"))
CASE_TIMEOUT = 20  # seconds; a hang fails its case instead of the suite


# --------------------------------------------------------------------------- the pipeline under test


def refusals(path: Path) -> list[Problem]:
    """What stands between ``path`` and a launch, as ``clusterdeck run`` checks it (no task is started)."""
    try:
        config = config_mod.load(path)
    except ConfigError as exc:
        return exc.problems
    problems = config_mod.validate(config)
    if problems:
        return problems
    return preflight.preflight(datasets.absolute_paths(config, path.parent), scripts=True, timeout=CASE_TIMEOUT)


def header(path: Path) -> tuple[str, str]:
    """(``# expect:`` field, ``# says:`` text) of a corpus file."""
    text = path.read_text(encoding="utf-8", errors="replace")
    field = re.search(r"^# expect: ?(.*)$", text, re.M)
    says = re.search(r"^# says: ?(.*)$", text, re.M)
    assert field is not None and says is not None, f"{path.name}: no '# expect:' / '# says:' header"
    return field.group(1).strip(), says.group(1).strip()


def names(problem: Problem, field: str) -> bool:
    return problem.field == field or problem.field.startswith((field + ".", field + "["))


def assert_refused(problems: list[Problem], field: str, says: str, what: str) -> None:
    assert problems, f"{what} was accepted"
    shown = "\n".join(str(p) for p in problems)
    for p in problems:
        assert isinstance(p.field, str) and p.message.strip(), f"{what}: an empty problem: {p!r}"
        assert "Traceback" not in p.message and len(str(p)) < 1500, f"{what}: {str(p)[:300]}"
    matching = [p for p in problems if names(p, field)] if field else problems
    assert matching, f"{what}: no problem names {field!r}:\n{shown}"
    if says:
        assert any(says in str(p) for p in matching), f"{what}: no problem at {field!r} says {says!r}:\n{shown}"


# --------------------------------------------------------------------------- data files of the corpus


def _write_data_files(folder: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((64, 4), dtype=np.float32)
    y = rng.integers(0, 3, 64)

    def npz(name: str, **arrays: Any) -> None:
        np.savez(folder / name, **arrays)

    for name, value, row in (("nan.npz", np.nan, 5), ("inf.npz", np.inf, 7), ("neginf.npz", -np.inf, 63)):
        bad = x.copy()
        bad[row, 2] = value
        npz(name, x=bad, y=y)
    npz("text.npz", x=np.array([["a", "b", "c", "d"]] * 64), y=y)
    npz("object.npz", x=np.array([[1, None, 3, 4]] * 64, dtype=object), y=y)
    npz("complex.npz", x=x.astype(np.complex64), y=y)
    npz("nox.npz", a=x, y=y)
    npz("labels99.npz", x=x, y=np.where(np.arange(64) == 9, 99, y))
    npz("labelsfrac.npz", x=x, y=y + 0.5)
    npz("shape5.npz", x=rng.random((64, 5)), y=y)
    npz("lengths.npz", x=x, y=y[:63])
    npz("few.npz", x=x[:4], y=y[:4])
    (folder / "notzip.npz").write_bytes(b"this is not a zip file\n" * 10)
    rows = [",".join(f"{v:.3f}" for v in r) + f",{c}" for r, c in zip(x, y, strict=True)]

    def csv(name: str, body: list[str]) -> None:
        (folder / name).write_text("a,b,c,d,y\n" + "\n".join(body) + "\n", encoding="utf-8")

    csv("nan.csv", rows[:10] + ["0.1,nan,0.3,0.4,1"] + rows[10:])
    csv("inf.csv", rows[:3] + ["0.1,0.2,inf,0.4,1"] + rows[3:])
    csv("text.csv", rows[:20] + ["0.1,0.2,abc,0.4,1"] + rows[20:])
    csv("ragged.csv", rows[:20] + ["0.1,0.2,1"] + rows[20:])
    (folder / "nolabel.csv").write_text("a,b,c,d\n" + "\n".join(r.rsplit(",", 1)[0] for r in rows) + "\n")
    (folder / "empty.csv").write_bytes(b"")
    (folder / "binary.csv").write_bytes(b"a,b,c,d,y\n" + bytes(range(256)) * 4)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus presets copied next to the data files they read."""
    folder = tmp_path_factory.mktemp("corpus")
    for path in CORPUS_FILES:
        shutil.copy(path, folder / path.name)
    _write_data_files(folder)
    return folder


@pytest.fixture(autouse=True)
def _ports_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    # as on a machine without network namespaces: this machine's ports are the run's ports
    monkeypatch.setenv("CLUSTERDECK_NETNS", "0")


# --------------------------------------------------------------------------- hand-written presets


def test_the_corpus_is_large_and_covers_every_family() -> None:
    families = {p.name.split("--")[0] for p in CORPUS_FILES}
    assert families >= {"injected-host", "duplicate-key", "alias", "unknown-key", "missing-file", "bad-data",
                        "impossible-mesh", "machine-fit", "absurd-count", "malformed-yaml"}
    assert len(CORPUS_FILES) + len(GENERATED) + len(SPECIAL) >= 150


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.stem)
def test_a_corpus_preset_is_refused_naming_its_field(path: Path, corpus_dir: Path) -> None:
    field, says = header(path)
    started = time.monotonic()
    problems = refusals(corpus_dir / path.name)
    assert_refused(problems, field, says, path.name)
    assert time.monotonic() - started < 10


# --------------------------------------------------------------------------- generated: wrong types and ranges


BASE: dict[str, Any] = {
    "name": "generated",
    "cluster": {"hosts": [{"name": "local", "address": "localhost", "gpus": 0, "ssh_port": 22,
                           "tasks": [{"role": "worker", "index": 0, "port": "auto"},
                                     {"role": "worker", "index": 1, "port": "auto"}]}]},
    "parallelism": {"mode": "data", "mesh": {"batch": 1, "model": 2},
                    "partitioner": {"kind": "none", "shards": 2, "min_shard_bytes": 1024},
                    "collective_timeout_s": 0},
    "data": {"source": "synthetic", "shape": [784], "classes": 10, "size": 8192},
    "model": {"name": "mlp", "hidden": [256], "vocab_size": 1000, "embed_dim": 64, "heads": 4},
    "training": {"global_batch_size": 128, "steps": 10, "optimizer": "sgd", "learning_rate": 0.05, "seed": 1,
                 "checkpoint_every": 0, "restarts": 0, "metrics_hz": 20, "allow_oversubscribe": False},
}

WRONG: dict[str, list[Any]] = {
    "name": ["", "   ", 7, ["a"], {"a": 1}],
    "cluster.hosts": ["local", 5, {"name": "x"}, []],
    "cluster.hosts.0.name": ["", 3, [1]],
    "cluster.hosts.0.address": ["", "-x", "a b", "a\x00b", 4, ["localhost"], "é.example", "a;b"],
    "cluster.hosts.0.gpus": [-1, 65, "2", 1.5, True],
    "cluster.hosts.0.ssh_port": [0, 65536, "22", -22],
    "cluster.hosts.0.tasks": ["worker", 3, {"role": "worker"}],
    "cluster.hosts.0.tasks.0.role": ["boss", "", 1, "Worker"],
    "cluster.hosts.0.tasks.0.index": [-1, "zero", 1.5, 10000],
    "cluster.hosts.0.tasks.0.port": [0, 65536, -1, "any", 2.5, True],
    "parallelism.mode": ["sync", "", 3, ["data"]],
    "parallelism.mesh": [2, "2x2"],
    "parallelism.partitioner.kind": ["even", 2],
    "parallelism.partitioner.min_shard_bytes": [0, 2**41],
    "parallelism.collective_timeout_s": [-1, "soon", ".inf", ".nan"],
    "data.source": ["imagenet", "", 3],
    "data.shape": [[0], [-1], "784", [1.5], [True], [], [1] * 65],
    "data.classes": [1, 0, "ten", 10**7],
    "data.size": [0, -5, "big", 10**9],
    "data.path": [5, ["a"], "x" * 5000],
    "data.x_key": ["", 3],
    "data.x_dtype": ["float64", 1],
    "model.name": ["gpt", "", 0],
    "model.hidden": [[0], [-3], "256", [2.5], [10**7]],
    "model.vocab_size": [1, 0, 10**8],
    "model.embed_dim": [0, 10**6],
    "model.heads": [0, -1, 2000],
    "training.global_batch_size": [0, -1, "128", 127, 10**7],
    "training.steps": [0, -1, "many", 2.5],
    "training.optimizer": ["lamb", 0],
    "training.learning_rate": [0, -1, ".inf", "fast"],
    "training.seed": [-1, 2**31],
    "training.checkpoint_every": [-1, "often"],
    "training.restarts": [-1, 101],
    "training.metrics_hz": [0, -1, ".nan"],
    "training.allow_oversubscribe": ["yes please", 1, [True]],
    "schema": [0, 2, "1"],
}


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = data
    parts = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def _field_of(dotted: str) -> str:
    out = ""
    for part in dotted.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _yaml_value(value: Any) -> Any:
    return {".inf": float("inf"), ".nan": float("nan")}.get(value, value) if isinstance(value, str) else value


GENERATED: list[tuple[str, str, Any]] = [(_field_of(k), k, v) for k, values in WRONG.items() for v in values]


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize(("field", "dotted", "value"), GENERATED,
                         ids=[f"{f}={str(v)[:20]!r}" for f, _, v in GENERATED])
def test_a_wrong_value_is_refused_naming_its_field(field: str, dotted: str, value: Any, tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _put(data, dotted, _yaml_value(value))
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    problems = refusals(path)
    # a wrong index or port may also show up as a clash with the other task's: still the cluster, still named
    if field.startswith("cluster.hosts[0].tasks[0]") and problems and not any(names(p, field) for p in problems):
        field = "cluster"
    if field == "data.path" and problems and not any(names(p, field) for p in problems):
        field = "data"
    assert_refused(problems, field, "", f"{field}={value!r}")


# --------------------------------------------------------------------------- made at test time


def _alias_bomb_tasks() -> str:
    """The 8 KB preset of the issue: aliases that would build 1,048,576 tasks."""
    lines = ["t0: &t0 [" + ", ".join(["{role: worker}"] * 4) + "]"]
    for i in range(1, 10):
        lines.append(f"t{i}: &t{i} [" + ", ".join([f"*t{i - 1}"] * 4) + "]")
    lines += ["name: bomb", "cluster:", "  hosts: &hosts", "  - name: local", "    tasks: *t9"]
    return "\n".join(lines) + "\n"


def _billion_laughs() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\nname: *i\n"


def _make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _make_socket(path: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    return path


def _write(name: str, text: str | bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path
    return make


def _link(target: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "link.yaml"
        path.symlink_to(target)
        return path
    return make


_OVERSIZED = b"name: big\n" + b"# " + b"x" * (config_mod.MAX_CONFIG_BYTES) + b"\n"
_MANY_VALUES = "name: many\nlots: [" + ", ".join(["1"] * 150_000) + "]\n"

#: (id, make the preset in a folder, field, what the message says)
SPECIAL: list[tuple[str, Callable[[Path], Path], str, str]] = [
    ("fifo", lambda d: _make_fifo(d / "f.yaml"), "", "not a regular file (a FIFO)"),
    ("dev-zero", lambda d: Path("/dev/zero"), "", "not a regular file (a character device)"),
    ("dev-null", lambda d: Path("/dev/null"), "", "not a regular file (a character device)"),
    ("dev-urandom", lambda d: Path("/dev/urandom"), "", "not a regular file"),
    ("symlink-to-dev-zero", _link("/dev/zero"), "", "not a regular file (a character device)"),
    ("symlink-dangling", _link("/nonexistent/preset.yaml"), "", "no such file"),
    ("folder", lambda d: d, "", "is a folder"),
    ("unix-socket", lambda d: _make_socket(d / "s.yaml"), "", "not a regular file (a socket)"),
    ("oversized", _write("big.yaml", _OVERSIZED), "", "larger than 4 MiB"),
    ("alias-bomb-million-tasks", _write("bomb.yaml", _alias_bomb_tasks()), "", "values once its aliases"),
    ("billion-laughs", _write("laughs.yaml", _billion_laughs()), "", "values once its aliases"),
    ("150k-plain-values", _write("many.yaml", _MANY_VALUES), "", "holds more than 20,000 values"),
    ("not-utf8", _write("latin1.yaml", "name: caf\u00e9\n".encode("latin-1")), "", "not UTF-8"),
    ("nul-bytes", _write("nul.yaml", b"name: a\x00b\n"), "", "not valid YAML"),
]


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize(("make", "field", "says"), [c[1:] for c in SPECIAL], ids=[c[0] for c in SPECIAL])
def test_a_special_file_is_refused_at_once(make: Callable[[Path], Path], field: str, says: str,
                                           tmp_path: Path) -> None:
    path = make(tmp_path)
    started = time.monotonic()
    problems = refusals(path)
    assert_refused(problems, field, says, path.name)
    assert time.monotonic() - started < 5


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on (127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.mark.timeout(CASE_TIMEOUT)
@pytest.mark.parametrize("task", [0, 1])
def test_a_fixed_port_already_taken_is_refused_before_launch(busy_port: int, task: int, tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["cluster"]["hosts"][0]["tasks"][task]["port"] = busy_port
    path = tmp_path / "port.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    problems = refusals(path)
    assert [str(p) for p in problems] == [f"cluster.hosts[0].tasks[{task}].port: {busy_port} is already in use on "
                                          f"this machine; expected a free port, or 'auto'"]


SPECIAL_COUNT = len(SPECIAL) + 2  # the two busy-port cases


# --------------------------------------------------------------------------- as the user runs them


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.timeout(120)
def test_clusterdeck_validate_refuses_a_fifo_dev_zero_and_an_alias_bomb_at_once(tmp_path: Path) -> None:
    fifo = _make_fifo(tmp_path / "f.yaml")
    bomb = _write("bomb.yaml", _alias_bomb_tasks())(tmp_path)
    assert len(bomb.read_bytes()) < 8192
    for target, says in ((fifo, "not a regular file"), (Path("/dev/zero"), "/dev/zero: not a regular file"),
                         (bomb, "values once its aliases")):
        started = time.monotonic()
        out = _cli("validate", str(target), timeout=30)
        assert out.returncode != 0 and says in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr) < 2000
        assert time.monotonic() - started < 15  # the interpreter's start-up included


def _fake_ssh(folder: Path) -> tuple[dict[str, str], Path]:
    """A ``ssh`` first on PATH that logs its argv: it must never be called for a refused preset."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    log = folder / "ssh.log"
    ssh = bin_dir / "ssh"
    ssh.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit 255\n", encoding="utf-8")
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}, log


@pytest.mark.timeout(120)
def test_clusterdeck_run_refuses_an_injected_ssh_host_without_calling_ssh(tmp_path: Path) -> None:
    env, log = _fake_ssh(tmp_path)
    marker = tmp_path / "pwned"
    data = copy.deepcopy(BASE)
    data["cluster"]["hosts"].append({"name": "evil", "address": "10.0.0.2",
                                     "ssh_host": f"-oProxyCommand=touch${{IFS}}{marker}",
                                     "tasks": [{"role": "worker", "index": 2}]})
    data["training"]["global_batch_size"] = 120
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = _cli("run", str(path), "--out", str(tmp_path / "runs"), env=env)
    assert out.returncode != 0
    assert "cluster.hosts[1].ssh_host: expected a host name" in out.stderr, out.stderr
    assert "-oProxyCommand" in out.stderr and "Traceback" not in out.stderr
    assert not log.exists() and not marker.exists()
    assert not any((tmp_path / "runs").glob("*/run.json")) if (tmp_path / "runs").exists() else True


@pytest.mark.timeout(120)
def test_clusterdeck_run_refuses_a_model_too_big_for_this_machine_before_any_task(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["model"]["hidden"] = [1_000_000, 1_000_000, 1_000_000]
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    started = time.monotonic()
    out = _cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert out.returncode != 0, out.stdout
    assert "model.hidden: the run needs about" in out.stderr and "of memory on this machine" in out.stderr, out.stderr
    assert time.monotonic() - started < 30
    assert not any((tmp_path / "runs").glob("*/run.json")) if (tmp_path / "runs").exists() else True


@pytest.mark.timeout(120)
def test_clusterdeck_run_refuses_a_taken_port_and_nan_data(busy_port: int, tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["cluster"]["hosts"][0]["tasks"][1]["port"] = busy_port
    path = tmp_path / "port.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = _cli("run", str(path), "--out", str(tmp_path / "runs"), env={"CLUSTERDECK_NETNS": "0"})
    assert out.returncode != 0
    assert f"cluster.hosts[0].tasks[1].port: {busy_port} is already in use on this machine" in out.stderr, out.stderr

    _write_data_files(tmp_path)
    data = copy.deepcopy(BASE)
    data["data"] = {"source": "npz", "path": str(tmp_path / "nan.npz"), "shape": [4], "classes": 3, "size": 64}
    data["training"]["global_batch_size"] = 8
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = _cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert out.returncode != 0
    assert f"data.path: '{tmp_path / 'nan.npz'}': value 2 of example 5 in 'x' is nan" in out.stderr, out.stderr


# --------------------------------------------------------------------------- machine fit, with this machine's figures fixed


def test_memory_estimate_follows_the_model_and_refuses_only_what_cannot_fit() -> None:
    config = config_mod.load(ROOT / "presets" / "data-2workers.yaml")
    est = machine_fit.estimate(config)
    assert est.parameters == 784 * 256 + 256 + 256 * 10 + 10  # the MLP engine.runtime.models builds
    assert est.tasks == 2
    assert machine_fit.memory_problems(config, available=est.total, measure_gpus=False) == []
    problems = machine_fit.memory_problems(config, available=est.total - 1, measure_gpus=False)
    # two TensorFlow processes weigh most here (more than the 2 x 8192 synthetic examples)
    assert [p.field for p in problems] == ["cluster.hosts[0].tasks"]
    assert problems[0].message.endswith("expected fewer tasks on this machine")
    wide = config_mod.replace(config, model=config_mod.replace(config.model, hidden=(1_000_000,) * 3))
    problem, = machine_fit.memory_problems(wide, available=64 * 2**30, measure_gpus=False)
    assert problem.field == "model.hidden" and "got [1000000, 1000000, 1000000]" in problem.message


def test_a_gpu_host_holds_the_model_against_the_gpu_memory() -> None:
    config = config_mod.load(ROOT / "presets" / "data-1worker-2gpus.yaml")
    wide = config_mod.replace(config, model=config_mod.replace(config.model, hidden=(100_000, 100_000)))
    assert machine_fit.memory_problems(wide, available=2**50, gpu_free=[2**40, 2**40]) == []
    problem, = machine_fit.memory_problems(wide, available=2**50, gpu_free=[2**30, 2**30])
    assert problem.field == "model.hidden" and "on each of its GPUs" in problem.message


def test_remote_hosts_are_not_measured_here() -> None:
    config = config_mod.load(ROOT / "presets" / "data-2workers.yaml")
    remote = config_mod.replace(config.cluster.hosts[0], address="10.0.0.2")
    far = config_mod.replace(config, cluster=config_mod.Cluster(hosts=(remote,)),
                             model=config_mod.replace(config.model, hidden=(1_000_000,) * 3))
    assert machine_fit.memory_problems(far, available=1, measure_gpus=False) == []
    assert machine_fit.cpu_problems(far, cpus=1) == []


def _workers(n: int) -> config_mod.RunConfig:
    config = config_mod.default_config()
    host = config_mod.Host(name="local", tasks=tuple(config_mod.Task("worker", i) for i in range(n)))
    return config_mod.replace(config, cluster=config_mod.Cluster(hosts=(host,)),
                              training=config_mod.replace(config.training, global_batch_size=n * 8))


def test_local_tasks_against_cpus_warn_then_refuse_unless_allowed() -> None:
    assert machine_fit.warnings(_workers(2), cpus=2) == [] and machine_fit.cpu_problems(_workers(8), cpus=2) == []
    warning, = machine_fit.warnings(_workers(3), cpus=2)
    assert warning.field == "cluster.hosts[0].tasks" and "3 tasks share this machine's 2 CPUs" in warning.message
    problem, = machine_fit.cpu_problems(_workers(9), cpus=2)
    assert str(problem) == ("cluster.hosts[0].tasks: 9 tasks would run on this machine's 2 CPUs (more than 4 per "
                            "CPU); expected at most 8, or training.allow_oversubscribe: true to run them anyway")
    allowed = _workers(9)
    allowed = config_mod.replace(allowed, training=config_mod.replace(allowed.training, allow_oversubscribe=True))
    assert machine_fit.cpu_problems(allowed, cpus=2) == []
    assert machine_fit.warnings(allowed, cpus=2)  # still said, no longer refused
    assert config_mod.loads(config_mod.dumps(allowed)) == allowed


def test_2048_local_workers_are_refused_by_validation() -> None:
    tasks = [{"role": "worker", "index": i} for i in range(2048)]
    data = copy.deepcopy(BASE)
    data["cluster"]["hosts"][0]["tasks"] = tasks
    with pytest.raises(ConfigError) as exc:
        config_mod.from_dict(data)
    assert "cluster.hosts[0].tasks: expected at most 256 tasks on one host, got 2048" in str(exc.value)
    assert len(str(exc.value)) < 500
    with pytest.raises(ConfigError) as exc:  # built in code (the app), the same rule
        config_mod.from_dict(data, check=False)
    assert config_mod.validate(_workers(2048))[0].field == "cluster.hosts[0].tasks"


def test_a_port_in_an_isolated_run_is_not_this_machines_port(busy_port: int) -> None:
    data = copy.deepcopy(BASE)
    data["cluster"]["hosts"][0]["tasks"][0]["port"] = busy_port
    config = config_mod.from_dict(data)
    assert machine_fit.port_problems(config, isolated=True) == []
    assert [p.field for p in machine_fit.port_problems(config, isolated=False)] == ["cluster.hosts[0].tasks[0].port"]
