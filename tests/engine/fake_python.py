#!/usr/bin/env python3
"""A stand-in ``python`` for control-side tests: real supervisors, real processes and signals, tasks without TensorFlow.

Passed as ``Run(python=...)``: ``fake_python.py -m engine.control.supervisor`` runs the real supervisor;
``fake_python.py -m engine.runtime.task ...`` runs a tiny task that speaks the event protocol. What a task does
comes from ``FAKE_<role>_<index>`` in its environment (``Run(task_env=...)``), default ``steps``:

- ``steps``: steps every 20 ms up to the config's total, then ``finished``.
- ``forever``: steps every 20 ms without end.
- ``idle``: reports ``running``, then sleeps (a task waiting on a hung peer).
- ``spin``: reports ``running``, then loops on the CPU without a step (a hang in Python).
- ``spawn``: starts a child in its own process group and one in a new session (``FAKE_CHILDREN`` gets
  their pids), then steps forever.
- ``flush``: steps forever; on SIGTERM writes one last step (``final: true``) and ``stopped``, then exits.
- ``ignore_term``: steps forever and ignores SIGTERM.
- ``flood``: prints about 50 MB/s (1 MiB lines; ``flood_cr``: a progress bar redrawn with ``\r`` alone) and
  steps forever.
Async chiefs credit their steps to ``worker`` ``FAKE_WORKERS`` (comma-separated indices, default ``0``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> None:
    if sys.argv[1:3] != ["-m", "engine.runtime.task"]:
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    args = sys.argv[3:]
    event_fd = int(args[args.index("--event-fd") + 1])
    lifeline = int(args[args.index("--lifeline-fd") + 1])
    run_dir = args[args.index("--run-dir") + 1]
    task = os.environ.get("CLUSTERDECK_TASK", "worker:0")
    role, index = task.split(":")
    mode = os.environ.get(f"FAKE_{role}_{index}", "steps")
    total = 50
    try:
        for line in open(os.path.join(run_dir, "config.yaml"), encoding="utf-8"):
            if line.strip().startswith("steps:"):
                total = int(line.split(":")[1])
    except (OSError, ValueError):
        pass
    lock = threading.RLock()  # the SIGTERM handler may emit while the main thread holds it

    def emit(kind: str, **fields: object) -> None:
        line = json.dumps({"v": 1, "kind": kind, "task": task, "t": time.time(), **fields}) + "\n"
        with lock:
            try:
                os.write(event_fd, line.encode())
            except OSError:
                pass

    def watch_lifeline() -> None:
        while os.read(lifeline, 64):
            pass
        os._exit(137)

    threading.Thread(target=watch_lifeline, daemon=True).start()
    step = 0
    workers = [int(w) for w in os.environ.get("FAKE_WORKERS", "0").split(",") if w]

    def one_step() -> None:
        nonlocal step
        step += 1
        extra = {"worker": workers[step % len(workers)]} if role == "chief" and workers else {}
        emit("step", replica=int(index), step=step, loss=1.0 / step, examples_per_sec=100.0, step_time=0.02, **extra)
        time.sleep(0.02)

    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "flush":
        def on_term(*_: object) -> None:
            emit("step", replica=int(index), step=step + 1, loss=0.5, examples_per_sec=100.0, step_time=0.02,
                 final=True)
            emit("status", state="stopped", reason="SIGTERM: final step written")
            os._exit(143)

        signal.signal(signal.SIGTERM, on_term)
    if mode in ("flood", "flood_cr"):
        line = (b"x" * (1024 * 1024 - 1)) + (b"\r" if mode == "flood_cr" else b"\n")

        def flood() -> None:  # about 50 MB/s, what a chatty program was seen to print
            while True:
                os.write(1, line)
                time.sleep(0.02)

        threading.Thread(target=flood, daemon=True).start()
        mode = "forever"
    if mode == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open(os.environ["FAKE_CHILDREN"], "w", encoding="utf-8") as fh:
            fh.write(f"{child.pid} {escaped.pid}\n")
    # what the supervisor set in the environment that matters to TensorFlow's threads
    emit("status", state="running", pid=os.getpid(), intra_op_threads=os.environ.get("TF_NUM_INTRAOP_THREADS"),
         inter_op_threads=os.environ.get("TF_NUM_INTEROP_THREADS"), affinity=sorted(os.sched_getaffinity(0)),
         pgid=os.getpgid(0), sid=os.getsid(0), policy=os.sched_getscheduler(0),
         parent_policy=os.sched_getscheduler(os.getppid()))
    if mode == "idle":
        while True:
            time.sleep(1)
    if mode == "spin":
        while True:
            pass
    if mode == "steps" and role in ("worker", "chief"):
        while step < total:
            one_step()
        emit("status", state="finished", steps=step)
        os._exit(0)
    if mode in ("steps",):  # ps and evaluator: serve until stopped
        while True:
            time.sleep(1)
    while True:
        one_step()


if __name__ == "__main__":
    main()
