"""Keras, imported for a task process without its notebook extras.

Where IPython is installed (as it is wherever Jupyter is), importing Keras imports IPython too: its
``keras.src.saving.file_editor`` looks for a notebook to display in. That is about half a second of every
task's start (0.90 of the import of the data-parallel runtime, measured side by side), for a process that
never runs in a notebook. :func:`import_keras` imports Keras with IPython hidden, then unhides it, so a
user's script that imports IPython still gets it.
"""

from __future__ import annotations

import sys


def import_keras() -> None:
    """Import Keras (and so TensorFlow) without importing IPython; a no-op once Keras is imported."""
    if "keras" in sys.modules:
        return
    hidden = "IPython" not in sys.modules
    if hidden:
        sys.modules["IPython"] = None  # type: ignore[assignment]  # ``import IPython`` raises ImportError
    try:
        import keras  # noqa: F401
    finally:
        if hidden and sys.modules.get("IPython", 0) is None:
            del sys.modules["IPython"]
