"""What the run says: strategy and device notes, layouts, restored checkpoints, what trained (the
model as compiled, or the preset's optimizer) and warnings (exposed ports, emulated GPUs) — every
``info`` event of the run, newest last."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from gui import gpu_notice, theme
from gui.failure_text import headline
from gui.metric_series import describe_training
from gui.run_session import RunSession


class RunMessages(QWidget):
    """A list of the run's ``info`` events; warnings stand out and are announced once."""

    warning = Signal(str)  # a new warning, for the status bar

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.list = QListWidget()
        self.list.setObjectName("runMessages")
        self.list.setWordWrap(True)
        self.list.setToolTip("Messages of the run: strategies, devices, layouts, checkpoints and warnings")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        self._shown = 0
        self._failure_said = False
        self._gpu_item: QListWidgetItem | None = None  # the one notice of emulated GPUs
        self._gpus: dict[str, int] = {}
        session.runLoaded.connect(self.reload)
        session.runUpdated.connect(self.update_messages)
        session.runStateChanged.connect(lambda _state: self.update_messages())

    def reload(self) -> None:
        self.list.clear()
        self._shown = 0
        self._failure_said = False
        self._gpu_item = None
        self._gpus = {}
        config = self.session.config
        if self.session.is_running and gpu_notice.emulated_here(config):  # said at once, in every mode
            self._gpu_notice(gpu_notice.assigned_gpus(config))
        self.update_messages()

    def update_messages(self) -> None:
        infos = self.session.state.infos
        for event in infos[self._shown:]:
            reported = gpu_notice.emulated_by_task([event])
            if reported:  # every task says it; one line says it for the run
                self._gpu_notice({**self._gpus, **reported})
                continue
            message = str(event.get("message", "")).strip()
            trained = describe_training(event.get("training"))
            if trained:  # what trained, in the same words wherever it is shown; the task's own words in the tooltip
                message, note = trained, message
            else:
                note = ""
            if not message:
                continue
            stamp = time.strftime("%H:%M:%S", time.localtime(float(event.get("t", 0.0))))
            is_warning = bool(event.get("warning"))
            text = f"{stamp}  {event.get('task', '')}: {message}"
            item = QListWidgetItem(("⚠ " if is_warning else "") + text)
            item.setToolTip(f"{message}\n{note}" if note and note != message else message)
            if is_warning:
                item.setForeground(QBrush(QColor(theme.PROBLEM_COLOR)))
                self.warning.emit(message)
            item.setData(Qt.ItemDataRole.UserRole, bool(is_warning))
            self.list.addItem(item)
        self._shown = len(infos)
        self._say_failure()
        if self.list.count():
            self.list.scrollToBottom()

    def _gpu_notice(self, by_task: dict[str, int]) -> None:
        self._gpus = dict(by_task)
        text = gpu_notice.notice(by_task)
        tip = (f"{text}.\nThis machine has no NVIDIA GPU (or no driver): each task's GPUs are logical CPU "
               "devices, so the run shows the strategy, not GPU speed.\n"
               + "\n".join(f"{task}: {n} GPU(s) emulated" for task, n in sorted(by_task.items())))
        if self._gpu_item is None:
            self._gpu_item = QListWidgetItem()
            self._gpu_item.setForeground(QBrush(QColor(theme.PROBLEM_COLOR)))
            self._gpu_item.setData(Qt.ItemDataRole.UserRole, True)
            self.list.addItem(self._gpu_item)
            self.warning.emit(text)
        self._gpu_item.setText(f"⚠ {time.strftime('%H:%M:%S')}  {text}")
        self._gpu_item.setToolTip(tip)

    def _say_failure(self) -> None:
        """One line when the run failed: which task, and why in the user's words where there are some."""
        s = self.session.state
        if s.state != "failed" or self._failure_said:
            return
        self._failure_said = True
        task = s.tasks.get(s.failed_task)
        reason = s.reason
        while s.failed_task and reason.startswith(f"{s.failed_task}: "):
            reason = reason[len(s.failed_task) + 2:]
        said = headline(reason, task.log_tail if task is not None else ()) or reason or "see the task table"
        stamp = time.strftime("%H:%M:%S", time.localtime(s.ended_at or time.time()))
        item = QListWidgetItem(f"✖ {stamp}  run failed: {s.failed_task or 'a task'}: {said}")
        item.setToolTip(s.reason or said)
        item.setForeground(QBrush(QColor(theme.PROBLEM_COLOR)))
        item.setData(Qt.ItemDataRole.UserRole, True)
        self.list.addItem(item)

    def texts(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]
