"""Where the Runs panel looks: this machine's runs folder, or a runs folder on another machine (``user@host[:DIR]``,
reached over the user's own ssh), typed once and kept as a short recent list.

:class:`LocationBar` is the chooser (an editable list, a button that lists again, a busy bar); :class:`RunsSource`
lists the chosen folder: this machine's by a scan, a remote one on a worker thread (``clusterdeck ls`` there,
:func:`gui.runs_remote.remote_entries`), again every :data:`REMOTE_REFRESH_MS` while the panel shows it, and says
what it found, or why not in one line.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QSize, Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QStyle, QToolButton, QWidget

from engine.control.remote import RemoteError
from engine.control.remote_protocol import RemoteTarget, TargetError
from gui import theme
from gui.elided_label import ElidedLabel
from gui.preferences import app_settings
from gui.runs_remote import remote_entries
from gui.runs_scan import RunEntry, RunsScanner

#: The chooser's first entry: the runs folder of this machine.
LOCAL = "This machine"
#: How often a remote runs folder is listed again while the panel shows it (milliseconds).
REMOTE_REFRESH_MS = 10_000
LOCATION_TIP = ("Whose runs are listed: this machine's runs folder, or one on another machine — type user@host "
                "(its runs folder) or user@host:DIR and press Enter. It is listed over your own ssh (keys or an "
                "agent, no password prompt) with the ClusterDeck installed there; the locations typed are remembered")


class RecentTargets:
    """Texts typed last (remote locations, remote runs), newest first, at most ``limit``, kept in the app's settings."""

    def __init__(self, key: str, limit: int = 6) -> None:
        self.key = key
        self.limit = limit

    def items(self) -> list[str]:
        value = app_settings().value(self.key, [])
        if isinstance(value, str):  # QSettings gives a one-item list back as its item
            return [value] if value else []
        return [str(v) for v in value if str(v)] if isinstance(value, list) else []

    def add(self, text: str) -> None:
        app_settings().setValue(self.key, [text, *(t for t in self.items() if t != text)][:self.limit])


def parse_location(text: str) -> RemoteTarget | None:
    """None for this machine; else the remote runs folder ``text`` names (:class:`TargetError` when it names none)."""
    text = text.strip()
    if not text or text == LOCAL:
        return None
    return RemoteTarget.parse(text, need_path=False)


class LocationBar(QWidget):
    """The Runs panel's location chooser; ``chosen`` when another location is picked or typed (Enter); the ones
    listed are remembered (:meth:`remember`). Its
    :attr:`notice` (placed by the panel) says in one line why a location cannot be listed, or names no machine."""

    chosen = Signal()
    reload = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.recent = RecentTargets("runsPanel/remoteLocations")
        self.target: RemoteTarget | None = None
        label = QLabel("&Location")
        label.setToolTip(LOCATION_TIP)
        self.combo = QComboBox()
        self.combo.setObjectName("runsLocation")
        self.combo.setEditable(True)
        self.edit = QLineEdit()
        self.combo.setLineEdit(self.edit)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setMinimumContentsLength(16)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setToolTip(LOCATION_TIP)
        self.edit.setPlaceholderText("user@host[:DIR]")
        self.edit.returnPressed.connect(self._typed)
        self.combo.activated.connect(lambda _i: self._typed())
        label.setBuddy(self.combo)
        self.reload_button = QToolButton()
        self.reload_button.setObjectName("runsReload")
        self.reload_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_BrowserReload))
        self.reload_button.setIconSize(QSize(16, 16))
        self.reload_button.setAutoRaise(True)
        self.reload_button.setToolTip("List the runs of this location again (a remote one is also listed every "
                                      f"{REMOTE_REFRESH_MS // 1000} s while the panel shows)")
        self.reload_button.clicked.connect(self.reload)
        self.busy = QProgressBar()
        self.busy.setObjectName("runsBusy")
        self.busy.setRange(0, 0)  # a busy bar, no percentage
        self.busy.setTextVisible(False)
        self.busy.setFixedSize(44, 10)
        self.busy.setToolTip("Listing the runs over ssh…")
        self.busy.setVisible(False)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(3)
        row.addWidget(label)
        row.addWidget(self.combo, 1)
        row.addWidget(self.reload_button)
        row.addWidget(self.busy, 0, Qt.AlignmentFlag.AlignVCenter)
        self.notice = ElidedLabel()
        self.notice.setObjectName("runsProblem")
        self.notice.setStyleSheet(f"color: {theme.PROBLEM_COLOR}")
        self.notice.setVisible(False)
        self._fill()

    @property
    def text(self) -> str:
        """The location as it reads (``This machine``, or ``user@host[:DIR]``)."""
        return str(self.target) if self.target is not None else LOCAL

    def choose(self, text: str) -> bool:
        """Look at ``text``'s runs (this machine for ``This machine`` or nothing); False, with ``invalid``, when it
        names no machine."""
        try:
            target = parse_location(text)
        except TargetError as exc:
            self.say(f"Location {text.strip()!r}: {exc}")
            return False
        changed = target != self.target
        self.target = target
        self._fill()
        if changed:
            self.chosen.emit()
        else:
            self.reload.emit()  # the same place again: listed again
        return True

    def remember(self, location: str) -> None:
        """``location`` was listed: it heads the recent ones (a typo that reached no machine is not kept)."""
        if self.recent.items()[:1] != [location]:
            self.recent.add(location)
            self._fill()

    def set_busy(self, busy: bool) -> None:
        self.busy.setVisible(busy)

    def say(self, problem: str | None) -> None:
        """Show why the location cannot be listed, in one line (its whole text in the tooltip); None: nothing."""
        self.notice.setText(problem or "")
        self.notice.setToolTip(problem or "")
        self.notice.setVisible(bool(problem))

    def _typed(self) -> None:
        self.choose(self.combo.currentText())

    def _fill(self) -> None:
        """The list: this machine, then the remote locations typed last; the current one shown."""
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(self.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon), LOCAL)
        self.combo.setItemData(0, "The runs folder of this machine", Qt.ItemDataRole.ToolTipRole)
        net = self.style().standardIcon(QStyle.StandardPixmap.SP_DriveNetIcon)
        for text in self.recent.items():
            self.combo.addItem(net, text)
            self.combo.setItemData(self.combo.count() - 1, f"The runs on {text}, listed over ssh",
                                   Qt.ItemDataRole.ToolTipRole)
        self.combo.setCurrentIndex(max(0, self.combo.findText(self.text)))
        self.combo.setEditText(self.text)
        self.edit.setCursorPosition(0)  # the host first, where a long folder does not fit
        self.combo.setToolTip(LOCATION_TIP if self.target is None else f"<b>{self.text}</b><br>{LOCATION_TIP}")
        self.combo.blockSignals(False)


@dataclass(frozen=True)
class Listing:
    """What one look at a runs folder found: its runs, or why they could not be listed (one line); ``location`` is
    "" for this machine's runs folder, else ``user@host[:DIR]``; ``missing``: this machine's has no run yet."""

    location: str
    entries: list[RunEntry] = field(default_factory=list)
    problem: str | None = None
    missing: bool = False


class RunsSource(QObject):
    """The runs the panel lists: this machine's runs folder (:class:`RunsScanner`, on the GUI thread: a listing and
    a stat or two per run) or a remote one (``clusterdeck ls`` there, on a worker thread). ``listed`` says each
    look; :meth:`tick`, called every second while the panel shows, looks again (a remote folder every
    :data:`REMOTE_REFRESH_MS`)."""

    listed = Signal(object)  # Listing (on the GUI thread)
    busyChanged = Signal(bool)  # a remote listing is under way
    _said = Signal(object)  # from a worker

    def __init__(self, root: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.scanner = RunsScanner(root)
        self.target: RemoteTarget | None = None
        self._running: set[str] = set()  # remote locations being listed now
        self._listed_at = 0.0
        self._said.connect(self._delivered)

    @property
    def location(self) -> str:
        return str(self.target) if self.target is not None else ""

    @property
    def busy(self) -> bool:
        return self.location in self._running

    def set_root(self, root: Path) -> None:
        self.scanner = RunsScanner(root)

    def set_target(self, target: RemoteTarget | None) -> None:
        """Look at ``target``'s runs from now on (None: this machine's); what a listing under way finds of another
        place is dropped."""
        self.target = target
        self.busyChanged.emit(self.busy)

    def refresh(self) -> None:
        """Look now: this machine's folder is scanned here and then; a remote one is asked for (not twice at once)."""
        target = self.target
        if target is None:
            scan = self.scanner.scan()
            self.listed.emit(Listing("", scan.entries, scan.problem, scan.missing))
            return
        if str(target) in self._running:
            return
        self._running.add(str(target))
        self._listed_at = time.monotonic()
        self.busyChanged.emit(True)
        threading.Thread(target=self._work, args=(target,), name="remote-list", daemon=True).start()

    def tick(self) -> None:
        if self.target is None or time.monotonic() - self._listed_at >= REMOTE_REFRESH_MS / 1000:
            self.refresh()

    def _work(self, target: RemoteTarget) -> None:
        try:
            listing = Listing(str(target), remote_entries(target))
        except RemoteError as exc:
            listing = Listing(str(target), problem=str(exc))
        except Exception as exc:  # noqa: BLE001 - told in the panel, never raised into a thread's void
            listing = Listing(str(target), problem=f"{target.login}: the runs could not be listed ({exc!r})")
        try:
            self._said.emit(listing)
        except RuntimeError:  # the panel went away meanwhile
            pass

    def _delivered(self, listing: Listing) -> None:
        self._running.discard(listing.location)
        self._listed_at = time.monotonic()
        self.busyChanged.emit(self.busy)
        if listing.location == self.location:
            self.listed.emit(listing)
