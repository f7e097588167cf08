"""A task's events: each one on disk and on the supervisor's pipe; a report's events in one write each way,
and the supervisor relaying what it read at once in one write to the launcher."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.task_plan import TaskPlan
from engine.control.supervisor import Supervisor, TaskProcess
from engine.runtime import async_ps
from engine.runtime import emitter as emitter_mod
from engine.runtime.context import TaskContext
from engine.runtime.emitter import Emitter


def nonblocking_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
    return r, w


def read_now(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


@pytest.fixture
def pipe_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every ``os.write`` the emitter makes to a pipe (its events file is written with ``os.write`` too)."""
    writes: list[bytes] = []
    real = os.write

    def counting(fd: int, data: bytes) -> int:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(emitter_mod.os, "write", counting)
    return writes


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_each_event_goes_out_at_once_outside_a_batch(tmp_path: Path, pipe_writes: list[bytes]) -> None:
    r, w = nonblocking_pipe()
    em = Emitter("worker:0", tmp_path / "events.jsonl", fd=w)
    em.emit("step", replica=0, step=1, loss=1.0)
    assert len(pipe_writes) == 1 and read_now(r).count(b"\n") == 1
    em.emit("step", replica=0, step=2, loss=0.9)
    assert len(pipe_writes) == 2 and [e["step"] for e in lines_of(tmp_path / "events.jsonl")] == [1, 2]
    em.close()
    os.close(r)


def test_a_batch_goes_out_in_one_write_when_it_ends(tmp_path: Path, pipe_writes: list[bytes]) -> None:
    r, w = nonblocking_pipe()
    path = tmp_path / "events.jsonl"
    em = Emitter("chief:0", path, fd=w)
    with em.batch():
        em.emit("step", replica=0, step=16, loss=1.0)
        with em.batch():  # nested: the outer batch writes
            em.emit("step", replica=1, step=16, loss=1.1)
        em.emit("progress", step=16, total=100)
        assert pipe_writes == [] and read_now(r) == b"" and not path.read_text(encoding="utf-8")
    assert len(pipe_writes) == 1
    got = [json.loads(x) for x in read_now(r).splitlines()]
    assert [(e["kind"], e.get("replica")) for e in got] == [("step", 0), ("step", 1), ("progress", None)]
    assert lines_of(path) == got  # the file holds the same events, in the same order
    em.close()
    os.close(r)


def test_a_batch_that_raises_still_sends_what_it_held(tmp_path: Path) -> None:
    r, w = nonblocking_pipe()
    em = Emitter("chief:0", tmp_path / "events.jsonl", fd=w)
    with pytest.raises(RuntimeError), em.batch():
        em.emit("step", replica=0, step=1, loss=1.0)
        raise RuntimeError("a report failed half-way")
    assert read_now(r).count(b"\n") == 1 and len(lines_of(tmp_path / "events.jsonl")) == 1
    em.emit("info", message="after")  # the batch is over: this goes out at once
    assert read_now(r).count(b"\n") == 1
    em.close()
    os.close(r)


def test_another_threads_events_are_not_held_by_a_batch(tmp_path: Path) -> None:
    r, w = nonblocking_pipe()
    em = Emitter("chief:0", tmp_path / "events.jsonl", fd=w)
    with em.batch():
        em.emit("step", replica=0, step=1, loss=1.0)
        t = threading.Thread(target=lambda: em.info("from the stop thread"))
        t.start()
        t.join()
        assert [json.loads(x)["kind"] for x in read_now(r).splitlines()] == ["info"]
    assert [json.loads(x)["kind"] for x in read_now(r).splitlines()] == ["step"]
    em.close()
    os.close(r)


class FlushCounter:
    """A launcher's end of the supervisor's output: what was written, and when it was flushed."""

    def __init__(self) -> None:
        self.pending = b""
        self.flushes: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.pending += data
        return len(data)

    def flush(self) -> None:
        if self.pending:
            self.flushes.append(self.pending)
        self.pending = b""


def _supervisor_reading(tmp_path: Path, task: str) -> tuple[FlushCounter, Supervisor, TaskProcess, int, int]:
    """A supervisor of one task ``task`` whose event pipe (both ends returned) it reads, writing to a counter."""
    out = FlushCounter()
    role, _, index = task.partition(":")
    plan = TaskPlan(name=task, role=role, index=int(index), host="local", port=1, gpu_ids=(), devices=1, env={})
    sup = Supervisor({"run_dir": str(tmp_path / "run"), "tasks": [plan.to_dict()]}, out=out)
    tp = TaskProcess(plan)
    r, w = nonblocking_pipe()
    tp.event_fd = r
    return out, sup, tp, r, w


def test_the_supervisor_relays_one_read_of_a_tasks_pipe_in_one_write(tmp_path: Path) -> None:
    out, sup, tp, _, w = _supervisor_reading(tmp_path, "chief:0")
    report = b"".join(events.encode(events.make(kind, "chief:0", **fields)).encode() for kind, fields in (
        ("step", {"replica": 0, "step": 16, "loss": 1.0}), ("step", {"replica": 1, "step": 16, "loss": 1.1}),
        ("progress", {"step": 16, "total": 100})))
    os.write(w, report)
    sup.read_events(tp)
    assert len(out.flushes) == 1, "a task's report reached the launcher in several writes"
    got = [json.loads(x) for x in out.flushes[0].splitlines()]
    assert [e["kind"] for e in got] == ["step", "step", "progress"] and {e["task"] for e in got} == {"chief:0"}
    os.write(w, report[: len(report) // 2])  # half a report: its whole lines go now, the rest waits
    sup.read_events(tp)
    assert len(out.flushes) == 2 and out.flushes[1].count(b"\n") == 1
    os.close(w)
    sup.read_events(tp)  # the task ended: its pipe is closed, and the half line it left is dropped
    assert tp.event_fd is None and out.pending == b""


def test_the_supervisor_passes_its_tasks_own_samples_on_as_written(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A step or device line that begins as the task's own emitter writes it goes out byte for byte, undecoded;
    every other line is decoded and relabelled as before, a bad one counted, a terminal failure held back."""
    out, sup, tp, r, w = _supervisor_reading(tmp_path, "worker:1")
    em = Emitter("worker:1", None, fd=w)
    em.emit("step", replica=0, step=1, loss=1.0, examples_per_sec=10.0, metrics={"accuracy": 0.5})
    em.emit("device", cpu_percent=99.5, rss_bytes=1, pid=7)
    own = read_now(r) + b'{"v":1,"kind":"step","task":"worker:1","t":1.0,"replica":1,"step":1,"loss":1.50}\n'
    os.write(w, own)  # the last one as no encoder writes it (1.50): not encoded again
    other = events.encode(events.make("step", "worker:0", replica=0, step=2, loss=0.9)).encode()
    spaced = b'{"v": 1, "kind": "step", "task": "worker:1", "t": 1.0, "replica": 0, "step": 3}\n'
    disguised = own.splitlines(keepends=True)[0][:-2] + b',"task":"worker:0"}\n'
    failed = events.encode(events.make("status", "worker:1", state="failed", reason="boom")).encode()
    os.write(w, other + b"garbage\n" + spaced + disguised + failed + own[:40])
    decoded: list[bytes] = []
    decode = events.decode

    def counted(line: bytes) -> dict[str, Any] | None:
        decoded.append(line)
        return decode(line)

    monkeypatch.setattr(events, "decode", counted)
    sup.read_events(tp)
    assert decoded == [other, b"garbage\n", spaced, disguised, failed]  # the emitter's samples are not decoded
    assert len(out.flushes) == 1
    sent = out.flushes[0].splitlines(keepends=True)
    assert b"".join(sent[:3]) == own  # byte for byte
    got = [json.loads(x) for x in sent]
    assert [(e["kind"], e.get("step")) for e in got] == [("step", 1), ("device", None), ("step", 1), ("step", 2),
                                                         ("step", 3), ("step", 1)]
    assert {e["task"] for e in got} == {"worker:1"}  # a task speaks only for itself
    assert sent[4] == events.encode({**json.loads(spaced), "task": "worker:1"}).encode()  # decoded, encoded again
    assert sup.stats.bad == 1 and sup.stats.good == 7
    assert tp.terminal_state == "failed" and tp.reason == "boom"  # held back until the task is reaped
    em.close()  # its end of the pipe closed
    sup.read_events(tp)  # the pipe ends: the half line left is counted, nothing more goes out
    assert tp.event_fd is None and sup.stats.bad == 2 and len(out.flushes) == 1


def test_the_async_chiefs_report_of_every_worker_is_one_write(tmp_path: Path, pipe_writes: list[bytes]) -> None:
    r, w = nonblocking_pipe()
    em = Emitter("chief:0", tmp_path / "events.jsonl", fd=w)
    ctx = TaskContext(config=config_mod.default_config(), task="chief:0", role="chief", index=0,
                      run_dir=tmp_path, emitter=em, devices=1, gpus_assigned=False)
    rep = async_ps.WorkerReporter(ctx, per_worker_batch=64, total=100, hz=0.0)
    rep.step_done(16, 1.0, 0, 10.0, 15)
    rep.step_done(32, 0.9, 1, 10.1, 15)
    rep.maybe_report(32, 32)
    assert len(pipe_writes) == 1
    assert [json.loads(x)["kind"] for x in read_now(r).splitlines()] == ["step", "step", "progress"]
    em.close()
    os.close(r)
