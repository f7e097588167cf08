"""The app survives Qt bindings that drop references to None on every void call (PySide6 6.12.0, Python 3.11)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject

from gui import qt_binding


def test_many_void_calls_cannot_exhaust_none() -> None:
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(50_000):
        probe.setObjectName("")
    drop = before - sys.getrefcount(None)
    if drop > 1000:  # a faulty binding: the guard must have made None effectively immortal
        assert qt_binding._guarded
        assert sys.getrefcount(None) > 1 << 39
    assert qt_binding.guard_singletons() is qt_binding._guarded
