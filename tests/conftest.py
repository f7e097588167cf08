"""Shared fixtures: every test gets its own runs folder, and no test may leave a process behind."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "presets"


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "runs"
    monkeypatch.setenv("CLUSTERDECK_RUNS", str(root))
    return root


# Every process this test session starts inherits this marker, so the leftover check
# never mistakes another session's processes (or a benchmark's) for ours.
SESSION_MARK = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["CLUSTERDECK_TEST_SESSION"] = SESSION_MARK


def clusterdeck_processes() -> list[psutil.Process]:
    """Task and supervisor processes started from this test session."""
    found = []
    for proc in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "engine.runtime.task" in cmd or "engine.control.supervisor" in cmd:
            try:
                if proc.environ().get("CLUSTERDECK_TEST_SESSION") != SESSION_MARK:
                    continue
            except psutil.Error:
                continue
            found.append(proc)
    return found


def command_line(proc: psutil.Process) -> str:
    """``proc``'s command line, or "" once it has exited (a zombie or gone process has none to read)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def descendants_running(pid: int, marker: str) -> list[psutil.Process]:
    """Live descendants of ``pid`` whose command line holds ``marker``."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if marker in command_line(p)]


def alive(pids: Iterable[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Pids still alive after ``timeout`` seconds (empty: all gone)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = alive(pids)
        if not left:
            return []
        time.sleep(0.05)
    return alive(pids)


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = {p.pid for p in clusterdeck_processes()}
    yield
    left = [p for p in clusterdeck_processes() if p.pid not in before]
    if left:
        pids = [p.pid for p in left]
        stragglers = wait_gone(pids, 5.0)
        for pid in stragglers:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        assert not stragglers, f"processes left running by the test: {stragglers}"


@pytest.fixture(autouse=True, scope="session")
def _quiet_tf() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, why: str, *, needed_in_ci: bool = True) -> None:
    """Skip the calling test when ``condition`` is false; with ``CI=true`` fail it instead (for what CI
    must provide: sshd, network namespaces), so a missing service never hides behind a skip."""
    if condition:
        return
    if IN_CI and needed_in_ci:
        pytest.fail(f"CI=true and {why}: CI must provide it (.ci/run installs it)")
    pytest.skip(why)


@pytest.fixture
def needs() -> Callable[..., None]:
    """``needs(condition, why)``: :func:`require` as a fixture (skips here, fails with ``CI=true``)."""
    return require


class EventRecorder:
    """Every event of a run, as a listener receives them (listeners run on the launcher's dispatcher thread)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """The events of ``kind`` whose fields equal ``match``."""
        with self.lock:
            return [e for e in self.events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def pids(self) -> set[int]:
        return {e["pid"] for e in self.of("status") if isinstance(e.get("pid"), int)}
