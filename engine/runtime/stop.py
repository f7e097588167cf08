"""A polite stop: ``SIGTERM`` asks a task to write a final checkpoint and its last step events, then exit.

TensorFlow's coordination service installs a C++ ``SIGTERM`` handler of its own (its preemption
notifier), which swallows the signal: a Python handler installed before it never runs. So the task
blocks ``SIGTERM`` in its main thread before TensorFlow starts any thread (every thread inherits
the mask, so no handler of TF's ever sees it) and one thread of ours takes it with ``sigwait``.

The training loop checks :attr:`StopSignal.requested` between steps. The stop is bounded: if the
process has not exited ``budget_s`` seconds after the signal (a step that never returns, a peer
gone), the watcher ends it (exit code 143, as a ``SIGTERM`` would).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

#: Seconds a task may spend on its final checkpoint and events after SIGTERM.
STOP_BUDGET_S = 2.5
EXIT_CODE = 128 + signal.SIGTERM


class StopSignal:
    """Set when the task was asked to stop (``SIGTERM``); see the module docstring."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.received_at: float | None = None
        #: seconds from the signal to the forced exit (a task may shorten it, e.g. a server)
        self.budget_s = STOP_BUDGET_S
        #: what the task says when the budget ends it (None: nothing; its supervisor reports the end)
        self.late_reason: str | None = "SIGTERM: stopped before its final checkpoint was written"

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def watch(self, on_timeout: Callable[[], None] | None = None) -> bool:
        """Block ``SIGTERM`` in this (the main) thread and take it on a watcher thread instead.

        Call first thing in the task, before TensorFlow is imported. ``on_timeout`` runs when the
        budget (:attr:`budget_s`, read when the signal comes) is spent, just before the process
        exits. Returns False where signals cannot be blocked (not the main thread, or no ``pthread_sigmask``): then nothing changes.
        """
        if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
            return False
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def watcher() -> None:
            signal.sigwait({signal.SIGTERM})
            self.request()
            time.sleep(self.budget_s)
            if on_timeout is not None:
                try:
                    on_timeout()
                except Exception:  # noqa: BLE001 - exiting matters more than a last note
                    pass
            os._exit(EXIT_CODE)

        threading.Thread(target=watcher, name="sigterm", daemon=True).start()
        return True


class Stopped(Exception):  # noqa: N818 - a request, not an error
    """Raised by the training loop once it has stopped on request (checkpoint written where it checkpoints)."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        self.step = step
        self.checkpoint = checkpoint
        where = f", checkpoint {os.path.basename(checkpoint)}" if checkpoint else ""
        super().__init__(f"stopped at step {step}{where}")
