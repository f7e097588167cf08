"""The warm-start template: imports the runtime once, then forks each task of its host on request.

Started by the supervisor as ``python -m engine.runtime.task --template-fd FD --run-dir DIR`` (the
protocol and the rules of what may be forked: :mod:`engine.contract.warm_start`). The template runs no
TensorFlow op: importing TensorFlow and Keras starts none of TensorFlow's threads, so each fork is a
single-threaded copy of an imported interpreter. Each task is forked twice over: the middle process
exits at once, so the task is reparented to the supervisor (a child subreaper), which then owns it as
it owns a task it started cold.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from engine.contract import parent_death, warm_start

#: How long a forked task waits to be reparented to the supervisor (its middle process exits at once).
REPARENT_TIMEOUT_S = 5.0


def import_runtime() -> None:
    """Everything a task imports before its own work, in the order a cold task imports it (nothing for simulated
    tasks, which import no TensorFlow: :data:`engine.runtime.fault_hooks.SIMULATE`)."""
    from engine.runtime import fault_hooks

    if fault_hooks.simulated_step() > 0:
        return
    from engine.runtime.keras_import import import_keras

    import_keras()  # first, without the notebook extras (as engine.runtime.task does)
    from engine.runtime import async_ps, context, data_parallel, model_parallel  # noqa: F401


#: A task's entry point (``engine.runtime.task.main``), given its arguments; it ends the process itself.
TaskMain = Callable[[list[str]], object]


def serve(fd: int, task_main: TaskMain) -> int:
    """Import, say ready, then fork one task per request (each runs ``task_main``) until the supervisor
    closes the socket."""
    sock = socket.socket(fileno=fd)
    import_runtime()
    sock.send(warm_start.encode({"ready": True}))
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, warm_start.MAX_MESSAGE, len(warm_start.FDS))
        except OSError:
            return 0
        if not data:
            return 0  # the supervisor is gone
        try:
            request = warm_start.decode(data)
            if request is None or len(fds) != len(warm_start.FDS):
                raise ValueError(f"malformed request ({len(data)} bytes, {len(fds)} descriptors)")
            reply: dict[str, Any] = {"pid": _fork_task(sock, request, fds, task_main)}
        except Exception as exc:  # noqa: BLE001 - the supervisor starts the task cold instead
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for f in fds:
                os.close(f)
        try:
            sock.send(warm_start.encode(reply))
        except OSError:
            return 0


def _fork_task(sock: socket.socket, request: dict[str, Any], fds: list[int], task_main: TaskMain) -> int:
    """Fork the task through a middle process that exits at once; the task's pid, once it is an orphan."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the task, say its pid, leave
        code = 1
        try:
            os.close(read_end)
            me = os.getpid()  # the task's parent until this process exits (read here: it may be gone before the task runs)
            task = os.fork()
            if task == 0:
                os.close(write_end)
                _become_task(sock, request, fds, task_main, me)
            try:
                os.setpgid(task, task)  # as the task does itself: whichever runs first, no signal misses it
            except OSError:
                pass
            os.write(write_end, str(task).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 64):
        data += chunk
    os.close(read_end)
    os.waitpid(middle, 0)  # once it is reaped the task is the supervisor's child
    if not data:
        raise RuntimeError("the task could not be forked")
    return int(data)


def _become_task(sock: socket.socket, request: dict[str, Any], fds: list[int], task_main: TaskMain,
                 middle: int) -> NoReturn:
    """In the forked task: become the process a cold start gives, then run the task (which never returns).

    ``middle`` is the pid of the process that forked it, given by that process: read here with ``getppid()`` it
    would already be the supervisor's wherever the middle process exited first (a busy machine), and the wait
    below would wait its whole timeout for a change that had happened."""
    try:
        sock.close()
        log, event, lifeline = fds
        os.setpgid(0, 0)  # its own process group, inside the supervisor's session (as a cold start)
        deadline = time.monotonic() + REPARENT_TIMEOUT_S
        while os.getppid() == middle and time.monotonic() < deadline:
            time.sleep(0.0005)
        parent_death.arm(int(request["parent"]))  # ends this process if the supervisor is not its parent
        cores = [int(c) for c in request.get("cores", ())]
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        _reseed()
        args = [str(a) for a in request["args"]] + ["--event-fd", str(event), "--lifeline-fd", str(lifeline)]
        sys.argv = [sys.argv[0], *args]
        task_main(args)  # ends the process
    except BaseException:  # noqa: BLE001 - whatever happens, this process must not go back to serving
        traceback.print_exc()
    os._exit(1)


def _reseed() -> None:
    """Forked tasks must not share the template's random state (Python's ``random`` reseeds by itself)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
