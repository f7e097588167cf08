"""Process-wide memory settings for the processes that keep a run's history (the app, ``clusterdeck run``).

:func:`tune_allocator` fixes glibc's mmap threshold. By default glibc serves an allocation of
128 KiB or more with a ``mmap`` of its own, given back to the system when it is freed, but it
raises that threshold to the size of every such block freed (up to 32 MiB). The history's arrays
grow by reallocation, so after a few growths the threshold sits above their size: their new
copies land in the ``brk`` heap, and the old ones, freed between live blocks, leave holes that
glibc keeps. Setting the threshold also stops its adjustment, so large arrays stay in ``mmap``
blocks, returned whole when freed, whose untouched pages (a growable array's spare capacity)
cost no memory at all.

Measured with ``bench/gui_scale.py`` (32 replicas x 4 metrics at 10 Hz for an hour, 4.6 M
points, in the real window), RSS at the end: 403 MB by default (298 MB after a ``malloc_trim(0)``
there, which shows what was kept); 323 MB with the threshold fixed at 128 KiB, 316 MB at 64 KiB
(peak 381 MB, from the fast-forward), with no change in the time the benchmark takes.

Linux with glibc only: elsewhere (macOS, Windows, musl) it does nothing.

:func:`trim_heap` hands the free pages of glibc's heap back to the system (``malloc_trim(0)``):
small blocks freed between live ones (Qt's, numpy's small arrays, the plots' growing summaries)
stay with the process otherwise. A process that folds events for hours calls it now and then
(the app: :class:`gui.run_session.RunSession`, at most every :data:`TRIM_INTERVAL_S` while events
come); it walks the heap, ~1-3 ms for the app's.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: ``M_MMAP_THRESHOLD`` of glibc's ``<malloc.h>``.
M_MMAP_THRESHOLD = -3
#: Allocations from this size on get ``mmap`` blocks of their own (8192 float64; glibc starts at 128 KiB).
MMAP_THRESHOLD = 64 * 1024
#: The environment variable through which glibc takes the threshold; when set, it is left alone.
ENV = "MALLOC_MMAP_THRESHOLD_"
#: Seconds between two :func:`trim_heap` calls of a process that keeps folding events.
TRIM_INTERVAL_S = 30.0


def _glibc(platform: str) -> ctypes.CDLL | None:
    """The process's C library when it is glibc, else None."""
    if not platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into the process: its own C library
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # musl or another C library: no glibc malloc to tune
    return libc


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; True when it was set.

    A no-op (False) off glibc and when ``MALLOC_MMAP_THRESHOLD_`` already set it. Calling it
    again is harmless: it sets the same value.
    """
    if ENV in os.environ:
        return False
    libc = _glibc(sys.platform)
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


def trim_heap() -> bool:
    """Give the free pages of glibc's heap back to the system; True when some were.

    A no-op (False) off glibc.
    """
    libc = _glibc(sys.platform)
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    trim = libc.malloc_trim
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
