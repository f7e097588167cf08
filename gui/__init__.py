"""ClusterDeck desktop app (PySide6 + pyqtgraph). Never imports TensorFlow."""
