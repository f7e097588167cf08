"""Per-task logs of the shown run, tailed incrementally, with a filter and TensorFlow noise folded away."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine.contract.run_folder import RunFolder
from engine.contract.task_logs import LineTail, is_noise
from gui import gpu_notice
from gui.run_session import RunSession

TAIL_INTERVAL_MS = 300
MAX_LINES = 50_000
READ_CHUNK = 4 * 1024 * 1024


def task_log_path(run_dir: Path, task: str) -> Path:
    """``worker:0`` → ``<run_dir>/tasks/worker-0/log.txt``."""
    return RunFolder(run_dir).task_log(task)


@dataclass
class LogTail:
    """Reads a growing text file from where it left off; only complete lines come out, split by the engine's
    :class:`~engine.contract.task_logs.LineTail` (a ``\r``-redrawn line is its last drawing; a partial line is
    held to a bounded size, so a huge log of progress bars costs kilobytes here)."""

    path: Path
    offset: int = 0
    splitter: LineTail = field(default_factory=LineTail)
    lines: list[tuple[bool, str]] = field(default_factory=list)  # (is_noise, text)

    def poll(self) -> list[tuple[bool, str]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                if size < self.offset:  # the file was truncated or replaced: start over
                    self.offset, self.splitter, self.lines = 0, LineTail(), []
                fh.seek(self.offset)
                data = fh.read(READ_CHUNK)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        new = []
        for text in self.splitter.feed(data):
            # TensorFlow's "GPU will not be used" stays in sight: it may be the only word on the GPUs
            new.append((is_noise(text) and not gpu_notice.is_gpu_word(text), text))
        self.lines.extend(new)
        if len(self.lines) > MAX_LINES:
            del self.lines[: len(self.lines) - MAX_LINES]
        return new


class LogView(QWidget):
    """Pick a task, filter its lines, show or fold TensorFlow's start-up noise."""

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.tails: dict[str, LogTail] = {}
        self.task = QComboBox()
        self.task.setObjectName("logTask")
        self.task.setToolTip("The task whose log is shown")
        self.task.setMinimumContentsLength(12)
        self.filter = QLineEdit()
        self.filter.setObjectName("logFilter")
        self.filter.setPlaceholderText("Filter lines…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setToolTip("Show only lines containing this text (case-insensitive)")
        self.show_noise = QCheckBox("Show TensorFlow start-up noise")
        self.show_noise.setObjectName("logShowNoise")
        self.show_noise.setToolTip("oneDNN, absl and CUDA probing lines are folded away unless this is checked")
        self.folded = QLabel()
        self.folded.setToolTip("Lines hidden as TensorFlow start-up noise")
        self.text = QPlainTextEdit()
        self.text.setObjectName("logText")
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(MAX_LINES)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setToolTip("The task's log.txt, followed while the run lasts")
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(QLabel("Task"))
        bar.addWidget(self.task)
        bar.addWidget(self.filter, 1)
        bar.addWidget(self.show_noise)
        bar.addWidget(self.folded)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.text, 1)
        self.timer = QTimer(self)
        self.timer.setObjectName("logTailTimer")
        self.timer.setInterval(TAIL_INTERVAL_MS)
        self.timer.timeout.connect(self.poll)
        self.task.currentIndexChanged.connect(lambda _i: self.refresh_text())
        self.filter.textChanged.connect(lambda _t: self.refresh_text())
        self.show_noise.toggled.connect(lambda _b: self.refresh_text())
        session.runLoaded.connect(self.reset)
        session.runStateChanged.connect(self._state_changed)
        self.reset()

    def reset(self) -> None:
        """A new run (or none) is shown: forget the old tails, list its tasks."""
        self.tails.clear()
        self.task.blockSignals(True)
        self.task.clear()
        self.task.addItems(list(self.session.state.tasks))
        if self.session.state.state == "failed" and self.session.state.failed_task:
            self.task.setCurrentIndex(max(0, self.task.findText(self.session.state.failed_task)))
        self.task.blockSignals(False)
        self.refresh_text()
        if self.session.run_dir is not None:
            self.poll()
            self.timer.start()
        else:
            self.timer.stop()

    def _state_changed(self, state: str) -> None:
        if self.session.run is None and state in ("finished", "failed", "stopped"):
            self.poll()  # the last lines, then stop following
            self.timer.stop()
        failed = self.session.state.failed_task
        if state == "failed" and failed:
            self.show_task(failed)  # the Logs tab opens on the task that failed

    def show_task(self, task: str) -> bool:
        """Show ``task``'s log; False when the run has no such task."""
        if self.task.findText(task) < 0 and task in self.session.state.tasks:
            self.task.addItem(task)
        index = self.task.findText(task)
        if index < 0:
            return False
        self.task.setCurrentIndex(index)
        return True

    def stop(self) -> None:
        self.timer.stop()

    def current_task(self) -> str:
        return self.task.currentText()

    def _tail(self, task: str) -> LogTail | None:
        run_dir = self.session.run_dir
        if run_dir is None or not task:
            return None
        tail = self.tails.get(task)
        if tail is None:
            tail = self.tails[task] = LogTail(task_log_path(run_dir, task))
        return tail

    def _visible(self, noise: bool, text: str) -> bool:
        if noise and not self.show_noise.isChecked():
            return False
        needle = self.filter.text().strip().lower()
        return not needle or needle in text.lower()

    def poll(self) -> None:
        """Read what every task's log gained; append the shown task's new lines."""
        for name in list(self.session.state.tasks):
            if self.task.findText(name) < 0:
                self.task.addItem(name)
        current = self.current_task()
        for name in self.session.state.tasks:
            tail = self._tail(name)
            if tail is None:
                continue
            new = tail.poll()
            if name == current and new:
                shown = [text for noise, text in new if self._visible(noise, text)]
                if shown:
                    self.text.appendPlainText("\n".join(shown))
                self._update_folded(tail)

    def refresh_text(self) -> None:
        tail = self._tail(self.current_task())
        if tail is None:
            remote = self.session.remote_run
            if remote:  # a run on another machine: its logs stay there (only its events come over ssh)
                self.text.setPlainText(f"Task logs of a remote run are not available here: they stay on its machine, "
                                       f"in {remote}/tasks/<task>/log.txt.")
            else:
                self.text.setPlainText("" if self.session.run_dir is None else "No log yet.")
            self.folded.setText("")
            return
        if not tail.lines:
            tail.poll()
        self.text.setPlainText("\n".join(text for noise, text in tail.lines if self._visible(noise, text)))
        self.text.moveCursor(self.text.textCursor().MoveOperation.End)
        self._update_folded(tail)

    def _update_folded(self, tail: LogTail) -> None:
        n = sum(1 for noise, _ in tail.lines if noise)
        self.folded.setText("" if self.show_noise.isChecked() or not n else f"{n} noise lines folded")

