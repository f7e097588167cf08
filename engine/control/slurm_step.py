"""Run inside a Slurm step on a node (``srun ... python -m engine.control.slurm_step``).

Two uses:

- ``--ports N``: print ``{"node": <Slurm's node name>, "ports": [N free ports]}`` and exit; the
  launcher builds ``TF_CONFIG`` from the allocation's nodes and these ports.
- ``-- COMMAND...`` (the supervisor): read the launcher's first line (the supervisor's spec), bind
  every task's GPUs to those Slurm gave this step (the step's ``CUDA_VISIBLE_DEVICES``: task ids
  0, 1, ... are positions in that list, as ``SlurmClusterResolver`` binds them by local rank), start
  COMMAND with the spec, and relay the rest of stdin to it. Its stdout and stderr are this step's
  (srun relays them to the launcher). When stdin ends, COMMAND's stdin ends; a SIGTERM from Slurm
  (scancel, time limit) is passed on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from engine.contract.plan import node_gpu_ids


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on right now on this node (held open together)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def step_gpus(env: dict[str, str] | None = None) -> list[int]:
    """The GPU ids Slurm gave this step (``CUDA_VISIBLE_DEVICES``, else ``SLURM_STEP_GPUS``)."""
    env = dict(os.environ) if env is None else env
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = env.get(key, "").strip()
        if text:
            try:
                return [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                return []  # UUIDs or MIG names: keep the plan's ids
    return []


def bind_gpus(spec: dict[str, Any], allocated: list[int]) -> dict[str, Any]:
    """``spec`` with each task's ``gpu_ids`` and ``CUDA_VISIBLE_DEVICES`` mapped onto ``allocated``."""
    if not allocated:
        return spec
    tasks = []
    for task in spec.get("tasks", []):
        task = dict(task)
        ids = node_gpu_ids(allocated, [int(i) for i in task.get("gpu_ids", [])])
        task["gpu_ids"] = ids
        env = dict(task.get("env", {}))
        if "CUDA_VISIBLE_DEVICES" in env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
        task["env"] = env
        tasks.append(task)
    return {**spec, "tasks": tasks}


def _read_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return line


def run_supervisor(command: list[str]) -> int:
    stdin_fd = sys.stdin.fileno()
    first = _read_line(stdin_fd)
    if not first.strip():
        return 2
    try:
        spec = bind_gpus(json.loads(first), step_gpus())
        first = (json.dumps(spec) + "\n").encode("utf-8")
    except (ValueError, TypeError, AttributeError):
        pass  # not ours to judge: the supervisor reports a bad spec itself
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # each task gets its own from the spec
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None

    def forward(signum: int, _frame: Any) -> None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def relay() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(first)
            proc.stdin.flush()
            while True:
                chunk = os.read(stdin_fd, 65536)
                if not chunk:
                    break
                proc.stdin.write(chunk)
                proc.stdin.flush()
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threading.Thread(target=relay, name="stdin-relay", daemon=True).start()
    return proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--ports":
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(json.dumps({"node": node, "ports": free_ports(int(argv[1]))}), flush=True)
        return 0
    if argv and argv[0] == "--" and len(argv) > 1:
        code = run_supervisor(argv[1:])
        return code if code >= 0 else 128 - code
    print("usage: python -m engine.control.slurm_step --ports N | -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
