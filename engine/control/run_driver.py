"""The run driver: the dispatcher of one :class:`~engine.control.launcher.Run` and what it does on the lifecycle's word.

:class:`RunDriver` owns the run's dispatcher thread: each event a reader queued is recorded (the run's
:class:`~engine.control.run_record.RunRecord`), folded into the run's state, handed to listeners and fed to the
pure :class:`~engine.control.lifecycle.Lifecycle`, and each action the lifecycle answers is carried out here
(stop every supervisor, restart the whole run, restart a task, probe or relaunch a host through
:class:`~engine.control.host_watch.HostWatch`). It also ends the run: the final ``run`` event, the record closed,
whatever is left killed (:mod:`engine.control.process_end`), the transports released. The process plumbing is
:mod:`engine.control.supervisor_links`; what is started, and how, stays the :class:`Run`'s.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from engine.contract import checkpoint_state, events
from engine.contract.config import RunConfig
from engine.contract.records import TERMINAL
from engine.control import doctor, process_end, transports
from engine.control import lifecycle as lc
from engine.control.run_core import Item as Item  # also read from here
from engine.control.run_core import RunCore
from engine.control.run_record import RunRecord
from engine.control.supervisor_links import HostAnswer, SupervisorGone, SupervisorLink, stop_supervisors

TICK_S = 0.5  # progress deadlines and the run folder are checked this often
MAX_WORKER_RESTARTS = 10  # async: a worker that keeps dying is restarted at most this often
#: Marks an event the launcher says of a task on a lost host: shown and recorded, but not news from that host.
LOST_WITH_HOST = "lost_with_host"
LOCAL_GROUP = "localhost"  # the supervisor of every host that is this machine


class _Tick:
    """A dispatcher turn without an event."""


_TICK = _Tick()
_Item = Item  # what the dispatcher's queue holds (engine.control.run_core.Item)


def lifecycle_for(config: RunConfig, now: float) -> lc.Lifecycle:
    """The policy of a run of ``config`` (its tasks, restarts, progress and report rules, its hosts of other
    machines)."""
    training = config.training
    return lc.Lifecycle(
        [lc.TaskInfo(t.name, t.role, h.name) for h, t in config.cluster.tasks()],
        mode=config.parallelism.mode, restarts_allowed=training.restarts,
        # a user's program reports when it likes (or never): no hang is inferred from its silence
        progress_timeout_s=0.0 if config.program is not None else
        float(getattr(training, "progress_timeout_s", 0.0) or 0.0),
        steps_per_execution=training.steps_per_execution, now=now,
        report_interval_s=1.0 / training.metrics_hz if training.metrics_hz > 0 else 0.0,
        remote_hosts=[h.name for h in config.cluster.hosts if transports.kind_of(
            None if h.is_local else h) == "ssh"],
        max_relaunches=MAX_WORKER_RESTARTS)


def keeping(run: Any, target: Callable[..., Any], *args: Any) -> None:
    """``target(*args)`` on a thread that holds ``run`` while it runs: the driver and the host watch hold their run
    weakly (no reference cycle: an ended run is freed at once, its supervisors' pipes closed with it)."""
    target(*args)


class RunDriver:
    """Drives one run: its dispatcher, the lifecycle's actions, restarts and the end. The state it shares with the
    :class:`Run` (locks, queue, lifecycle, supervisors, record) is the :class:`~engine.control.run_core.RunCore`
    given at construction; the run's own is read through its public names; this class holds the behaviour."""

    def __init__(self, run: Any, core: RunCore) -> None:
        self._run = weakref.ref(run)  # the engine.control.launcher.Run it serves (not imported: no cycle)
        self.core = core  # what it shares with the run (its locks, queue, lifecycle, supervisors, record)

    @property
    def run(self) -> Any:
        return self._run()

    def decide(self, item: lc.Input) -> None:
        """Feed ``item`` to the lifecycle and carry out what it answers."""
        self.act(self.feed(item))

    def stop_supervisors(self, sups: list[SupervisorLink], task_state: lc.TaskPhase, reason: str) -> None:
        stop_supervisors(sups, str(task_state), reason, lambda sup: self.run.stop_grace(sup, task_state),
                         self.core.cut)

    def watch(self) -> None:
        """Ends the run once every supervisor has exited and its stream is drained (restarts aside)."""
        while True:
            with self.core.restart_lock:
                current = list(self.core.supervisors)
            for sup in current:
                if sup.reader is not None:
                    sup.reader.join()
            with self.core.restart_lock:
                launched = bool(self.core.supervisors) or self.core.stopping
                if launched and not self.core.restarting.is_set() and not self.core.relaunching \
                        and current == self.core.supervisors:
                    break
            time.sleep(0.05)
        self.core.queue.put(None)

    def dispatch(self) -> None:
        """The dispatcher thread: never dies without ending the run."""
        next_tick = time.monotonic() + TICK_S
        try:
            while True:
                item: _Item | _Tick
                try:
                    item = self.core.queue.get(timeout=max(0.0, next_tick - time.monotonic()))
                except queue.Empty:
                    item = _TICK
                if item is None:
                    break
                if time.monotonic() >= next_tick:  # a steady stream of events must not starve the ticks
                    next_tick = time.monotonic() + TICK_S
                    if not isinstance(item, _Tick):
                        self._handle_safely(_TICK)
                if isinstance(item, list):
                    self._handle_events(item)
                else:
                    self._handle_safely(item)
                self.recorder().catch_up(self.core.queue.empty)  # events.jsonl, run.json: per burst
        finally:
            self.finish()

    def _handle_safely(self, item: dict[str, Any] | SupervisorGone | HostAnswer | _Tick,
                       line: bytes | None = None) -> None:
        try:
            self._handle(item, line)
        except Exception as exc:  # noqa: BLE001 - the run must end visibly, never hang
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        traceback.print_exc(file=sys.stderr)
        self.act(self.feed(lc.LauncherFailed(f"internal error of the launcher: {exc!r}")))

    def _handle_events(self, batch: list[tuple[dict[str, Any], bytes | None]]) -> None:
        """A reader's batch of ``(event, line)``: each as :meth:`_handle_safely` takes it, one call less deep; a row
        of samples (``step``, ``device``: nearly every event of a run) as :meth:`_samples` takes them."""
        i, n = 0, len(batch)
        while i < n:
            event, line = batch[i]
            if event.get("kind") in events.SAMPLE_KINDS:
                j = i + 1
                while j < n and batch[j][0].get("kind") in events.SAMPLE_KINDS:
                    j += 1
                try:
                    self._samples(batch[i:j] if i or j < n else batch)
                except Exception as exc:  # noqa: BLE001 - the run must end visibly, never hang
                    self._failed(exc)
                i = j
                continue
            try:
                self._event(event, line)
            except Exception as exc:  # noqa: BLE001 - the run must end visibly, never hang
                self._failed(exc)
            i += 1

    def _samples(self, rows: list[tuple[dict[str, Any], bytes | None]]) -> None:
        """Samples in a row, as :meth:`_event` takes each (recorded and folded, the listeners, the lifecycle), with one
        hold of the run's lock for their record and fold and one for the lifecycle, and its actions after them all."""
        core = self.core
        self.deliver_rows(rows)
        actions: list[lc.Action] = []
        now = time.monotonic()
        with core.lock:
            for event, _ in rows:
                if not event.get(LOST_WITH_HOST):
                    actions += lc.feed_sample(core.lifecycle, event, now)
        if actions:
            self.act(actions)

    def _handle(self, item: dict[str, Any] | SupervisorGone | HostAnswer | _Tick, line: bytes | None = None) -> None:
        if isinstance(item, _Tick):
            self.recorder().check_folder()
            self.act(self.feed(lc.Tick()))
            self.recorder().update_meta()
        elif isinstance(item, SupervisorGone):
            sup = item.sup
            message = ""
            if not self.core.stopping and item.exit_code != 0:
                tail = transports.log_tail(sup.launch.log)
                message = sup.transport.failure(sup.launch, item.exit_code, tail)
            elif not self.core.stopping and any(t.state not in TERMINAL for n in sup.tasks
                                                if (t := self.run.state.tasks.get(n)) is not None):
                message = sup.transport.why_ended(sup.launch)  # a clean exit while its tasks ran: a scheduler's end?
            self.act(self.feed(lc.SupervisorExited(sup.group, item.exit_code, message, tuple(sup.tasks),
                                                     sup.generation)))
        elif isinstance(item, HostAnswer):
            self.act(self.feed(lc.HostProbed(item.host, item.problem)))
        else:
            self._event(item, line)

    def _event(self, event: dict[str, Any], line: bytes | None) -> None:
        self.deliver(event, line)
        if event.get(LOST_WITH_HOST):
            return  # the launcher's word of a lost task: no news from its host
        with self.core.lock:  # as feed(lc.from_event(event)), without the input for a step or device event
            actions = lc.feed_sample(self.core.lifecycle, event, time.monotonic())
        if actions:
            self.act(actions)

    def deliver(self, event: dict[str, Any], line: bytes | None = None) -> None:
        """``event`` into the run's file (``line`` as received where it can be kept), the state and the
        listeners."""
        self.deliver_rows([(event, line)])

    def deliver_rows(self, rows: list[tuple[dict[str, Any], bytes | None]]) -> None:
        """Each ``(event, line)`` as :meth:`deliver` takes it, the run's lock held once for their record and fold;
        each listener gets them in order."""
        record, state = self.recorder(), self.run.state
        with self.core.lock:
            for event, line in rows:
                record.write_event(event, line)
                state.apply(event)
            listeners = list(self.core.listeners)
        for listener in listeners:
            for event, _ in rows:
                try:
                    listener(event)
                except Exception as exc:  # noqa: BLE001 - a broken view must not stop the run
                    print(f"clusterdeck: a run listener failed: {exc!r}", file=sys.stderr)

    def feed(self, item: lc.Input) -> list[lc.Action]:
        with self.core.lock:
            return self.core.lifecycle.feed(item, time.monotonic())

    def act(self, actions: list[lc.Action]) -> None:
        for action in actions:
            if isinstance(action, lc.RestartTask) or getattr(action, "dump_stacks", False):  # a hang: who waits where
                ask_for_stacks(self.run, self.core, action)
            if isinstance(action, lc.StopRun):
                with self.core.restart_lock:
                    if self.core.stopping:
                        continue
                    self.core.stopping = True
                self.core.stop_asked.set()
                threading.Thread(target=keeping, args=(self.run, self._stop_all, action.outcome), name="run-stop",
                                 daemon=True).start()
            elif isinstance(action, lc.RestartRun):
                self.core.restarting.set()
                threading.Thread(target=keeping, args=(self.run, self._restart_all, action), name="run-restart",
                                 daemon=True).start()
            elif isinstance(action, lc.RestartTask):
                self.run.emit_info(f"{action.task}: {action.reason}; its supervisor restarts it", task_hung=action.task)
                self.run.send(action.task, "restart", reason=action.reason)
            elif isinstance(action, lc.ProbeHost):
                threading.Thread(target=keeping, args=(self.run, self.run.hosts.probe, action.host), name=f"probe-{action.host}",
                                 daemon=True).start()
            elif isinstance(action, lc.HostNotice):
                (self.core.cut.add if action.unreachable else self.core.cut.discard)(action.host)
                self.run.emit_info(action.message, host=action.host, host_unreachable=action.unreachable,
                                **({"warning": "host-unreachable", "lost_tasks": list(action.tasks)}
                                   if action.unreachable else {}))
            elif isinstance(action, lc.RelaunchHost):
                self.run.hosts.relaunch_host(action)

    def _restart_all(self, action: lc.RestartRun) -> None:
        """Stop every task and start them all again; they resume from the last checkpoint."""
        self.run.emit_run("restarting", reason=action.reason, restart=action.restart,
                           restarts_allowed=action.restarts_allowed, **({"requested": True} if action.requested else {}))
        try:
            with self.core.restart_lock:
                old = list(self.core.supervisors)
            self.stop_supervisors(old, lc.TaskPhase.STOPPED, f"restarting the run: {action.reason}")
            for sup in old:
                if sup.reader is not None:
                    sup.reader.join(timeout=5)
            if not resubmit(self.run, self.core):
                return  # stopped while the new allocation waited
            with self.core.restart_lock:
                if self.core.stopping:
                    return
                with self.core.lock:
                    self.core.lifecycle.restart_started(time.monotonic())
                self.core.supervisors = []
                self.run.resolve()
                self.run.start_supervisors()
            self.run.emit_run("running", restart=action.restart)
            with self.core.lock:
                actions = self.core.lifecycle.restart_done()
            self.act(actions)
        except Exception as exc:  # noqa: BLE001 - a failed restart fails the run, visibly
            with self.core.lock:
                self.core.lifecycle.phase = lc.RunPhase.RUNNING
            self.act(self.feed(lc.LauncherFailed(f"the restart failed: {exc}")))
        finally:
            self.core.restarting.clear()

    def finish(self) -> None:
        try:
            with self.core.lock:
                outcome = self.core.lifecycle.final()
            if self.core.bad.bad:
                self.deliver(events.make("info", "launcher", message=f"{self.core.bad.bad} malformed event line(s) "
                                          "skipped", bad_lines=self.core.bad.bad))
            self.deliver(events.make("run", "launcher", **outcome.event_fields()))
            self.recorder().flush()
            self.kill_leftovers()
            # every process gone: the run's checkpoint state names no checkpoint a lost save left without files
            checkpoint_state.repair(self.run.folder.checkpoints)
            for transport in self.core.prepared:
                try:
                    transport.release()
                except Exception as exc:  # noqa: BLE001 - a release must not keep the run from ending
                    print(f"clusterdeck: releasing the {transport.kind} transport failed: {exc!r}", file=sys.stderr)
            self.core.prepared = []
            with self.core.lock:
                self.recorder().write_meta(str(outcome.state), ended=time.strftime("%Y-%m-%dT%H:%M:%S"))
        except Exception:  # noqa: BLE001 - done must be set whatever happens
            traceback.print_exc(file=sys.stderr)
        finally:
            # closed, and let go: the record holds the run's callbacks, and an ended run must be freed
            # at once (its supervisors' pipes close with it), not at the next garbage collection
            record, self.core.record = self.core.record, None  # the dispatcher's alone from start() on
            if record is not None:
                record.close()
            self.core.stop_done.set()
            self.core.done.set()

    def _stop_all(self, outcome: lc.Outcome) -> None:
        try:
            with self.core.restart_lock:
                sups = list(self.core.supervisors)
            self.stop_supervisors(sups, outcome.task_state, outcome.task_reason)
            self.kill_leftovers()
        finally:
            self.core.stop_done.set()

    def kill_leftovers(self) -> None:
        """Whatever of the run still runs on this machine: task processes whose supervisor was killed
        and the children of users' scripts (every task process carries the run folder in its environment)."""
        if self.core.run_dir is None:
            return
        with self.core.lock:
            pids = [t.pid for t in self.run.state.tasks.values() if t.pid]
        process_end.kill_tasks(pids)
        process_end.kill_run_processes(str(self.run.run_dir.resolve()))

    def describe(self) -> dict[str, Any]:
        """``run.json``'s fields of the moment: what runs where, and how far it got."""
        with self.core.lock:
            sups = list(self.core.supervisors)  # a snapshot (a restart may be replacing them)
            supervisors = {s.group: {"pid": s.proc.pid, "transport": s.transport.kind,
                                     "host": s.launch.host.name if s.launch.host is not None else LOCAL_GROUP}
                           for s in sups}
            tasks = {n: {"pid": t.pid, "state": t.state, "host": t.host} for n, t in self.run.state.tasks.items()}
            return {"name": self.run.config.name, "state": str(self.core.lifecycle.phase),
                    "mode": self.run.config.parallelism.mode, "launcher": self.core.launcher, "supervisors": supervisors,
                    "tasks": tasks, "step": self.run.state.step, "summary": self.run.state.summary()}

    def record_failed(self, reason: str) -> None:
        """The run folder can no longer be written or vanished: the run fails, saying why."""
        self.act(self.feed(lc.LauncherFailed(reason)))

    def recorder(self) -> RunRecord:
        """The run's record (there from :meth:`start` on; the dispatcher starts after it)."""
        if self.core.record is None:
            raise RuntimeError("the run has not started")
        return self.core.record


def ask_for_stacks(run: Any, core: RunCore, action: lc.Action) -> None:  # run: the launcher's Run
    """A hang (a task restarted for it, or the run stopped or restarted): every live task (only the restarted one)
    dumps its Python stacks, and the run says where they are."""
    with core.lock:
        live = [n for n, t in run.state.tasks.items() if t.state not in TERMINAL]
    if isinstance(action, lc.RestartTask):
        culprit = action.task
        live = [culprit]
    elif isinstance(action, lc.StopRun):
        culprit = action.outcome.failed_task
    elif isinstance(action, lc.RestartRun):
        culprit = action.reason.split(": ")[0]
    else:
        return  # asked only for a hang
    for message, fields in doctor.dump_for_hang(run.folder, run.send, live, culprit):
        run.emit_info(message, **fields)


def resubmit(run: Any, core: RunCore) -> bool:
    """A whole-run restart: transports holding a scheduler's allocation (``resubmit_on_restart``, Slurm)
    give it back and queue a new one; those that place the run themselves (``replan_on_restart``: Slurm, also
    inside the batch job it adopted) place it again, on fresh ports. False: stopped meanwhile."""
    again = [t for t in core.prepared if getattr(t, "resubmit_on_restart", False)
             or getattr(t, "replan_on_restart", False)]
    if not again:
        return True
    drawn = core.drawn_config
    ctx = transports.PrepareContext(config=drawn if drawn is not None else core.base_config,
                                    folder=run.folder, stop=core.stop_asked, emit=core.queue.put)
    try:
        for transport in core.transports.values():
            if transport in again and getattr(transport, "resubmit_on_restart", False):
                transport.release()
            ctx.config = transport.prepare(ctx)
    except transports.TransportStopped:
        return False
    core.base_config = ctx.config
    return True
