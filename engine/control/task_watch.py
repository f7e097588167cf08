"""Watching a supervisor's tasks: reaping those that ended (and restarting lost async workers), sampling their use
of CPU, memory and GPU (a frozen task failed), keeping their logs under the cap.

:class:`TaskWatch` is that part of :class:`~engine.control.supervisor.Supervisor`, run every turn of its loop.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil

from engine.contract import events
from engine.contract.task_logs import LOG_CAP_BYTES, LOG_HEAD_BYTES, cap_log, log_tail
from engine.control.gpu import task_gpu_figures
from engine.control.process_end import describe_exit
from engine.control.process_end import has_exited as _has_exited
from engine.control.process_end import signal_group as _signal_group
from engine.control.task_start import TaskProcess


class TaskWatch:
    """Reaps, samples and bounds the logs of one supervisor's tasks (see the module docstring)."""

    def __init__(self, sup: Any) -> None:
        self.sup = sup  # the engine.control.supervisor.Supervisor it serves

    def reap(self) -> None:
        for tp in self.sup.tasks.values():
            if tp.done or tp.proc is None:
                continue
            if tp.proc.returncode is None:
                if not _has_exited(tp.proc):
                    continue
                # its group first (still reserved by the unreaped leader): no child of it survives it
                _signal_group(tp.proc.pid, signal.SIGKILL, group_only=True)
            code = tp.proc.wait()
            if tp.event_fd is not None:
                self.sup.read_events(tp)
                self.sup.close_events(tp)
            if tp.lifeline_fd is not None:
                os.close(tp.lifeline_fd)
                tp.lifeline_fd = None
            tp.done = True
            name = tp.plan.name
            if tp.terminal_state == "finished":
                pass  # the task said so itself (a stop racing its exit changes nothing)
            elif tp.stopping or self.sup.stopping:
                if self.sup.launcher_gone:
                    self.sup.send(events.make("status", name, state="stopped", exit_code=code,
                                          reason="the launcher is gone"))
                else:
                    why = {"reason": self.sup.stop_reason} if self.sup.stop_reason else {}
                    self.sup.send(events.make("status", name, state=self.sup.stop_state, exit_code=code, **why))
            else:
                allowed = name in self.sup.restartable or tp.restart_requested
                will_restart = allowed and tp.restarts < self.sup.max_restarts and not self.sup.stopping
                if tp.terminal_state == "failed" or (tp.terminal_state == "stopped" and tp.cause_task):
                    reason = tp.reason  # its own words (a stop it was not asked for names the task that caused it)
                else:
                    reason = describe_exit(code, was=False) if code != 0 else "exited without finishing"
                if allowed and not will_restart and not self.sup.stopping:  # it would be restarted, but no more
                    reason = (f"{reason}; not restarted again: it was restarted {tp.restarts} time(s), the most a "
                              f"lost async worker is restarted (max_task_restarts {self.sup.max_restarts})")
                extra: dict[str, Any] = {"traceback": tp.traceback} if tp.traceback else {}
                if tp.cause_task:
                    extra["cause_task"] = tp.cause_task
                self.sup.send(events.make("status", name, state="failed", exit_code=code, reason=reason,
                                      log_tail=log_tail(self.sup.task_dir(name) / "log.txt"),
                                      will_restart=will_restart, **extra))
                if will_restart:
                    tp.restarts += 1
                    self.sup.send(events.make("status", name, state="restarting", reason=reason,
                                          restarts=tp.restarts))
                    self.sup.starter.start_task(tp)
        if self.sup.subreaper:
            self.reap_orphans()

    def reap_orphans(self) -> None:
        """As a child subreaper (warm start) the supervisor adopts what its tasks leave behind when they
        end before their own children: reap those that ended (the tasks themselves are reaped above)."""
        known = {tp.proc.pid for tp in self.sup.tasks.values() if tp.proc is not None and tp.proc.returncode is None}
        template = self.sup.template.proc if self.sup.template is not None else None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in known:
                return
            if template is not None and info.si_pid == template.pid:
                template.poll()  # a template that ended: its next fork request fails, and tasks start cold
                template = None
                continue
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return

    def bound_log(self, tp: TaskProcess) -> None:
        """Cut the task's ``log.txt`` where it passed its cap (``task_logs.cap_log``); say so once per task."""
        path = self.sup.task_dir(tp.plan.name) / "log.txt"
        try:
            if os.lstat(path).st_size <= LOG_CAP_BYTES:
                return
        except OSError:
            return
        dropped = cap_log(path)
        if dropped and not tp.log_cut:
            tp.log_cut = True
            self.sup.send(events.make("info", tp.plan.name, log_cut=dropped, message=(
                f"its log passed {LOG_CAP_BYTES // (1024 * 1024)} MiB and was cut: tasks/"
                f"{path.parent.name}/log.txt keeps its first {LOG_HEAD_BYTES // (1024 * 1024)} MiB and its latest "
                "output (it is cut again whenever it passes the cap; this is said once)")))

    def sample(self) -> None:
        gpu_samples = self.sup.gpus.sample() if self.sup.gpus is not None and self.sup.gpus.available else []
        for tp in self.sup.tasks.values():
            if tp.done or tp.ps is None:
                continue
            try:
                with tp.ps.oneshot():
                    cpu = tp.ps.cpu_percent(None)
                    rss = tp.ps.memory_info().rss
                    status = tp.ps.status()
            except psutil.Error:
                continue
            if status == psutil.STATUS_STOPPED and not tp.stopping and not self.sup.stopping:
                tp.frozen_samples += 1
                if tp.frozen_samples >= 2:  # stopped for a whole sample interval: frozen, not a blip
                    tp.frozen_samples = 0
                    tp.terminal_state = "failed"
                    tp.reason = "frozen: the process was stopped (SIGSTOP) and made no progress"
                    _signal_group(tp.ps.pid, signal.SIGKILL)
                    continue
            else:
                tp.frozen_samples = 0
            fields: dict[str, Any] = {"cpu_percent": cpu, "rss_bytes": rss, "pid": tp.ps.pid}
            fields.update(task_gpu_figures(gpu_samples, list(tp.plan.gpu_ids), tp.ps.pid))
            self.sup.send(events.make("device", tp.plan.name, **fields), flush=False)
        self.sup.flush_out()  # every task's figures in one write
