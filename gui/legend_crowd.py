"""What a plot of many replicas or tasks shows besides their mean and band: a search box and a choice.

A plot with more lines than a legend can name (see :mod:`gui.plots_crowd`) draws the mean of every
replica (or task) and the band from their lowest to their highest value, and a few of them as lines:
the *k* highest or lowest (the slowest, the highest loss: the ones a person looks for), one mean
line per host, or those the search box names. These controls sit in the plot's title bar and say
which; the legend then names only the lines drawn.
"""

from __future__ import annotations

from PySide6.QtCore import QStringListModel, Qt, Signal
from PySide6.QtWidgets import QComboBox, QCompleter, QHBoxLayout, QLabel, QLineEdit, QSizePolicy, QWidget

#: The choices of lines drawn besides the mean and the band: (text, k, highest), or per host (k 0).
CHOICES: tuple[tuple[str, int, bool | None], ...] = (
    ("5 highest", 5, True),
    ("5 lowest", 5, False),
    ("10 highest", 10, True),
    ("10 lowest", 10, False),
    ("each host", 0, None),
)
#: Lines a search draws at most (the note says how many more it names).
MAX_MATCHES = 16


class CrowdControls(QWidget):
    """A search box (``r17``, ``worker:3``, ``host-2``; several terms with commas) and the choice of
    lines drawn while it is empty. ``changed`` is emitted when either changes."""

    changed = Signal()

    def __init__(self, key: str, noun: str = "replica", highest: bool = True, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.noun = noun
        self.search = QLineEdit()
        self.search.setObjectName(f"crowdSearch-{key}")
        self.search.setPlaceholderText(f"find {noun}, host…")
        self.search.setClearButtonEnabled(True)
        self.search.setMinimumWidth(70)
        self.search.setMaximumWidth(170)
        self.search.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.search.setToolTip(f"Draw the {noun}s named here (r17, worker:3, host-2; several with commas) beside "
                               f"the mean and the band of all of them; empty: the choice on the right")
        self._names = QStringListModel(self)
        completer = QCompleter(self._names, self)
        completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        completer.setFilterMode(Qt.MatchFlag.MatchContains)
        self.search.setCompleter(completer)
        self.choice = QComboBox()
        self.choice.setObjectName(f"crowdChoice-{key}")
        for text, _k, _high in CHOICES:
            self.choice.addItem(text)
        self.choice.setCurrentIndex(0 if highest else 1)
        self.choice.setToolTip(f"Which {noun}s are drawn as lines besides the mean and the min–max band of all "
                               f"of them: the highest or lowest of their latest values, or one mean line per host")
        self.note = QLabel()
        self.note.setObjectName(f"crowdNote-{key}")
        self.note.hide()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        layout.addWidget(self.search, 1)
        layout.addWidget(self.note)
        layout.addWidget(self.choice)
        self.search.textChanged.connect(self.changed)
        self.choice.currentIndexChanged.connect(self.changed)

    @property
    def query(self) -> str:
        return self.search.text().strip()

    @property
    def k(self) -> int:
        """How many of the highest or lowest are drawn (0: a line per host instead)."""
        return CHOICES[max(0, self.choice.currentIndex())][1]

    @property
    def highest(self) -> bool:
        return bool(CHOICES[max(0, self.choice.currentIndex())][2])

    @property
    def per_host(self) -> bool:
        return CHOICES[max(0, self.choice.currentIndex())][2] is None

    def offer(self, names: list[str]) -> None:
        """What the search box completes (names of owners and hosts)."""
        if names != self._names.stringList():
            self._names.setStringList(names)

    def say(self, matched: int, drawn: int) -> None:
        """How many the search names, and how many of them are drawn."""
        if not self.query:
            self.note.hide()
            return
        self.note.setText(f"{matched}" if matched == drawn else f"{drawn} of {matched}")
        self.note.setToolTip(f"The search names {matched} {self.noun}{'s' if matched != 1 else ''}"
                             + (f"; the first {drawn} are drawn" if drawn < matched else ""))
        self.note.show()
