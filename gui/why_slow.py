"""The "Why slow" panel: where each replica's step goes (live), how that changed over time, why a straggler
straggles, and two buttons that ask the live run itself: a 2 s profile of every task (top ops per task) and
a dump of every task's stacks (who waits where).

It takes the app's :class:`~gui.run_session.RunSession` (and its :class:`~gui.stragglers_view.StragglerWatch`,
or makes its own), reads :attr:`RunSession.state`'s ``breakdowns`` and redraws at most 4 times a second.
The buttons' work runs off the GUI thread (:mod:`gui.why_slow_jobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QColor, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.control import profiling
from engine.control.doctor import Dump
from engine.observe.run_reader import ENDED
from gui.run_session import RunSession
from gui.stragglers_view import StragglerWatch, describe_change
from gui.why_slow_bars import ReplicaBars
from gui.why_slow_jobs import PROFILE_MS, DoctorJobs
from gui.why_slow_model import PART_COLORS, mean_stack, part_label, part_tip, replica_stack, summary_text
from gui.why_slow_results import ProfileResults, StacksView
from gui.why_slow_trend import BreakdownTrend

#: The views redraw at most this often (milliseconds between two redraws).
REDRAW_MS = 250
NO_LIVE_RUN = ("No live run is shown: {what} needs a running run (start one, or open the folder of a run that is "
               "running on this machine)")
MEAN = -1
#: Breakdowns the mean of the replicas is made of at most, per redraw.
MEAN_SAMPLES = 3000


class WhySlowPanel(QWidget):
    """Why the shown run is slow, or stuck (see the module docstring)."""

    def __init__(self, session: RunSession, stragglers: StragglerWatch | None = None,
                 parent: QWidget | None = None, jobs: DoctorJobs | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("whySlowPanel")
        self.session = session
        self.stragglers = stragglers if stragglers is not None else StragglerWatch(session, parent=self)
        self.jobs = jobs if jobs is not None else DoctorJobs(self)
        self._drawn_version = -1
        self._drawn_flags: dict[int, object] = {}
        self._legend_of: tuple[tuple[str, ...], str] | None = None
        self._redraw = QTimer(self)
        self._redraw.setObjectName("whySlowRedraw")
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(REDRAW_MS)
        self._redraw.timeout.connect(self.refresh)

        self.cause = QLabel()
        self.cause.setObjectName("whySlowCause")
        self.cause.setWordWrap(True)
        self.cause.setTextFormat(Qt.TextFormat.PlainText)
        self.cause.setToolTip("Why the run is slow: a straggler and its cause (from its step breakdown), else where "
                              "the replicas' steps go on average")
        self.profile_button = QPushButton(f"Profile {PROFILE_MS / 1000:g} s")
        self.profile_button.setObjectName("whySlowProfileButton")
        self.profile_button.clicked.connect(self.profile)
        self.stacks_button = QPushButton("Dump stacks")
        self.stacks_button.setObjectName("whySlowStacksButton")
        self.stacks_button.clicked.connect(self.dump_stacks)
        self.busy = QLabel("")
        self.busy.setObjectName("whySlowBusy")
        self.busy.setToolTip("What the panel is asking the run's tasks")
        buttons = QHBoxLayout()
        buttons.addWidget(self.profile_button)
        buttons.addWidget(self.stacks_button)
        buttons.addWidget(self.busy, 1)

        self.bars = ReplicaBars()
        self.bars.replicaClicked.connect(self.select_replica)
        bars_scroll = QScrollArea()
        bars_scroll.setWidgetResizable(True)
        bars_scroll.setWidget(self.bars)
        bars_scroll.setMinimumHeight(60)
        bars_scroll.setToolTip(self.bars.toolTip())
        self.legend = QHBoxLayout()
        self.legend.setSpacing(10)
        left = QWidget()
        left_box = QVBoxLayout(left)
        left_box.setContentsMargins(0, 0, 0, 0)
        title = QLabel("<b>Where each replica's step goes</b>")
        title.setToolTip("Each bar is one replica's step, as long as its step time, split into what it spent on")
        left_box.addWidget(title)
        left_box.addWidget(bars_scroll, 1)
        left_box.addLayout(self.legend)

        self.trend = BreakdownTrend()
        self.replica_choice = QComboBox()
        self.replica_choice.setObjectName("whySlowReplica")
        self.replica_choice.setToolTip("Whose breakdown the plot follows: the mean of the replicas, or one replica")
        self.replica_choice.addItem("Mean of the replicas", MEAN)
        self.replica_choice.currentIndexChanged.connect(self._choice_changed)
        right = QWidget()
        right_box = QVBoxLayout(right)
        right_box.setContentsMargins(0, 0, 0, 0)
        top_row = QHBoxLayout()
        over_time = QLabel("<b>Over time</b>")
        over_time.setToolTip("The breakdown of the chosen replica (or of their mean) over the last minutes")
        top_row.addWidget(over_time)
        top_row.addStretch(1)
        top_row.addWidget(self.replica_choice)
        right_box.addLayout(top_row)
        right_box.addWidget(self.trend, 1)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        self.profile_results = ProfileResults()
        self.stacks_view = StacksView()
        self.tabs = QTabWidget()
        self.tabs.setObjectName("whySlowTabs")
        self.tabs.addTab(self.profile_results, "Top ops")
        self.tabs.setTabToolTip(0, "The last profile's top ops per task")
        self.tabs.addTab(self.stacks_view, "Stacks")
        self.tabs.setTabToolTip(1, "The last stack dump of every task, side by side")
        body = QSplitter(Qt.Orientation.Vertical)
        body.addWidget(split)
        body.addWidget(self.tabs)
        body.setStretchFactor(0, 3)
        body.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.cause)
        layout.addLayout(buttons)
        layout.addWidget(body, 1)

        session.runLoaded.connect(self._run_loaded)
        session.runUpdated.connect(self._schedule)
        session.runStateChanged.connect(self._state_changed)
        self.stragglers.changed.connect(self._schedule)
        self.jobs.busyChanged.connect(self._busy_changed)
        self.jobs.profiled.connect(self._profiled)
        self.jobs.dumped.connect(self._dumped)
        self._run_loaded()

    def sizeHint(self) -> QSize:
        """Room for its plots without asking more than a 1366x768 screen's window can give a panel."""
        return QSize(900, 520)

    # ------------------------------------------------------------------ state

    @property
    def mode(self) -> str:
        return str(self.session.config.parallelism.mode)

    def live_run_dir(self) -> Path | None:
        """The shown run's folder while it runs (launched here, or an opened folder still written), else None."""
        s = self.session
        if s.run_dir is None or not s.shows_run:
            return None
        if s.is_running or s.state.state not in ENDED:
            return s.run_dir
        return None

    def _run_loaded(self) -> None:
        self._drawn_version = -1
        self.replica_choice.blockSignals(True)
        while self.replica_choice.count() > 1:
            self.replica_choice.removeItem(1)
        self.replica_choice.setCurrentIndex(0)
        self.replica_choice.blockSignals(False)
        self.bars.selected = None
        self._show_saved_capture()
        self._update_buttons()
        self.refresh(force=True)

    def _show_saved_capture(self) -> None:
        """An opened run folder's newest capture, if it has one (no TensorFlow: the summaries the tasks wrote)."""
        run_dir = self.session.run_dir
        ids = profiling.captures(run_dir) if run_dir is not None and self.session.shows_run else []
        if ids:
            self.profile_results.show_capture(profiling.read_capture(run_dir, ids[-1]))  # type: ignore[arg-type]

    def _update_buttons(self) -> None:
        live = self.live_run_dir() is not None
        busy = bool(self.jobs.busy)
        for button, what, tip in ((self.profile_button, "Profile",
                                   f"Capture a TensorFlow profile of every task for {PROFILE_MS / 1000:g} s while the "
                                   "run goes on, then list each task's top ops (the trace opens in TensorBoard)"),
                                  (self.stacks_button, "Dump stacks",
                                   "Ask every task of this machine for its Python stacks now and show where each "
                                   "waits (a stuck run: who waits for whom)")):
            button.setEnabled(live and not busy)
            button.setToolTip(tip if live and not busy else
                              f"Busy: {self.jobs.busy}" if busy else NO_LIVE_RUN.format(what=what))

    def _state_changed(self, _state: str) -> None:
        self._update_buttons()

    def _choice_changed(self, _index: int) -> None:
        self.refresh(force=True)

    def _schedule(self) -> None:
        if not self._redraw.isActive():
            self._redraw.start()

    # ------------------------------------------------------------------ drawing

    def refresh(self, force: bool = False) -> None:
        """Redraw from the session's state (only when new steps were folded, unless ``force``)."""
        state = self.session.state
        breakdowns = state.breakdowns
        if not force and breakdowns.version == self._drawn_version and not self._stragglers_moved():
            return
        self._drawn_version = breakdowns.version
        latest = breakdowns.latest()
        flagged = self.stragglers.flagged
        tasks = {rid: r.task for rid, r in state.replicas.items()}
        self.bars.set_rows([(rid, tasks.get(rid, ""), b) for rid, b in latest.items()], self.mode, set(flagged))
        self._fill_choice(latest, tasks)
        self._fill_legend(breakdowns.measured())
        self._drawn_flags = dict(flagged)
        if flagged:
            worst = max(flagged.values(), key=lambda c: c.ratio)
            more = len(flagged) - 1
            self.cause.setText(f"⚠ Straggler: {describe_change(worst)}" + (f" (and {more} more)" if more else ""))
        else:
            self.cause.setText(summary_text(latest, self.mode))
        chosen = self.replica_choice.currentData()
        t0 = breakdowns.first_t() or 0.0
        parts = breakdowns.measured() or ("compute",)
        if chosen is None or chosen == MEAN or chosen not in latest:
            # the mean of many replicas reads every n-th of their breakdowns: a redraw stays a few milliseconds
            every = max(1, -(-breakdowns.kept() // MEAN_SAMPLES))
            stack = mean_stack((breakdowns.recent(rid, every) for rid in breakdowns.replicas()), t0, parts)
        else:
            stack = replica_stack(breakdowns.recent(chosen), t0, parts)
        self.trend.set_stack(stack, self.mode)

    def _stragglers_moved(self) -> bool:
        return self.stragglers.flagged != self._drawn_flags

    def _fill_choice(self, latest: Mapping[int, object], tasks: dict[int, str]) -> None:
        have = {self.replica_choice.itemData(i) for i in range(self.replica_choice.count())}
        for rid in sorted(latest):
            if rid not in have:
                self.replica_choice.addItem(f"replica {rid} ({tasks.get(rid, '?')})", rid)

    def _fill_legend(self, parts: tuple[str, ...]) -> None:
        if (parts, self.mode) == self._legend_of:
            return
        self._legend_of = (parts, self.mode)
        while self.legend.count():
            item = self.legend.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        for part in parts:
            swatch = QPixmap(12, 12)
            swatch.fill(QColor(PART_COLORS[part]))
            key = QLabel()
            key.setPixmap(swatch)
            text = QLabel(part_label(part, self.mode))
            for widget in (key, text):
                widget.setToolTip(part_tip(part, self.mode))
            self.legend.addWidget(key)
            self.legend.addWidget(text)
        self.legend.addStretch(1)

    def select_replica(self, replica: int) -> None:
        """Follow ``replica`` in the plot (a click on its bar)."""
        i = self.replica_choice.findData(replica)
        if i >= 0:
            self.replica_choice.setCurrentIndex(i)

    # ------------------------------------------------------------------ the buttons

    def profile(self) -> None:
        run_dir = self.live_run_dir()
        if run_dir is None or self.jobs.busy:
            return
        self.tabs.setCurrentWidget(self.profile_results)
        self.profile_results.show_message(f"Profiling every task of {run_dir.name} for {PROFILE_MS / 1000:g} s…")
        self.jobs.profile(run_dir)

    def dump_stacks(self) -> None:
        run_dir = self.live_run_dir()
        if run_dir is None or self.jobs.busy:
            return
        self.tabs.setCurrentWidget(self.stacks_view)
        self.stacks_view.show_message(f"Asking every task of {run_dir.name} for its stacks…")
        self.jobs.dump_stacks(run_dir)

    def _busy_changed(self, what: str) -> None:
        self.busy.setText(what)
        self._update_buttons()

    def _profiled(self, outcome: object) -> None:
        if isinstance(outcome, profiling.ProfileCapture):
            self.profile_results.show_capture(outcome)
        else:
            self.profile_results.show_message(f"No profile: {outcome}")

    def _dumped(self, outcome: object) -> None:
        if isinstance(outcome, dict):
            dumps: dict[str, Dump | str] = {str(k): v for k, v in outcome.items()}
            self.stacks_view.show_dumps(dumps, self.session.run_dir)
        else:
            self.stacks_view.show_message(f"No stacks: {outcome}")

    def shutdown(self) -> None:
        """Stop the redraw timer, cancel a job under way and leave the session (call when the window closes)."""
        self._redraw.stop()
        self.jobs.shutdown()
        for signal, slot in ((self.session.runLoaded, self._run_loaded), (self.session.runUpdated, self._schedule),
                             (self.session.runStateChanged, self._state_changed),
                             (self.stragglers.changed, self._schedule)):
            try:
                signal.disconnect(slot)
            except (RuntimeError, TypeError):  # already gone
                pass
