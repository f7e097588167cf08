"""Warm start: a host's tasks forked from one template that imported TensorFlow once, each then owned by
its supervisor exactly as a task it started cold (parent, process group, death with the supervisor)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract import parent_death, warm_start
from engine.contract.config import replace
from engine.contract.run_folder import RunFolder
from engine.control.launcher import Run
from engine.control.warm_tasks import ForkedTask, Template, TemplateError, template_env
from tests.conftest import PRESETS, ROOT, EventRecorder, alive, wait_gone

BASE = {"PATH": "/usr/bin", "TF_CPP_MIN_LOG_LEVEL": "1", "CUDA_VISIBLE_DEVICES": "", "CLUSTERDECK_RUN_DIR": "/r"}


def test_a_task_is_forked_only_where_it_differs_in_what_is_read_after_the_import() -> None:
    task = dict(BASE, TF_CONFIG='{"task": {}}', CLUSTERDECK_TASK="worker:1", TF_NUM_INTRAOP_THREADS="1",
                TF_NUM_INTEROP_THREADS="2", DTENSOR_CLIENT_ID="1")
    assert warm_start.can_fork(BASE, task)
    # read when TensorFlow is imported: the task must start cold
    assert not warm_start.can_fork(BASE, dict(task, TF_ENABLE_ONEDNN_OPTS="0"))
    assert not warm_start.can_fork(BASE, dict(task, TF_CPP_MIN_LOG_LEVEL="0"))
    assert not warm_start.can_fork(BASE, {k: v for k, v in task.items() if k != "PATH"})
    # a GPU: cold where NVIDIA's driver is there, forked where the GPUs are emulated (nothing reads it)
    gpu = dict(task, CUDA_VISIBLE_DEVICES="0,1")
    assert not warm_start.can_fork(BASE, gpu, gpu_driver=True)
    assert warm_start.can_fork(BASE, gpu, gpu_driver=False)
    assert not warm_start.can_fork(dict(BASE, CUDA_VISIBLE_DEVICES="0"), task, gpu_driver=True)
    # the template's own environment hides every GPU and keeps the run's folder (what finds its processes)
    assert template_env(dict(BASE, CUDA_VISIBLE_DEVICES="3")) == BASE


def test_a_template_starts_where_some_task_could_be_forked() -> None:
    cpu_and_gpu = [(), (0,), (1,)]  # an async ps and two workers with a GPU each
    assert warm_start.template_useful({}, cpu_and_gpu, gpu_driver=True)
    assert not warm_start.template_useful({}, [(0,), (1,)], gpu_driver=True)  # real GPUs only: all cold
    assert warm_start.template_useful({}, [(0,), (1,)], gpu_driver=False)  # emulated GPUs
    assert not warm_start.template_useful({warm_start.WARM_START_ENV: "0"}, cpu_and_gpu, gpu_driver=False)


def test_a_forked_task_reads_as_a_popen_does() -> None:
    ended = ForkedTask(os.posix_spawn("/bin/sh", ["sh", "-c", "exit 3"], dict(os.environ)))
    assert ended.wait(10) == 3 and ended.poll() == 3
    sleeping = ForkedTask(os.posix_spawn("/bin/sh", ["sh", "-c", "sleep 30"], dict(os.environ)))
    assert sleeping.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(0.05)
    os.kill(sleeping.pid, signal.SIGKILL)
    assert sleeping.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("0", False), ("off", False), ("false", False)])
def test_the_switch(value: str, on: bool) -> None:
    assert warm_start.enabled({warm_start.WARM_START_ENV: value} if value else {}) is on


def test_junk_from_a_template_is_no_message() -> None:
    assert warm_start.decode(b"") is None
    assert warm_start.decode(b"\xff\xfe") is None
    assert warm_start.decode(b"[1, 2]") is None
    assert warm_start.decode(warm_start.encode({"pid": 5})) == {"pid": 5}


def _wait_readable(template: Template, timeout: float) -> None:
    sel = selectors.DefaultSelector()
    sel.register(template.fileno(), selectors.EVENT_READ)
    assert sel.select(timeout), "the template said nothing"
    sel.close()


def test_a_template_that_cannot_import_says_so_and_forks_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "site"
    (broken / "keras").mkdir(parents=True)
    (broken / "keras" / "__init__.py").write_text("raise ImportError('no keras here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(broken), str(ROOT)]), CUDA_VISIBLE_DEVICES="")
    log = tmp_path / "template.log"
    template = Template(sys.executable, tmp_path, env, log, {})
    try:
        _wait_readable(template, 60)
        template.read_ready()
        assert not template.ready and "ended while importing" in template.error
        assert "no keras here" in log.read_text()
        r, w = os.pipe()
        with pytest.raises(TemplateError):
            template.fork(["--run-dir", str(tmp_path)], env, str(tmp_path), (), (w, w, r))
        os.close(r)
        os.close(w)
    finally:
        template.close()


def _supervisor_of(pid: int) -> psutil.Process:
    parent = psutil.Process(pid).parent()
    assert parent is not None
    return parent


def _small(steps: int) -> config_mod.RunConfig:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    return replace(cfg, training=replace(cfg.training, steps=steps, epochs=None))


@pytest.mark.cluster
@pytest.mark.skipif(not parent_death.available(), reason="warm start needs PR_SET_CHILD_SUBREAPER (Linux)")
def test_forked_tasks_are_the_supervisors_own_and_die_with_it(runs_root: Path) -> None:
    run = Run(_small(100_000), runs_root=runs_root)
    got_step = threading.Event()
    run.add_listener(lambda e: got_step.set() if e["kind"] == "step" else None)
    run.start()
    try:
        assert got_step.wait(90), "no step within 90 s"
        tasks = [run.state.tasks[name].pid for name in ("worker:0", "worker:1")]
        assert all(tasks)
        supervisor = _supervisor_of(tasks[0])  # type: ignore[arg-type]
        assert "engine.control.supervisor" in " ".join(supervisor.cmdline())
        # the template, and the tasks forked from it, have one command line: the template is the one not a task
        (template,) = [c for c in supervisor.children()
                       if warm_start.TEMPLATE_FLAG in c.cmdline() and c.pid not in tasks]
        for pid in tasks:
            assert pid is not None
            assert _supervisor_of(pid).pid == supervisor.pid, "a forked task is its supervisor's child"
            assert os.getpgid(pid) == pid, "in a process group of its own (what a stop signals)"
            assert pid != template.pid and psutil.Process(pid).ppid() != template.pid
        for name in ("worker:0", "worker:1"):
            log = RunFolder(run.run_dir).task_log(name).read_text()
            assert f"starting {name} (forked, warm)" in log
        # the kernel ends the forked tasks, and the template, with their supervisor
        supervisor.kill()
        assert wait_gone([*tasks, template.pid], 3.0) == [], "forked tasks outlived their supervisor"  # type: ignore[list-item]
    finally:
        run.stop()
        run.wait(20)
    assert not alive(run.pids())


@pytest.mark.cluster
def test_with_warm_start_off_every_task_starts_cold(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(warm_start.WARM_START_ENV, "0")
    run = Run(_small(20), runs_root=runs_root)
    run.start()
    assert run.wait(120) == "finished", run.state.summary()
    for name in ("worker:0", "worker:1"):
        log = RunFolder(run.run_dir).task_log(name).read_text()
        assert f"starting {name}\n" in log and "forked" not in log


@pytest.mark.cluster
@pytest.mark.skipif(not parent_death.available(), reason="warm start needs PR_SET_CHILD_SUBREAPER (Linux)")
def test_a_stop_while_the_template_imports_stops_every_task_unstarted(runs_root: Path) -> None:
    run = Run(_small(100_000), runs_root=runs_root)
    seen: list[dict] = []
    run.add_listener(seen.append)
    run.start()
    time.sleep(0.5)  # the template takes seconds to import TensorFlow: the stop comes while it does
    t0 = time.monotonic()
    run.stop()
    assert run.wait(10) == "stopped"
    assert time.monotonic() - t0 < 3.0, "a stop must not wait for TensorFlow's import"
    assert {t.state for t in run.state.tasks.values()} == {"stopped"}
    assert not any(e["kind"] == "status" and e.get("state") == "starting" for e in seen)


@pytest.mark.cluster
@pytest.mark.skipif(not parent_death.available(), reason="warm start needs PR_SET_CHILD_SUBREAPER (Linux)")
def test_a_lost_template_leaves_the_run_to_cold_starts(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_TEST_STEP_DELAY", "chief:0=0.01")  # cores stay free for the cold restart
    cfg = config_mod.load(PRESETS / "async-1ps.yaml")
    run = Run(replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0)), runs_root=runs_root)
    rec = EventRecorder()
    run.add_listener(rec)
    run.start()
    try:
        deadline = time.monotonic() + 120
        while not rec.of("step"):
            assert time.monotonic() < deadline and run.state.state in ("starting", "running"), run.state.reason
            time.sleep(0.1)
        tasks = {t.pid for t in run.state.tasks.values()}
        worker = run.state.tasks["worker:1"].pid
        assert worker is not None
        supervisor = _supervisor_of(worker)
        (template,) = [c for c in supervisor.children()
                       if warm_start.TEMPLATE_FLAG in c.cmdline() and c.pid not in tasks]
        template.kill()  # the template is lost (an OOM kill, say), then a worker
        os.kill(worker, signal.SIGKILL)
        while not any(e["task"] == "worker:1" and e["state"] == "running" and e.get("pid") not in (None, worker)
                      for e in rec.of("status")):
            assert time.monotonic() < deadline + 60, "the lost worker was never restarted"
            assert run.state.state == "running", run.state.reason
            time.sleep(0.1)
    finally:
        run.stop()
        run.wait(30)
    log = RunFolder(run.run_dir).task_log("worker:1").read_text()
    # forked first; then cold, said either at the start (the template's end seen) or after the failed fork
    starts = [line for line in log.splitlines() if line.startswith("---") and "starting worker:1" in line]
    assert starts[0].endswith("starting worker:1 (forked, warm)"), log[-1500:]
    # the restart: a plain cold start, or a fork tried on the dead template and then a cold start
    restart = starts[1:]
    assert len(restart) in (1, 2), log[-1500:]
    assert restart[-1].endswith(("starting worker:1", "starting worker:1 cold")), log[-1500:]
    if len(restart) == 2:
        assert restart[0].endswith("(forked, warm)") and "template failed" in restart[1], log[-1500:]
    assert any("tasks start cold" in str(e.get("message")) for e in rec.of("info")), "the switch is said"


#: A template's fork path driven alone: this process is the supervisor (a subreaper) and the template at once; each
#: task is slow to run after its fork (as on a busy core) and says when it began its own work (CLOCK_MONOTONIC is one
#: clock for every process).
_FORK_SLOW_TASKS = r"""
import os, socket, sys, tempfile, time
from engine.contract import parent_death
from engine.runtime import template
assert parent_death.become_subreaper()
folder = tempfile.mkdtemp()
ours, _theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
real_fork, depth = os.fork, [0]
def slow_task_fork():  # the task (the middle's child) is slow to run: its middle process has exited by then
    pid = real_fork()
    if pid == 0:
        depth[0] += 1
        if depth[0] == 2:
            time.sleep(0.3)
    return pid
os.fork = slow_task_fork
def task_main(args):
    print(f"{time.monotonic():.6f}", flush=True)
    os._exit(0)
delays = []
for i in range(3):
    log = os.open(os.path.join(folder, f"task{i}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    ev_r, ev_w = os.pipe()
    life_r, life_w = os.pipe()
    request = {"args": [], "env": dict(os.environ), "cwd": folder, "cores": [], "parent": os.getpid()}
    began = time.monotonic()
    pid = template._fork_task(ours, request, [log, ev_w, life_r], task_main)
    for fd in (log, ev_w, life_r):
        os.close(fd)
    os.waitpid(pid, 0)
    with open(os.path.join(folder, f"task{i}.log")) as fh:
        delays.append(float(fh.read().split()[0]) - began)
print("DELAYS", " ".join(f"{d:.3f}" for d in delays))
"""


@pytest.mark.skipif(not parent_death.available(), reason="warm start needs PR_SET_CHILD_SUBREAPER (Linux)")
def test_a_forked_task_starts_at_once_even_where_its_middle_process_exits_first() -> None:
    # on a busy core the middle process may run on after its fork and exit before the task runs at all: the task,
    # reparented already, must not wait for a reparenting that happened (its timeout, 5 s: 64 tasks over 8
    # one-core hosts lost 5 s at their start that way, docs/benchmarks.md 4d)
    done = subprocess.run([sys.executable, "-c", _FORK_SLOW_TASKS], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    delays = [float(d) for d in done.stdout.split("DELAYS", 1)[1].split()]
    assert max(delays) < 2.0, delays  # 0.3 s of its own slowness, not 5.3


def test_a_forked_task_takes_the_config_its_template_read_only_while_the_file_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.runtime import task

    monkeypatch.setattr(task, "_preloaded", None)
    path = tmp_path / "config.yaml"
    path.write_text(config_mod.dumps(_small(7)))
    task.preload_config(path)  # in the template, before it forks
    assert task.load_config(path) is task._preloaded[1]  # type: ignore[index]
    assert task.load_config(path).training.steps == 7
    path.write_text(config_mod.dumps(_small(9)))  # rewritten since: read again
    assert task.load_config(path).training.steps == 9
    path.write_text("not: [a config")
    task.preload_config(path)  # a file it cannot read: each task reads it, and says what is wrong
    assert task._preloaded is None
    with pytest.raises(config_mod.ConfigError):
        task.load_config(path)
