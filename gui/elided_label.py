"""A one-line label that ends in "…" where its space cuts it, and never asks for more room than
its minimum: long texts (a TensorFlow error, a run folder's name) cannot widen a toolbar or a window."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """One line of text that ends in "…" where the space cuts it (:meth:`text` is the whole text;
    the tooltip shows it whole while it is cut, unless a tooltip was set)."""

    HINT_CHARS = 80

    def __init__(self, text: str = "", parent: QWidget | None = None, *, min_chars: int = 0) -> None:
        super().__init__(parent)
        self._full = ""
        self._min_chars = min_chars
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - QLabel's name
        self._full = " ".join(text.split()) if "\n" in text else text  # one line, whatever it is given
        self._elide()

    def text(self) -> str:
        return self._full

    def shown_text(self) -> str:
        """What is drawn now (the text, cut with "…" where it does not fit)."""
        return super().text()

    def is_elided(self) -> bool:
        return self.shown_text() != self._full

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        # the whole text's width, up to ``HINT_CHARS`` characters: a long text is cut, not given its room
        most = self.fontMetrics().averageCharWidth() * self.HINT_CHARS
        wanted = self.fontMetrics().horizontalAdvance(self._full) + 4
        return QSize(min(wanted, most), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().averageCharWidth() * self._min_chars, super().minimumSizeHint().height())

    def _elide(self) -> None:
        width = self.contentsRect().width() if self.isVisible() else 10_000
        super().setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(0, width)))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def showEvent(self, event: object) -> None:  # noqa: N802
        super().showEvent(event)  # type: ignore[arg-type]
        self._elide()
