"""A guard against a reference-counting fault of some Qt for Python builds on Python 3.11.

PySide6/shiboken6 6.12.0 wheels return ``None`` (and ``True``/``False``) from
void or bool C++ methods without taking a reference, as is correct only where
those objects are immortal (Python >= 3.12). On Python 3.11 every such call
drops one reference, and after some tens of thousands of calls the interpreter
aborts with ``Fatal Python error: none_dealloc``. Where that fault is measured,
:func:`guard_singletons` gives those singletons the huge reference count that
Python 3.12 gives them by design, so the drops can never reach zero.
"""

from __future__ import annotations

import ctypes
import sys

_GUARD = 1 << 40
_guarded = False


def drops_singleton_refs() -> bool:
    """True when calling a void Qt method loses a reference to ``None`` (the faulty builds)."""
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(64):
        probe.setObjectName("")
    return sys.getrefcount(None) < before - 32


def guard_singletons() -> bool:
    """Make ``None``, ``True`` and ``False`` immortal in effect where the binding needs it; True if applied."""
    global _guarded
    if _guarded:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython" or not drops_singleton_refs():
        return False
    for obj in (None, True, False, Ellipsis, NotImplemented):
        ctypes.c_ssize_t.from_address(id(obj)).value += _GUARD  # ob_refcnt is the first field
    _guarded = True
    return True
