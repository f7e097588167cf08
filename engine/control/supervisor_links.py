"""The launcher's process plumbing of one supervisor: its pipes, its reader thread, stopping a set of them.

A :class:`SupervisorLink` is one started supervisor as the launcher holds it (its transport, process, tasks and the
generation of the run it belongs to); :func:`read_supervisor` is its reader thread (the supervisor's stdout decoded
by :class:`~engine.contract.events.StreamDecoder`, a batch of events per read handed on);
:func:`stop_supervisors` asks a set of them to stop their tasks and kills what is left. No policy here: the run
driver (:mod:`engine.control.run_driver`) decides what to start and stop.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from engine.contract import events
from engine.control import transports
from engine.control.supervisor import TASK_STOP_GRACE

#: How long the launcher waits for supervisors to stop their tasks (they give each task
#: :data:`~engine.control.supervisor.TASK_STOP_GRACE` after SIGTERM) before killing what is left.
STOP_TIMEOUT = TASK_STOP_GRACE + 1.5
READ_CHUNK = 1 << 16  # bytes a reader takes from a supervisor's stream at once


@dataclass
class SupervisorLink:
    """One started supervisor: what the launcher writes to (commands) and reads from (events)."""

    launch: transports.SupervisorLaunch
    transport: transports.Transport
    proc: subprocess.Popen[bytes]
    tasks: list[str]
    reader: threading.Thread | None = None
    generation: int = 0
    stdin_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def group(self) -> str:
        return self.launch.group

    def send(self, line: str) -> bool:
        with self.stdin_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode("utf-8") if line.endswith("\n") else line.encode("utf-8") + b"\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def close_stdin(self) -> None:
        with self.stdin_lock:
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass


@dataclass(frozen=True)
class SupervisorGone:
    """Queued by a reader once its supervisor's stream ended and the process exited."""

    sup: SupervisorLink
    exit_code: int


@dataclass(frozen=True)
class HostAnswer:
    """Queued by a probe of a silent host: why it does not answer, or "" (it does)."""

    host: str
    problem: str


def read_supervisor(sup: SupervisorLink, stream: IO[bytes], put: Callable[[Any], None],
                    stats: events.ReadStats) -> None:
    """A supervisor's stream: what each read brings (up to :data:`READ_CHUNK` bytes) is decoded
    (:class:`~engine.contract.events.StreamDecoder`, bad lines counted in ``stats``), and its events are ``put``
    as one list of ``(event, line to write)``; at the end, :class:`SupervisorGone`."""
    read = getattr(stream, "read1", None) or stream.read
    decoder = events.StreamDecoder(stats)
    suffix = b',"generation":%d}\n' % sup.generation if sup.generation else b""
    try:
        while True:
            chunk = read(READ_CHUNK)
            pairs = decoder.feed(chunk) if chunk else decoder.finish()
            # a chunk without JSON's non-numbers has none in a line it holds whole: every line but its first (which
            # may have begun in the chunk before) needs only line_to_write's cheap checks
            clean = bool(chunk) and b"NaN" not in chunk and b"Infinity" not in chunk
            batch: list[tuple[dict[str, Any], bytes | None]] = []
            for i, (event, line) in enumerate(pairs):
                if suffix:
                    event["generation"] = sup.generation  # which restart of the run it belongs to
                if clean and i and line.endswith(b"}\n") and line.startswith(b"{"):
                    batch.append((event, line[:-2] + suffix if suffix else line))
                else:
                    batch.append((event, line_to_write(line, suffix)))
            if batch:
                put(batch)
            if not chunk:
                break
    except (OSError, ValueError):
        pass  # the stream broke: the supervisor is gone
    finally:
        put(SupervisorGone(sup, sup.proc.wait()))


def line_to_write(line: bytes, suffix: bytes) -> bytes | None:
    """The line as received, for the run's file (``suffix`` adds the generation as the last field, which
    wins over any earlier one, as in the decoded event); None where it must be encoded again: a line
    with JSON's non-numbers (``NaN``, ``Infinity``: the file holds strict JSON only) or odd spacing."""
    if b"NaN" in line or b"Infinity" in line:
        return None
    if not line.endswith(b"}\n") or not line.startswith(b"{"):
        line = line.strip()
        if not line.endswith(b"}") or not line.startswith(b"{"):
            return None
        line += b"\n"
    return line[:-2] + suffix if suffix else line


def stop_supervisors(sups: list[SupervisorLink], task_state: str, reason: str,
                     grace_of: Callable[[SupervisorLink], float], cut: set[str]) -> None:
    """Ask each supervisor to stop its tasks (reported ``task_state``, ``reason``; ``grace_of(sup)`` seconds between
    SIGTERM and SIGKILL), wait :data:`STOP_TIMEOUT` at most, then kill what is left. A supervisor of a host in
    ``cut`` (it does not answer) cannot hear the stop: its connection ends at once."""
    deadline = time.monotonic() + STOP_TIMEOUT
    for sup in sups:
        sup.send(events.make_command("stop", state=task_state, reason=reason, grace_s=grace_of(sup)))
        if sup.group in cut:
            sup.transport.kill(sup.proc)
            sup.close_stdin()
    for sup in sups:
        try:
            sup.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for sup in sups:
        sup.transport.kill(sup.proc)
        sup.close_stdin()
    for sup in sups:
        try:
            sup.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
