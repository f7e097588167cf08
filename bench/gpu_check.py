"""The GPU check: ClusterDeck on a machine with NVIDIA GPUs, end to end, in at most ~8 minutes, no network.

Two data-parallel runs of the 784-256-10 MLP (synthetic data, SGD) over every GPU of the machine:

- *one worker per GPU*: G worker tasks, ``MultiWorkerMirroredStrategy``, each task given one GPU
  (``CUDA_VISIBLE_DEVICES`` set by the plan);
- *MirroredStrategy over all GPUs*: one task given all G GPUs.

Each run is checked:

1. every task saw only its GPUs: its ``CUDA_VISIBLE_DEVICES`` (the supervisor's ``starting``
   event carries the ids) has as many entries as the task has training devices (the task's
   strategy ``info`` event lists them), and NVML, sampled during the run, shows the task's
   process on its own GPUs and on no other (matched by PCI bus id where the task's log names
   the devices TensorFlow created);
2. NVML utilisation and per-process memory reached the events (``device`` events with
   ``gpu_util`` and ``gpu_mem_bytes`` for every trainer task) and the history the plots draw
   (``task/<name>/gpu_util`` and ``task/<name>/gpu_mem_bytes`` series in ``RunState.history``,
   the series the app's "CPU / GPU use" and "Memory" plots show);
3. examples/s per GPU, ClusterDeck against the same loop bare (``python -m engine.runtime.task
   --bare`` with the same plan), steady state, ``--rounds`` rounds, order rotating.

Without an NVIDIA GPU (no NVML, no driver, or no device) it says so and exits 0 (skipped).

    python bench/gpu_check.py [--steps 1500] [--rounds 2] [--batch-per-gpu 256] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, median, want_doc, write_section  # noqa: E402
from _stats import paired_ratio, rotated, rounds_note  # noqa: E402

from engine.contract import config as config_mod  # noqa: E402
from engine.contract.plan import plan_tasks, resolve_ports  # noqa: E402
from engine.contract.presets import load_preset  # noqa: E402
from engine.control.gpu import GpuSampler  # noqa: E402
from engine.control.launcher import Run  # noqa: E402
from engine.observe.run_reader import read_events  # noqa: E402

TIME_BUDGET_S = 8 * 60


def gpu_inventory() -> tuple[int, str, list[str]]:
    """(GPU count, reason when none, PCI bus ids in NVML order)."""
    sampler = GpuSampler()
    if not sampler.available:
        reason = sampler.error or "no GPU"
        sampler.close()
        return 0, reason, []
    buses = []
    for i in range(sampler.count):
        try:
            handle = sampler.nvml.nvmlDeviceGetHandleByIndex(i)
            bus = sampler.nvml.nvmlDeviceGetPciInfo(handle).busId
            buses.append(bus.decode() if isinstance(bus, bytes) else str(bus))
        except Exception:  # noqa: BLE001 - bus ids only sharpen the check
            buses.append("")
    count = sampler.count
    sampler.close()
    return count, "", buses


def make_config(gpus: int, one_worker_per_gpu: bool, steps: int, batch_per_gpu: int) -> config_mod.RunConfig:
    cfg = load_preset("data-2workers")
    host = cfg.cluster.hosts[0]
    workers = gpus if one_worker_per_gpu else 1
    tasks = tuple(config_mod.replace(host.tasks[0], index=i, role="worker", port=None) for i in range(workers))
    cluster = config_mod.replace(cfg.cluster, hosts=(config_mod.replace(host, tasks=tasks, gpus=gpus),))
    name = f"gpu-check-{'workers' if one_worker_per_gpu else 'mirrored'}"
    return config_mod.replace(cfg, name=name, cluster=cluster,
                              training=config_mod.replace(cfg.training, steps=steps, epochs=None, checkpoint_every=0,
                                                          global_batch_size=batch_per_gpu * gpus))


class NvmlWatch:
    """Which pids hold memory on which GPU (NVML index), sampled every 0.25 s during a run."""

    def __init__(self) -> None:
        self.seen: dict[int, set[int]] = {}  # pid -> GPU indices
        self.util_max: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> NvmlWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        sampler = GpuSampler()
        try:
            while not self._stop.is_set():
                for s in sampler.sample():
                    self.util_max[s.index] = max(self.util_max.get(s.index, 0.0), s.util_percent)
                    for pid in s.process_mem_bytes:
                        self.seen.setdefault(pid, set()).add(s.index)
                self._stop.wait(0.25)
        finally:
            sampler.close()


def check_run(cfg: config_mod.RunConfig, root: Path, buses: list[str]) -> dict[str, Any]:
    """One ClusterDeck run with every check; returns figures and the problems found."""
    run = Run(cfg, runs_root=root, keep_history=True)  # the plots' series are checked below
    collected: list[dict[str, Any]] = []
    run.add_listener(collected.append)
    with NvmlWatch() as watch:
        run.start()
        state = run.wait(TIME_BUDGET_S)
    problems: list[str] = []
    if state != "finished":
        problems.append(f"the run ended {state}: {run.state.reason}")
    plans = {p.name: p for p in run.plans}
    starting = {e["task"]: e for e in collected if e["kind"] == "status" and e.get("state") == "starting"}
    strategy_info = {e["task"]: e for e in collected if e["kind"] == "info" and e.get("strategy")}
    finished = [e for e in collected if e["kind"] == "status" and e.get("state") == "finished"]
    for name, plan in plans.items():
        want = list(plan.gpu_ids)
        visible = plan.env.get("CUDA_VISIBLE_DEVICES", "")
        if visible != ",".join(map(str, want)):
            problems.append(f"{name}: CUDA_VISIBLE_DEVICES={visible!r}, its GPUs are {want}")
        got = starting.get(name, {}).get("gpu_ids")
        if got != want:
            problems.append(f"{name}: the supervisor started it with gpu_ids {got}, expected {want}")
        info = strategy_info.get(name)
        devices = [d for d in (info or {}).get("devices", []) if "GPU" in str(d).upper()]
        if info is None:
            problems.append(f"{name}: no strategy info event")
        elif len(devices) != len(want):
            problems.append(f"{name}: trained on {len(devices)} GPU device(s) {devices}, expected {len(want)}")
        pid = starting.get(name, {}).get("pid")
        on = sorted(watch.seen.get(int(pid), set())) if pid else []
        if pid and on and on != sorted(want):
            problems.append(f"{name} (pid {pid}): NVML saw it on GPU(s) {on}, it was given {want} "
                            "(CUDA and NVML number GPUs differently here: set CUDA_DEVICE_ORDER=PCI_BUS_ID)")
        if pid and not on:
            problems.append(f"{name} (pid {pid}): NVML never saw it hold memory on a GPU")
        log = run.folder.task_dir(name) / "log.txt"
        seen_buses = re.findall(r"pci bus id: ([0-9a-fA-F:.]+)", log.read_text(errors="replace")) if log.exists() else []
        want_buses = {buses[i].lower()[-12:] for i in want if i < len(buses) and buses[i]}
        got_buses = {b.lower()[-12:] for b in seen_buses}
        if seen_buses and want_buses and not got_buses <= want_buses:
            problems.append(f"{name}: TensorFlow created devices on PCI {sorted(got_buses)}, its GPUs are "
                            f"{sorted(want_buses)}")
    device_events = [e for e in collected if e["kind"] == "device" and "gpu_util" in e]
    history = run.state.history
    for name, plan in plans.items():
        if not plan.gpu_ids:
            continue
        mine = [e for e in device_events if e["task"] == name]
        if not mine:
            problems.append(f"{name}: no device event carried gpu_util")
        elif not any((e.get("gpu_mem_bytes") or 0) > 0 for e in mine):
            problems.append(f"{name}: no device event carried its process' GPU memory (gpu_mem_bytes > 0)")
        for metric in ("gpu_util", "gpu_mem_bytes"):
            series = history.series.get(f"task/{name}/{metric}")
            if series is None or len(series) == 0:
                problems.append(f"{name}: no {metric} points in the history the plots draw")
    written = read_events(run.folder.path)  # the lifecycle and the samples' store
    if device_events and not any(e["kind"] == "device" and "gpu_util" in e for e in written):
        problems.append("the run's events.jsonl holds no device event with gpu_util")
    rates = [e["window_examples_per_sec"] for e in finished if e.get("window_examples_per_sec")]
    rate = sum(rates) / len(rates) if rates else float("nan")  # each synchronous task measures the global batch
    shutil.rmtree(run.run_dir, ignore_errors=True)
    return {"problems": problems, "examples_per_sec": rate, "util_max": dict(watch.util_max),
            "device_events": len(device_events)}


def bare_rate(cfg: config_mod.RunConfig, root: Path) -> float:
    cfg = config_mod.replace(cfg, cluster=resolve_ports(cfg.cluster))
    work = Path(tempfile.mkdtemp(dir=root, prefix="bare-"))
    config_mod.save(cfg, work / "config.yaml")
    env = {k: v for k, v in os.environ.items()}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))
    procs = []
    for plan in plan_tasks(cfg):
        out = work / f"{plan.name.replace(':', '-')}.json"
        procs.append((out, subprocess.Popen([sys.executable, "-m", "engine.runtime.task", "--run-dir", str(work),
                                             "--bare", "--summary-out", str(out)], env=dict(env, **plan.env),
                                            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    rates = []
    for out, proc in procs:
        _, err = proc.communicate(timeout=TIME_BUDGET_S)
        if proc.returncode != 0:
            raise SystemExit(f"bare task failed ({proc.returncode}): {err.decode()[-2000:]}")
        rates.append(float(json.loads(out.read_text())["window_examples_per_sec"]))
    shutil.rmtree(work, ignore_errors=True)
    return sum(rates) / len(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1500, quick 200)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of ClusterDeck and bare (default 2, quick 1)")
    parser.add_argument("--batch-per-gpu", type=int, default=256, help="examples per GPU per step")
    parser.add_argument("--max-gpus", type=int, default=8, help="use at most this many GPUs")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    count, reason, buses = gpu_inventory()
    if count == 0:
        print(f"gpu check: skipped — no NVIDIA GPU here ({reason}); nothing was run")
        if args.write_doc:
            write_section("gpu_check", doc_skipped(reason), args.doc)
        return 0
    gpus = min(count, args.max_gpus)
    steps = args.steps or (200 if args.quick else 1500)
    rounds = args.rounds or (1 if args.quick else 2)
    started = time.monotonic()
    print(f"gpu check: {gpus} of {count} GPU(s) (PCI {', '.join(buses[:gpus])}); {steps} steps, "
          f"{args.batch_per_gpu} examples per GPU per step, {rounds} round(s){rounds_note(rounds)}; {machine_line()}",
          flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cd-gpu-") as tmp:
        root = Path(tmp)
        for layout, per_gpu in (("one worker per GPU", True), ("MirroredStrategy over all GPUs", False)):
            cfg = make_config(gpus, per_gpu, steps, args.batch_per_gpu)
            cd_rates, bare_rates, problems, util = [], [], [], {}
            for r in range(rounds):
                for side in rotated(("clusterdeck", "bare"), r):
                    if time.monotonic() - started > TIME_BUDGET_S - 60:
                        problems.append("stopped early: the time budget of the check ran out")
                        break
                    if side == "clusterdeck":
                        got = check_run(cfg, root, buses)
                        problems += [p for p in got["problems"] if p not in problems]
                        cd_rates.append(got["examples_per_sec"])
                        util = got["util_max"]
                    else:
                        bare_rates.append(bare_rate(cfg, root))
            n = min(len(cd_rates), len(bare_rates))
            ratio = paired_ratio(cd_rates[:n], bare_rates[:n]) if n else None
            results[layout] = {"problems": problems, "cd_per_gpu": median(cd_rates) / gpus if cd_rates else None,
                               "bare_per_gpu": median(bare_rates) / gpus if bare_rates else None, "ratio": ratio,
                               "util_max": util, "tasks": len(cfg.cluster.tasks())}
            x = results[layout]
            print(f"{layout} ({x['tasks']} task(s)): {'ok' if not problems else 'PROBLEMS'}; examples/s per GPU: "
                  f"clusterdeck {x['cd_per_gpu'] or float('nan'):.0f}, bare {x['bare_per_gpu'] or float('nan'):.0f}"
                  + (f", ratio {ratio.text()}" if ratio else "") + "; NVML utilisation max per GPU: "
                  + ", ".join(f"{i}: {u:.0f} %" for i, u in sorted(util.items())), flush=True)
            for p in problems:
                print(f"  problem: {p}")
    print(f"gpu check done in {time.monotonic() - started:.0f} s")
    if want_doc(args):
        write_section("gpu_check", doc_section(results, gpus, count, steps, rounds, args.batch_per_gpu), args.doc)
    return 1 if any(x["problems"] for x in results.values()) else 0


def doc_skipped(reason: str) -> str:
    return "\n".join([
        "## 6. The GPU check",
        "",
        f"`python bench/gpu_check.py` — skipped on this machine: no NVIDIA GPU ({reason}). Ready to run on a "
        "machine with NVIDIA GPUs (no network, at most ~8 minutes): one worker per GPU and one "
        "`MirroredStrategy` over all GPUs, each checked for its `CUDA_VISIBLE_DEVICES`, NVML utilisation and "
        "per-process memory in the events and the plots' history, and examples/s per GPU against the same loop "
        "bare.",
    ])


def doc_section(results: dict[str, Any], gpus: int, count: int, steps: int, rounds: int, batch: int) -> str:
    lines = ["## 6. The GPU check", "",
             f"`python bench/gpu_check.py` — {gpus} of {count} NVIDIA GPU(s); the 784-256-10 MLP, {batch} examples per "
             f"GPU per step, {steps} steps, {rounds} round(s) per layout, order rotating{rounds_note(rounds)}; "
             f"{machine_line()}.", "",
             "| layout | tasks | checks | examples/s per GPU, bare | ClusterDeck | ClusterDeck / bare [95 % CI] | "
             "NVML utilisation max |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for layout, x in results.items():
        checks = "all passed" if not x["problems"] else "; ".join(x["problems"])
        util = ", ".join(f"GPU {i} {u:.0f} %" for i, u in sorted(x["util_max"].items()))
        lines.append(f"| {layout} | {x['tasks']} | {checks} | {x['bare_per_gpu'] or float('nan'):.0f} | "
                     f"{x['cd_per_gpu'] or float('nan'):.0f} | {x['ratio'].text() if x['ratio'] else '-'} | {util} |")
    lines += ["", "Checks: each task's `CUDA_VISIBLE_DEVICES` and the supervisor's `gpu_ids` match its plan; the "
              "task trained on as many GPU devices as it was given; NVML saw its process on those GPUs only (and "
              "TensorFlow's log names their PCI bus ids); `device` events carried `gpu_util` and `gpu_mem_bytes` "
              "for every trainer task, and the history the plots draw holds those series."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
