"""The bar above the live plots (x axis, smoothing, a note on what trained, comparison buttons) and
the first plot's metric chooser."""

from __future__ import annotations

from collections.abc import Collection

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QSlider, QWidget

from gui.elided_label import ElidedLabel
from gui.metric_series import LOSS, display_name, metric_names
from gui.series_model import X_AXES

NO_CURVES_HINT = "No curves yet: run the config (F5) or open a run folder."
NO_CURVES_TIP = "Curves appear as soon as the replicas report their first steps"


class PlotsBar(QWidget):
    """The plots' shared view settings: the replica plots' x axis (step or wall time) and their EMA
    smoothing; a note (how to get curves, then what trained); compare with another run, or stop."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.x_mode = QComboBox()
        self.x_mode.setObjectName("xAxis")
        self.x_mode.addItems(list(X_AXES))
        self.x_mode.setToolTip("X axis of the replica plots: training step, or seconds since the run began")
        self.smoothing = QSlider(Qt.Orientation.Horizontal)
        self.smoothing.setObjectName("smoothing")
        self.smoothing.setRange(0, 99)
        self.smoothing.setValue(60)
        self.smoothing.setFixedWidth(140)
        self.smoothing.setToolTip("Exponential moving average of the replica curves (0: raw points)")
        self.smoothing_label = QLabel()
        self.smoothing_label.setMinimumWidth(32)
        self.compare_button = QPushButton("Compare with run…")
        self.compare_button.setToolTip("Overlay another run's replica curves, dashed")
        self.clear_compare = QPushButton("Clear comparison")
        self.clear_compare.setToolTip("Remove the overlaid runs")
        self.hint = ElidedLabel(NO_CURVES_HINT)
        self.hint.setObjectName("plotsHint")
        self.hint.setToolTip(NO_CURVES_TIP)
        self.hint.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        bar = QHBoxLayout(self)
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(QLabel("X axis"))
        bar.addWidget(self.x_mode)
        bar.addSpacing(12)
        bar.addWidget(QLabel("Smoothing"))
        bar.addWidget(self.smoothing)
        bar.addWidget(self.smoothing_label)
        bar.addSpacing(12)
        bar.addWidget(self.hint, 1)
        bar.addWidget(self.compare_button)
        bar.addWidget(self.clear_compare)

    @property
    def weight(self) -> float:
        return self.smoothing.value() / 100.0

    @property
    def by_time(self) -> bool:
        return self.x_mode.currentIndex() == 1

    def show_weight(self) -> None:
        self.smoothing_label.setText(f"{self.weight:.2f}")

    def show_hint(self, trained: str, no_metrics: bool, has_series: bool) -> None:
        """How to get curves while there are none, then what trained (``trained``: the run's optimizer,
        loss and compiled metrics); ``no_metrics``: the note says the program reports none."""
        if trained:
            self.hint.setText(trained)
            self.hint.setToolTip(f"What trained: {trained}")
        elif not no_metrics:
            self.hint.setText(NO_CURVES_HINT)
            self.hint.setToolTip(NO_CURVES_TIP)
        self.hint.setVisible(bool(trained) or no_metrics or not has_series)

    def say_no_metrics(self) -> None:
        self.hint.setText("This program reports no metrics (CPU, memory and the log are still shown): "
                          "it sends no step events")
        self.hint.setToolTip("Report steps and metrics from your program through ClusterDeck's reporting "
                             "API to see them plotted")


class MetricChooser(QComboBox):
    """Which training metric the first plot shows: the loss, or any metric the shown run reports."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("metricChooser")
        self.setToolTip("Which training metric the first plot shows, per replica; its validation "
                        "(held-out examples) is the dashed curve. New metrics are added as the run "
                        "reports them")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.addItem(display_name(LOSS), LOSS)
        self._keys = 0  # history series counted when the metrics were last listed

    @property
    def shown(self) -> str:
        """The metric shown (a series name: ``loss``, ``accuracy``, ``metric:loss``)."""
        return str(self.currentData() or LOSS)

    def forget(self) -> None:
        """Another run: the next :meth:`offer` lists its metrics whatever its series count."""
        self._keys = -1

    def offer(self, series: Collection[str]) -> bool:
        """Offer every metric of a history's ``series`` (checked only when it gained series); True when
        the list started again without a signal (another run: the caller shows the metric now chosen)."""
        if len(series) == self._keys:
            return False
        self._keys = len(series)
        names = metric_names(series)
        offered = [str(self.itemData(i)) for i in range(self.count())]
        if names[: len(offered)] == offered:  # new metrics arrived: added at the end
            for name in names[len(offered):]:
                self.addItem(display_name(name), name)
            return False
        # another run: the list starts again, on the metric shown if that run has it
        shown = self.shown
        self.blockSignals(True)
        self.clear()
        for name in names:
            self.addItem(display_name(name), name)
        self.setCurrentIndex(max(0, names.index(shown)) if shown in names else 0)
        self.blockSignals(False)
        return True
