"""A launcher that front ends can find: ``launcher.json`` and the control socket of a running run.

:class:`RunHost` serves a started :class:`~engine.control.launcher.Run` on the run folder's control
socket (``status``, ``stop``) and records in ``launcher.json`` who serves it (pid, start token, socket,
detached or not). A ``clusterdeck run --detach`` launcher and a foreground ``clusterdeck run`` both host
their run this way; ``clusterdeck ls``, ``attach`` and ``stop`` find it from the folder alone.

The no-orphan rule stays the launcher's: its supervisors read their commands from its pipes, and when
the launcher dies, however it dies, each supervisor sees its stdin close and ends every task it started.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import asdict
from typing import Any, Protocol

from engine.contract.run_folder import LIVE_STATES, RunFolder, write_atomic
from engine.control.control_socket import ControlServer
from engine.control.launcher_info import LauncherInfo, folder_state, read_launcher

__all__ = ["LauncherInfo", "RunHost", "launcher_alive", "read_launcher", "run_state"]

#: Seconds a ``stop`` request waits for the run to end before it answers (the launcher's own stop takes
#: at most its stop timeout plus the record's wait).
STOP_ANSWER_S = 20.0


class HostedRun(Protocol):
    """What :class:`RunHost` needs of a run (``engine.control.launcher.Run`` has it)."""

    @property
    def folder(self) -> RunFolder: ...

    @property
    def done(self) -> bool: ...

    state: Any
    config: Any

    def stop(self, reason: str = ..., wait: bool = ...) -> None: ...

    def wait(self, timeout: float | None = None) -> str: ...


def launcher_alive(folder: RunFolder) -> bool:
    """Whether the run's launcher is still there: ``launcher.json`` where there is one, else ``run.json``; a Slurm
    batch run whose launcher is on another node (or not started yet) is asked of Slurm."""
    from engine.control import slurm_batch

    info = read_launcher(folder)
    batch = slurm_batch.is_batch_run(folder)
    if info is not None and not (batch and info.host != socket.gethostname()):
        return info.alive()
    if batch:
        return run_state(folder) in LIVE_STATES
    return folder.effective_state() in LIVE_STATES


def run_state(folder: RunFolder, meta: dict[str, Any] | None = None) -> str:
    """The run's state as its folder tells it (:meth:`RunFolder.effective_state`), ``interrupted`` also where
    ``launcher.json`` names a launcher that is gone; ``""`` when the folder says nothing yet."""
    from engine.control import slurm_batch

    state = folder_state(folder, meta)
    batch = slurm_batch.batch_state(folder, state)  # None (one stat) for any run that is no Slurm batch job
    return batch.state if batch is not None else state


class RunHost:
    """Serves a started run's control socket and records its launcher, until :meth:`close`."""

    def __init__(self, run: HostedRun, *, detached: bool) -> None:
        self.run = run
        self.folder = run.folder
        self.info = LauncherInfo.of_this_process(self.folder, detached=detached)
        self._server = ControlServer(self.folder.control_socket, self.handle)
        self._stop_lock = threading.Lock()

    def start(self) -> RunHost:
        self._server.start()
        write_atomic(self.folder.launcher_json, json.dumps(asdict(self.info), indent=2))
        return self

    def close(self) -> None:
        """The run has ended: refuse new connections, answer the open ones, remove the socket."""
        self._server.close()

    def __enter__(self) -> RunHost:
        """``with RunHost(run, detached=...).start():`` closes it when the block ends."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        if message["command"] == "stop":
            return self._stop(message)
        if message["command"] == "restart":
            return self._restart(message)
        return self.status()

    def _restart(self, message: dict[str, Any]) -> dict[str, Any]:
        """Restart every task from the last checkpoint (not counted against ``training.restarts``); answers at once
        with whether the restart began (a run starting, restarting or ending does not restart)."""
        by = message.get("by")
        reason = f"restart requested by {by}" if isinstance(by, str) and by else "restart requested from its channel"
        restart = getattr(self.run, "restart", None)
        began = bool(restart(reason)) if restart is not None and not self.run.done else False
        return {**self.status(), "restarted": began}

    def status(self) -> dict[str, Any]:
        state = self.run.state
        return {"ok": True, "name": self.run.config.name, "mode": self.run.config.parallelism.mode,
                "state": state.state, "step": state.step, "total_steps": state.total_steps,
                "done": self.run.done, "pid": self.info.pid, "detached": self.info.detached,
                "run_dir": str(self.folder.path)}

    def _stop(self, message: dict[str, Any]) -> dict[str, Any]:
        """Stop as Ctrl+C does; answers once the run has ended (several ``stop`` at once all get the end)."""
        was_done = self.run.done
        if not was_done:
            by = message.get("by")
            reason = f"stopped by {by}" if isinstance(by, str) and by else "stopped from its control channel"
            with self._stop_lock:
                if not self.run.done:
                    self.run.stop(reason=reason, wait=False)
            self.run.wait(STOP_ANSWER_S)
        return {**self.status(), "already_ended": was_done}
