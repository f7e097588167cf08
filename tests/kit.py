"""The shared test kit: events built from the contract's records, so that no test feeds a view an event the
real decoder would reject.

Every builder makes the event with :func:`engine.contract.events.make` and checks it against the records
(:mod:`engine.contract.records`) by a round trip through the real encoder and decoder; a builder given a
field of the wrong type fails the test at once instead of testing a view with an impossible event.
"""

from __future__ import annotations

from typing import Any

from engine.contract import events


class Clock:
    """A monotonic clock a test moves by hand (``clock.advance(0.1)``), for code that takes ``clock=``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds


def checked(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as the real decoder reads it back (it must read it back)."""
    decoded = events.decode(events.encode(event))
    assert decoded is not None, f"the contract refuses this event: {event}"
    return decoded


def event(kind: str, task: str = "worker:0", *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    """Any event kind, checked; ``t`` replaces the wall time where a test needs its own clock."""
    made = events.make(kind, task, **fields)
    if t is not None:
        made["t"] = t
    return checked(made)


def step(replica: int = 0, n: int = 1, *, task: str | None = None, t: float | None = None, loss: float | None = 0.5,
         examples_per_sec: float | None = 100.0, step_time: float | None = 0.01, **fields: Any) -> dict[str, Any]:
    """A step event of replica ``replica`` at step ``n`` (task ``worker:<replica>`` unless given)."""
    return event("step", task or f"worker:{replica}", t=t, replica=replica, step=n, loss=loss,
                 examples_per_sec=examples_per_sec, step_time=step_time, **fields)


def evaluation(n: int, loss: float | None, *, task: str = "worker:0", t: float | None = None,
               **metrics: float | None) -> dict[str, Any]:
    """A held-out evaluation at step ``n`` with its metrics."""
    return event("eval", task, t=t, step=n, loss=loss, metrics=metrics)


def status(task: str, state: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    return event("status", task, t=t, state=state, **fields)


def run_state(state: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    return event("run", "launcher", t=t, state=state, **fields)


def run_to_end(config: Any, runs_root: Any, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Launch ``config`` for real (a valid config), wait for it to finish; every event the run delivered."""
    from engine.contract.config import validate
    from engine.control.launcher import Run

    problems = validate(config)
    assert problems == [], [str(p) for p in problems]
    seen: list[dict[str, Any]] = []
    run = Run(config, runs_root=runs_root)
    run.add_listener(seen.append)
    run.start()
    assert run.wait(timeout) == "finished", run.state.summary()
    return seen


def start_stepping(config: Any, runs_root: Any, timeout: float = 120.0) -> Any:
    """Launch ``config`` for real and return its ``Run`` once a first step event came (the caller stops it)."""
    import threading

    from engine.control.launcher import Run

    run = Run(config, runs_root=runs_root)
    stepping = threading.Event()
    run.add_listener(lambda e: stepping.set() if e["kind"] == "step" else None)
    run.start()
    if not stepping.wait(timeout):
        run.stop()
        raise AssertionError(f"no step within {timeout:.0f} s: {run.state.summary()}")
    return run


class ScriptedRun:
    """A started run whose events the test gives, as the app's session watches a real one
    (``gui.run_session.WatchedRun``: ``done``, ``add_listener``, ``stop``, ``pids``).

    Every event fed goes through the real encoder and decoder first (:func:`checked`), so a view is
    never shown an event a real run could not deliver; :meth:`end` delivers the launcher's last word.
    """

    def __init__(self, *, ends_on_stop: bool = True) -> None:
        self.listeners: list[Any] = []
        self.done = False
        self.stops: list[str] = []  # the reasons of every stop asked for
        #: a stop ends the run at once, as the real one's does once its tasks are gone (False: the test ends it)
        self.ends_on_stop = ends_on_stop

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def stop(self, reason: str = "", wait: bool = True) -> None:
        self.stops.append(reason)
        if self.ends_on_stop and not self.done:
            self.end("stopped", reason=reason or "stopped by the user")

    def pids(self) -> list[int]:
        return []

    def feed(self, *events_: dict[str, Any]) -> None:
        for made in events_:
            delivered = checked(made)
            for listener in self.listeners:
                listener(delivered)

    def end(self, state: str, **fields: Any) -> None:
        """The run ends as ``state`` (the launcher's ``run`` event), and reads as done."""
        self.feed(run_state(state, **fields))
        self.done = True
