"""Shared helpers of the benchmarks: presets, percentiles, free ports, the results document."""

from __future__ import annotations

import math
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "benchmarks.md"

#: Order of the sections in docs/benchmarks.md (one or two per benchmark script).
SECTIONS = ("telemetry_overhead", "whole_run", "whole_run_profile", "modes", "step_cpu", "live_latency", "gui_scale",
            "gui_scale_large", "ingest", "scale_design", "run_storage", "startup_stop", "stop_storm", "warm_start", "gpu_check", "profiles",
            "attach_latency", "breakdown_cost", "app_scale", "launch_scale")

_HEADER = """# Benchmarks

ClusterDeck promises live, sub-second, per-replica telemetry that costs the training
next to nothing. The scripts in `bench/` measure that promise side by side with what
users have today (TensorBoard's Keras callback and its server), on the same machine in
the same invocation, and report **ratios**: the machine they run on is shared and noisy,
so absolute figures drift between invocations while ratios of interleaved runs hold.

Each section below is rewritten by its script (`python bench/<name>.py`; add `--quick`
for a short smoke run that leaves this file alone unless `--write-doc` is given);
`python bench/run_all.py` runs them all.

## Method

Every ratio on this page comes from at least 10 rounds. A round runs each side once, in an
order that rotates from round to round, so that a drift of the shared machine falls on every
side alike. The figure is the **median of the paired ratios** (a side against its baseline
in the same round), given with a **bootstrap 95 % interval** of that median (the rounds
resampled 10,000 times, fixed seed: `bench/_stats.py`). A goal counts as **met only when
the whole interval clears it**; an interval that straddles the goal is reported as *not
shown* and counts as not met. Each section states the settings of every side: how often
it reports, when it flushes, and where its writing happens.

"""


#: The folders :func:`scratch_dir` made, removed by :func:`remove_scratch`.
_SCRATCH: list[Path] = []


def scratch_dir(prefix: str) -> Path:
    """A fresh temporary folder, removed when this process exits (kept where ``CD_BENCH_KEEP`` is set, to look at),
    so a benchmark leaves nothing behind in the temporary folder however often it runs. A process that leaves with
    ``os._exit`` calls :func:`remove_scratch` first."""
    import atexit
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if not _SCRATCH:
        atexit.register(remove_scratch)
    _SCRATCH.append(folder)
    return folder


def remove_scratch() -> None:
    """Remove every folder :func:`scratch_dir` made (none where ``CD_BENCH_KEEP`` is set)."""
    import shutil

    if os.environ.get("CD_BENCH_KEEP"):
        return
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


def timed_process(cmd: Sequence[str], *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                  stdout: Any = None, stderr: Any = None, timeout: float = 900.0,
                  watch: Any = None) -> tuple[float, float, int]:
    """Run ``cmd`` to its end: (wall seconds, CPU seconds of it and every descendant it reaped, exit code).

    The CPU time is ``wait4``'s resource usage of the child: user + system time of the process
    and of all its descendants that were waited for (on Linux a child's usage includes the
    descendants it reaped, as ``getrusage(RUSAGE_CHILDREN)`` does). ``watch(pid)`` is called
    right after the start (a sampler, say).
    """
    import subprocess
    import time

    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    if watch is not None:
        watch(proc.pid)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.005)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    k = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def task_threads(tasks: int, env: dict[str, str]) -> str:
    """``TF_NUM_INTRAOP_THREADS`` as ClusterDeck's supervisor gives each of ``tasks`` tasks on this machine:
    the environment's value where it sets one, else an even share of the cores."""
    from engine.contract.task_plan import INTRA_OP_ENV, intra_op_threads
    from engine.control import machine_fit

    return env.get(INTRA_OP_ENV) or str(intra_op_threads(tasks, machine_fit.cpu_count()))


def core_shares(plans: Sequence[Any]) -> dict[str, Any]:
    """The cores and thread settings ClusterDeck's supervisor gives each of ``plans`` (one host's tasks) on
    this machine (``engine.contract.task_plan.share_cores``); none where this environment chooses the intra-op
    threads, as the supervisor then leaves the tasks' placement to the kernel."""
    from engine.contract.task_plan import INTRA_OP_ENV, share_cores
    from engine.control import machine_fit

    if os.environ.get(INTRA_OP_ENV):
        return {}
    return share_cores(plans, machine_fit.cpus())


def config_core_shares(cfg: Any) -> dict[str, Any]:
    """:func:`core_shares` of the tasks of ``cfg`` (a one-host config whose ports may still be ``auto``)."""
    from engine.contract import config as config_mod
    from engine.contract.plan import plan_tasks, resolve_ports

    return core_shares(plan_tasks(config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))))


def cores_json(shares: dict[str, Any]) -> str:
    """``CD_BENCH_CORES`` for the hand-written loops (``bench/_handwritten.py``)."""
    import json

    return json.dumps({name: {"cores": list(s.cores), "env": s.env} for name, s in shares.items()})


def machine_line() -> str:
    import platform

    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        mem = ""
    return f"{os.cpu_count()} CPU cores{mem}, Python {platform.python_version()}, {platform.system()}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def write_section(name: str, body: str, path: Path = DOC) -> Path:
    """Replace (or add) the section ``name`` of the results document, leaving the others as they are."""
    if name not in SECTIONS:
        raise ValueError(f"name: expected one of {', '.join(SECTIONS)}, received: name={name!r}")
    text = path.read_text(encoding="utf-8") if path.exists() else _HEADER
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        # keep the sections in their order: insert before the first later section present
        later = [f"<!-- bench:{s} -->" for s in SECTIONS[SECTIONS.index(name) + 1:]]
        positions = [text.index(m) for m in later if m in text]
        if positions:
            at = min(positions)
            text = text[:at] + block + "\n\n" + text[at:]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def want_doc(args: object) -> bool:
    """Full runs write their section; ``--quick`` runs only with ``--write-doc``."""
    if getattr(args, "no_doc", False):
        return False
    return bool(getattr(args, "write_doc", False)) or not bool(getattr(args, "quick", False))


def add_doc_flags(parser: object) -> None:
    parser.add_argument("--quick", action="store_true", help="a short smoke run (figures are rough)")  # type: ignore[attr-defined]
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md even with --quick")  # type: ignore[attr-defined]
    parser.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")  # type: ignore[attr-defined]
    parser.add_argument("--doc", type=Path, default=DOC, help="the results document (default: docs/benchmarks.md)")  # type: ignore[attr-defined]
