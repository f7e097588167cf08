"""Reliability, round three: a warm-start template that is not getting anywhere (SIGSTOPped, or using no CPU) while
it imports is given up within seconds, the run says so (an ``info`` event of ``supervisor@<host>``: the template is
not answering, the tasks start cold), and the first step comes from cold tasks instead of after the 120 s ready
timeout; a template stopped once ready is not asked to fork (no 10 s wait for an answer that cannot come)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract import parent_death, warm_start
from engine.contract.config import replace
from engine.contract.run_folder import RunFolder
from engine.control import warm_tasks
from engine.control.launcher import Run
from engine.control.warm_tasks import ReadinessWatch, Template, TemplateError
from tests.conftest import PRESETS, ROOT, EventRecorder, alive, wait_gone

T = TypeVar("T")
needs_subreaper = pytest.mark.skipif(not parent_death.available(),
                                     reason="warm start needs PR_SET_CHILD_SUBREAPER (Linux)")


def _until(check: Callable[[], T], timeout: float) -> tuple[T, float]:
    """Call ``check`` until it gives something true (or ``timeout``): (what it gave, seconds taken)."""
    t0 = time.monotonic()
    while True:
        got = check()
        if got or time.monotonic() - t0 >= timeout:
            return got, time.monotonic() - t0
        time.sleep(0.05)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def test_a_busy_process_is_getting_somewhere_and_a_stopped_one_is_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        watch = ReadinessWatch(busy.pid, stopped_after=1.0, idle_after=1.0, interval=0.05)
        got, _ = _until(watch.stuck, 2.0)
        assert got is None, "a process using CPU was called stuck"
        assert not watch.stopped()
        os.kill(busy.pid, signal.SIGSTOP)
        got, took = _until(watch.stuck, 5.0)
        assert got == "it has been stopped (SIGSTOP) for 1 s while importing TensorFlow", got
        assert 0.9 <= took < 2.5 and watch.stopped()
    finally:
        _kill(busy)


def test_a_process_using_no_cpu_is_stuck_and_an_ended_one_is_left_to_its_socket() -> None:
    idle = subprocess.Popen(["sleep", "30"])
    try:
        watch = ReadinessWatch(idle.pid, stopped_after=1.0, idle_after=1.0, interval=0.05)
        got, took = _until(watch.stuck, 5.0)
        assert got == "it has used no CPU for 1 s while importing TensorFlow", got
        assert took < 2.5
    finally:
        _kill(idle)
    ended = ReadinessWatch(idle.pid, idle_after=0.0, interval=0.0)
    assert ended.stuck() is None and not ended.stopped()


def _template(tmp_path: Path) -> Template:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return Template(sys.executable, tmp_path, env, tmp_path / "template.log", {"start_new_session": True})


def test_a_template_stopped_while_it_imports_is_given_up_within_seconds(tmp_path: Path) -> None:
    template = _template(tmp_path)
    assert template.proc is not None and template.error == ""
    pid = template.proc.pid
    try:
        os.kill(pid, signal.SIGSTOP)  # at once: TensorFlow's import takes seconds
        got, took = _until(lambda: template.error, warm_tasks.STOPPED_TIMEOUT_S + 5)
        assert took < warm_tasks.STOPPED_TIMEOUT_S + 2, f"given up after {took:.1f} s"
        assert got == (f"the warm-start template (pid {pid}) is not answering: it has been stopped (SIGSTOP) for "
                       f"{warm_tasks.STOPPED_TIMEOUT_S:.0f} s while importing TensorFlow; starting the tasks cold "
                       "instead of waiting for it"), got
        assert not template.ready and not template.usable
    finally:
        template.close()  # a stopped template is killed all the same
    assert wait_gone([pid], 5) == []


@needs_subreaper
def test_a_template_stopped_once_ready_is_not_asked_to_fork(tmp_path: Path) -> None:
    template = _template(tmp_path)
    assert template.proc is not None
    try:
        _until(lambda: _poll_ready(template) or template.error, 120)
        assert template.ready, template.error or (tmp_path / "template.log").read_text()[-2000:]
        os.kill(template.proc.pid, signal.SIGSTOP)
        # a signal is delivered when the process next runs: on a busy machine, some milliseconds later
        _until(lambda: psutil.Process(template.proc.pid).status() == psutil.STATUS_STOPPED, 5)
        r, w = os.pipe()
        t0 = time.monotonic()
        with pytest.raises(TemplateError, match=r"is stopped \(SIGSTOP or a debugger\)"):
            template.fork(["--run-dir", str(tmp_path)], template.env, str(tmp_path), (), (w, w, r))
        assert time.monotonic() - t0 < 2, "a fork request waited on a stopped template"
        os.close(r)
        os.close(w)
        assert not template.usable
    finally:
        template.close()


def _poll_ready(template: Template) -> bool:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(template.fileno(), selectors.EVENT_READ)
    try:
        if sel.select(0.2):
            template.read_ready()
    finally:
        sel.close()
    return template.ready


def _templates() -> list[psutil.Process]:
    """This test's warm-start templates (its descendants with the template's flag)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if warm_start.TEMPLATE_FLAG in p.cmdline():
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.cluster
@needs_subreaper
def test_a_run_whose_template_is_stopped_says_so_and_starts_cold_within_seconds(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    run = Run(replace(cfg, training=replace(cfg.training, steps=100_000, epochs=None, checkpoint_every=0)),
              runs_root=runs_root)
    rec = EventRecorder()
    got_step = threading.Event()
    run.add_listener(rec)
    run.add_listener(lambda e: got_step.set() if e["kind"] == "step" else None)
    run.start()
    stopped: list[psutil.Process] = []
    try:
        found, _ = _until(_templates, 30)
        assert found, "no warm-start template was started"
        for p in found:  # while it imports
            p.suspend()
            stopped.append(p)
        t0 = time.monotonic()
        assert got_step.wait(90), f"no step within 90 s of the template's stop: {run.state.summary()}"
        assert time.monotonic() - t0 < 60, "the run waited for the stopped template"
        said = [e for e in rec.of("info") if "is not answering" in str(e.get("message"))]
        assert said and said[0]["task"].startswith("supervisor@"), [e.get("message") for e in rec.of("info")]
        assert said[0]["message"].startswith("tasks start cold: the warm-start template (pid ")
        assert "stopped (SIGSTOP)" in said[0]["message"]
        for name in ("worker:0", "worker:1"):
            log = RunFolder(run.run_dir).task_log(name).read_text()
            assert f"starting {name}\n" in log and "forked" not in log, log[-1000:]
        assert wait_gone([p.pid for p in stopped], 5) == [], "the stopped template was left behind"
    finally:
        for p in stopped:
            try:
                p.resume()
            except psutil.Error:
                pass
        run.stop()
        run.wait(30)
    assert not alive(run.pids())
