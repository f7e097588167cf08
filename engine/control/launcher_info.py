"""``launcher.json``: which process serves a run (pid, start token, host, control socket), read without the
launcher's code, and the run's state as its folder alone tells it. The detach, the batch launcher and every
reader of run folders share it."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from engine.contract.run_folder import INTERRUPTED, LIVE_STATES, RunFolder, process_alive, process_token


@dataclass(frozen=True)
class LauncherInfo:
    """``launcher.json``: the process serving a run, and how to reach it."""

    pid: int
    token: str
    host: str
    socket: str
    detached: bool
    started: str

    @classmethod
    def of_this_process(cls, folder: RunFolder, *, detached: bool) -> LauncherInfo:
        return cls(pid=os.getpid(), token=process_token(os.getpid()), host=socket.gethostname(),
                   socket=str(folder.control_socket), detached=detached,
                   started=time.strftime("%Y-%m-%dT%H:%M:%S"))

    def alive(self) -> bool:
        """Whether this launcher still runs (on this machine; one on another host reads as alive). A killed
        launcher not yet reaped by its new parent (a zombie) has ended."""
        if self.host != socket.gethostname():
            return True
        return process_alive(self.pid, self.token) and not _zombie(self.pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
        return text[text.rindex(")") + 2:].split()[0] in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return False


def read_launcher(folder: RunFolder) -> LauncherInfo | None:
    """The folder's ``launcher.json``, or None (a run hosted by the app, or from before detaching)."""
    try:
        data = json.loads(folder.launcher_json.read_text(encoding="utf-8"))
        return LauncherInfo(pid=int(data["pid"]), token=str(data.get("token", "")), host=str(data["host"]),
                            socket=str(data["socket"]), detached=bool(data.get("detached", False)),
                            started=str(data.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class RunRow:
    """What a run folder says of its run: one line of ``clusterdeck ls`` (and of the app's Runs panel)."""

    run: str
    path: str
    name: str
    mode: str
    state: str
    step: int
    total_steps: int | None
    started: str
    duration_s: float | None
    detached: bool
    hosts: str = ""  # where it runs: the kinds of its hosts (local, ssh, slurm), joined with " + "


def folder_state(folder: RunFolder, meta: dict[str, Any] | None = None) -> str:
    """The run's state as its folder tells it (:meth:`RunFolder.effective_state`), ``interrupted`` also where
    ``launcher.json`` names a launcher that is gone; ``""`` when the folder says nothing yet."""
    state = folder.effective_state(meta)
    info = read_launcher(folder)
    if info is not None:
        state = INTERRUPTED if not info.alive() and state in (*LIVE_STATES, "") else (state or "starting")
    return state
