"""Export from the config: TF_CONFIG files, bash launch scripts (checked by bash itself) and a Kubeflow TFJob."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.contract import config as config_mod
from engine.contract.config import ConfigError, RunConfig
from engine.contract.plan import gpu_assignment, plan_tasks
from engine.contract.task_plan import share_cores
from engine.control import export
from tests.conftest import ROOT

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")

DNS1123 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def make(hosts: list[dict[str, Any]], mode: str = "data", name: str = "run", **training: Any) -> RunConfig:
    raw = {"name": name, "cluster": {"hosts": hosts}, "parallelism": {"mode": mode},
           "training": {"global_batch_size": 128, "steps": 10, **training}}
    return config_mod.from_dict(raw)


def data_config() -> RunConfig:
    """Two workers on two machines, two GPUs each; worker 1 keeps a fixed port."""
    return make([
        {"name": "gpu-a", "address": "10.0.0.1", "gpus": 2, "tasks": [{"role": "worker", "index": 0}]},
        {"name": "gpu-b", "address": "10.0.0.2", "gpus": 2, "tasks": [{"role": "worker", "index": 1, "port": 3000}]},
    ])


def async_config() -> RunConfig:
    """Chief and two ps on one machine, two workers with one GPU each on another."""
    return make([
        {"name": "coord", "address": "10.0.0.1", "gpus": 0,
         "tasks": [{"role": "chief"}, {"role": "ps", "index": 0}, {"role": "ps", "index": 1}]},
        {"name": "gpus", "address": "10.0.0.2", "gpus": 2,
         "tasks": [{"role": "worker", "index": 0}, {"role": "worker", "index": 1}]},
    ], mode="async")


def evaluator_config() -> RunConfig:
    """Two local workers and an evaluator side-car, all on this machine."""
    return make([{"name": "local", "address": "localhost", "gpus": 0,
                  "tasks": [{"role": "worker", "index": 0}, {"role": "worker", "index": 1},
                            {"role": "evaluator", "index": 0}]}])


def model_config() -> RunConfig:
    raw = {"name": "mesh", "cluster": {"hosts": [
        {"name": "a", "address": "10.0.0.1", "tasks": [{"role": "worker", "index": 0}]},
        {"name": "b", "address": "10.0.0.2", "tasks": [{"role": "worker", "index": 1}]},
    ]}, "parallelism": {"mode": "model", "mesh": {"batch": 1, "model": 2}}, "training": {"steps": 10}}
    return config_mod.from_dict(raw)


# --------------------------------------------------------------------------- ports and TF_CONFIG


def test_auto_ports_count_up_per_machine_from_the_base_and_skip_fixed_ones() -> None:
    cfg = make([
        {"name": "l1", "address": "localhost", "tasks": [{"role": "worker", "index": 0},
                                                         {"role": "worker", "index": 1, "port": 2223}]},
        {"name": "l2", "address": "127.0.0.1", "tasks": [{"role": "worker", "index": 2}]},  # the same machine
        {"name": "r", "address": "10.1.1.1", "tasks": [{"role": "worker", "index": 3}]},
    ])
    resolved = export.export_ports(cfg)
    ports = {t.name: t.port for _, t in resolved.cluster.tasks()}
    assert ports == {"worker:0": 2222, "worker:1": 2223, "worker:2": 2224, "worker:3": export.DEFAULT_BASE_PORT}
    assert export.export_ports(cfg) == resolved  # deterministic


def test_tf_configs_give_each_task_the_cluster_and_its_own_identity() -> None:
    configs = export.tf_configs(data_config())
    spec = {"worker": ["10.0.0.1:2222", "10.0.0.2:3000"]}
    assert configs == {
        "worker:0": {"cluster": spec, "task": {"type": "worker", "index": 0}},
        "worker:1": {"cluster": spec, "task": {"type": "worker", "index": 1}},
    }
    a = export.tf_configs(async_config())
    assert a["chief:0"]["cluster"] == {"chief": ["10.0.0.1:2222"], "ps": ["10.0.0.1:2223", "10.0.0.1:2224"],
                                       "worker": ["10.0.0.2:2222", "10.0.0.2:2223"]}
    assert a["ps:1"]["task"] == {"type": "ps", "index": 1}
    e = export.tf_configs(evaluator_config())
    assert "evaluator" not in e["evaluator:0"]["cluster"]  # a side-car, outside the TF cluster
    assert e["evaluator:0"]["task"] == {"type": "evaluator", "index": 0}


def test_a_local_host_beside_remote_ones_is_refused_by_name() -> None:
    cfg = make([
        {"name": "here", "address": "localhost", "tasks": [{"role": "worker", "index": 0}]},
        {"name": "there", "address": "10.0.0.9", "tasks": [{"role": "worker", "index": 1}]},
    ])
    with pytest.raises(ConfigError, match=r"cluster.hosts\[0\].address: 'localhost'"):
        export.tf_configs(cfg)


def test_an_invalid_config_is_refused_with_its_problems() -> None:
    cfg = config_mod.replace(async_config(), parallelism=config_mod.replace(async_config().parallelism, mode="data"))
    with pytest.raises(ConfigError, match="does not use ps tasks"):
        export.tf_configs(cfg)


# --------------------------------------------------------------------------- launch scripts


def exports_by_task(script: str) -> dict[str, dict[str, str]]:
    """The variables each task block of a launch script exports, read back with shlex."""
    tasks: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith("export ") and line.startswith("  "):
            (assignment,) = shlex.split(stripped[len("export "):])
            key, _, value = assignment.partition("=")
            current[key] = value
        elif stripped.startswith("run_task ") and current:  # the task starts
            tasks[current["CLUSTERDECK_TASK"]] = current
            current = {}
    return tasks


def bash_syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(script, encoding="utf-8")
    out = subprocess.run([BASH or "bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


@needs_bash
@pytest.mark.parametrize("factory", [data_config, async_config, evaluator_config, model_config])
def test_every_launch_script_passes_bash_syntax_check(factory: Any, tmp_path: Path) -> None:
    scripts = export.launch_scripts(factory(), workdir="/opt/click deck", run_dir="/srv/runs/it's")
    assert scripts
    for text in scripts.values():
        assert text.startswith("#!/usr/bin/env bash\n")
        bash_syntax_ok(text, tmp_path)


def test_launch_scripts_export_each_task_s_tf_config_and_gpus() -> None:
    for cfg in (data_config(), async_config(), evaluator_config()):
        expected = export.tf_configs(cfg)
        scripts = export.launch_scripts(cfg)
        names = export.script_names(cfg)
        seen: set[str] = set()
        for h in cfg.cluster.hosts:
            blocks = exports_by_task(scripts[names[h.name]])
            assert set(blocks) == {t.name for t in h.tasks}
            gpus = gpu_assignment(h)
            for task, env in blocks.items():
                assert json.loads(env["TF_CONFIG"]) == expected[task]
                assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus[task]))
                seen.add(task)
        assert seen == set(expected)
    a = export.launch_scripts(async_config())
    gpu_blocks = exports_by_task(a["launch-gpus.sh"])
    assert gpu_blocks["worker:0"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert gpu_blocks["worker:1"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert exports_by_task(a["launch-coord.sh"])["ps:0"]["CUDA_VISIBLE_DEVICES"] == ""


def test_model_mode_scripts_carry_the_dtensor_client_variables() -> None:
    scripts = export.launch_scripts(model_config())
    env = exports_by_task(scripts["launch-b.sh"])["worker:1"]
    assert env["DTENSOR_CLIENT_ID"] == "1"
    assert env["DTENSOR_JOBS"] == "10.0.0.1:2222,10.0.0.2:2222"


def test_script_names_are_file_safe_and_unique() -> None:
    cfg = make([
        {"name": "a b", "address": "10.0.0.1", "tasks": [{"role": "worker", "index": 0}]},
        {"name": "a/b", "address": "10.0.0.2", "tasks": [{"role": "worker", "index": 1}]},
        {"name": "../..", "address": "10.0.0.3", "tasks": [{"role": "worker", "index": 2}]},
    ], global_batch_size=129)
    names = export.script_names(cfg)
    assert names == {"a b": "launch-a-b.sh", "a/b": "launch-a-b-2.sh", "../..": "launch-host.sh"}
    assert set(export.launch_scripts(cfg)) == set(names.values())


# The stand-in for python: records what the task was given, then ends (chief) or serves until killed.
STUB = r"""#!/usr/bin/env bash
run_dir="$4"
name="${CLUSTERDECK_TASK/:/-}"
printf '%s' "$TF_CONFIG" > "$run_dir/$name.tf_config"
printf '%s' "$CUDA_VISIBLE_DEVICES" > "$run_dir/$name.gpus"
printf '%s' "$TF_NUM_INTRAOP_THREADS" > "$run_dir/$name.threads"
printf '%s' "$TF_NUM_INTEROP_THREADS" > "$run_dir/$name.inter"
sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$$/status > "$run_dir/$name.cpus" 2>/dev/null
printf '%s %s %s %s' "$1" "$2" "$3" "$PWD" > "$run_dir/$name.argv"
echo $$ > "$run_dir/$name.pid"
case "$CLUSTERDECK_TASK" in
  chief:*)
    for other in ${STUB_CHIEF_WAITS_FOR:-}; do  # until these tasks have started, at most 10 s
      for _ in $(seq 1 500); do [ -s "$run_dir/$other.pid" ] && break; sleep 0.02; done
    done
    exit "${STUB_CHIEF_EXIT:-0}" ;;
  *) [ -n "${STUB_ALL_EXIT:-}" ] && exit 0
     exec sleep 30 ;;
esac
"""


def stub_python(tmp_path: Path) -> Path:
    stub = tmp_path / "stub python"
    stub.write_text(STUB, encoding="utf-8")
    stub.chmod(0o755)
    return stub


def wait_for(paths: list[Path], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.stat().st_size for p in paths):
        assert time.monotonic() < deadline, f"missing: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def start_script(path: Path, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    full = dict(os.environ, CLUSTERDECK_PYTHON=str(stub_python(tmp_path)), **env)
    return subprocess.Popen([BASH or "bash", str(path)], cwd=tmp_path, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_script(path: Path, tmp_path: Path, **env: str) -> tuple[int, str, str]:
    """Run a launch script to its end (20 s at most; its process group killed otherwise): code, stdout, stderr."""
    proc = start_script(path, tmp_path, **env)
    try:
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr


@needs_bash
@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_chief_host_script_runs_its_tasks_and_stops_its_servers_when_the_chief_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    cfg = async_config()
    workdir = tmp_path / "work 'dir'"
    workdir.mkdir()
    out = tmp_path / "export"
    export.write_export(cfg, out, workdir=str(workdir))
    run_dir = workdir / "runs" / "run"
    code, stdout, stderr = run_script(out / "launch-coord.sh", tmp_path, STUB_CHIEF_WAITS_FOR="ps-0 ps-1")
    assert code == 0, stderr
    expected = export.tf_configs(cfg)
    for task in ("chief:0", "ps:0", "ps:1"):
        stem = task.replace(":", "-")
        assert json.loads((run_dir / f"{stem}.tf_config").read_text()) == expected[task]
        assert (run_dir / f"{stem}.gpus").read_text() == ""
        # the host's three tasks share its cores (what nproc counts: this process's affinity)
        assert (run_dir / f"{stem}.threads").read_text() == str(max(1, len(os.sched_getaffinity(0)) // 3))
        assert (run_dir / f"{stem}.argv").read_text() == f"-m engine.runtime.task --run-dir {workdir}"
        assert not pid_alive(int((run_dir / f"{stem}.pid").read_text()))  # the ps servers were stopped
    assert config_mod.load(run_dir / "config.yaml") == export.export_ports(cfg)
    assert "started chief:0" in stdout


def cpu_range_list(text: str) -> list[int]:
    """``/proc``'s ``Cpus_allowed_list`` ("0-2,8") as CPUs."""
    out: list[int] = []
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


@needs_bash
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("taskset") is None,
                    reason="CPU affinity with taskset (Linux)")
@pytest.mark.parametrize("chosen", [None, "1"])
def test_training_tasks_run_on_cores_of_their_own_as_the_supervisor_places_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chosen: str | None) -> None:
    """The workers each on their own share of the script's CPUs (``share_cores``, the supervisor's rule), the
    evaluator anywhere; a user who set ``TF_NUM_INTRAOP_THREADS`` keeps the kernel's placement."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: two training tasks cannot have cores of their own")
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    cfg = evaluator_config()
    export.write_export(cfg, tmp_path / "export", workdir=str(tmp_path))
    env = {"STUB_ALL_EXIT": "1", **({"TF_NUM_INTRAOP_THREADS": chosen} if chosen else {})}
    code, _, stderr = run_script(tmp_path / "export" / "launch-local.sh", tmp_path, **env)
    assert code == 0, stderr
    run_dir = tmp_path / "runs" / "run"

    def seen(task: str, what: str) -> str:
        return (run_dir / f"{task.replace(':', '-')}.{what}").read_text().strip()

    tasks = ("worker:0", "worker:1", "evaluator:0")
    if chosen:
        assert all(cpu_range_list(seen(t, "cpus")) == cpus for t in tasks)
        assert all(seen(t, "threads") == chosen and seen(t, "inter") == "" for t in tasks)
        return
    shares = share_cores(plan_tasks(export.export_ports(cfg)), cpus)
    for task in tasks:
        assert cpu_range_list(seen(task, "cpus")) == list(shares[task].cores or cpus), task
        assert seen(task, "threads") == shares[task].env["TF_NUM_INTRAOP_THREADS"], task
        assert seen(task, "inter") == shares[task].env.get("TF_NUM_INTEROP_THREADS", ""), task
    assert set(shares["worker:0"].cores).isdisjoint(shares["worker:1"].cores) and shares["worker:0"].cores


@needs_bash
def test_the_script_exits_with_the_chief_s_failure_code(tmp_path: Path) -> None:
    export.write_export(async_config(), tmp_path / "export", workdir=str(tmp_path))
    code, _, _ = run_script(tmp_path / "export" / "launch-coord.sh", tmp_path, STUB_CHIEF_EXIT="3")
    assert code == 3


@needs_bash
def test_sigterm_stops_every_task_of_the_host(tmp_path: Path) -> None:
    export.write_export(async_config(), tmp_path / "export", workdir=str(tmp_path))
    run_dir = tmp_path / "runs" / "run"
    pid_files = [run_dir / "worker-0.pid", run_dir / "worker-1.pid"]
    proc = start_script(tmp_path / "export" / "launch-gpus.sh", tmp_path)  # async workers: servers only
    try:
        wait_for(pid_files)
        pids = [int(p.read_text()) for p in pid_files]
        assert all(pid_alive(p) for p in pids)
        assert proc.poll() is None  # servers run until stopped
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert (run_dir / "worker-0.gpus").read_text() == "0"
    assert (run_dir / "worker-1.gpus").read_text() == "1"
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(pid_alive(p) for p in pids)


@needs_bash
def test_quoting_survives_hostile_host_names_addresses_and_paths(tmp_path: Path) -> None:
    name = "it's a \"gpu\" box; touch pwned-name $(touch pwned-sub) `touch pwned-tick`"
    with pytest.raises(ConfigError, match="address"):  # the config itself refuses shell text as an address
        make([{"name": "x", "address": "10.0.0.1$(touch${IFS}pwned-addr)", "tasks": [{"role": "worker"}]}])
    address = "10.0.0.1"
    cfg = make([
        {"name": name, "address": address, "tasks": [{"role": "chief"}, {"role": "ps", "index": 0}]},
        {"name": "w", "address": "10.0.0.2", "tasks": [{"role": "worker", "index": 0}]},
    ], mode="async", name="run'; touch pwned-run")
    workdir = tmp_path / "w $(touch pwned-wd) 'q'"
    workdir.mkdir()
    paths = export.write_export(cfg, tmp_path / "export", workdir=str(workdir))
    (script,) = [p for p in paths if p.name.startswith("launch-it")]
    bash_syntax_ok(script.read_text(), tmp_path)
    code, _, stderr = run_script(script, tmp_path, STUB_CHIEF_WAITS_FOR="ps-0")
    assert code == 0, stderr
    assert not list(tmp_path.rglob("pwned*")), "a value was run as a command"
    run_dir = workdir / "runs" / "run-touch-pwned-run"
    tfc = json.loads((run_dir / "chief-0.tf_config").read_text())
    assert tfc["cluster"]["chief"] == [f"{address}:2222"]
    assert config_mod.load(run_dir / "config.yaml").cluster.hosts[0].name == name


# --------------------------------------------------------------------------- TFJob


def replica_specs(cfg: RunConfig, **kwargs: Any) -> dict[str, Any]:
    manifest = yaml.safe_load(export.tfjob_yaml(cfg, image="registry.example/clusterdeck:1", **kwargs))
    assert manifest["apiVersion"] == "kubeflow.org/v1"
    assert manifest["kind"] == "TFJob"
    assert DNS1123.match(manifest["metadata"]["name"])
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert container["image"] == "registry.example/clusterdeck:1"
        assert {"name": "tfjob-port", "containerPort": 2222} in container["ports"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert config_mod.loads(env["CLUSTERDECK_CONFIG"]) == export.export_ports(cfg)
    return manifest["spec"]["tfReplicaSpecs"]


def gpu_limit(spec: dict[str, Any]) -> int | None:
    container = spec["template"]["spec"]["containers"][0]
    return container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")


def test_tfjob_for_data_parallel_workers_with_two_gpus_each() -> None:
    specs = replica_specs(data_config())
    assert set(specs) == {"Worker"}
    assert specs["Worker"]["replicas"] == 2
    assert gpu_limit(specs["Worker"]) == 2
    assert specs["Worker"]["restartPolicy"] == "Never"  # training.restarts is 0


def test_tfjob_for_async_chief_workers_and_ps() -> None:
    cfg = async_config()
    specs = replica_specs(cfg)
    assert list(specs) == ["Chief", "Worker", "PS"]
    assert [specs[k]["replicas"] for k in ("Chief", "Worker", "PS")] == [1, 2, 2]
    assert gpu_limit(specs["Chief"]) is None and gpu_limit(specs["PS"]) is None
    assert gpu_limit(specs["Worker"]) == 1
    assert specs["Worker"]["restartPolicy"] == "OnFailure"  # async workers rejoin after a restart
    assert specs["PS"]["restartPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in specs["PS"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert config_mod.loads(env["CLUSTERDECK_CONFIG"]) == export.export_ports(cfg)
    restarting = config_mod.replace(cfg, training=config_mod.replace(cfg.training, restarts=2))
    manifest = export.tfjob_manifest(restarting, image="x", namespace="ml")
    assert {s["restartPolicy"] for s in manifest["spec"]["tfReplicaSpecs"].values()} == {"OnFailure"}
    assert manifest["metadata"]["namespace"] == "ml"
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == export.ASYNC_WORKER_RESTARTS


def test_tfjob_with_an_evaluator() -> None:
    specs = replica_specs(evaluator_config())
    assert specs["Worker"]["replicas"] == 2
    assert specs["Evaluator"]["replicas"] == 1
    assert gpu_limit(specs["Worker"]) is None and gpu_limit(specs["Evaluator"]) is None


def test_tfjob_refuses_roles_whose_tasks_have_different_gpu_counts() -> None:
    cfg = make([
        {"name": "a", "address": "10.0.0.1", "gpus": 2, "tasks": [{"role": "worker", "index": 0}]},
        {"name": "b", "address": "10.0.0.2", "gpus": 0, "tasks": [{"role": "worker", "index": 1}]},
    ], global_batch_size=129)
    with pytest.raises(ConfigError, match=r"worker tasks have different GPU counts \(worker:0: 2, worker:1: 0\)"):
        export.tfjob_manifest(cfg, image="x")
    with pytest.raises(ConfigError, match="image"):
        export.tfjob_manifest(data_config(), image=" ")


@pytest.mark.parametrize("name", ["My Run_#1 (ü)", "123-go", "---", "ÄÖÜ", "a" * 200, "x.y.z", "Data 2 Workers!",
                                  "two\nlines \t and trailing spaces  "])
def test_tfjob_names_are_dns1123_labels_for_odd_config_names(name: str) -> None:
    label = export.dns1123_name(name)
    assert DNS1123.match(label), label
    assert len(label) <= 47  # room for the operator's "-evaluator-0" style suffixes within 63
    assert replica_specs(config_mod.replace(data_config(), name=name))
    assert export.dns1123_name("My Run") == "my-run"
    assert export.dns1123_name("a" * 200) != export.dns1123_name("a" * 199)


def test_tfjob_default_command_names_the_task_and_writes_the_config(tmp_path: Path) -> None:
    stub = tmp_path / "py"
    # stands in for the image's python: runs -c snippets, and records the final task start
    stub.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
                    'env > "$CLUSTERDECK_RUN_DIR/env.txt"\n', encoding="utf-8")
    stub.chmod(0o755)
    cfg = model_config()
    manifest = export.tfjob_manifest(cfg, image="x")
    container = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    env["CLUSTERDECK_RUN_DIR"] = str(tmp_path / "run")
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["j-worker-0:2222", "j-worker-1:2222"]},
                                   "task": {"type": "worker", "index": 1}})
    command = export.default_command(str(stub))
    out = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "run" / "env.txt").read_text().splitlines() if "=" in line)
    assert seen["CLUSTERDECK_TASK"] == "worker:1"
    assert seen["DTENSOR_CLIENT_ID"] == "1"
    assert seen["DTENSOR_JOBS"] == "j-worker-0:2222,j-worker-1:2222"
    assert config_mod.load(tmp_path / "run" / "config.yaml") == export.export_ports(cfg)
    bad = subprocess.run(command, env={**os.environ, **env, "TF_CONFIG": "not json"}, capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode != 0  # no task starts under a wrong name


# --------------------------------------------------------------------------- files


def test_write_export_writes_every_file(tmp_path: Path) -> None:
    cfg = async_config()
    paths = export.write_export(cfg, tmp_path, image="img:1")
    rel = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert rel == ["Dockerfile", "clusterdeck/engine", "config.yaml", "launch-coord.sh", "launch-gpus.sh",
                   "tf_config/chief-0.json", "tf_config/ps-0.json", "tf_config/ps-1.json", "tf_config/worker-0.json",
                   "tf_config/worker-1.json", "tfjob.yaml"]
    assert all(p.is_file() for p in paths if p.name != "engine")
    assert (tmp_path / "clusterdeck" / "engine" / "runtime" / "task.py").is_file()
    assert not list((tmp_path / "clusterdeck").rglob("__pycache__"))
    for name in ("launch-coord.sh", "launch-gpus.sh"):
        assert os.access(tmp_path / name, os.X_OK)
    expected = export.tf_configs(cfg)
    assert json.loads((tmp_path / "tf_config" / "worker-1.json").read_text()) == expected["worker:1"]
    assert yaml.safe_load((tmp_path / "tfjob.yaml").read_text())["kind"] == "TFJob"
    no_image = tmp_path / "plain"
    assert not any(p.name == "tfjob.yaml" for p in export.write_export(cfg, no_image))


def test_write_export_of_an_invalid_config_writes_nothing(tmp_path: Path) -> None:
    bad = config_mod.replace(data_config(), name=" ")
    with pytest.raises(ConfigError, match="name"):
        export.write_export(bad, tmp_path / "out", image="x")
    assert not (tmp_path / "out").exists()


def test_the_export_imports_no_tensorflow_and_no_qt() -> None:
    heavy = ("tensorflow", "keras", "PySide6", "pyqtgraph")
    code = f"import sys, engine.control.export\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- TFJob v1 schema, volume, image

#: Fields of Kubeflow's TFJob v1 API (kubeflow.org/v1, training-operator): TFJobSpec, RunPolicy, ReplicaSpec.
TFJOB_SPEC_FIELDS = {"runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"}
RUN_POLICY_FIELDS = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
                     "schedulingPolicy", "suspend", "managedBy"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}
REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
REPLICA_SPEC_FIELDS = {"replicas", "template", "restartPolicy"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
# Kubernetes core v1: the PodTemplateSpec, PodSpec, Container and Volume fields a manifest here may use
POD_TEMPLATE_FIELDS = {"metadata", "spec"}
POD_SPEC_FIELDS = {"containers", "volumes", "initContainers", "nodeSelector", "tolerations", "affinity",
                   "serviceAccountName", "securityContext", "restartPolicy", "schedulerName", "priorityClassName"}
CONTAINER_FIELDS = {"name", "image", "command", "args", "env", "envFrom", "ports", "resources", "volumeMounts",
                    "workingDir", "imagePullPolicy", "securityContext", "livenessProbe", "readinessProbe"}


def check_tfjob_v1(manifest: dict[str, Any]) -> None:
    """The manifest against TFJob v1's field names, types and enums (what ``kubectl apply`` would reject)."""
    assert set(manifest) == {"apiVersion", "kind", "metadata", "spec"}
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    meta = manifest["metadata"]
    assert DNS1123.match(meta["name"]) and len(meta["name"]) <= 63
    assert set(meta) <= {"name", "namespace", "labels", "annotations"}
    assert all(isinstance(v, str) for v in meta.get("annotations", {}).values())
    spec = manifest["spec"]
    assert set(spec) <= TFJOB_SPEC_FIELDS and "tfReplicaSpecs" in spec
    run_policy = spec.get("runPolicy", {})
    assert set(run_policy) <= RUN_POLICY_FIELDS
    assert run_policy.get("cleanPodPolicy", "Running") in CLEAN_POD_POLICIES
    assert isinstance(run_policy.get("backoffLimit", 0), int)
    assert spec["tfReplicaSpecs"] and set(spec["tfReplicaSpecs"]) <= REPLICA_TYPES
    for replica in spec["tfReplicaSpecs"].values():
        assert set(replica) <= REPLICA_SPEC_FIELDS
        assert isinstance(replica["replicas"], int) and replica["replicas"] >= 1
        assert replica["restartPolicy"] in RESTART_POLICIES
        template = replica["template"]
        assert set(template) <= POD_TEMPLATE_FIELDS
        assert all(isinstance(v, str) for v in template.get("metadata", {}).get("annotations", {}).values())
        pod = template["spec"]
        assert set(pod) <= POD_SPEC_FIELDS
        names = [c["name"] for c in pod["containers"]]
        assert names.count("tensorflow") == 1, "the operator finds its container by the name 'tensorflow'"
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            assert set(v) == {"name", "persistentVolumeClaim"} and set(v["persistentVolumeClaim"]) == {"claimName"}
        for c in pod["containers"]:
            assert set(c) <= CONTAINER_FIELDS
            assert isinstance(c["image"], str) and c["image"]
            assert all(isinstance(w, str) for w in c.get("command", []))
            assert all(set(e) == {"name", "value"} and isinstance(e["value"], str) for e in c.get("env", []))
            assert all(set(p) <= {"name", "containerPort", "protocol"} for p in c.get("ports", []))
            assert any(p.get("name") == "tfjob-port" for p in c["ports"])
            for m in c.get("volumeMounts", []):
                assert set(m) <= {"name", "mountPath", "subPath", "readOnly"} and m["name"] in volumes


@pytest.mark.parametrize("make_config", [data_config, async_config, evaluator_config, model_config])
def test_every_tfjob_matches_the_v1_schema_and_skips_the_istio_sidecar(make_config: Any) -> None:
    manifest = yaml.safe_load(export.tfjob_yaml(make_config(), image="img:1", pvc="runs"))
    check_tfjob_v1(manifest)
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        assert spec["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"


def test_a_named_claim_holds_the_run_folder_in_every_replica() -> None:
    cfg = evaluator_config()
    manifest = export.tfjob_manifest(cfg, image="img:1", pvc="team-runs")
    name = manifest["metadata"]["name"]
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        assert pod["volumes"] == [{"name": "run-folder", "persistentVolumeClaim": {"claimName": "team-runs"}}]
        (container,) = pod["containers"]
        assert container["volumeMounts"] == [{"name": "run-folder", "mountPath": export.TFJOB_RUN_DIR, "subPath": name}]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["CLUSTERDECK_RUN_DIR"] == export.TFJOB_RUN_DIR
    plain = export.tfjob_manifest(cfg, image="img:1")
    assert all("volumes" not in s["template"]["spec"] for s in plain["spec"]["tfReplicaSpecs"].values())
    with pytest.raises(ConfigError, match="pvc: expected the name of a PersistentVolumeClaim"):
        export.tfjob_manifest(cfg, image="img:1", pvc="Bad Claim")
    claim = export.pvc_manifest("team-runs", size="20Gi", namespace="ml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi" and claim["metadata"]["namespace"] == "ml"
    with pytest.raises(ConfigError, match="quantity"):
        export.pvc_manifest("team-runs", size="lots")


def test_the_chosen_python_runs_the_task_and_is_the_one_the_image_installs_for() -> None:
    manifest = export.tfjob_manifest(data_config(), image="img:1", python="/opt/venv/bin/python")
    (container,) = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    script = container["command"][-1]
    assert "exec /opt/venv/bin/python -m engine.runtime.task" in script
    assert "python3" not in script
    recipe = export.dockerfile(data_config(), python="/opt/venv/bin/python")
    assert "RUN /opt/venv/bin/python -m pip install --no-cache-dir" in recipe
    assert "'tensorflow[and-cuda]==2.21.*'" in recipe  # the workers have GPUs
    assert "tensorflow==2.21.*" in export.dockerfile(evaluator_config())
    with pytest.raises(ConfigError, match="python"):
        export.tfjob_manifest(data_config(), image="img:1", python="python3; rm -rf /")


def test_the_image_holds_clusterdeck_and_the_user_s_script(tmp_path: Path) -> None:
    script = tmp_path / "my model.py"
    script.write_text("def build_model(config):\n    raise NotImplementedError\n", encoding="utf-8")
    cfg = config_mod.replace(evaluator_config(), model=config_mod.replace(evaluator_config().model, name="script",
                                                                         script=str(script)))
    out = tmp_path / "export"
    export.write_export(cfg, out, image="img:1", pvc="team-runs", pvc_size="5Gi", python="python3")
    recipe = (out / "Dockerfile").read_text()
    assert recipe.startswith("# Image of ClusterDeck's tasks") and "\nFROM " in recipe
    assert "COPY clusterdeck/engine /opt/clusterdeck/engine" in recipe
    assert f"COPY user/ {export.IMAGE_USER_DIR}/" in recipe
    assert "ENV PYTHONUNBUFFERED=1 PYTHONPATH=/opt/clusterdeck" in recipe
    assert (out / "user" / "my-model.py").read_text() == script.read_text()
    assert (out / "clusterdeck" / "engine" / "runtime" / "task.py").is_file()
    manifest = yaml.safe_load((out / "tfjob.yaml").read_text())
    check_tfjob_v1(manifest)
    env = {e["name"]: e["value"] for e in manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert config_mod.loads(env["CLUSTERDECK_CONFIG"]).model.script == f"{export.IMAGE_USER_DIR}/my-model.py"
    assert yaml.safe_load((out / "pvc.yaml").read_text())["metadata"]["name"] == "team-runs"
    missing = config_mod.replace(cfg, model=config_mod.replace(cfg.model, script=str(tmp_path / "gone.py")))
    report = export.write_export_report(missing, tmp_path / "other", image="img:1")  # the image cannot be built
    assert [p.field for p in report.skipped] == ["model.script"] and "gone.py" in str(report.skipped[0])
    assert not (tmp_path / "other" / "tfjob.yaml").exists() and not (tmp_path / "other" / "Dockerfile").exists()
    assert (tmp_path / "other" / "config.yaml").is_file()  # the rest is written


def test_a_tfjob_that_cannot_be_made_is_skipped_and_the_rest_written(tmp_path: Path) -> None:
    cfg = make([
        {"name": "a", "address": "10.0.0.1", "gpus": 2, "tasks": [{"role": "worker", "index": 0}]},
        {"name": "b", "address": "10.0.0.2", "gpus": 0, "tasks": [{"role": "worker", "index": 1}]},
    ], global_batch_size=129)
    out = tmp_path / "export"
    report = export.write_export_report(cfg, out, image="img:1")
    assert len(report.skipped) == 1 and "different GPU counts" in str(report.skipped[0])
    names = sorted(str(p.relative_to(out)) for p in report.paths)
    assert names == sorted(["config.yaml", "tf_config/worker-0.json", "tf_config/worker-1.json", "launch-a.sh",
                            "launch-b.sh", export.SKIPPED_NOTE])
    assert "different GPU counts" in (out / export.SKIPPED_NOTE).read_text()
    assert not (out / "tfjob.yaml").exists() and not (out / "Dockerfile").exists() and not (out / "clusterdeck").exists()
    assert json.loads((out / "tf_config" / "worker-1.json").read_text())["task"] == {"type": "worker", "index": 1}
    again = export.write_export(cfg, tmp_path / "again", image="img:1")  # the paths alone, as the CLI prints them
    assert sorted(str(p.relative_to(tmp_path / "again")) for p in again) == names


def test_a_slurm_group_exports_a_tfjob_but_no_launch_script() -> None:
    cfg = config_mod.load(ROOT / "presets" / "slurm-async.yaml")
    manifest = export.tfjob_manifest(cfg, image="img:1")
    check_tfjob_v1(manifest)
    assert {k: v["replicas"] for k, v in manifest["spec"]["tfReplicaSpecs"].items()} == \
        {"Chief": 1, "Worker": 2, "PS": 1}
    with pytest.raises(ConfigError, match=r"cluster.hosts\[0\].kind: host 'slurm' is a Slurm group"):
        export.launch_scripts(cfg)
