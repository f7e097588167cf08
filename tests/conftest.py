"""Shared fixtures: every test gets its own runs folder, and no test may leave a process behind.

The one-node Slurm of ``tests/engine/test_slurm.py`` is a session fixture, and its job over a time limit
starts with the session's first test when that test is collected: Slurm ends the job a minute later while
the other tests run, and the test only reads how it ended, instead of waiting out the minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

if TYPE_CHECKING:
    from engine.contract.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "presets"


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "runs"
    monkeypatch.setenv("CLUSTERDECK_RUNS", str(root))
    return root


# Every process this test session starts inherits this marker, so the leftover check
# never mistakes another session's processes (or a benchmark's) for ours. Under pytest-xdist
# each worker imports this file itself, so each worker has a mark of its own.
SESSION_MARK = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["CLUSTERDECK_TEST_SESSION"] = SESSION_MARK


def clusterdeck_processes() -> list[psutil.Process]:
    """Task and supervisor processes started from this test session."""
    found = []
    for proc in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "engine.runtime.task" in cmd or "engine.control.supervisor" in cmd:
            try:
                if proc.environ().get("CLUSTERDECK_TEST_SESSION") != SESSION_MARK:
                    continue
            except psutil.Error:
                continue
            found.append(proc)
    return found


def command_line(proc: psutil.Process) -> str:
    """``proc``'s command line, or "" once it has exited (a zombie or gone process has none to read)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def descendants_running(pid: int, marker: str) -> list[psutil.Process]:
    """Live descendants of ``pid`` whose command line holds ``marker``."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if marker in command_line(p)]


def alive(pids: Iterable[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Pids still alive after ``timeout`` seconds (empty: all gone)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = alive(pids)
        if not left:
            return []
        time.sleep(0.05)
    return alive(pids)


def wait_while_live(run: Any, event: threading.Event, timeout: float) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds, but no longer than ``run`` lives: a run that failed at
    its start is told at once instead of after the whole timeout. True when the event came."""
    from engine.contract.run_folder import LIVE_STATES

    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        if run.state.state not in LIVE_STATES or time.monotonic() >= deadline:
            return event.is_set()
    return True


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = {p.pid for p in clusterdeck_processes()}
    yield
    left = [p for p in clusterdeck_processes() if p.pid not in before]
    if left:
        pids = [p.pid for p in left]
        stragglers = wait_gone(pids, 5.0)
        for pid in stragglers:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        assert not stragglers, f"processes left running by the test: {stragglers}"


@pytest.fixture(autouse=True, scope="session")
def _quiet_tf() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, why: str, *, needed_in_ci: bool = True) -> None:
    """Skip the calling test when ``condition`` is false; with ``CI=true`` fail it instead (for what CI
    must provide: sshd, network namespaces), so a missing service never hides behind a skip."""
    if condition:
        return
    if IN_CI and needed_in_ci:
        pytest.fail(f"CI=true and {why}: CI must provide it (.ci/run installs it)")
    pytest.skip(why)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only): a real full disk for the tests of what a run does when its disk fills."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    require(done.returncode == 0, f"cannot mount a tmpfs here: {done.stderr.decode().strip()}", needed_in_ci=False)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def needs() -> Callable[..., None]:
    """``needs(condition, why)``: :func:`require` as a fixture (skips here, fails with ``CI=true``)."""
    return require


class EventRecorder:
    """Every event of a run, as a listener receives them (listeners run on the launcher's dispatcher thread)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """The events of ``kind`` whose fields equal ``match``."""
        with self.lock:
            return [e for e in self.events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def pids(self) -> set[int]:
        return {e["pid"] for e in self.of("status") if isinstance(e.get("pid"), int)}


def run_story(run_dir: Path, log_lines: int = 12) -> str:
    """What a failed run's folder tells: its run and status events (full reasons, with their generation),
    then the tail of each task's log. For assertion messages, so a failure in CI can be read afterwards."""
    from engine.contract import events
    from engine.contract.run_folder import RunFolder
    from engine.contract.task_logs import log_tail

    folder = RunFolder(run_dir)
    told = [e for e in events.read_file(folder.events) if e["kind"] in ("run", "status")]
    out = [f"{e['t']:.2f} gen {e.get('generation', 0)} {e['kind']} {e['task']} {e.get('state', '')} "
           f"{e.get('reason', '')}" for e in told]
    for task in sorted({e["task"] for e in told if e["kind"] == "status"}):
        out.append(f"--- {task}: log tail\n" + "\n".join(log_tail(folder.task_log(task), log_lines)))
    return "\n".join(out)


# --------------------------------------------------------------------------- the one-node Slurm

#: The test that reads how :func:`slurm_job_over_its_time_limit` ended.
SLURM_TIME_LIMIT_TEST = "test_slurm.py::test_a_job_over_its_time_limit_fails_with_slurm_s_reason"
#: The name of that job's run (and so of its Slurm job).
SLURM_TIME_LIMITED = "slurm-time-limit"


def slurm_preset(name: str, **changes: Any) -> RunConfig:
    """A Slurm preset, its python the interpreter running the tests (the node is this machine); ``changes``:
    the Slurm request's ``partition``, ``nodes``, ``time_limit`` and any training setting."""
    from engine.contract import config as config_mod

    config = config_mod.load(PRESETS / name)
    hosts = tuple(config_mod.replace(h, python=sys.executable) for h in config.cluster.hosts)
    config = config_mod.replace(config, cluster=config_mod.replace(config.cluster, hosts=hosts))
    slurm_changes = {k: changes.pop(k) for k in list(changes) if k in ("partition", "nodes", "time_limit")}
    if slurm_changes:
        h = config.cluster.hosts[0]
        assert h.slurm is not None
        host = config_mod.replace(h, slurm=config_mod.replace(h.slurm, **slurm_changes))
        config = config_mod.replace(config, cluster=config_mod.replace(config.cluster, hosts=(host,)))
    return config_mod.replace(config, training=config_mod.replace(config.training, **changes))


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[Any]:
    """The one-node Slurm on 127.0.0.1 (started unless it runs already; ``SLURM_CONF`` set for the session),
    or, as a string, why it is not there: the Slurm tests' ``cluster`` fixture skips or fails on it."""
    from tests.engine import slurm_cluster

    missing = slurm_cluster.missing_programs()
    if missing:
        yield f"Slurm is not installed ({', '.join(missing)} missing; .ci/services/slurm.sh installs it)"
        return
    try:
        up = slurm_cluster.ensure()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        yield f"the one-node Slurm did not start: {exc}"
        return
    saved = os.environ.get("SLURM_CONF")
    os.environ.update({k: v for k, v in up.env.items() if k == "SLURM_CONF"})
    try:
        yield up
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        up.stop()


@pytest.fixture(scope="session", autouse=True)
def slurm_job_over_its_time_limit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                                  ) -> Iterator[dict[str, Any] | None]:
    """``clusterdeck run`` of a 1-minute Slurm job that would train for an hour, from the session's first test
    on, when :data:`SLURM_TIME_LIMIT_TEST` is collected (else None, as when Slurm is not there).

    One job for the whole session, whichever pytest-xdist worker runs the test: every worker collects it, so the
    first one here starts the job (a lock in the folder the workers share) and the others find it there. Its exit
    code lands in ``code`` (the test waits for that file); its starter, at its own session's end, waits for the job
    to end on its own before it stops anything (a worker done early must not cancel the job another worker's test
    is waiting for).

    Its steps are slow on purpose (worker 0 sleeps 0.2 s a step, worker 1 waits for it): it trains through
    its minute on little CPU beside the other tests. Its own test-session mark keeps the per-test leftover
    check from counting its processes.
    """
    if not any(item.nodeid.endswith(SLURM_TIME_LIMIT_TEST) for item in request.session.items):
        yield None
        return
    up = request.getfixturevalue("slurm_session")
    if isinstance(up, str):
        yield None
        return
    import fcntl
    import json
    import signal

    from engine.contract import config as config_mod
    from engine.control import slurm
    from tests.engine import slurm_cluster

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N/, above each popen-gwK/
    folder = shared / "time-limit-job"
    folder.mkdir(exist_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "job.json").exists():
            config = slurm_preset("slurm-data.yaml", time_limit="1", steps=10**7, checkpoint_every=0,
                                  global_batch_size=32)
            config = config_mod.replace(config, name=SLURM_TIME_LIMITED,
                                        model=config_mod.replace(config.model, hidden=(16,)))
            path = folder / "preset.yaml"
            config_mod.save(config, path)
            env = dict(os.environ, CLUSTERDECK_TEST_SESSION=f"time-limit-{uuid.uuid4().hex[:8]}",
                       CLUSTERDECK_TEST_STEP_DELAY="worker:0=0.2")
            env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            # the run's exit code into ``code`` once it ends (written whole: a rename)
            script = '"$@"; echo $? > "$0/code.part" && mv "$0/code.part" "$0/code"'
            with open(folder / "out.jsonl", "wb") as out, open(folder / "err.txt", "wb") as err:
                proc = subprocess.Popen(["bash", "-c", script, str(folder), sys.executable, "-m", "engine.cli", "run",
                                         str(path), "--out", str(folder / "runs"), "--json"],
                                        stdout=out, stderr=err, env=env, start_new_session=True)
            (folder / "job.json").write_text(json.dumps({"started": time.monotonic(),
                                                         "mark": env["CLUSTERDECK_TEST_SESSION"]}))
    job = json.loads((folder / "job.json").read_text())
    try:
        yield {"folder": folder, "started": job["started"], "mark": job["mark"]}
    finally:
        if proc is not None:  # its starter: the job ends on its own (its time limit) or is ended here
            try:
                proc.wait(timeout=max(1.0, job["started"] + 200 - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            for jid in slurm_cluster.jobs_named(SLURM_TIME_LIMITED):
                slurm.cancel(jid)
