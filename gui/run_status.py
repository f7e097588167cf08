"""The run's state, always in sight: starting, running (step x of y, ETA), finished, failed, stopped."""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from engine.contract.run_folder import INTERRUPTED
from engine.observe.telemetry import RunState
from gui import theme
from gui.document_model import DocumentModel
from gui.elided_label import ElidedLabel
from gui.failure_text import headline
from gui.launch_checks import LaunchChecks
from gui.pre_run_problems import PreRunProblems
from gui.run_session import RunSession

STATE_TEXT = {
    "ready": "Ready",
    "pending": "Queued",
    "checking": "Checking…",
    "starting": "Starting…",
    "running": "Running",
    "stopping": "Stopping…",
    "finished": "Finished",
    "failed": "Failed",
    "stopped": "Stopped",
    INTERRUPTED: "Interrupted",
}

DETAIL_TIP = "Step, time left at the current pace, and examples/s over all replicas"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def tasks_ready(state: RunState) -> tuple[int, int]:
    """(tasks whose TensorFlow is up and running, all tasks) of a starting run."""
    ready = sum(1 for t in state.tasks.values() if t.state in ("running", "finished"))
    return ready, len(state.tasks)


def format_rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


class RunStatus(QWidget):
    """State badge, progress bar and one line of figures; refreshed on events and once a second.

    It shrinks rather than moves behind a toolbar's "»": the badge and the progress keep their
    size, the line of figures is cut with "…" (its whole text in the tooltip)."""

    def __init__(self, session: RunSession, checks: LaunchChecks, document: DocumentModel,
                 parent: QWidget | None = None, pre_run: PreRunProblems | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.checks = checks
        self.document = document
        self.pre_run = pre_run
        self.badge = QLabel()
        self.badge.setObjectName("runState")
        self.badge.setMinimumWidth(90)
        self.badge.setToolTip("State of the shown run")
        self.progress = QProgressBar()
        self.progress.setObjectName("runProgress")
        self.progress.setMinimumWidth(110)
        self.progress.setMaximumWidth(180)
        self.progress.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.progress.setTextVisible(True)
        self.progress.setToolTip("Steps done of the run's total")
        self.detail = ElidedLabel(min_chars=12)
        self.detail.setObjectName("runDetail")
        self.detail.setToolTip(DETAIL_TIP)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 0, 8, 0)
        layout.addWidget(self.badge)
        layout.addWidget(self.progress)
        layout.addWidget(self.detail, 1)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.timer = QTimer(self)
        self.timer.setObjectName("runStatusTimer")
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self.refresh)
        session.runUpdated.connect(self.refresh)
        session.runLoaded.connect(self.refresh)
        session.runStateChanged.connect(self._state_changed)
        checks.busyChanged.connect(self._state_changed)
        document.problemsChanged.connect(self.refresh)
        if pre_run is not None:
            pre_run.changed.connect(self.refresh)
        self.refresh()

    def _state_changed(self, *_args: object) -> None:
        if self.session.is_running or self.checks.busy:
            self.timer.start()
        else:
            self.timer.stop()
        self.refresh()

    def stop(self) -> None:
        self.timer.stop()

    def text(self) -> str:
        """The whole status in words (also the status-bar text)."""
        return f"{self.badge.text()} {self.detail.text()}".strip()

    def refresh(self, *_args: object) -> None:
        session = self.session
        s = session.state
        live = session.is_running
        if self.checks.busy:
            state = "checking"
        elif session.is_stopping:
            state = "stopping"
        elif not session.shows_run:
            state = "ready"
        else:
            state = s.state
        color = theme.STATE_COLORS.get("queued" if state == "pending" else state, "#888888")
        self.badge.setText(STATE_TEXT.get(state, state.capitalize()))
        self.badge.setStyleSheet(f"QLabel {{ color: white; background: {color}; border-radius: 4px; "
                                 "padding: 2px 8px; font-weight: bold; }")
        if state == "checking":  # nothing of the previous run: this one has not started
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("checking…")
            self._set_detail("checking your script in a separate process before the run starts")
            return
        total = max(1, s.total_steps)
        self.progress.setRange(0, total)
        self.progress.setValue(min(s.step, total))
        self.progress.setFormat(f"{s.step} / {s.total_steps}")
        parts: list[str] = []
        if state in ("running", "stopping", "starting") and live and s.first_step_at is None:
            # TensorFlow takes seconds to load in every task: say so rather than "step 0"
            ready, total_tasks = tasks_ready(s)
            parts.append(f"starting tasks: {ready} of {total_tasks} ready")
            if s.started_at is not None:
                parts.append(f"elapsed {format_duration(time.time() - s.started_at)}")
        elif state == "stopping":  # no ETA: the run is ending, not training
            parts.append(f"stopping at step {s.step} of {s.total_steps}: every task ends")
            if s.started_at is not None:
                parts.append(f"ran {format_duration(time.time() - s.started_at)}")
        elif state in ("running", "starting") and live:
            parts.append(f"step {s.step} of {s.total_steps}")
            eta = s.eta_seconds()
            parts.append(f"ETA {format_duration(eta)}" if eta is not None else "ETA –")
            if s.replicas:
                parts.append(f"{format_rate(s.throughput())} examples/s")
            if s.started_at is not None:
                parts.append(f"elapsed {format_duration(time.time() - s.started_at)}")
        elif state == "finished":
            duration = s.ended_at - s.started_at if s.ended_at and s.started_at else None
            parts.append(f"{s.step} steps in {format_duration(duration)}")
            losses = [r.loss for r in s.replicas.values() if r.loss is not None]
            if losses:
                parts.append(f"final loss {sum(losses) / len(losses):.4f}")
        elif state == "failed":  # the user's own exception where there is one, not TensorFlow's wrapping
            task = s.tasks.get(s.failed_task)
            reason = strip_task(s.reason, s.failed_task)
            said = headline(reason, task.log_tail if task is not None else ())
            parts.append(f"{s.failed_task or 'a task'}: {said or reason}" if s.reason else "see the task table")
        elif state == "stopped":
            parts.append(f"at step {s.step}" + (f" — {s.reason}" if s.reason else ""))
        elif state == INTERRUPTED:
            parts.append(f"at step {s.step} — its launcher ended without finishing it")
        elif state == "pending":  # a scheduler (Slurm) holds the run in its queue
            parts.append(f"waiting in the scheduler's queue — {s.reason}" if s.reason else
                         "waiting in the scheduler's queue")
        elif state == "ready":
            n = len(self.document.problems)
            found = len(self.pre_run.problems) if self.pre_run is not None else 0
            if n:
                parts.append(f"{n} problem{'s' if n > 1 else ''} — fix them to run")
            elif found:
                parts.append(f"{found} problem{'s' if found > 1 else ''} found before the launch — see Settings")
            else:
                parts.append("press Run (F5) to launch")
        if session.run_dir is not None and state != "ready":
            parts.append(f"[{session.run_dir.name}]")
        self._set_detail(" · ".join(parts))

    def _set_detail(self, text: str) -> None:
        self.detail.setText(text)
        self.setToolTip(self.text())
        self.detail.setToolTip(self.text() if self.detail.is_elided() else DETAIL_TIP)


def strip_task(reason: str, task: str) -> str:
    """A reason without the task's name in front when the caller names the task already
    (``worker:1: killed by SIGKILL`` said of worker:1 reads ``killed by SIGKILL``)."""
    while task and reason.startswith(f"{task}: "):
        reason = reason[len(task) + 2:]
    return reason
