"""A task's answers to "why is it stuck, why is it slow": stack dumps on a signal, profiles on request.

**Stacks.** :func:`arm_stack_dumps` registers :mod:`faulthandler` on :data:`DUMP_SIGNAL` (``SIGUSR1``): the
signal makes the process append the Python stacks of all its threads to ``tasks/<task>/stacks.txt``.
faulthandler's handler is C and async-signal-safe, so it answers while the main thread is blocked in
TensorFlow (a collective waiting for a peer), where a Python handler would never run. The file starts each
arming with a line naming the task, its pid and its main thread (``# clusterdeck stacks … main thread
0x…``), so a reader can tell which dumped thread is the main one; whoever asks for a dump writes its own
marker line first (:mod:`engine.control.doctor`). A fatal signal (SIGSEGV, SIGABRT: a crash inside TensorFlow)
appends a last dump to the same file, headed ``Fatal Python error``.

**Profiles.** :class:`ProfileRequests` looks for ``RUN/profile/request.json`` (``{"id", "ms", "t"}``) at most
every :data:`POLL_S` seconds, each time the task writes an event (its reports, at ``training.metrics_hz``), or from
an idle main loop (:func:`look`); for a new, recent request it captures, on a thread that lasts as long as the
capture, a TensorFlow profile of ``ms`` milliseconds while the task trains on, writes it in TensorBoard's profile layout
(``RUN/tensorboard/plugins/profile/<id>/<task>.xplane.pb``: one "host" per task), then its summary
``RUN/profile/<id>/<task>.summary.json`` (:func:`summarize`: the top ops and op types by self time, and the
ops' time by category: compute, collective, input), read back by front ends without
TensorFlow (``engine.control.profiling``), and last ``RUN/profile/<id>/<task>.done`` (JSON: the file, the top
ops, where the summary is, or the error). Before its first capture a task guards TensorFlow 2.21's trace
collection (:func:`guard_trace_collection`): unguarded, ``profiler.stop()`` wrote into freed memory on a
multi-worker task and killed it about one capture in ten.

No thread waits for requests: a task that kept one (asleep in ``time.sleep`` between looks, or for a whole
minute) trained its 1,500 data-mode steps about 10 % slower than without it, though the thread's own work was
~2 ms a run (docs/benchmarks.md 1b); the cause in TensorFlow's runtime is not known.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from engine.contract.run_folder import RunFolder, task_folder_name

#: The signal that asks a task for its stacks (its default action would end the process: armed first thing).
DUMP_SIGNAL = signal.SIGUSR1
#: The file in the task's folder that collects its dumps (``engine.control.doctor.STACKS_FILE`` reads it).
STACKS_FILE = "stacks.txt"
#: Seconds between two looks for a profile request.
POLL_S = 0.5
#: A request older than this (seconds, by its ``t``) is not taken: it was meant for tasks before this one.
STALE_S = 60.0
#: Bounds of a capture, milliseconds.
MIN_MS, MAX_MS = 10, 60_000
#: How many ops (and op types) a task names in its profile summary.
TOP_OPS = 8
#: The summary's file beside the done file.
SUMMARY_SUFFIX = ".summary.json"
#: Op types by what a step waits on, as TensorFlow names them in a trace (matched case-sensitively, anywhere
#: in the type); every other op is compute. A collective's self time includes its wait for the peers.
COLLECTIVE_OPS = ("Collective", "AllReduce", "AllGather", "AllToAll", "ReduceScatter", "Nccl", "Recv", "Send",
                  "CopyToMesh", "Relayout", "DTensor")
INPUT_OPS = ("Iterator", "Dataset", "PyFunc")
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_armed: list[IO[str]] = []  # faulthandler writes to these files' descriptors: they must stay open


def arm_stack_dumps(task_dir: Path, task: str) -> Path | None:
    """``SIGUSR1`` appends every thread's Python stack to ``task_dir/stacks.txt``; the file, or None where it
    cannot be armed (no such signal, the file cannot be opened)."""
    if not hasattr(faulthandler, "register"):
        return None
    path = task_dir / STACKS_FILE
    try:
        task_dir.mkdir(parents=True, exist_ok=True)
        out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - stays open for faulthandler
    except OSError:
        return None
    out.write(f"# clusterdeck stacks of {task}: pid {os.getpid()}, main thread 0x{threading.get_ident():016x}\n")
    out.flush()
    faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    # a fatal signal (a crash inside TensorFlow) leaves every thread's stack there too, then ends the task as before
    faulthandler.enable(file=out, all_threads=True)
    _armed.append(out)
    return path


class ProfileRequests:
    """Takes profile requests from the run folder (see the module docstring); one capture at a time."""

    def __init__(self, run_dir: Path, task: str, emit_info: Any = None) -> None:
        self.folder = RunFolder(run_dir)
        self.task = task
        self.emit_info = emit_info  # ``emitter.info`` or None
        self.seen: set[str] = set()
        self._lock = threading.Lock()
        self._looked_at = -POLL_S  # the monotonic clock's time of the last look
        self._capture_thread: threading.Thread | None = None

    @property
    def request_file(self) -> Path:
        return self.folder.path / "profile" / "request.json"

    def look(self) -> threading.Thread | None:
        """A look for a request, at most every :data:`POLL_S` seconds whoever calls (any thread; it never waits);
        a new request is captured on a thread of its own, returned, which ends with the capture."""
        now = time.monotonic()
        if not self._lock.acquire(blocking=False):
            return None
        try:
            busy = self._capture_thread is not None and self._capture_thread.is_alive()
            if busy or now - self._looked_at < POLL_S:
                return None
            self._looked_at = now
            try:
                request = self.pending()
            except Exception as exc:  # noqa: BLE001 - diagnostics must never end the task
                self._say(f"profile request failed: {exc!r}")
                return None
            if request is None:
                return None
            self.seen.add(request[0])
            thread = self._capture_thread = threading.Thread(target=self.take, args=request, name="profile-capture",
                                                             daemon=True)
        finally:
            self._lock.release()
        thread.start()
        return thread

    def pending(self) -> tuple[str, int] | None:
        """The request to capture now, once TensorFlow is imported (until then it waits: its "t" bounds how long)."""
        tf = sys.modules.get("tensorflow")
        if tf is None or not hasattr(tf, "profiler"):
            return None
        return self.read_request()

    def read_request(self) -> tuple[str, int] | None:
        """The pending request's ``(id, ms)``, or None (no file, malformed, stale, seen or done)."""
        try:
            request = json.loads(self.request_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(request, dict):
            return None
        rid, ms, t = request.get("id"), request.get("ms"), request.get("t", 0)
        if not isinstance(rid, str) or not _ID.match(rid) or rid in self.seen:
            return None
        if not isinstance(ms, int) or isinstance(ms, bool) or not isinstance(t, (int, float)):
            return None
        if time.time() - float(t) > STALE_S or self.done_file(rid).exists():
            return None
        return rid, max(MIN_MS, min(MAX_MS, ms))

    def done_file(self, rid: str) -> Path:
        return self.folder.path / "profile" / rid / f"{task_folder_name(self.task)}.done"

    def xplane_file(self, rid: str) -> Path:
        return self.folder.tensorboard / "plugins" / "profile" / rid / f"{task_folder_name(self.task)}.xplane.pb"

    def take(self, rid: str, ms: int) -> None:
        """Capture request ``rid`` and write its done file (an error is written there too, or said)."""
        try:
            result: dict[str, Any] = {"task": self.task, "id": rid, "ms": ms}
            try:
                result.update(self._capture(sys.modules["tensorflow"], rid, ms))
            except Exception as exc:  # noqa: BLE001 - reported in the done file
                result["error"] = f"{type(exc).__name__}: {exc}"[:600]
            done = self.done_file(rid)
            self.folder.private_dir(done.parent)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(result), encoding="utf-8")
            os.replace(tmp, done)
        except Exception as exc:  # noqa: BLE001 - diagnostics must never end the task
            self._say(f"profile request failed: {exc!r}")

    def _capture(self, tf: Any, rid: str, ms: int) -> dict[str, Any]:
        raw = self.folder.path / "profile" / rid / f"raw-{task_folder_name(self.task)}"
        self.folder.private_dir(raw)
        guard = guard_trace_collection()
        started = time.time()
        tf.profiler.experimental.start(str(raw))
        try:
            time.sleep(ms / 1000)
        finally:
            tf.profiler.experimental.stop()
        # stop() writes raw/plugins/profile/<timestamp>/<hostname>.xplane.pb: one file per task instead
        found = sorted(raw.glob("plugins/profile/*/*.xplane.pb"))
        if not found:
            raise RuntimeError(f"the profiler wrote no .xplane.pb under {raw}")
        target = self.xplane_file(rid)
        self.folder.private_dir(target.parent)
        os.replace(found[-1], target)
        shutil.rmtree(raw, ignore_errors=True)
        out: dict[str, Any] = {"xplane": str(target.relative_to(self.folder.path)), "started": started,
                               "seconds": round(time.time() - started, 3), "trace_collection": guard}
        try:
            summary = summarize(target)
        except Exception as exc:  # noqa: BLE001 - the file is there; the summary is a bonus
            out["top_ops_error"] = f"{type(exc).__name__}: {exc}"[:300]
            return out
        out["top_ops"] = summary["top_ops"]
        path = self.done_file(rid).with_name(f"{task_folder_name(self.task)}{SUMMARY_SUFFIX}")
        self.folder.private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"task": self.task, "id": rid, "ms": ms, **out, **summary}), encoding="utf-8")
        os.replace(tmp, path)
        out["summary"] = str(path.relative_to(self.folder.path))
        return out

    def _say(self, message: str) -> None:
        if self.emit_info is not None:
            try:
                self.emit_info(f"{self.task}: {message}")
            except Exception:  # noqa: BLE001, S110 - nothing more to say
                pass


def guard_trace_collection() -> str:
    """Make this process's ``profiler.stop()`` safe before its first capture (``tf_compat.keep_trace_events_in_place``:
    TensorFlow 2.21's trace collection writes into freed memory on a task whose collectives start and end on
    different threads, as a multi-worker task's do, and kills it about one capture in ten); what was done, or
    why not (another TensorFlow needs no cure, or the cure does not fit it: the capture goes ahead as it is)."""
    from engine.runtime import tf_compat

    try:
        return tf_compat.keep_trace_events_in_place()
    except Exception as exc:  # noqa: BLE001 - the capture goes ahead unguarded, and says so
        return f"not guarded: {exc}"[:300]


def op_table(xplane: Path) -> list[dict[str, Any]]:
    """Every op of a profile (idle included, as type ``IDLE``): ``{"type", "operation", "occurrences",
    "total_self_time" (microseconds), "host_total_self_time_percent" (a share, 0 to 1), ...}``.

    TensorFlow's own converter (the profile plugin's ``framework_op_stats`` tool, in TensorFlow since the
    profiler moved into it) reads the file, so no TensorBoard plugin is needed."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

    data, ok = plugin.xspace_to_tools_data([str(xplane)], "framework_op_stats", {})
    if not ok:
        raise RuntimeError(data.decode("utf-8", "replace")[:200])
    tables = json.loads(data)
    table = tables[0]  # the first table counts idle time; the second leaves it out
    cols = [c["id"] for c in table["cols"]]
    return [{k: cell.get("v") if isinstance(cell, dict) else None for k, cell in zip(cols, r["c"], strict=False)}
            for r in table["rows"]]


def category_of(op_type: str) -> str:
    """``collective``, ``input`` or ``compute``: what an op of this type is for a step."""
    if any(word in op_type for word in COLLECTIVE_OPS):
        return "collective"
    if any(word in op_type for word in INPUT_OPS):
        return "input"
    return "compute"


def _us(row: dict[str, Any]) -> float:
    return float(row.get("total_self_time") or 0.0)


def summarize(xplane: Path, limit: int = TOP_OPS) -> dict[str, Any]:
    """A profile's summary: its top ops and op types by self time (idle left out: shares of the ops' time),
    and the ops' time by category (``breakdown``: shares of compute, collective and input, summing to 1;
    ``busy_us``: the ops' self time, ``idle_us``: the threads' idle time, both summed over threads).

    The categories are of op time, not of the step: an input pipeline's ops run on threads of their own,
    beside the step. A custom loop marks no steps in the trace, so TensorFlow's own step-time analysis
    (``overview_page``) has nothing to go on; the step's own breakdown is in its ``step`` events."""
    rows = op_table(xplane)
    ops = sorted((r for r in rows if r.get("type") != "IDLE"), key=_us, reverse=True)
    busy = sum(_us(r) for r in ops)
    types: dict[str, dict[str, Any]] = {}
    by_category = {"compute": 0.0, "collective": 0.0, "input": 0.0}
    for r in ops:
        by_category[category_of(str(r.get("type")))] += _us(r)
        entry = types.setdefault(str(r.get("type")), {"type": str(r.get("type")), "self_us": 0.0, "count": 0})
        entry["self_us"] += _us(r)
        entry["count"] += int(r.get("occurrences") or 0)
    top_types = sorted(types.values(), key=lambda e: e["self_us"], reverse=True)[:limit]

    def share(us: float) -> float:
        return round(us / busy, 4) if busy > 0 else 0.0

    return {
        "top_ops": [{"type": r.get("type"), "op": r.get("operation"), "category": category_of(str(r.get("type"))),
                     "self_us": round(_us(r), 1), "count": int(r.get("occurrences") or 0),
                     "share": share(_us(r))} for r in ops[:limit]],
        "top_types": [{**e, "self_us": round(e["self_us"], 1), "category": category_of(e["type"]),
                       "share": share(e["self_us"])} for e in top_types],
        "breakdown": {name: share(us) for name, us in by_category.items()},
        "busy_us": round(busy, 1),
        "idle_us": round(sum(_us(r) for r in rows if r.get("type") == "IDLE"), 1),
    }


def top_ops(xplane: Path, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    """The ops of a profile by total self time (idle left out): ``{"type", "op", "category", "self_us",
    "count", "share"}`` (:func:`summarize`'s ``top_ops``)."""
    return list(summarize(xplane, limit)["top_ops"])


#: This task's profile requests, once :func:`arm` ran.
_requests: ProfileRequests | None = None


def look() -> None:
    """This task's look for a profile request (see :meth:`ProfileRequests.look`); nothing before :func:`arm`. Called
    after each event the task writes, and by main loops with no events to write (a server's)."""
    requests = _requests
    if requests is not None:
        requests.look()


def wait_forever() -> NoReturn:
    """The main thread of a task that only serves (its server's threads do the work): it looks for profile
    requests, which no event of its own would bring, until the launcher ends the process."""
    while True:
        time.sleep(POLL_S)
        look()


def arm(run_dir: Path, task: str, emit_info: Any = None) -> None:
    """Both, for a supervised task: stacks on ``SIGUSR1`` and profile requests, looked for by :func:`look` (call
    after the SIGTERM set-up, before TensorFlow is imported)."""
    global _requests
    folder = RunFolder(run_dir)
    try:
        task_dir = folder.private_dir(folder.task_dir(task))
    except OSError:
        return  # the task's folder is refused (a planted link): no dumps, and the task says so elsewhere
    arm_stack_dumps(task_dir, task)
    _requests = ProfileRequests(run_dir, task, emit_info)
