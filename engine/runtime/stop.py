"""A polite stop: ``SIGTERM`` asks a task to write a final checkpoint and its last step events, then exit.

TensorFlow's coordination service installs a C++ ``SIGTERM`` handler of its own (its preemption
notifier), which swallows the signal: a Python handler installed before it never runs. So the task
blocks ``SIGTERM`` in its main thread before TensorFlow starts any thread (every thread inherits
the mask, so no handler of TF's ever sees it) and one thread of ours takes it with ``sigwait``.

The training loop checks :attr:`StopSignal.requested` between steps. The stop is bounded: if the
process has not exited ``budget_s`` seconds after the signal (a step that never returns, a peer
gone), the watcher ends it (exit code 143, as a ``SIGTERM`` would).

Whose ``SIGTERM``: the supervisor creates the task's stop marker (``RunFolder.stop_marker``) before it
signals a task it stops; a ``SIGTERM`` without the marker came from someone else (a scheduler, a
user's ``kill``): :attr:`StopSignal.external` says who sent it, and the run treats it as that task's
failure (restart or fail, naming it), never as the run's stop.

The blocked ``SIGTERM`` must not reach what the task starts (a blocked signal stays blocked across
``exec``: ``timeout 1 sleep 20`` would take 20 s): :func:`unblock_in_children` unblocks it in every
child, forked (``os.fork``, ``multiprocessing``) or spawned (``subprocess``, ``os.system``,
``os.posix_spawn``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Seconds a task may spend on its final checkpoint and events after SIGTERM.
STOP_BUDGET_S = 2.5
EXIT_CODE = 128 + signal.SIGTERM


class StopSignal:
    """Set when the task was asked to stop (``SIGTERM``); see the module docstring."""

    def __init__(self, marker: Path | None = None) -> None:
        self._event = threading.Event()
        self.received_at: float | None = None
        #: the file the supervisor creates before it stops this task (None: every SIGTERM is a stop)
        self.marker = marker
        #: why the SIGTERM was not ClusterDeck's (who sent it), or None for a stop of the run
        self.external: str | None = None
        #: seconds from the signal to the forced exit (a task may shorten it, e.g. a server)
        self.budget_s = STOP_BUDGET_S
        #: what the task says when the budget ends it (None: nothing; its supervisor reports the end)
        self.late_reason: str | None = "SIGTERM: stopped before its final checkpoint was written"

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, sender: int | None = None) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            if self.marker is not None and not self.marker.exists() and sender_name(sender) not in SCHEDULERS:
                self.external = f"got a SIGTERM ClusterDeck did not send ({describe_sender(sender)})"
        self._event.set()

    def follow(self) -> None:
        """Stop without a signal of this task's own: a peer's stop was agreed (``engine.runtime.loop``)."""
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
        unblock_in_children()

        def watcher() -> None:
            sender: int | None = None
            if hasattr(signal, "sigwaitinfo"):
                sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
            else:
                signal.sigwait({signal.SIGTERM})
            self.request(sender)
            time.sleep(self.budget_s)
            remove_autograph_files()  # before the last word (on_timeout's): the run's end may kill this process
            if on_timeout is not None:
                try:
                    on_timeout()
                except Exception:  # noqa: BLE001 - exiting matters more than a last note
                    pass
            os._exit(EXIT_CODE)

        threading.Thread(target=watcher, name="sigterm", daemon=True).start()
        return True


def remove_autograph_files() -> None:
    """Remove the source files TensorFlow's autograph wrote for this process's functions (``tf.function``).

    Autograph writes each converted function to ``<tmp>/__autograph_generated_file*.py`` and removes it in an
    ``atexit`` handler; a task leaves with ``os._exit`` (TensorFlow's own teardown can hang), which runs none, so
    without this every task, check and restart of every run left its files in the temporary folder for good
    (tens of thousands on a machine that runs many). They are the modules autograph put in ``sys.modules``."""
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith("__autograph_generated_file"):
            continue
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.basename(path).startswith("__autograph_generated_file"):
            try:
                os.unlink(path)
            except OSError:  # gone already, or not this user's to remove
                pass


#: Senders that end a whole job step (its time limit, a cancel, a preemption): every process of the step gets
#: the SIGTERM, the supervisor too, and the run names the job's end (the transport asks the scheduler why).
SCHEDULERS = ("slurmstepd",)


def sender_name(pid: int | None) -> str:
    """The command name of process ``pid`` (``/proc/<pid>/comm``), or ``""``."""
    if not pid:
        return ""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def describe_sender(pid: int | None) -> str:
    """``"from pid 123 (kill)"``: who sent a signal, as far as this host can tell."""
    if not pid:
        return "sender unknown"
    name = sender_name(pid)
    return f"from pid {pid}{f' ({name})' if name else ''}"


_SIGTERM_ONLY = {signal.SIGTERM}


def _unblock_sigterm() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGTERM_ONLY)


_children_unblocked = False


def unblock_in_children() -> None:
    """Every process this one starts from now on starts with ``SIGTERM`` unblocked (idempotent)."""
    global _children_unblocked
    if _children_unblocked or not hasattr(signal, "pthread_sigmask"):
        return
    _children_unblocked = True
    import subprocess

    os.register_at_fork(after_in_child=_unblock_sigterm)  # os.fork, multiprocessing, pty.fork
    original_init = subprocess.Popen.__init__

    def popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        # a preexec_fn runs in the child before exec (and makes CPython run the after-fork hooks there)
        user_preexec = kwargs.get("preexec_fn")

        def preexec() -> None:
            _unblock_sigterm()
            if user_preexec is not None:
                user_preexec()

        if os.name == "posix" and (len(args) < 7 or args[6] is None):  # preexec_fn is the 7th positional
            kwargs["preexec_fn"] = preexec
        original_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]

    def system(command: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> int:
        # os.system forks in C (no hook runs there): run it through subprocess instead
        proc = subprocess.Popen(["/bin/sh", "-c", os.fsdecode(command)])  # what os.system runs: the user's command
        code = proc.wait()
        return (-code) & 0x7F if code < 0 else (code & 0xFF) << 8

    os.system = system
    for name in ("posix_spawn", "posix_spawnp"):
        spawn = getattr(os, name, None)
        if spawn is not None:
            setattr(os, name, _spawn_unblocked(spawn))


def _spawn_unblocked(spawn: Callable[..., int]) -> Callable[..., int]:
    def wrapped(*args: Any, **kwargs: Any) -> int:
        if "setsigmask" not in kwargs:
            current = signal.pthread_sigmask(signal.SIG_BLOCK, ())
            kwargs["setsigmask"] = current - _SIGTERM_ONLY
        return spawn(*args, **kwargs)

    return wrapped


class Stopped(Exception):  # noqa: N818 - a request, not an error
    """Raised by the training loop once it has stopped on request (checkpoint written where it checkpoints).

    ``external``: this task got a SIGTERM ClusterDeck did not send (why); ``cause_task``: the task whose
    such SIGTERM stopped this one (its peers stop with it, at an agreed step)."""

    def __init__(self, step: int, checkpoint: str | None, *, external: str | None = None,
                 cause_task: str | None = None, cause_why: str | None = None) -> None:
        self.step = step
        self.checkpoint = checkpoint
        self.external = external
        self.cause_task = cause_task
        self.cause_why = cause_why  # what the cause said of its SIGTERM ("got a SIGTERM ... (from pid 9 (kill))")
        where = f", checkpoint {os.path.basename(checkpoint)}" if checkpoint else ""
        super().__init__(f"stopped at step {step}{where}")

    def reason(self, task: str) -> str:
        """What the task says: why it stopped, for a stop that was not the run's."""
        where = f"; checkpoint {os.path.basename(self.checkpoint)} written" if self.checkpoint else ""
        if self.external:
            return f"{self.external} at step {self.step}{where}"
        if self.cause_task:
            why = self.cause_why or "got a SIGTERM ClusterDeck did not send"
            return f"stopped at step {self.step} with {self.cause_task}, which {why}{where}"
        return "SIGTERM"
