"""One-click profile of every task: a request file in the run folder, a TensorFlow profile per task in
TensorBoard's layout, the run going on; the guard that keeps TensorFlow 2.21's trace collection from writing into
freed memory (tf_compat.keep_trace_events_in_place); and the on-demand stack dump of a live run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.cli import doctor as doctor_cli
from engine.contract import config as config_mod
from engine.contract.run_folder import RunFolder
from engine.control import doctor
from engine.runtime import diagnostics
from tests import kit
from tests.conftest import PRESETS, ROOT


def test_a_task_takes_only_a_new_recent_well_formed_request(tmp_path: Path) -> None:
    requests = diagnostics.ProfileRequests(tmp_path, "worker:0")
    assert requests.read_request() is None
    requests.request_file.parent.mkdir(parents=True)
    for bad in ('{"id": "../x", "ms": 5}', '{"id": "a", "ms": "5"}', "[1]", "{",
                json.dumps({"id": "old", "ms": 5, "t": time.time() - 3600})):
        requests.request_file.write_text(bad)
        assert requests.read_request() is None, bad
    requests.request_file.write_text(json.dumps({"id": "r1", "ms": 10**9, "t": time.time()}))
    assert requests.read_request() == ("r1", diagnostics.MAX_MS)
    requests.seen.add("r1")
    assert requests.read_request() is None


def test_profile_refuses_a_folder_without_run_json_and_a_bad_ms(tmp_path: Path, capsys: Any) -> None:
    assert doctor_cli.main(["profile", str(tmp_path)]) == 2
    assert "expected a folder holding run.json" in capsys.readouterr().err
    (tmp_path / "run.json").write_text("{}")
    assert doctor_cli.main(["profile", str(tmp_path), "--ms", "0"]) == 2
    assert doctor_cli.main(["profile", str(tmp_path)]) == 1  # no live task


@pytest.mark.cluster
def test_every_task_profiles_at_once_and_the_run_finishes(runs_root: Path, capsys: Any) -> None:
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=2500, checkpoint_every=0))
    run = kit.start_stepping(cfg, runs_root)
    deadline = time.monotonic() + 10  # run.json names the tasks' pids within a flush or two
    while len(doctor.run_task_pids(RunFolder(run.run_dir))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    stacks = doctor.dump_stacks(run.run_dir)
    assert set(stacks) == {"worker:0", "worker:1"}, stacks
    assert all(isinstance(d, doctor.Dump) and d.main_frames for d in stacks.values()), stacks
    assert doctor_cli.main(["profile", str(run.run_dir), "--ms", "1000"]) == 0
    out = capsys.readouterr().out
    assert run.wait(180) == "finished", run.state.summary()
    xplanes = sorted(p.name for p in (run.run_dir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert xplanes == ["worker-0.xplane.pb", "worker-1.xplane.pb"], out
    assert "worker:0: tensorboard/plugins/profile/" in out and "tensorboard --logdir" in out
    print(out)


@pytest.mark.cluster
def test_an_async_runs_servers_profile_too_though_they_write_no_events(runs_root: Path, capsys: Any) -> None:
    """The ps and the workers only serve (no event of theirs brings the request): their idle main loop looks."""
    cfg = config_mod.load(PRESETS / "async-1ps.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=100_000, checkpoint_every=0))
    run = kit.start_stepping(cfg, runs_root)
    try:
        assert doctor_cli.main(["profile", str(run.run_dir), "--ms", "300"]) == 0, capsys.readouterr()
    finally:
        run.stop()
    xplanes = sorted(p.name for p in (run.run_dir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert xplanes == ["chief-0.xplane.pb", "ps-0.xplane.pb", "worker-0.xplane.pb", "worker-1.xplane.pb"], xplanes


def test_thread_events_are_relocated_with_their_events_left_where_they_are() -> None:
    """tf_compat.relocate_thread_events, on ThreadEvents laid out as libstdc++ lays them out: a name kept in its
    local buffer is pointed at its new buffer, a heap name and the deque's pointers are carried over as they are
    (the events they point at stay put: what the profiler's tracker points at stays valid), the sources are left
    empty; a range that is not whole ThreadEvents is refused before anything is touched."""
    import ctypes

    from engine.runtime import tf_compat

    size = tf_compat.THREAD_EVENTS_SIZE
    src, dst = (ctypes.c_uint8 * (3 * size))(), (ctypes.c_uint8 * (3 * size))()
    first, dest = ctypes.addressof(src), ctypes.addressof(dst)
    heap = ctypes.create_string_buffer(b"tf_Compute/a-thread-name-longer-than-15", 64)
    node_map = (ctypes.c_uint64 * 8)()

    def word(address: int, value: int | None = None) -> int:
        cell = ctypes.c_uint64.from_address(address)
        if value is not None:
            cell.value = value
        return cell.value

    def name(element: int) -> bytes:
        return ctypes.string_at(word(element + 8), word(element + 16))

    for i in range(3):
        element = first + i * size
        word(element, 100 + i)  # the thread's id
        if i == 1:  # a long name, on the heap
            word(element + 8, ctypes.addressof(heap))
            word(element + 16, 39)
        else:  # a short one, in the string's own buffer
            ctypes.memmove(element + 24, b"worker\0", 7)
            word(element + 8, element + 24)
            word(element + 16, 6)
        if i < 2:  # a deque: its map, the map's size, then its start and finish (cur, first, last, node)
            word(element + 40, ctypes.addressof(node_map))
            word(element + 48, 8)
            for k, value in enumerate((0xA0, 0xA0, 0xB0, ctypes.addressof(node_map) + 24,
                                       0xA8, 0xA0, 0xB0, ctypes.addressof(node_map) + 24)):
                word(element + 56 + 8 * k, value)
    deques = [bytes(src)[i * size + 40:(i + 1) * size] for i in range(3)]
    assert tf_compat.relocate_thread_events(first, first + 3 * size, dest) == dest + 3 * size
    for i in range(3):
        moved, left = dest + i * size, first + i * size
        assert word(moved) == 100 + i and bytes(dst)[i * size + 40:(i + 1) * size] == deques[i]
        assert name(moved) == (b"tf_Compute/a-thread-name-longer-than-15" if i == 1 else b"worker")
        assert word(moved + 8) == (ctypes.addressof(heap) if i == 1 else moved + 24)
        assert word(left + 8) == left + 24 and word(left + 16) == 0 and ctypes.c_uint8.from_address(left + 24).value == 0
        assert bytes(src)[i * size + 40:(i + 1) * size] == bytes(size - 40)  # a null map: nothing to free
    before = bytes(dst)
    with pytest.raises(ValueError, match="not a range of ThreadEvents"):
        tf_compat.relocate_thread_events(first, first + size + 8, dest)
    word(first + 16, 20)  # a name "in its local buffer" longer than the buffer: not a std::string
    with pytest.raises(ValueError, match="not a std::string"):
        tf_compat.relocate_thread_events(first, first + size, dest)
    assert bytes(dst) == before


GUARDED_CAPTURES = """
    import glob, os, sys, threading, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from engine.runtime import diagnostics, tf_compat
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    print("guard:", diagnostics.guard_trace_collection())
    print("again:", diagnostics.guard_trace_collection())
    tf_compat.emulate_multi_worker_devices(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # one worker, two devices: collectives in one process
    with strategy.scope():
        v = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def step():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.matmul(v, v)))

    done = threading.Event()
    def train():
        while not done.is_set():
            step()
    trainer = threading.Thread(target=train)
    trainer.start()
    time.sleep(1.0)
    for i in range(3):
        tf.profiler.experimental.start(os.path.join(sys.argv[1], str(i)))
        time.sleep(0.4)
        tf.profiler.experimental.stop()
    done.set()
    trainer.join()
    print("relocations:", tf_compat.trace_events_relocated())
    # the collectives' CompleteParams starts on an executor thread and ends on a collective_ops one: merged there
    merged = 0
    for path in glob.glob(os.path.join(sys.argv[1], "*", "plugins", "profile", "*", "*.xplane.pb")):
        space = xplane_pb2.XSpace()
        space.ParseFromString(open(path, "rb").read())
        for plane in space.planes:
            for line in plane.lines:
                merged += sum(1 for e in line.events if line.name.startswith("collective_ops") and
                              plane.event_metadata[e.metadata_id].name.split("#")[0] == "CollectiveExecutor::CompleteParams")
    print("merged:", merged)
"""


@pytest.mark.cluster
def test_the_profilers_trace_collection_is_guarded_and_cross_thread_events_come_through(tmp_path: Path) -> None:
    """tf_compat.keep_trace_events_in_place on the installed TensorFlow (2.21: the PLT slot of the growing
    vector's copy, patched once), then real captures of a process whose collectives start and end on different
    threads: the vector grew through the relocation, and those events came out merged on their end thread."""
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent(GUARDED_CAPTURES).lstrip(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "traces")], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr[-3000:])
    guard = re.search(r"^guard: (.*)$", out, re.M)
    assert guard and guard.group(1).startswith("TraceMeRecorder's growing vector relocates its deques"), out
    assert re.search(r"^again: (.*)$", out, re.M).group(1) == guard.group(1), out  # type: ignore[union-attr]
    assert int(re.search(r"^relocations: (\d+)$", out, re.M).group(1)) > 0, out  # type: ignore[union-attr]
    assert int(re.search(r"^merged: (\d+)$", out, re.M).group(1)) > 0, out  # type: ignore[union-attr]


def test_a_request_is_looked_for_at_most_every_poll_s_and_captured_on_a_thread_that_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread waits for requests (one asleep cost a data run ~10 %): a look rides on the task's events, at most
    every POLL_S seconds, and a request found is captured on a thread of its own that ends with the capture."""
    import types

    taken: list[tuple[str, int]] = []
    requests = diagnostics.ProfileRequests(tmp_path, "worker:0")
    monkeypatch.setitem(sys.modules, "tensorflow", types.SimpleNamespace(profiler=object()))
    monkeypatch.setattr(requests, "take", lambda rid, ms: (time.sleep(0.2), taken.append((rid, ms))))
    before = threading.active_count()
    assert requests.look() is None  # no request: no thread
    requests.request_file.parent.mkdir(parents=True)
    requests.request_file.write_text(json.dumps({"id": "r1", "ms": 50, "t": time.time()}))
    assert requests.look() is None  # looked less than POLL_S ago
    time.sleep(diagnostics.POLL_S)
    thread = requests.look()
    assert thread is not None and thread.name == "profile-capture"
    time.sleep(diagnostics.POLL_S)
    assert requests.look() is None  # one capture at a time, and r1 is seen
    thread.join(5)
    assert taken == [("r1", 50)] and threading.active_count() == before
    time.sleep(diagnostics.POLL_S)
    assert requests.look() is None  # r1 is not taken twice


def test_a_task_looks_for_requests_after_each_write_of_its_events(tmp_path: Path) -> None:
    from engine.runtime.emitter import Emitter

    looks: list[int] = []
    emitter = Emitter("worker:0", None)
    emitter.after_write = lambda: looks.append(1)
    emitter.info("one")
    with emitter.batch():
        emitter.info("two")
        emitter.info("three")
    assert len(looks) == 2  # once per write, a batch being one
    emitter.after_write = lambda: 1 / 0
    emitter.info("a failing look loses no event")  # raises nothing
