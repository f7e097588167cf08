"""Attaching to a long running run: how soon the history and the first live step show, locally and over SSH.

A running run is simulated: ``--hours`` of ``--replicas`` replicas (one task each; per replica and tick a
``step`` event with loss, examples/s, step time and accuracy at ``--hz``, per task a ``device`` event at
``--device-hz``) written through the launcher's own :class:`engine.control.run_record.RunRecord` (lifecycle to
``events.jsonl``, samples to the tiered store ``series/``), the history ending now; then this process goes on
as its launcher (``launcher.json`` names it): a writer thread appends the same events live, stamped with the
wall time, and gives them to the record as the launcher's dispatcher does (``catch_up`` after every tick:
``events.jsonl`` at once, samples every ``SERIES_FLUSH_S`` = 0.5 s).

Sides, each in a fresh process per round (imports included, as a user's command pays them), order rotating:

- ``local``: ``clusterdeck attach``'s source (``engine.cli.attach.FollowedRun``) on the folder, drained as its
  live view does (``wait(0.125)`` in a loop);
- ``ssh``: ``engine.control.remote.RemoteRun("host:RUN")`` through ``ssh`` to an sshd on 127.0.0.1 started
  here with a throw-away key (``clusterdeck follow`` on the other end), drained the same way.

Per round: seconds from the process start to the history folded (``open``), to the first live step (a step
stamped after the attach began), and the median latency of every live step received over ``--seconds``
(arrival minus the event's ``t``). Medians with bootstrap 95 % intervals (``bench/_stats.py``); the remote
cost as the paired difference ssh - local per round.

    python bench/attach_latency.py [--hours 1] [--replicas 8] [--rounds 10] [--seconds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DOC, ROOT, add_doc_flags, free_port, machine_line, want_doc, write_section  # noqa: E402
from _stats import bootstrap_median, goal_verdict, paired_difference, rotated, rounds_note  # noqa: E402

from engine.contract.config import default_config, replace  # noqa: E402
from engine.contract.run_folder import RunFolder, process_token  # noqa: E402
from engine.control.run_record import RunRecord  # noqa: E402

SECTION = "attach_latency"
GOAL_FIRST_S = 2.0
GOAL_REMOTE_EXTRA_S = 0.100

#: One attach in a fresh process: prints when the history was folded, the first live step, the live latencies.
PROBE = r'''
import json, sys, time
start_wall, start = time.time(), time.perf_counter()
side, target, seconds, root = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
sys.path.insert(0, root)
lat, first = [], []
def on_event(e):
    if e.get("kind") == "step" and e["t"] > start_wall:
        now = time.time()
        lat.append(now - e["t"])
        if not first:
            first.append(time.perf_counter() - start)
if side == "local":
    from engine.cli.attach import FollowedRun
    from engine.contract.run_folder import RunFolder
    run = FollowedRun(RunFolder(target))
else:
    from engine.control.remote import RemoteRun
    run = RemoteRun(target, remote_command=sys.argv[5]).open()
opened = time.perf_counter() - start
points = run.state.history.total_points()
run.add_listener(on_event)
end = time.perf_counter() + seconds
while time.perf_counter() < end and not run.done:
    run.wait(0.125)
if side != "local":
    run.close()
lat.sort()
print(json.dumps({"open_s": opened, "first_live_s": first[0] if first else None, "points": points,
                  "live": len(lat), "latency_s": lat[len(lat) // 2] if lat else None,
                  "p90_s": lat[int(len(lat) * 0.9)] if lat else None}))
'''


# --------------------------------------------------------------------------- the simulated running run


def _step(r: int, tick: int, t: float) -> dict[str, Any]:
    decay = 2.0 / (1.0 + tick / 1000.0)
    noise = ((tick * 7919 + r * 104729) % 1000) / 1000.0
    return {"v": 1, "kind": "step", "task": f"worker:{r}", "t": t, "replica": r, "step": tick,
            "loss": decay + 0.05 * noise, "examples_per_sec": 600.0 + 40 * noise, "step_time": 0.04 + 0.01 * noise,
            "metrics": {"accuracy": 1.0 - decay / 2.5}}


def _device(r: int, tick: int, t: float) -> dict[str, Any]:
    return {"v": 1, "kind": "device", "task": f"worker:{r}", "t": t, "pid": 100 + r,
            "cpu_percent": 80.0 + (tick % 17), "rss_bytes": 2_000_000_000 + tick}


class LiveRun:
    """A run folder whose launcher is this process: ``hours`` of history ending now, then live events at ``hz``
    from a thread until :meth:`close` (which records the run as stopped)."""

    def __init__(self, root: Path, hours: float, replicas: int, hz: float, device_hz: float) -> None:
        self.replicas, self.hz, self.device_hz = replicas, hz, device_hz
        cfg = default_config()
        self.folder = RunFolder.create(root, "attach-bench")
        self.folder.write_config(replace(cfg, name="attach-bench", training=replace(cfg.training, steps=10**9)))
        self.record = RunRecord(self.folder, describe=self._describe, on_failure=print)
        self.tick = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        t_end = time.time()
        ticks = int(hours * 3600 * hz)
        t0 = t_end - ticks / hz
        self.record.write_event({"v": 1, "kind": "run", "task": "launcher", "t": t0 - 2, "state": "running"})
        for r in range(replicas):
            self.record.write_event({"v": 1, "kind": "status", "task": f"worker:{r}", "t": t0 - 1,
                                     "state": "running", "pid": 100 + r})
        device_every = max(1, round(hz / device_hz))
        flush_every = max(1, round(hz * 0.5))
        for tick in range(ticks):
            t = t0 + tick / hz
            for r in range(replicas):
                self.record.write_event(_step(r, tick, t))
            if tick % device_every == 0:
                for r in range(replicas):
                    self.record.write_event(_device(r, tick, t))
            if tick % flush_every == 0:
                self.record.flush()
        self.record.flush()
        self.tick = ticks
        self.events = ticks * replicas * (1 + 1 / device_every)
        self.record.write_meta("running")
        info = {"pid": os.getpid(), "token": process_token(os.getpid()), "host": socket.gethostname(),
                "socket": str(self.folder.control_socket), "detached": True,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.folder.launcher_json.write_text(json.dumps(info), encoding="utf-8")
        self._thread = threading.Thread(target=self._live, name="live-writer", daemon=True)
        self._thread.start()

    def _describe(self) -> dict[str, Any]:
        return {"state": "running", "name": "attach-bench", "mode": "data", "step": self.tick,
                "summary": {"total_steps": 10**9, "steps": self.tick},
                "launcher": {"pid": os.getpid(), "host": socket.gethostname(), "token": process_token(os.getpid())}}

    def _live(self) -> None:
        device_every = max(1, round(self.hz / self.device_hz))
        period = 1.0 / self.hz
        next_at = time.monotonic()
        while not self._stop.is_set():
            t = time.time()
            with self._lock:
                for r in range(self.replicas):
                    self.record.write_event(_step(r, self.tick, t))
                if self.tick % device_every == 0:
                    for r in range(self.replicas):
                        self.record.write_event(_device(r, self.tick, t))
                self.record.catch_up(lambda: True)  # as the launcher's dispatcher does when its queue runs dry
                self.tick += 1
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            self.record.write_event({"v": 1, "kind": "run", "task": "launcher", "t": time.time(), "state": "stopped"})
            self.record.write_meta("stopped")
            self.record.close()


# --------------------------------------------------------------------------- an sshd on 127.0.0.1


class Sshd:
    """An sshd on 127.0.0.1 taking one throw-away key; :attr:`config` names it ``cdbench`` (``ssh -F``)."""

    def __init__(self, folder: Path) -> None:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd) or shutil.which("ssh") is None:
            raise RuntimeError("OpenSSH server/client not installed")
        d = folder
        d.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
        shutil.copy(d / "id.pub", d / "authorized_keys")
        port = free_port()
        user = os.environ.get("USER") or __import__("getpass").getuser()
        (d / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PasswordAuthentication no\nPubkeyAuthentication yes\nKbdInteractiveAuthentication no\nStrictModes no\n"
            f"UsePAM no\nPidFile {d / 'sshd.pid'}\nPermitRootLogin yes\nLogLevel ERROR\n", encoding="utf-8")
        self.config = d / "config"
        self.config.write_text(
            f"Host cdbench\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d / 'id'}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            encoding="utf-8")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")],
                                     stderr=open(d / "sshd.log", "wb"))
        deadline = time.monotonic() + 10
        while True:
            probe = subprocess.run(["ssh", "-F", str(self.config), "-o", "BatchMode=yes", "cdbench", "true"],
                                   capture_output=True, timeout=10)
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"sshd did not accept the key: {probe.stderr.decode()[-300:]}")
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


# --------------------------------------------------------------------------- measuring


def probe(side: str, target: str, seconds: float, env: dict[str, str]) -> dict[str, Any]:
    argv = [sys.executable, "-c", PROBE, side, target, str(seconds), str(ROOT), f"{sys.executable} -m engine.cli"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, env=env,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"{side}: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _fmt(values: list[float], scale: float = 1.0, unit: str = "s", digits: int = 2) -> str:
    m, lo, hi = bootstrap_median([v * scale for v in values if v is not None])
    return f"{m:.{digits}f} {unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def report(args: argparse.Namespace, run: LiveRun, results: dict[str, list[dict[str, Any]]], ssh_note: str) -> str:
    rounds = len(results["local"])
    lines = [
        "## 7. Attaching to a long run: history, then live, locally and over SSH",
        "",
        f"`python bench/attach_latency.py --hours {args.hours:g} --replicas {args.replicas} --rounds {rounds} "
        f"--seconds {args.seconds:g}` — a running run simulated through the launcher's own `RunRecord`: "
        f"{args.hours:g} h of history of {args.replicas} replicas (loss, examples/s, step time, accuracy at "
        f"{args.hz:g} Hz per replica; CPU and RSS at {args.device_hz:g} Hz per task: {run.events:,.0f} events) ending "
        "at the start, then the same events live, stamped with the wall time and recorded as the launcher does "
        "(`events.jsonl` at once, samples every 0.5 s, `SERIES_FLUSH_S`); this process is the run's launcher. "
        "Each side attaches in a fresh process per round (imports, and for SSH the connection and login, "
        f"included), order rotating, and follows the run for {args.seconds:g} s as the live view does "
        "(`wait(0.125)` in a loop). *local*: `clusterdeck attach`'s source (`FollowedRun`) on the folder; *ssh*: "
        "`RemoteRun('host:RUN')` through OpenSSH to an sshd on 127.0.0.1 running `clusterdeck follow` there. "
        f"Medians with bootstrap 95 % intervals{rounds_note(rounds)}; {machine_line()}.",
        "",
        "| side | history folded (open) | first live step shown | live latency (median per round) | p90 per round | "
        "points loaded |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for side, got in results.items():
        if not got:
            continue
        lines.append(f"| {side} | {_fmt([g['open_s'] for g in got])} | {_fmt([g['first_live_s'] for g in got])} | "
                     f"{_fmt([g['latency_s'] for g in got], 1000, 'ms', 0)} | "
                     f"{_fmt([g['p90_s'] for g in got], 1000, 'ms', 0)} | {got[0]['points']:,} |")
    lines.append("")
    for side, got in results.items():
        if not got:
            continue
        first = bootstrap_median([g["first_live_s"] or float("nan") for g in got])
        from _stats import Ratio

        verdict = goal_verdict(Ratio(*first, ()), GOAL_FIRST_S, at_most=True)
        lines.append(f"- {side}: history then the first live step within {GOAL_FIRST_S:g} s of the command's start: "
                     f"{verdict} ({first[0]:.2f} s [{first[1]:.2f}, {first[2]:.2f}]).")
    if results.get("ssh"):
        extra = paired_difference([g["latency_s"] for g in results["ssh"]], [g["latency_s"] for g in results["local"]])
        verdict = goal_verdict(extra, GOAL_REMOTE_EXTRA_S, at_most=True)
        lines.append(f"- Live latency over SSH minus local, paired per round: **{extra.median * 1000:+.0f} ms "
                     f"[{extra.low * 1000:+.0f}, {extra.high * 1000:+.0f}]**; goal within "
                     f"{GOAL_REMOTE_EXTRA_S * 1000:.0f} ms of local: {verdict}.")
    else:
        lines.append(f"- SSH side **not measured**: {ssh_note}.")
    lines.append("- Where the live latency goes: the launcher writes samples to `series/` every 0.5 s, so a step "
                 "waits 0–0.5 s on disk; the local source reads the folder about every 0.1 s, the follower "
                 f"every {0.1:g} s and sends at once over ssh, where the front end folds it as it arrives.")
    lines.append(f"- Load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--hz", type=float, default=20.0)
    parser.add_argument("--device-hz", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=6.0, help="live seconds followed per round")
    parser.add_argument("--no-ssh", action="store_true", help="the local side only")
    add_doc_flags(parser)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the sshd and the folder are cleaned up on a kill too
    if args.quick:
        args.hours, args.replicas, args.rounds, args.seconds = min(args.hours, 0.01), min(args.replicas, 2), \
            min(args.rounds, 2), min(args.seconds, 2.0)
    work = Path(tempfile.mkdtemp(prefix="cd-attach-"))
    sshd: Sshd | None = None
    run: LiveRun | None = None
    ssh_note = "--no-ssh"
    try:
        started = time.perf_counter()
        run = LiveRun(work / "runs", args.hours, args.replicas, args.hz, args.device_hz)
        print(f"simulated {args.hours:g} h x {args.replicas} replicas: {run.events:,.0f} events in "
              f"{time.perf_counter() - started:.1f} s; live from now on", flush=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        sides = ["local"]
        if not args.no_ssh:
            try:
                sshd = Sshd(work / "ssh")
                env["CLUSTERDECK_SSH_CONFIG"] = str(sshd.config)
                sides.append("ssh")
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                ssh_note = str(exc)
                print(f"no ssh side: {exc}", flush=True)
        targets = {"local": str(run.folder.path), "ssh": f"cdbench:{run.folder.path}"}
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for i in range(args.rounds):
            for side in rotated(sides, i):
                got = probe(side, targets[side], args.seconds, env)
                results[side].append(got)
                print(f"round {i + 1} {side}: open {got['open_s']:.2f} s, first live step "
                      f"{got['first_live_s'] if got['first_live_s'] is None else round(got['first_live_s'], 2)} s, "
                      f"{got['live']} live steps, median latency "
                      f"{(got['latency_s'] or float('nan')) * 1000:.0f} ms", flush=True)
        body = report(args, run, results, ssh_note)
        print(body)
        if want_doc(args):
            write_section(SECTION, body, args.doc if args.doc is not None else DOC)
    finally:
        if run is not None:
            run.close()
        if sshd is not None:
            sshd.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
