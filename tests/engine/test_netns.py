"""Network namespaces: the cheap probe, and a supervisor that brings its own loopback up."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import replace
from engine.control import netns
from engine.control.launcher import Run
from tests.conftest import ROOT, require

PRESETS = ROOT / "presets"

#: A stand-in ``python``: the supervisor runs for real; each task binds a port on 127.0.0.1 (which fails
#: while the namespace's loopback is down), says whether it could, and finishes.
TASK = r'''#!{python}
import json, os, socket, sys, time
if sys.argv[1:3] != ["-m", "engine.runtime.task"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
args = sys.argv[3:]
fd = int(args[args.index("--event-fd") + 1])
task = os.environ.get("CLUSTERDECK_TASK", "worker:0")
def emit(**e):
    os.write(fd, (json.dumps({{"v": 1, "task": task, "t": time.time(), **e}}) + "\n").encode())
try:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with socket.create_connection(s.getsockname(), timeout=2):
            pass
    bound = "yes"
except OSError as exc:
    bound = f"no: {{exc}}"
emit(kind="status", state="running", pid=os.getpid())
emit(kind="info", message="loopback", bound=bound)
emit(kind="status", state="finished", pid=os.getpid())
'''


def test_the_probe_says_why_a_refused_namespace_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", "from engine.control import netns; print(netns.available())"],
                         env=env, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    assert out == "(False, 'unshare -rn is not allowed here (unshare: unshare failed: Operation not permitted)')"


def test_the_supervisor_runs_in_the_namespace_without_a_helper_and_its_tasks_have_a_loopback(
        runs_root: Path) -> None:
    ok, why = netns.available()
    require(ok, f"network namespaces are not available: {why}")
    stand_in = runs_root.parent / "python-stand-in"
    stand_in.write_text(TASK.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=10, checkpoint_every=0, restarts=0))
    run = Run(cfg, runs_root=runs_root, python=str(stand_in), isolate=True, checked=True)
    seen: list[dict[str, Any]] = []
    run.add_listener(seen.append)
    run.start()
    sup_cmdline = " ".join(run.core.supervisors[0].proc.args)  # type: ignore[arg-type]
    assert run.wait(60) == "finished", run.state.summary()
    assert run.isolated
    assert "engine.control.netns" not in sup_cmdline and netns.LOOPBACK_FLAG in sup_cmdline
    bound = {e["task"]: e["bound"] for e in seen if e["kind"] == "info" and "bound" in e}
    assert bound == {"worker:0": "yes", "worker:1": "yes"}
    assert [e for e in events.read_file(run.folder.events) if e.get("bound")] != []


def test_a_supervisor_whose_loopback_cannot_come_up_ends_saying_so() -> None:
    # outside a namespace of its own, a process without CAP_NET_ADMIN may not change an interface's flags
    cmd = [sys.executable, "-m", "engine.control.supervisor", netns.LOOPBACK_FLAG]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        require(setpriv is not None, "root here, and no setpriv to drop CAP_NET_ADMIN", needed_in_ci=False)
        cmd = [str(setpriv), "--inh-caps=-net_admin", "--bounding-set=-net_admin", *cmd]
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), input=b"", capture_output=True,
                          timeout=30)
    assert done.returncode == 3, done.stderr
    assert b"cannot bring the network namespace's loopback up" in done.stderr
