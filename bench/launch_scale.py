"""Launch at scale: ``Run.start()`` to every task stepping, 64 tasks over 8 hosts reached over SSH.

The hosts are the lab's (``.ci/services/lab.sh``, docs/lab.md): network namespaces on a bridge of this machine,
each with its own sshd, pinned to one core (8 hosts on this machine's cores). A real ClusterDeck
:class:`~engine.control.launcher.Run` of ``--hosts`` x ``--per-host`` data-mode workers is launched over ``ssh``
(the lab's ssh config), every part of it real (preflight, ssh, supervisors, warm-start templates, task
processes, event pipes, the launcher's dispatcher) except the training: each task is *simulated*
(``CLUSTERDECK_TEST_SIMULATE``, :mod:`engine.runtime.fault_hooks`): it imports no TensorFlow, says ``running``,
then emits a ``step`` event every 0.1 s, as a training task does from its start (its host's warm-start template
imports no TensorFlow either). So the figure is a launch without the slowest task's TensorFlow start (the import a
template does once per host, a task's model build, its first step): ClusterDeck's own share, and what any launch
over ssh of the same tasks costs on these hosts (the floor, below), which is not ClusterDeck's.

Per run (one fresh process per run, importing the tree it measures: its remote supervisors and tasks too, through
a ``python`` wrapper that puts that tree first on their path): ``Run.start()`` to the last task's first ``step``
event received by a launcher listener, cut along that task's path into ClusterDeck's phases, from the launcher's
timers and the events' own times (every host is this machine: one clock):

- *preflight: ports* (``reachability.problems``: every task's address and port tried from here);
- *preflight: ssh login* (``reachability.login_problems``: each host logged in to, in parallel);
- *other launcher work* (validation, run folder, ports, config) up to the start of that task's host's ``ssh``;
- *ssh connect* (``ssh`` started to the supervisor's process created there, ``hosts/<host>/supervisor.json``);
- *supervisor start* (python, its imports, the spec, its record) to its first event;
- *template* (the host's warm-start template started and ready) to its first task's ``starting``;
- *task spawn* (the host's earlier tasks forked first) to this task's ``starting``;
- *task start* (the forked task's own start) to its ``running``; *first step* to its first ``step`` event;
- *through the launcher* (the supervisor's relay, ssh, the launcher's reader and dispatcher) to the listener.

The floor (side ``bare``): what any launch of these tasks over ssh costs, ClusterDeck or not, on the same hosts in
the same rounds: per host one ``ssh`` (the same config, a fresh login) whose login shell runs one Python (this
interpreter, its ``site`` and all) that forks ``--per-host`` children, each printing its line at once; timed to
the last line received. Its key exchanges, login shells and interpreters are the part of the launch that is not
ClusterDeck's: ClusterDeck's own share is the paired difference, ClusterDeck's launch less the floor.

Sides, in rounds (order rotating, ``bench/_stats.py``): the 64-task launch and the reference of one host x 8
tasks, each for this tree, the floor and, with ``--against REV``, for that git revision (a temporary worktree), so a
change is measured before/after in the same rounds; ``--variant nomux`` adds this tree with a switch
(``CLUSTERDECK_SSH_MUX=0``: no shared ssh connection) on the 64-task launch. Medians with bootstrap 95 %
intervals; before/after as the paired difference per round. Also per run: the CPU-seconds this machine was busy
from ``Run.start()`` to every task stepping (``/proc/stat``: every host's work is on these cores).

    python bench/launch_scale.py [--rounds 10] [--against REV] [--variant nomux] [--hosts 8] [--per-host 8] [--quick]

Needs root (the lab); brings the lab up with ``--hosts`` hosts where fewer answer, and down again at the end
where it brought it up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_doc_flags, machine_line, want_doc, write_section  # noqa: E402
from _stats import Ratio, bootstrap_median, goal_verdict, paired_difference, rotated, rounds_note  # noqa: E402

SECTION = "launch_scale"
LAB_SH = ROOT / ".ci" / "services" / "lab.sh"
LAB_DIR = Path(os.environ.get("CLUSTERDECK_LAB_DIR", "/tmp/clusterdeck-lab"))
#: ClusterDeck's own share of a launch of 64 tasks over 8 hosts, beyond the slowest task's TensorFlow start.
GOAL_S = 2.0
#: Seconds between a simulated task's steps.
STEP_S = 0.1
#: The phases of the last task's path, in order (the names the child reports).
PHASES = (
    ("ports", "preflight: ports tried"),
    ("login", "preflight: ssh login, every host"),
    ("launcher", "other launcher work, to its host's ssh started"),
    ("ssh", "ssh connect (to the supervisor's process there)"),
    ("supervisor", "supervisor start (python, imports, spec) to its first event"),
    ("template", "warm-start template, to the host's first task started"),
    ("spawn", "the host's earlier tasks started, to this one's"),
    ("task", "task start (fork) to `running`"),
    ("step", "`running` to its first step"),
    ("relay", "through the supervisor, ssh and the launcher to a listener"),
)


# --------------------------------------------------------------------------- one run (a fresh process)


def create_time_offset() -> float:
    """psutil's process start times less this clock's (they count from the boot time, a whole second in /proc)."""
    import psutil

    offsets = []
    for _ in range(3):
        before = time.time()
        proc = subprocess.Popen(["sleep", "0.1"])
        after = time.time()
        offsets.append(psutil.Process(proc.pid).create_time() - (before + after) / 2)
        proc.wait()
    return sorted(offsets)[1]


def busy_cpu_s() -> float:
    """CPU seconds this machine's cores have been busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


#: Where the machine's CPU went during a launch, by process (every host's processes are this machine's): the
#: groups, in the table's order, and how a process is put in one (its name, its command line).
CPU_GROUPS = (
    ("launcher", "ClusterDeck: the launcher (this process)"),
    ("ssh", "OpenSSH's client (logins, key exchange; reaped by the launcher)"),
    ("sshd", "OpenSSH's sshd on the hosts (key exchange, sessions)"),
    ("shell", "the hosts' login shells (bash and its rc files' commands: this machine's `pyenv init`)"),
    ("supervisor", "ClusterDeck: supervisors (python start, imports, work; the shell before it exec'd them)"),
    ("template", "ClusterDeck: warm-start templates and the tasks forked from them"),
    ("bare", "the floor's Python (one per host; the shell before it exec'd it) and the tasks it forked"),
    ("other", "anything else on the machine"),
)


def _cpu_group(pid: int, name: str, cmdline: str) -> str:
    if pid == os.getpid():
        return "launcher"
    if name == "ssh":
        return "ssh"
    if name.startswith("sshd") or cmdline.startswith("sshd"):
        return "sshd@" if "@" in cmdline else "sshd"  # `sshd: user@notty`: a connection's, its sessions' parent
    if name in ("bash", "sh", "dash", "zsh"):  # a login shell (one running a supervisor's command line too)
        return "shell"
    if "engine.control.supervisor" in cmdline:
        return "supervisor"
    if "engine.runtime.task" in cmdline:
        return "template"
    if BARE_MARK in cmdline:
        return "bare"
    return "other"


def cpu_by_process() -> dict[tuple[int, float], tuple[str, float, float]]:
    """Every process's (group, own CPU seconds, CPU seconds of the children it reaped), by (pid, start time)."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times", "create_time"]):
        times = proc.info["cpu_times"]
        if times is None:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        out[(proc.pid, proc.info["create_time"])] = (
            _cpu_group(proc.pid, proc.info["name"] or "", cmdline), times.user + times.system,
            times.children_user + times.children_system)
    return out


def cpu_spent(before: dict[tuple[int, float], tuple[str, float, float]],
              after: dict[tuple[int, float], tuple[str, float, float]]) -> dict[str, float]:
    """CPU seconds each group spent between two :func:`cpu_by_process` looks: a process's own, and what its children
    that ended and were reaped meanwhile spent (the launcher's: its ssh clients; a shell's: its rc's commands)."""
    spent = dict.fromkeys((g for g, _ in CPU_GROUPS), 0.0)
    for key, (group, own, reaped) in after.items():
        own0, reaped0 = before[key][1:] if key in before else (0.0, 0.0)
        # what a process reaped: the launcher's, its ssh clients; a supervisor's, the commands its login shell's rc
        # ran before that shell exec'd the supervisor's command line (its tasks and template live on: not reaped);
        # an sshd session's (`sshd: user@notty`), the login shells of its sessions that ended (a `true`)
        spent["sshd" if group == "sshd@" else group] += own - own0
        spent[{"launcher": "ssh", "supervisor": "shell", "sshd@": "shell", "bare": "shell"}.get(group, group)] += reaped - reaped0
    return spent


def child(tree: Path, hosts: int, per_host: int, step_s: float) -> dict[str, Any]:
    """Launch one run from ``tree`` (put first on ``sys.path`` here), stop it; its figures."""
    assert "engine" not in sys.modules, "the tree's engine must be the one imported"
    sys.path.insert(0, str(tree))
    from engine.contract import config as config_mod
    from engine.contract.config import Cluster, Host, Task
    from engine.control import reachability, transports
    from engine.control.launcher import Run
    from engine.runtime import fault_hooks

    tmp = Path(tempfile.mkdtemp(prefix="cd-launch-scale-"))
    python = tmp / "python"  # the tree's engine first on the path of every supervisor and task on every host
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tree} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    cfg = config_mod.load(tree / "presets" / "data-2workers.yaml")
    cluster = Cluster(hosts=tuple(
        Host(name=f"lab{n}", address=f"10.99.0.{10 + n}", ssh_host=f"lab{n}", python=str(python),
             tasks=tuple(Task("worker", (n - 1) * per_host + i) for i in range(per_host)))
        for n in range(1, hosts + 1)))
    cfg = config_mod.replace(cfg, name="launch-scale", cluster=cluster,
                             training=config_mod.replace(cfg.training, steps=10_000_000, epochs=None,
                                                         checkpoint_every=0, restarts=0))
    marks: dict[str, float] = {}
    popen: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            marks[name + "_start"] = time.time()
            try:
                return fn(*a, **kw)
            finally:
                marks[name + "_end"] = time.time()
        return wrapper

    reachability.problems = timed("ports", reachability.problems)
    reachability.login_problems = timed("login", reachability.login_problems)
    start_ssh = transports.SshTransport.start

    def start(self: Any, launch: Any) -> Any:
        popen.setdefault(launch.group, time.time())
        return start_ssh(self, launch)

    transports.SshTransport.start = start  # type: ignore[method-assign]
    n_tasks = hosts * per_host
    first_step: dict[str, tuple[float, float]] = {}  # task: (its t, received)
    status: dict[tuple[str, str], float] = {}  # (task, state): its t (the first)
    sup_first: dict[str, float] = {}  # host: t of its supervisor's first event
    everyone = threading.Event()
    lock = threading.Lock()

    def on_event(e: dict[str, Any]) -> None:
        now = time.time()
        with lock:
            task, kind = str(e.get("task", "")), e.get("kind")
            if kind == "step" and task not in first_step:
                first_step[task] = (float(e["t"]), now)
                if len(first_step) == n_tasks:
                    everyone.set()
            elif kind == "status":
                status.setdefault((task, str(e.get("state"))), float(e["t"]))
            if task.startswith("supervisor@"):
                sup_first.setdefault(task.partition("@")[2], float(e["t"]))

    runs_root = tmp / "runs"
    run = Run(cfg, runs_root=runs_root, task_env={fault_hooks.SIMULATE: str(step_s)})
    run.add_listener(on_event)
    processes0 = cpu_by_process()
    cpu0 = busy_cpu_s()
    t0 = time.time()
    try:
        run.start()
        if not everyone.wait(180):
            raise SystemExit(f"not every task stepped: {len(first_step)} of {n_tasks}; {run.state.state} "
                             f"{run.state.reason}")
        cpu = busy_cpu_s() - cpu0
        cpu_by = cpu_spent(processes0, cpu_by_process())
    finally:
        stop_at = time.time()
        run.stop()
        stopped = time.time() - stop_at
    run_dir = run.run_dir
    created = {}
    offset = create_time_offset()
    for n in range(1, hosts + 1):
        record = run_dir / "hosts" / f"lab{n}" / "supervisor.json"
        created[f"lab{n}"] = float(json.loads(record.read_text())["created"]) - offset
    host_of = {t.name: h.name for h in cluster.hosts for t in h.tasks}
    last = max(first_step, key=lambda name: first_step[name][1])
    host = host_of[last]
    first_start = min(status[(t, "starting")] for t, h in host_of.items() if h == host)
    path = [t0, marks["ports_start"], marks["ports_end"], marks["login_start"], marks["login_end"], popen[host],
            created[host], sup_first[host], first_start, status[(last, "starting")], status[(last, "running")],
            first_step[last][0], first_step[last][1]]
    # phases: ports, login, launcher (the rest before the host's ssh), then one segment per mark
    phases = {"ports": path[2] - path[1], "login": path[4] - path[3],
              "launcher": (path[5] - path[0]) - (path[2] - path[1]) - (path[4] - path[3])}
    for name, (a, b) in zip(("ssh", "supervisor", "template", "spawn", "task", "step", "relay"),
                            zip(path[5:-1], path[6:], strict=True), strict=True):
        phases[name] = b - a
    total = first_step[last][1] - t0
    detail = {t: [round(status.get((t, "starting"), 0) - t0, 3), round(status.get((t, "running"), 0) - t0, 3),
                  round(first_step[t][1] - t0, 3)] for t in host_of}
    detail.update({f"sup@{h}": [round(popen[h] - t0, 3), round(created[h] - t0, 3), round(sup_first[h] - t0, 3)]
                   for h in popen})
    if os.environ.get("CD_BENCH_KEEP"):
        print(f"kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"total": total, "phases": phases, "last": last, "host": host, "stop": stopped,
            "first_any": min(v[1] for v in first_step.values()) - t0,
            "ssh_max": max(created[h] - popen[h] for h in popen), "tasks": n_tasks, "cpu": cpu, "cpu_by": cpu_by,
            "detail": detail}


#: What the floor's Python runs on each host (its first line marks its processes for the CPU split).
BARE_MARK = "# launch-scale floor"
BARE_CODE = f"""{BARE_MARK}
import os, sys
for i in range(int(sys.argv[1])):
    if os.fork() == 0:
        os.write(1, f"step {{i}}\\n".encode())
        while os.read(0, 4096):  # each task lives on until the launcher has counted the CPU (a live process's
            pass  # CPU is its own group's: a task reaped earlier would be counted as its parent's)
        os._exit(0)
for _ in range(int(sys.argv[1])):
    os.wait()
"""


def bare_child(hosts: int, per_host: int) -> dict[str, Any]:
    """The floor: per host one ssh login whose shell runs one Python forking ``per_host`` children that each say a
    line; the time until every line is here, and the CPU the machine spent meanwhile."""
    import selectors
    import shlex

    config = str(LAB_DIR / "ssh_config")
    remote = shlex.join([sys.executable, "-c", BARE_CODE, str(per_host)])
    processes0 = cpu_by_process()
    cpu0 = busy_cpu_s()
    t0 = time.time()
    procs = [subprocess.Popen(["ssh", "-F", config, "-T", "-o", "BatchMode=yes", f"lab{n}", remote],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in range(1, hosts + 1)]
    sel = selectors.DefaultSelector()
    for proc in procs:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        sel.register(proc.stdout, selectors.EVENT_READ, proc)
    lines, n_tasks, deadline = 0, hosts * per_host, t0 + 120
    pending = {proc.stdout.fileno(): b"" for proc in procs if proc.stdout is not None}
    while lines < n_tasks and sel.get_map() and time.time() < deadline:
        for key, _ in sel.select(1.0):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
            *whole, pending[key.fd] = (pending[key.fd] + chunk).split(b"\n")
            lines += sum(1 for line in whole if line.startswith(b"step "))  # not what a login shell's rc prints
    total = time.time() - t0
    cpu = busy_cpu_s() - cpu0
    cpu_by = cpu_spent(processes0, cpu_by_process())
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()  # the floor's tasks read its end: they leave, then their Python, then its session
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if lines < n_tasks:
        raise SystemExit(f"the floor's launch said {lines} of {n_tasks} lines: "
                         + "; ".join((p.stderr.read() or b"").decode(errors="replace")[-300:] for p in procs if p.stderr))
    return {"total": total, "phases": {}, "last": "", "host": "", "stop": 0.0, "first_any": 0.0, "ssh_max": 0.0,
            "tasks": n_tasks, "cpu": cpu, "cpu_by": cpu_by, "detail": {}}


# --------------------------------------------------------------------------- the rounds


def lab_hosts_answering() -> int:
    done = subprocess.run([str(LAB_SH), "status"], capture_output=True, text=True)
    return sum(1 for line in done.stdout.splitlines() if line.endswith("ssh answers"))


def prepare_tree(rev: str) -> Path:
    where = Path(tempfile.mkdtemp(prefix="cd-launch-base-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)
    return where


#: Variants of this tree measured beside it: the environment they add.
VARIANTS = {"nomux": {"CLUSTERDECK_SSH_MUX": "0"}}


def one(tree: Path | None, hosts: int, per_host: int, step_s: float, extra: dict[str, str]) -> dict[str, Any]:
    """One run of a side in a fresh process: ClusterDeck's launch from ``tree``, or the floor where it is None."""
    if tree is None:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--bare-child", "--hosts", str(hosts),
                              "--per-host", str(per_host)], capture_output=True, text=True, timeout=400)
        for line in reversed(out.stdout.splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        raise SystemExit(f"the floor's run failed ({out.returncode}): {out.stderr[-3000:]}")
    env = dict(os.environ, PYTHONPATH=str(tree), CLUSTERDECK_SSH_CONFIG=str(LAB_DIR / "ssh_config"),
               TF_CPP_MIN_LOG_LEVEL="2", **extra)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--hosts", str(hosts),
                          "--per-host", str(per_host), "--step-s", str(step_s)],
                         env=env, cwd=str(tree), capture_output=True, text=True, timeout=400)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise SystemExit(f"a run from {tree} failed ({out.returncode}): {out.stderr[-3000:]}")


def ci(values: list[float], digits: int = 2) -> str:
    med, low, high = bootstrap_median(values)
    return f"{med:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 10, quick 2)")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=STEP_S)
    parser.add_argument("--against", default="", help="a git revision measured in the same rounds (before/after)")
    parser.add_argument("--no-reference", action="store_true", help="leave out the 1 host x 8 tasks reference")
    parser.add_argument("--variant", action="append", default=[],
                        help=f"also this tree with a switch, on the large launch: {', '.join(VARIANTS)}")
    parser.add_argument("--no-floor", action="store_true", help="leave out the floor (a bare launch over ssh)")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.hosts, args.per_host, args.step_s)), flush=True)
        return {}
    if args.bare_child:
        print(json.dumps(bare_child(args.hosts, args.per_host)), flush=True)
        return {}
    rounds = args.rounds or (2 if args.quick else 10)
    brought_up = False
    if lab_hosts_answering() < args.hosts:
        subprocess.run([str(LAB_SH), "up"], env=dict(os.environ, LAB_HOSTS=str(args.hosts)), check=True)
        brought_up = True
    trees = {"this": ROOT}
    if args.against:
        trees["base"] = prepare_tree(args.against)
    n = args.hosts * args.per_host
    shapes = {str(n): (args.hosts, args.per_host)} if args.no_reference else {
        str(n): (args.hosts, args.per_host), str(args.per_host): (1, args.per_host)}
    variants = [v for v in args.variant if v in VARIANTS]
    sides = [f"{shape}/{tree}" for shape in shapes for tree in [*trees, *([] if args.no_floor else ["bare"])]]
    sides += [f"{next(iter(shapes))}/{v}" for v in variants]  # the switches: on the large launch only
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    print(f"{args.hosts} hosts x {args.per_host} simulated tasks (and 1 x {args.per_host}), {rounds} round(s), "
          f"sides {', '.join(sides)}; {machine_line()}", flush=True)
    try:
        for r in range(rounds):
            for side in rotated(sides, r):
                shape, tree = side.split("/")
                res = one(None if tree == "bare" else trees.get(tree, ROOT), *shapes[shape], args.step_s,
                          VARIANTS.get(tree, {}))
                got[side].append(res)
                ph = res["phases"]
                by = ", ".join(f"{g} {v:.2f}" for g, v in res.get("cpu_by", {}).items())
                print(f"round {r + 1} {side:>8}: {res['total']:.2f} s, {res['cpu']:.1f} CPU-s busy ({by}) "
                      f"(last {res['last']} "
                      f"on {res['host']}; " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items())
                      + f"; stop {res['stop']:.2f} s)", flush=True)
    finally:
        if "base" in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["base"])],
                           capture_output=True)
        if brought_up:
            subprocess.run([str(LAB_SH), "down"], capture_output=True)
    figures: dict[str, Any] = {"rounds": rounds, "sides": {}}
    for side, results in got.items():
        totals = [x["total"] for x in results]
        figures["sides"][side] = {"total": bootstrap_median(totals),
                                  "phases": {k: bootstrap_median([x["phases"][k] for x in results]) for k, _ in PHASES
                                             if all(k in x["phases"] for x in results)},
                                  "stop": bootstrap_median([x["stop"] for x in results]),
                                  "cpu": bootstrap_median([x["cpu"] for x in results]),
                                  "cpu_by": {g: bootstrap_median([x["cpu_by"][g] for x in results])
                                             for g, _ in CPU_GROUPS if all("cpu_by" in x for x in results)},
                                  "totals": totals}
        print(f"{side}: Run.start() to every task stepping {ci(totals)} s{rounds_note(rounds)}")
    pairs = [(f"{shape}/this", f"{shape}/base") for shape in shapes if "base" in trees]
    pairs += [(f"{next(iter(shapes))}/this", f"{next(iter(shapes))}/{v}") for v in variants]
    pairs += [(f"{shape}/this", f"{shape}/bare") for shape in shapes if not args.no_floor]
    figures["diffs"] = {}
    for a, b in pairs:
        diff = paired_difference([x["total"] for x in got[a]], [x["total"] for x in got[b]])
        figures["diffs"][(a, b)] = diff
        print(f"{a} - {b}: {diff.text(2)} s")
    if want_doc(args):
        write_section(SECTION, _doc(args, figures, got), args.doc)
    return figures


def _doc(args: Any, figures: dict[str, Any], got: dict[str, list[dict[str, Any]]]) -> str:
    rounds = figures["rounds"]
    n = args.hosts * args.per_host
    lines = [
        "## 4d. Launch at scale",
        "",
        f"`python bench/launch_scale.py{' --against ' + args.against if args.against else ''}` — a real `Run` of "
        f"{n} data-mode workers over {args.hosts} lab hosts (network namespaces on a bridge of this machine, each "
        f"with its own sshd, pinned to one core: `.ci/services/lab.sh`), launched over ssh; every task *simulated* "
        f"(`CLUSTERDECK_TEST_SIMULATE`: no TensorFlow, `running` then a step every {args.step_s:g} s), so what is "
        f"timed is a launch without TensorFlow's start: ClusterDeck's own share and what any ssh launch of these tasks "
        f"costs here (`bare`, the floor). {rounds} rounds, sides in rotating order, one fresh launcher "
        f"process per run; medians with bootstrap 95 % intervals{rounds_note(rounds)}; {machine_line()}.",
        "",
    ]
    names = [s for s in got]
    head = "| phase of the last task's path (s) | " + " | ".join(f"`{s}`" for s in names) + " |"
    lines += [head, "| --- |" + " ---: |" * len(names)]
    for key, label in PHASES:
        cells = []
        for s in names:
            if key not in figures["sides"][s]["phases"]:  # the floor has no phases of ClusterDeck's
                cells.append("—")
                continue
            med, low, high = figures["sides"][s]["phases"][key]
            cells.append(f"{med:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for s in names:
        med, low, high = figures["sides"][s]["total"]
        cells.append(f"**{med:.2f} [{low:.2f}, {high:.2f}]**")
    lines.append("| **`Run.start()` to every task stepping** | " + " | ".join(cells) + " |")
    lines.append("| CPU-seconds the machine was busy meanwhile (its 2 cores: all hosts') | " + " | ".join(
        "{:.1f} [{:.1f}, {:.1f}]".format(*figures["sides"][s]["cpu"]) for s in names) + " |")
    for group, label in CPU_GROUPS:
        if all(group in figures["sides"][s]["cpu_by"] for s in names):
            lines.append(f"| &nbsp;&nbsp;of it: {label} | " + " | ".join(
                "{:.2f} [{:.2f}, {:.2f}]".format(*figures["sides"][s]["cpu_by"][group]) for s in names) + " |")
    lines.append("| `Run.stop()` (returns once the run's processes are gone) | " + " | ".join(
        "—" if s.endswith("/bare") else "{:.2f} [{:.2f}, {:.2f}]".format(*figures["sides"][s]["stop"])
        for s in names) + " |")
    this = figures["sides"].get(f"{n}/this")
    if this is not None:
        med, low, high = this["total"]
        lines += ["", f"Launching {n} tasks over {args.hosts} hosts, `Run.start()` to every task stepping (the simulated "
                      f"tasks' TensorFlow start is nil): **{med:.2f} [{low:.2f}, {high:.2f}] s**."]
        share = figures["diffs"].get((f"{n}/this", f"{n}/bare"))
        if share is not None:
            verdict = goal_verdict(Ratio(share.median, share.low, share.high), GOAL_S, at_most=True)
            bmed, blow, bhigh = figures["sides"][f"{n}/bare"]["total"]
            lines.append(f"The floor (the same hosts' ssh logins, login shells and one Python per host forking its "
                         f"tasks): **{bmed:.2f} [{blow:.2f}, {bhigh:.2f}] s**. ClusterDeck's own share, the launch less "
                         f"the floor (paired per round): **{share.text(2)} s**, goal <= {GOAL_S:g} s beyond the slowest "
                         f"task's TensorFlow start: {verdict}.")
    for (a, b), diff in figures["diffs"].items():
        lines.append(f"`{a}` - `{b}` (paired per round): **{diff.text(2)} s**.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
