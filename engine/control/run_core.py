"""What one run's launcher shares with its dispatcher and its host watch.

:class:`RunCore` is the state a :class:`~engine.control.launcher.Run` holds and hands, at construction, to its
:class:`~engine.control.run_driver.RunDriver` and :class:`~engine.control.host_watch.HostWatch`: the locks, the queue
its readers fill, the lifecycle, the supervisors, the record, the stop and restart flags. They read and change it
there, under its locks, never through the run's private attributes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue
from typing import Any

from engine.contract import events
from engine.contract.config import RunConfig
from engine.control import lifecycle as lc
from engine.control.run_record import RunRecord
from engine.control.supervisor_links import HostAnswer, SupervisorGone, SupervisorLink
from engine.control.transports import Transport

#: What the dispatcher's queue holds: a reader's batch of ``(event, line to write)``, one event (the
#: launcher's own), a supervisor's end, a host's answer, or None (every stream ended).
Item = list[tuple[dict[str, Any], bytes | None]] | dict[str, Any] | SupervisorGone | HostAnswer | None
Listener = Callable[[dict[str, Any]], None]


@dataclass(eq=False)
class RunCore:
    """One run's shared state (see the module docstring)."""

    base_config: RunConfig  # ports still 'auto': re-resolved on a whole-run restart
    lifecycle: lc.Lifecycle
    launcher: dict[str, Any]  # the launcher's identity (run.json)
    run_dir: Path | None = None
    drawn_config: RunConfig | None = None  # the config the transports prepared (drawn ports), once launched
    lock: threading.RLock = field(default_factory=threading.RLock)  # the lifecycle, the state fold, listeners
    restart_lock: threading.Lock = field(default_factory=threading.Lock)  # the set of supervisors while replaced
    queue: Queue[Item] = field(default_factory=Queue)
    done: threading.Event = field(default_factory=threading.Event)
    stop_asked: threading.Event = field(default_factory=threading.Event)  # a stop was asked: prepare() gives up
    stop_done: threading.Event = field(default_factory=threading.Event)
    restarting: threading.Event = field(default_factory=threading.Event)
    stopping: bool = False
    record: RunRecord | None = None  # events.jsonl and run.json, once started
    bad: events.ReadStats = field(default_factory=events.ReadStats)  # bad lines of the supervisors' streams
    listeners: list[Listener] = field(default_factory=list)
    supervisors: list[SupervisorLink] = field(default_factory=list)
    transports: dict[str, Transport] = field(default_factory=dict)
    prepared: list[Transport] = field(default_factory=list)
    relaunching: set[str] = field(default_factory=set)  # hosts waiting to be started again (workers lost)
    cut: set[str] = field(default_factory=set)  # hosts a probe found not answering (a stop does not wait for them)
