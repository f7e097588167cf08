"""Hosts of other machines while a run runs: probing one that went silent, starting its supervisor again.

:class:`HostWatch` carries out the lifecycle's host actions for a :class:`~engine.control.launcher.Run`: a host
that went silent is probed on a thread of its own (``reachability.probe_host``) when the lifecycle asks
(``ProbeHost``), the answer queued back (:class:`~engine.control.supervisor_links.HostAnswer`); an async host of
workers only whose supervisor ended is started again once it answers (``RelaunchHost``): its lost workers are
reported failed (to be restarted), the new supervisor taking over what the earlier one left there (``takeover`` in
its spec), the others training on meanwhile.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from engine.contract import events
from engine.control import lifecycle as lc
from engine.control import reachability
from engine.control.run_core import RunCore
from engine.control.run_driver import LOST_WITH_HOST, MAX_WORKER_RESTARTS, keeping
from engine.control.supervisor_links import HostAnswer


class HostWatch:
    """The launcher's side of hosts that stop answering (see the module docstring)."""

    def __init__(self, run: Any, core: RunCore) -> None:
        self._run = weakref.ref(run)  # the engine.control.launcher.Run it serves (held weakly: no cycle)
        self.core = core  # what it shares with the run (its locks, queue, supervisors, hosts cut or relaunching)

    @property
    def run(self) -> Any:
        return self._run()

    def problem(self, host: str) -> str:
        """Why ``host`` does not answer on its tasks' ports (its address named), or "" (it answers)."""
        remote = self.run.remote(host)
        if remote is None:
            return ""
        return reachability.probe_host(remote.address.strip(), [t.port for t in remote.tasks if t.port])

    def probe(self, host: str) -> None:
        try:
            problem = self.problem(host)
        except Exception as exc:  # noqa: BLE001 - a probe that breaks says nothing, it never ends the run
            problem = ""
            print(f"clusterdeck: probing host {host} failed: {exc!r}", file=sys.stderr)
        (self.core.cut.add if problem else self.core.cut.discard)(host)
        self.core.queue.put(HostAnswer(host, problem))

    def relaunch_host(self, action: lc.RelaunchHost) -> None:
        """Report ``action.host``'s tasks lost, then start its supervisor again on a thread once it answers."""
        with self.core.lock:
            restarts = {name: (t.restarts or 0) + 1 for name in action.tasks
                        if (t := self.run.state.tasks.get(name)) is not None}
        for name in action.tasks:
            why = f"lost with host {action.host}: {action.reason}"
            self.core.queue.put(events.make("status", name, state="failed", reason=why, will_restart=True,
                                        **{LOST_WITH_HOST: action.host}))
            self.core.queue.put(events.make("status", name, state="restarting", restarts=restarts.get(name, 1),
                                        reason=f"{why}; its host's supervisor is started again once it answers",
                                        **{LOST_WITH_HOST: action.host}))
        with self.core.restart_lock:
            self.core.relaunching.add(action.host)
        threading.Thread(target=keeping, args=(self.run, self._relaunch, action, restarts), name=f"relaunch-{action.host}",
                         daemon=True).start()

    def _relaunch(self, action: lc.RelaunchHost, restarts: dict[str, int]) -> None:
        host = action.host
        try:
            waited = 0
            while not self.core.stop_asked.is_set():
                problem = self.problem(host)
                if not problem:
                    break
                waited += 1
                if waited == 1:
                    self.run.emit_info(f"host {host} does not answer ({problem}): its supervisor is started again once "
                                    "it does", host=host)
                self.core.stop_asked.wait(1.0)
            with self.core.restart_lock:
                if self.core.stopping or self.core.stop_asked.is_set():
                    return
                plans = self.run.groups(self.run.config).get(host, [])
                self.core.supervisors = [s for s in self.core.supervisors if s.group != host]
                self.run.start_supervisor(host, plans, takeover=True, restarts=restarts)
            self.run.emit_info(f"host {host}: its supervisor started again for {', '.join(action.tasks)} (relaunch "
                            f"{action.relaunch} of at most {MAX_WORKER_RESTARTS})", host=host, relaunch=action.relaunch)
        except Exception as exc:  # noqa: BLE001 - a relaunch that breaks fails the run, visibly
            self.run.driver.decide(lc.LauncherFailed(f"host {host} could not be started again: {exc}"))
        finally:
            with self.core.restart_lock:
                self.core.relaunching.discard(host)
