"""Reliability, round three: no code the user did not choose. Slurm options that run programs are refused before
launch (or shown, with the opt-in); a host's ``python`` must be a Python interpreter; run folders are the user's
own, and nothing planted in one (a ``config.yaml``, a ``log.txt`` link) is used or followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Host, Task, replace
from engine.contract.run_folder import RunFolder
from engine.contract.supervisor_spec import SPEC_VERSION
from engine.control import unchosen_code
from engine.control.launcher import Run, launch_problems
from tests.conftest import PRESETS, ROOT
from tests.engine.test_faults import fake_run, start_and_wait_for_steps

#: The family: Slurm options of a shared preset -> words of the refusal
SLURM_OPTIONS = {
    ("srun_options", "--prolog=prolog.sh"): "runs a program on the nodes",
    ("srun_options", "--task-prolog=/tmp/x.sh"): "runs a program on the nodes",
    ("srun_options", "--epilog=/tmp/x.sh"): "runs a program on the nodes",
    ("srun_options", "--task-epilog=/tmp/x.sh"): "runs a program on the nodes",
    ("srun_options", "--prol=x.sh"): "(--prolog) runs a program",
    ("sbatch_options", "--wrap=id"): "runs a command",
    ("sbatch_options", "--output=/root/.bashrc"): "writes or reads a file outside the run folder",
    ("srun_options", "-o/root/.bashrc"): "writes or reads a file outside the run folder",
    ("srun_options", "--export=ALL,LD_PRELOAD=/tmp/x.so"): "sets LD_PRELOAD",
}


def _slurm_config(field: str, option: str, allow: bool = False) -> config_mod.RunConfig:
    cfg = config_mod.load(PRESETS / "slurm-data.yaml")
    host = cfg.cluster.hosts[0]
    assert host.slurm is not None
    slurm = replace(host.slurm, **{field: (option,)})
    if allow:
        object.__setattr__(slurm, "allow_program_options", True)  # the field the config model is to get
    return replace(cfg, cluster=replace(cfg.cluster, hosts=(replace(host, slurm=slurm),)))


@pytest.mark.parametrize(("field", "option"), sorted(SLURM_OPTIONS))
def test_slurm_options_that_run_programs_are_refused_before_launch(field: str, option: str) -> None:
    cfg = _slurm_config(field, option)
    problems = launch_problems(cfg)  # every path to a launch, the app's pre-checked one included
    assert problems and problems[0].field == f"cluster.hosts[0].slurm.{field}", problems
    assert SLURM_OPTIONS[(field, option)] in problems[0].message


def test_harmless_slurm_options_pass_and_the_opt_in_is_shown_before_launch() -> None:
    assert unchosen_code.problems(_slurm_config("srun_options", "--exclusive")) == []
    allowed = _slurm_config("srun_options", "--prolog=prolog.sh", allow=True)
    assert unchosen_code.problems(allowed) == []
    shown = unchosen_code.shown(allowed)
    assert shown and "allow_program_options is on" in shown[0].message and "--prolog" in shown[0].message


@pytest.mark.parametrize("python", ["/tmp/payload.sh", "bash", "/usr/bin/env"])
def test_a_hosts_python_must_be_a_python_interpreter(python: str) -> None:
    cfg = config_mod.load(PRESETS / "slurm-data.yaml")
    cfg = replace(cfg, cluster=replace(cfg.cluster, hosts=(replace(cfg.cluster.hosts[0], python=python),)))
    problems = unchosen_code.problems(cfg)
    assert problems and problems[0].field == "cluster.hosts[0].python" and "not a Python interpreter" in \
        problems[0].message
    for fine in ("python3", "/opt/venv/bin/python", "python3.11", sys.executable):
        ok = replace(cfg, cluster=replace(cfg.cluster, hosts=(replace(cfg.cluster.hosts[0], python=fine),)))
        assert unchosen_code.python_problems(ok) == []
    remote = Host(name="r", address="10.0.0.9", python="/opt/venv/bin/python", tasks=(Task("worker", 0),))
    shown = unchosen_code.shown(replace(cfg, cluster=replace(cfg.cluster, hosts=(remote,))))
    assert shown and "runs '/opt/venv/bin/python' on 'r'" in shown[0].message


def _supervise(run_dir: Path, config_yaml: str) -> subprocess.CompletedProcess[str]:
    """The real supervisor, as a transport starts it on a host, with a spec of no tasks."""
    spec = {"v": SPEC_VERSION, "run_dir": str(run_dir), "host": "remote", "tasks": [], "config_yaml": config_yaml}
    return subprocess.run([sys.executable, "-m", "engine.control.supervisor"], input=json.dumps(spec) + "\n",
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_a_planted_config_yaml_is_never_used(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "config.yaml").write_text("planted: true\n")
    ours = config_mod.dumps(config_mod.load(PRESETS / "data-2workers.yaml"))
    out = _supervise(run_dir, ours)
    assert out.returncode == 0, out.stderr
    assert (run_dir / "config.yaml").read_text() == ours


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_a_run_folder_another_user_made_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("planted: true\n")
    os.chown(run_dir, 65534, 65534)
    os.chown(run_dir / "config.yaml", 65534, 65534)
    out = _supervise(run_dir, "name: x\n")
    assert out.returncode == 4 and "belongs to another user (uid 65534" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert (run_dir / "config.yaml").read_text() == "planted: true\n"


def test_a_log_planted_as_a_link_is_never_followed(runs_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run_dir = runs_root / "planted"
    (run_dir / "tasks" / "worker-0").mkdir(parents=True)
    (run_dir / "tasks" / "worker-0" / "log.txt").symlink_to(victim)
    template = fake_run(runs_root, worker_0="forever", worker_1="forever")  # stand-in tasks, into that folder
    run = Run(template.config, run_dir=run_dir, python=template.python, task_env=template.task_env, checked=True)
    start_and_wait_for_steps(run, 30)
    run.stop()
    assert victim.read_text() == "precious\n"
    log = RunFolder(run_dir).task_log("worker:0")
    assert not log.is_symlink() and "replaced, never followed" in log.read_text()


def test_the_scripts_a_preset_runs_are_said_before_launch() -> None:
    from engine.control import unchosen_code

    presets = Path(__file__).resolve().parents[2] / "presets"
    cfg = config_mod.load(presets / "data-user-script.yaml")
    said = {p.field: p.message for p in unchosen_code.shown(cfg)}
    assert "model.script" in said and "user_script.py" in said["model.script"] and "every task" in said["model.script"]
    assert unchosen_code.shown(config_mod.load(presets / "data-2workers.yaml")) == []
