"""A task dies with its supervisor: the agreement between the two, kept by the kernel where it can.

On Linux the supervisor arms ``PR_SET_PDEATHSIG`` in each task between fork and exec
(:func:`arm`): when the supervisor ends, however it ends, the kernel sends the task ``SIGKILL``. The
task then needs nothing of its own to notice (:func:`armed`). Elsewhere, and wherever arming failed, the
task watches its lifeline pipe instead (``engine/runtime/task.py``), which costs it a thread blocked in
``read`` for the whole run: in a data-parallel run on pinned cores that thread cost the training loop
10-17 % of its throughput in two series (``docs/benchmarks.md``, 1d); the kernel's signal costs no thread.

The signal follows the *thread* that started the task, so only a single-threaded starter (the
supervisor) may arm it.

A task forked from the warm-start template (:mod:`engine.contract.warm_start`) is reparented to the
supervisor, which made itself a *child subreaper* (:func:`become_subreaper`); the task arms the signal
itself once the supervisor is its parent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_SET_CHILD_SUBREAPER = 36


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # loaded once, before any fork: nothing is loaded between fork and exec


def available() -> bool:
    return _LIBC is not None


def arm(parent: int, sig: int = signal.SIGKILL) -> bool:
    """In a child between fork and exec: ``sig`` when the parent ends. ``parent``: the starter's pid, read
    before the fork; a parent already gone when the signal is armed ends the child at once. False: not
    armed here (the task falls back to its lifeline)."""
    if _LIBC is None or _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent ended before the signal was armed: it will never come
        os._exit(1)
    return True


def armed() -> bool:
    """Whether this process gets a signal when its parent ends (so it needs no lifeline watcher)."""
    if _LIBC is None:
        return False
    value = ctypes.c_int(0)
    if _LIBC.prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:
        return False
    return value.value != 0


def become_subreaper() -> bool:
    """Make this process the parent of any orphan among its descendants (``PR_SET_CHILD_SUBREAPER``), so
    a task forked by another of its children becomes its own child. False where that is not possible."""
    return _LIBC is not None and _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
