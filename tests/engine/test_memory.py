"""The allocator setting of the processes that keep a run's history."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import types

import pytest

from engine.control import memory
from tests.conftest import ROOT

GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc only")


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memory.ENV, raising=False)


@needs_glibc
@pytest.mark.usefixtures("no_env")
def test_it_applies_on_glibc_and_again_harmlessly() -> None:
    assert memory.tune_allocator() is True
    assert memory.tune_allocator() is True, "a second call sets the same value"
    assert memory.tune_allocator(memory.MMAP_THRESHOLD) is True


@pytest.mark.usefixtures("no_env")
@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_it_does_nothing_off_linux(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    def no_cdll(*args: object, **kwargs: object) -> object:
        raise AssertionError("no C library is loaded off Linux")

    monkeypatch.setattr(memory.sys, "platform", platform)
    monkeypatch.setattr(memory.ctypes, "CDLL", no_cdll)
    assert memory.tune_allocator() is False


@pytest.mark.usefixtures("no_env")
def test_it_does_nothing_on_another_c_library(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    musl = types.SimpleNamespace(mallopt=mallopt)  # musl has a mallopt that does nothing, and no gnu_* symbols
    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: musl)
    assert memory.tune_allocator() is False and calls == []

    def unloadable(name: object) -> object:
        raise OSError("no such library")

    monkeypatch.setattr(memory.ctypes, "CDLL", unloadable)
    assert memory.tune_allocator() is False


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.ENV, "262144")
    monkeypatch.setattr(memory, "_glibc", lambda platform: pytest.fail("glibc is left alone"))
    assert memory.tune_allocator() is False


@needs_glibc
def test_large_blocks_stay_mmapped_after_a_larger_one_was_freed() -> None:
    """glibc's dynamic threshold, then the fixed one: the effect the app relies on, in fresh processes."""
    probe = textwrap.dedent("""
        import ctypes, sys
        from engine.control.memory import tune_allocator

        class MallInfo2(ctypes.Structure):
            _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                      "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL(None)
        if not hasattr(libc, "mallinfo2"):
            print("skip")
            sys.exit()
        libc.mallinfo2.restype = MallInfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        if sys.argv[1] == "tuned":
            assert tune_allocator()
        libc.free(libc.malloc(4 << 20))  # by default this raises the threshold to 4 MiB
        before = libc.mallinfo2().hblks
        block = libc.malloc(1 << 20)
        print(libc.mallinfo2().hblks - before)  # 1: an mmap block of its own, returned whole when freed
        libc.free(block)
    """)
    env = {k: v for k, v in os.environ.items() if k != memory.ENV}
    out = {}
    for mode in ("default", "tuned"):
        done = subprocess.run([sys.executable, "-c", probe, mode], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60, check=True)
        out[mode] = done.stdout.strip()
    if out["default"] == "skip":
        pytest.skip("glibc before 2.33 has no mallinfo2")
    assert out == {"default": "0", "tuned": "1"}


@needs_glibc
def test_trim_heap_gives_free_pages_back() -> None:
    # a process whose heap holds freed small blocks behind a live one: trimming gives the pages back
    code = textwrap.dedent("""
        import ctypes, sys
        from engine.control import memory
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        def rss():
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * 4096
        blocks = [libc.malloc(4000) for _ in range(40_000)]  # 160 MB of small blocks in the heap
        for b in blocks:
            ctypes.memset(b, 1, 4000)
        keep = libc.malloc(4000)  # the heap's top stays in use: only a trim returns what lies below
        for b in blocks:
            libc.free(b)
        before = rss()
        trimmed = memory.trim_heap()
        print(trimmed, (before - rss()) // 2**20)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    trimmed, returned_mb = out.stdout.split()
    assert trimmed == "True" and int(returned_mb) > 100, out.stdout


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_trim_heap_does_nothing_off_linux(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setattr(memory.sys, "platform", platform)
    assert memory.trim_heap() is False
