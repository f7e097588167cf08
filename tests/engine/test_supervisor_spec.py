"""The supervisor's versioned spec (engine.contract.supervisor_spec): one declaration, checked by the supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.contract.supervisor_spec import SPEC_VERSION, SpecError, SupervisorSpec
from engine.contract.task_plan import TaskPlan
from engine.control import transports

PLAN = TaskPlan(name="worker:0", role="worker", index=0, host="local", port=1234, gpu_ids=(), devices=1, env={"A": "1"})


def _spec(**kw: object) -> SupervisorSpec:
    return SupervisorSpec(run_dir="/tmp/cd-spec", tasks=(PLAN,), host="h1", python="python3", env={"X": "y"},
                          restart_on_failure=("worker:0",), max_task_restarts=4, takeover=True,
                          restarts={"worker:0": 2}, config_yaml="name: x\n", **kw)  # type: ignore[arg-type]


def test_a_spec_round_trips_through_its_line() -> None:
    spec = _spec()
    line = spec.to_json()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["v"] == SPEC_VERSION
    assert SupervisorSpec.from_json(line) == spec
    assert SupervisorSpec.from_json(line.encode()) == spec


@pytest.mark.parametrize("version", [None, 0, SPEC_VERSION + 1, "1", True])
def test_a_spec_of_another_version_is_refused_saying_which(version: object) -> None:
    data = _spec().to_dict()
    if version is None:
        del data["v"]
    else:
        data["v"] = version
    with pytest.raises(SpecError) as err:
        SupervisorSpec.from_dict(data)
    message = str(err.value)
    assert f"reads version {SPEC_VERSION} only" in message and "different ClusterDeck versions" in message


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", json.dumps({"v": SPEC_VERSION}).encode(),
                                  json.dumps({"v": SPEC_VERSION, "run_dir": "/x", "tasks": [], "nope": 1}).encode()])
def test_a_malformed_spec_is_refused(line: bytes) -> None:
    with pytest.raises(SpecError):
        SupervisorSpec.from_json(line)


def test_the_supervisor_refuses_another_version_with_a_clear_error(tmp_path: Path) -> None:
    data = _spec().to_dict()
    data.update(v=SPEC_VERSION + 1, run_dir=str(tmp_path / "run"))
    out = subprocess.run(transports.supervisor_command(sys.executable), input=json.dumps(data).encode() + b"\n",
                         capture_output=True, env=transports.local_env(), timeout=60, cwd=os.getcwd())
    assert out.returncode == 5
    said = out.stderr.decode()
    assert f"spec of version {SPEC_VERSION + 1}" in said and f"reads version {SPEC_VERSION} only" in said
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_the_spec_line_is_read_whole_and_what_follows_it_is_kept() -> None:
    from engine.control.supervisor import read_first_line

    r, w = os.pipe()
    spec = b'{"v":1,' + b'"x":"' + b"y" * 100_000 + b'"}\n'
    command = b'{"v":1,"command":"stop"}\n'
    pid = os.fork()
    if pid == 0:  # a writer of its own: the pipe holds less than the spec
        os.close(r)
        os.write(w, spec + command)
        os._exit(0)
    os.close(w)
    try:
        assert read_first_line(r) == (spec, command)
    finally:
        os.waitpid(pid, 0)
        os.close(r)
    r, w = os.pipe()
    os.write(w, b'{"v":1')  # the launcher went away before a whole spec
    os.close(w)
    assert read_first_line(r) is None
    os.close(r)


def test_a_supervisor_imports_neither_the_config_model_nor_yaml() -> None:
    """Every host of a launch starts a supervisor: it needs the task plans of its spec, not the config model (a
    fifth of its start's CPU, docs/benchmarks.md 4d)."""
    code = ("import sys, engine.control.supervisor\n"
            "print(sorted(m for m in sys.modules if m in ('yaml', 'engine.contract.config', 'engine.contract.plan')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
