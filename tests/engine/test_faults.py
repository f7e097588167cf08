"""Faults as users meet them: killed, frozen and hung tasks, a killed supervisor or launcher, a run folder
that fills up, turns read-only or vanishes, leftover children, stops that flush, and exposed ports.

Control-side cases run real supervisors and real signals with a TensorFlow-free stand-in task
(``tests/engine/fake_python.py``); the ``cluster`` cases run real TensorFlow tasks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import Cluster, Host, Task, replace
from engine.contract.run_folder import RunFolder
from engine.control import netns
from engine.control.launcher import Run
from engine.observe.run_reader import read_events
from tests.conftest import PRESETS, ROOT, alive, require, wait_gone

FAKE_PYTHON = str(Path(__file__).with_name("fake_python.py"))


def long_run(cfg: config_mod.RunConfig) -> config_mod.RunConfig:
    return replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))


def start_and_wait_for_steps(run: Run, timeout: float = 90, tasks: tuple[str, ...] = ()) -> None:
    """Start ``run`` and wait for a step (from each of ``tasks``, when given)."""
    seen: set[str] = set()
    got = threading.Event()

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "step":
            seen.add(e["task"])
            if set(tasks) <= seen:
                got.set()

    run.add_listener(on_event)
    run.start()
    assert got.wait(timeout), f"no step from {set(tasks) - seen or 'any task'} within {timeout} s: {run.state.summary()}"


BOTH = ("worker:0", "worker:1")


def fake_run(runs_root: Path, *, steps: int = 100_000, mode: str = "data", progress_timeout_s: float = 0.0,
             **task_modes: str) -> Run:
    """A run of stand-in tasks (no TensorFlow): ``worker_1="spin"`` sets what worker:1 does."""
    preset = "async-1ps.yaml" if mode == "async" else "data-2workers.yaml"
    cfg = config_mod.load(PRESETS / preset)
    cfg = replace(cfg, training=replace(cfg.training, steps=steps, checkpoint_every=0, restarts=0,
                                        progress_timeout_s=progress_timeout_s))
    env = {f"FAKE_{k}": v for k, v in task_modes.items() if k != "children"}
    if "children" in task_modes:
        env["FAKE_CHILDREN"] = task_modes["children"]
    return Run(cfg, runs_root=runs_root, python=FAKE_PYTHON, task_env=env, checked=True)


def read_events_checked(path: Path) -> list[dict[str, Any]]:
    """Every line of an events file, each of which must be a valid event."""
    lines = [line for line in path.read_bytes().split(b"\n") if line]
    decoded = [events.decode(line) for line in lines]
    assert all(e is not None for e in decoded), "a line of events.jsonl is not a valid event"
    return [e for e in decoded if e is not None]


# -- real TensorFlow tasks


@pytest.mark.cluster
def test_frozen_worker_fails_the_run_naming_it(runs_root: Path) -> None:
    run = Run(long_run(config_mod.load(PRESETS / "data-2workers.yaml")), runs_root=runs_root)
    start_and_wait_for_steps(run)
    pids = run.pids()
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGSTOP)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "worker:1"
    assert "frozen" in run.state.reason and not run.state.reason.startswith("worker:1")
    assert wait_gone(pids, 3) == []
    assert any(e["kind"] == "step" for e in read_events(run.run_dir))
    # the other task was stopped because of it, not "by the user"
    assert run.state.tasks["worker:0"].reason in ("stopped because worker:1 failed", "")


@pytest.mark.cluster
def test_killed_chief_fails_the_run_and_stops_the_worker(runs_root: Path) -> None:
    cfg = long_run(config_mod.default_config())
    cfg = replace(cfg, cluster=Cluster(hosts=(Host(name="local", tasks=(Task("chief", 0), Task("worker", 0))),)))
    run = Run(cfg, runs_root=runs_root)
    start_and_wait_for_steps(run)
    pids = run.pids()
    os.kill(run.state.tasks["chief:0"].pid or 0, signal.SIGKILL)
    t0 = time.monotonic()
    assert run.wait(15) == "failed"
    assert time.monotonic() - t0 < 10
    assert run.state.failed_task == "chief:0"
    assert run.state.reason == "killed by SIGKILL"  # the task's name is not repeated in the reason
    assert wait_gone(pids, 3) == []


HANG_SCRIPT = '''
import os
import keras


def build_model(config):
    if os.environ.get("CLUSTERDECK_TASK") == "worker:1":
        while True:  # the user's bug: an endless loop on one worker
            pass
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(10)])
'''


@pytest.mark.cluster
def test_a_task_stuck_in_python_fails_a_synchronous_run_naming_it(runs_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG_SCRIPT)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, model=replace(cfg.model, name="script", script=str(script)),
                  training=replace(cfg.training, steps=100_000, progress_timeout_s=6.0))
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    t0 = time.monotonic()
    assert run.wait(90) == "failed", run.state.summary()
    assert 18 <= time.monotonic() - t0 < 50  # 3 x 6 s for the first step
    assert run.state.failed_task == "worker:1", run.state.reason
    assert "hung" in run.state.reason and "first step" in run.state.reason


def reachable(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` in this (the host's) network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_port_probe_notices_a_listening_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert reachable(port)
    assert not reachable(port)


@pytest.mark.cluster
@pytest.mark.parametrize("isolate", [True, False])
def test_tensorflow_ports_are_unreachable_from_the_host_only_when_isolated(runs_root: Path, isolate: bool) -> None:
    if isolate:
        ok, why = netns.available()
        require(ok, f"network namespaces are not available: {why}")
    run = Run(long_run(config_mod.load(PRESETS / "data-2workers.yaml")), runs_root=runs_root, isolate=isolate)
    start_and_wait_for_steps(run)  # the workers talk to each other over these ports
    try:
        ports = [p.port for p in run.plans if p.port]
        assert len(ports) == 2 and run.isolated == isolate
        open_ports = [p for p in ports if reachable(p)]
        if isolate:
            assert open_ports == [], f"TensorFlow ports reachable from the host: {open_ports}"
            # the tasks do listen (they train together), but only inside their namespace
            listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            assert not set(ports) & listening
            assert any(e.get("isolated") for e in run.state.infos)
        else:
            assert open_ports, "the probe sees no TensorFlow port even without isolation: it proves nothing"
            assert any(e.get("warning") == "ports-exposed" for e in run.state.infos), "the user is not warned"
    finally:
        run.stop()
    assert run.wait(10) == "stopped"
    assert [p for p in ports if reachable(p)] == [], "a run left a listening port"


@pytest.mark.cluster
def test_stop_storm_leaves_no_process_or_fd(runs_root: Path) -> None:
    """A short stop storm: one stop at each moment (the benchmark bench/stop_storm.py runs 100 cycles)."""
    cfg = long_run(config_mod.load(PRESETS / "data-2workers.yaml"))
    me = psutil.Process()
    fds_before = me.num_fds()
    for cycle in range(3):
        run = Run(cfg, runs_root=runs_root)
        run.start()
        # stop at different moments: at once, while TF imports, after the first steps
        if cycle % 3 == 1:
            time.sleep(1.0)
        elif cycle % 3 == 2:
            got = threading.Event()
            run.add_listener(lambda e, got=got: got.set() if e["kind"] == "step" else None)
            got.wait(90)
        pids = run.pids()
        run.stop()
        assert run.wait(5) in ("stopped", "failed")
        assert wait_gone(pids, 3) == [], f"cycle {cycle}: processes left"
        assert RunFolder(run.run_dir).read_meta()["state"] == run.state.state
    assert me.num_fds() <= fds_before + 2, "file descriptors leak across runs"


# -- stand-in tasks: the control side with real processes and signals


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_run_json_is_kept_current_while_the_run_runs(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30, BOTH)
    folder = RunFolder(run.run_dir)
    wait_for(lambda: folder.read_meta().get("step", 0) > 0, 5, "run.json to show the step")
    meta = folder.read_meta()
    assert meta["state"] == "running" and meta["launcher"]["pid"] == os.getpid()
    assert {t["pid"] for t in meta["tasks"].values()} == {run.state.tasks[n].pid for n in ("worker:0", "worker:1")}
    assert meta["supervisors"]["localhost"]["pid"] in run.pids()
    assert folder.effective_state() == "running"
    created = meta["created"]
    run.stop()
    meta = folder.read_meta()
    assert meta["state"] == "stopped" and meta["created"] == created and "ended" in meta
    # the tasks were stopped by the user, and say so
    assert {t.reason for t in run.state.tasks.values()} == {"stopped by the user"}


def test_a_finished_runs_servers_read_finished_not_stopped_by_the_user(runs_root: Path) -> None:
    run = fake_run(runs_root, mode="async", steps=30, worker_0="idle", worker_1="idle")
    run.start()
    assert run.wait(30) == "finished", run.state.summary()
    states = {n: (t.state, t.reason) for n, t in run.state.tasks.items()}
    assert states["chief:0"][0] == "finished"
    assert all(state == "finished" and "user" not in reason for state, reason in states.values()), states


def test_a_failed_runs_other_tasks_read_stopped_because_it_failed(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30, BOTH)
    os.kill(run.state.tasks["worker:1"].pid or 0, signal.SIGKILL)
    assert run.wait(10) == "failed"
    assert (run.state.failed_task, run.state.reason) == ("worker:1", "killed by SIGKILL")
    assert run.state.tasks["worker:0"].reason == "stopped because worker:1 failed"


def test_a_killed_supervisor_is_blamed_not_a_task(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30, BOTH)
    pids = run.pids()
    supervisor = RunFolder(run.run_dir).read_meta()["supervisors"]["localhost"]["pid"]
    os.kill(supervisor, signal.SIGKILL)
    t0 = time.monotonic()
    assert run.wait(10) == "failed"
    assert time.monotonic() - t0 < 5
    assert run.state.failed_task == "supervisor@localhost"
    assert "killed by SIGKILL" in run.state.reason and "ended without finishing" not in run.state.reason
    assert wait_gone(pids, 5) == []


def test_an_ssh_that_cannot_connect_is_blamed_with_its_own_message(runs_root: Path) -> None:
    require(subprocess.run(["which", "ssh"], capture_output=True).returncode == 0, "no ssh client")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = Host(name="far", address="127.0.0.1", ssh_host="127.0.0.1", ssh_port=port, python=sys.executable,
                  tasks=(Task("worker", 0), Task("worker", 1)))
    cfg = config_mod.default_config()
    cfg = replace(cfg, cluster=Cluster(hosts=(remote,)), training=replace(cfg.training, steps=100))
    run = Run(cfg, runs_root=runs_root, checked=True)
    run.start()
    assert run.wait(20) == "failed"
    assert run.state.failed_task == "supervisor@far"
    assert run.state.reason.startswith("ssh to 127.0.0.1 failed") and "refused" in run.state.reason.lower()


@pytest.fixture
def immutable_cleanup() -> Iterator[list[Path]]:
    paths: list[Path] = []
    yield paths
    for path in paths:
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


def test_an_event_file_made_immutable_fails_the_run_saying_so(runs_root: Path, immutable_cleanup: list[Path]) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30)
    target = run.run_dir / "events.jsonl"
    done = subprocess.run(["chattr", "+i", str(target)], capture_output=True)
    require(done.returncode == 0, f"chattr +i does not work here: {done.stderr.decode().strip()}", needed_in_ci=False)
    immutable_cleanup.append(target)
    t0 = time.monotonic()
    assert run.wait(10) == "failed", run.state.summary()
    assert time.monotonic() - t0 < 5
    assert run.state.failed_task == "launcher"
    assert "run folder cannot be written" in run.state.reason and "Operation not permitted" in run.state.reason
    read_events_checked(target)



def test_a_full_disk_fails_the_run_within_seconds_and_the_events_stay_valid(tiny_tmpfs: Path) -> None:
    run = fake_run(tiny_tmpfs, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30)
    with open(tiny_tmpfs / "filler", "wb") as fh:  # someone else fills the disk
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    t0 = time.monotonic()
    assert run.wait(10) == "failed", run.state.summary()
    assert time.monotonic() - t0 < 5
    assert run.state.failed_task == "launcher" and "No space left on device" in run.state.reason
    read_events_checked(run.run_dir / "events.jsonl")  # whole, valid lines (the lifecycle)
    read_events(run.run_dir)  # the samples' store reads back (what a full disk let it write: whole records)


def test_a_deleted_run_folder_fails_the_run_and_is_not_recreated(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30)
    t0 = time.monotonic()
    for _ in range(10):  # rm -rf races the launcher's own writes (a file appears while rm empties the folder)
        if subprocess.run(["rm", "-rf", str(run.run_dir)], capture_output=True).returncode == 0:
            break
    assert run.wait(10) == "failed"
    assert time.monotonic() - t0 < 5
    assert run.state.failed_task == "launcher" and "vanished" in run.state.reason
    time.sleep(0.5)
    assert not run.run_dir.exists(), "the run folder was recreated"


def test_no_child_of_a_task_survives_the_run_even_of_a_task_that_died(runs_root: Path, tmp_path: Path) -> None:
    children = tmp_path / "children.txt"
    run = fake_run(runs_root, worker_0="spawn", worker_1="forever", children=str(children))
    start_and_wait_for_steps(run, 30, BOTH)
    wait_for(children.exists, 10, "the children")
    in_group, own_session = (int(x) for x in children.read_text().split())
    assert alive([in_group, own_session]) == [in_group, own_session]
    os.kill(run.state.tasks["worker:0"].pid or 0, signal.SIGKILL)  # the task dies, its children would not
    assert run.wait(10) == "failed"
    assert wait_gone([in_group, own_session], 5) == [], "a child of a task outlived the run"


def test_a_hung_task_fails_a_synchronous_run_naming_it(runs_root: Path) -> None:
    # worker:1 spins in Python before its first step; worker:0 waits for it, idle (as in a collective)
    run = fake_run(runs_root, progress_timeout_s=2.0, worker_0="idle", worker_1="spin")
    run.start()
    t0 = time.monotonic()
    assert run.wait(20) == "failed", run.state.summary()
    assert time.monotonic() - t0 < 12
    assert run.state.failed_task == "worker:1", run.state.reason
    assert "no first step within 6 s" in run.state.reason


def test_a_hung_async_worker_is_restarted_like_a_lost_one(runs_root: Path) -> None:
    # the chief's steps all run on worker 0: worker 1 makes no progress
    run = fake_run(runs_root, mode="async", progress_timeout_s=1.0, chief_0="forever", worker_0="idle",
                   worker_1="idle")
    restarted = threading.Event()
    run.add_listener(lambda e: restarted.set() if e["kind"] == "status" and e["task"] == "worker:1"
                     and e.get("state") == "restarting" else None)
    run.start()
    assert restarted.wait(15), run.state.summary()
    assert run.state.state == "running"
    assert "hung" in run.state.tasks["worker:1"].reason
    run.stop()
    assert run.wait(10) == "stopped"


def test_stop_gives_tasks_sigterm_and_a_grace_to_flush(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="flush", worker_1="ignore_term")
    finals: list[dict[str, Any]] = []
    run.add_listener(lambda e: finals.append(e) if e.get("final") else None)
    start_and_wait_for_steps(run, 30, BOTH)
    stubborn = run.state.tasks["worker:1"].pid or 0
    t0 = time.monotonic()
    run.stop()
    took = time.monotonic() - t0
    assert run.wait(5) == "stopped"
    assert [e["task"] for e in finals] == ["worker:0"]  # its last step, written on SIGTERM, arrived
    assert 2.5 <= took < 6, took  # the task ignoring SIGTERM got its grace, then SIGKILL
    assert wait_gone([stubborn], 2) == []


def test_a_malformed_command_is_counted_and_ignored(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30, BOTH)
    sup = run.core.supervisors[0]
    assert sup.send("stop")  # the old text protocol: not a command any more
    assert sup.send('{"v": 2, "command": "stop"}')
    assert sup.send('{"v": 1, "command": "signal", "task": "worker:0", "signal": "NOPE"}')
    wait_for(lambda: sum("malformed command" in str(i.get("message")) for i in run.state.infos) >= 3, 5,
             "the supervisor to report the malformed commands")
    assert run.state.state == "running"
    assert run.send("worker:1", "signal", signal="SIGKILL")  # a well-formed one is obeyed
    assert run.wait(10) == "failed" and run.state.failed_task == "worker:1"


def test_the_dispatcher_survives_an_internal_error_and_ends_the_run(runs_root: Path) -> None:
    run = fake_run(runs_root, worker_0="forever", worker_1="forever")
    start_and_wait_for_steps(run, 30)
    real_apply = run.state.apply
    calls = {"n": 0}

    def broken(event: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        real_apply(event)

    run.state.apply = broken  # type: ignore[method-assign]
    assert run.wait(10) == "failed"
    assert run.state.failed_task == "launcher" and "internal error" in run.state.reason


LAUNCH_AND_WAIT = """
import sys, time
from engine.contract import config as config_mod
from engine.contract.config import replace
from engine.control.launcher import Run
cfg = config_mod.load(sys.argv[1])
cfg = replace(cfg, training=replace(cfg.training, steps=100000))
run = Run(cfg, runs_root=sys.argv[2], python=sys.argv[3], task_env={"FAKE_worker_0": "forever",
          "FAKE_worker_1": "forever"}, checked=True)
run.start()
while run.state.step == 0:
    time.sleep(0.05)
print(run.run_dir, flush=True)
time.sleep(600)
"""


def test_a_run_whose_launcher_was_killed_reads_interrupted(runs_root: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH_AND_WAIT, str(PRESETS / "data-2workers.yaml"),
                                 str(runs_root), FAKE_PYTHON], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert launcher.stdout is not None
        run_dir = Path(launcher.stdout.readline().decode().strip())
        folder = RunFolder(run_dir)
        wait_for(lambda: len(folder.read_meta().get("tasks", {})) == 2 and all(
            t.get("pid") for t in folder.read_meta()["tasks"].values()), 10, "run.json to list the tasks")
        pids = [t["pid"] for t in folder.read_meta()["tasks"].values()]
        assert folder.effective_state() == "running"
        launcher.kill()  # kill -9 of the CLI or the app
        launcher.wait()
        assert folder.effective_state() == "interrupted"
        assert wait_gone(pids, 10) == [], "tasks outlived their launcher"
    finally:
        launcher.kill()
        launcher.wait()


def test_a_run_says_when_its_local_tasks_outnumber_the_cpus(runs_root: Path) -> None:
    from engine.control import machine_fit

    cpus = machine_fit.cpu_count()
    hosts = (Host(name="local", tasks=tuple(Task("worker", i) for i in range(cpus + 1))),)
    cfg = config_mod.RunConfig(name="crowded", cluster=Cluster(hosts=hosts),
                               training=config_mod.Training(global_batch_size=8 * (cpus + 1), steps=3))
    run = Run(cfg, runs_root=runs_root, python=FAKE_PYTHON, checked=True)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    said = [e for e in run.state.infos if e.get("warning") == "machine"]
    assert len(said) == 1 and f"{cpus + 1} tasks share this machine" in said[0]["message"]


@pytest.mark.parametrize("chosen", [None, "3"])
def test_tasks_sharing_a_host_share_its_cores_unless_the_user_chose(runs_root: Path, chosen: str | None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.control import machine_fit

    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    run = fake_run(runs_root, steps=5)  # two workers on this machine
    if chosen is not None:
        run = Run(run.config, runs_root=runs_root, python=FAKE_PYTHON,
                  task_env={"TF_NUM_INTRAOP_THREADS": chosen}, checked=True)
    running: dict[str, Any] = {}
    run.add_listener(lambda e: running.update({e["task"]: e.get("intra_op_threads")})
                     if e["kind"] == "status" and e.get("state") == "running" else None)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    share = str(max(1, machine_fit.cpu_count() // 2))
    assert running == dict.fromkeys(BOTH, chosen or share)
    said = [e for e in run.state.infos if "intra-op thread" in str(e.get("message"))]
    if chosen is None:
        assert len(said) == 1 and said[0]["intra_op_threads"] == int(share), said
        assert f"2 tasks share {machine_fit.cpu_count()} core" in said[0]["message"]
    else:
        assert said == []  # the user's choice is theirs: nothing to say


@pytest.mark.parametrize("mode", ["data", "async"])
def test_training_tasks_run_on_cores_of_their_own_where_there_are_enough(runs_root: Path, mode: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each training task's affinity is its own share of the supervisor's cores; the ps and the async chief
    stay free; every task keeps the inter-op pool TensorFlow would give it on the whole host."""
    from engine.control import machine_fit

    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    running: dict[str, dict[str, Any]] = {}
    starting: dict[str, dict[str, Any]] = {}
    run = fake_run(runs_root, steps=5, mode=mode)
    run.add_listener(lambda e: (running if e.get("state") == "running" else starting).update({e["task"]: e})
                     if e["kind"] == "status" and e.get("state") in ("running", "starting") else None)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    cpus = machine_fit.cpus()
    trainers = ["worker:0", "worker:1"]
    if len(cpus) < 2:
        pytest.skip("one CPU: two training tasks cannot have cores of their own")
    own = [running[t]["affinity"] for t in trainers]
    assert own[0] and own[1] and not set(own[0]) & set(own[1]), own
    assert set(own[0]) | set(own[1]) <= set(cpus) and len(own[0]) == len(own[1]) == len(cpus) // 2
    assert [starting[t]["cores"] for t in trainers] == own  # what the supervisor said it gave
    assert all(running[t]["intra_op_threads"] == str(len(cpus) // 2) for t in trainers)
    assert all(running[t]["inter_op_threads"] == str(len(cpus)) for t in trainers)
    for free in set(running) - set(trainers):  # the async chief and ps
        assert running[free]["affinity"] == cpus and starting[free]["cores"] == [], running[free]
    said = [e for e in run.state.infos if "intra-op thread" in str(e.get("message"))]
    assert len(said) == 1 and said[0]["task_cores"] == dict(zip(trainers, own, strict=True)), said
    assert "the training tasks run on cores of their own: worker:0 on core" in said[0]["message"]


def test_a_user_who_chose_the_threads_keeps_the_kernels_placement(runs_root: Path) -> None:
    from engine.control import machine_fit

    cfg = fake_run(runs_root).config
    run = Run(cfg, runs_root=runs_root, python=FAKE_PYTHON, task_env={"TF_NUM_INTRAOP_THREADS": "1"}, checked=True)
    running: dict[str, dict[str, Any]] = {}
    run.add_listener(lambda e: running.update({e["task"]: e})
                     if e["kind"] == "status" and e.get("state") == "running" else None)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    assert [e["affinity"] for e in running.values()] == [machine_fit.cpus()] * 2


def test_clusterdecks_own_work_yields_to_the_tasks_which_keep_the_normal_policy(runs_root: Path) -> None:
    """The supervisor and the launcher's event path run under SCHED_BATCH (a wake-up of theirs never preempts
    a training task); every task, started by the supervisor, has the normal policy back."""
    if not hasattr(os, "SCHED_BATCH"):
        pytest.skip("no SCHED_BATCH on this platform")
    running: dict[str, dict[str, Any]] = {}
    dispatcher: list[int] = []

    def listen(e: dict[str, Any]) -> None:
        dispatcher.append(os.sched_getscheduler(0))  # listeners run on the launcher's dispatcher thread
        if e["kind"] == "status" and e.get("state") == "running":
            running[e["task"]] = e

    run = fake_run(runs_root, steps=5, mode="async")
    run.add_listener(listen)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    assert len(running) == 4, running
    assert {e["policy"] for e in running.values()} == {os.SCHED_OTHER}, running
    assert {e["parent_policy"] for e in running.values()} == {os.SCHED_BATCH}, running  # the supervisor
    assert dispatcher and set(dispatcher) == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own thread is left alone


def test_each_task_has_a_process_group_of_its_own_in_one_session_with_its_peers(runs_root: Path) -> None:
    """A stop signals a task's group; scheduling sees the run's tasks as one program (one session)."""
    running: dict[str, dict[str, Any]] = {}
    run = fake_run(runs_root, steps=5, mode="async")
    run.add_listener(lambda e: running.update({e["task"]: e})
                     if e["kind"] == "status" and e.get("state") == "running" else None)
    run.start()
    assert run.wait(60) == "finished", run.state.reason
    assert len(running) == 4, running
    assert all(e["pgid"] == e["pid"] for e in running.values())  # each its own group
    sessions = {e["sid"] for e in running.values()}
    assert len(sessions) == 1 and not sessions & {e["pid"] for e in running.values()}, running
    assert sessions != {os.getsid(0)}  # the supervisor's session, not the launcher's
