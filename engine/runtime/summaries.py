"""TensorBoard summaries of the same per-replica scalars the task streams as events.

Each task writes its own event files under ``<run>/tensorboard/<role>-<index>``,
so ``tensorboard --logdir RUN_FOLDER`` shows the curves ClusterDeck shows.

Points are written by a background thread: six eager ``tf.summary.scalar`` calls
cost ~2 ms, during which a synchronous training loop would not train at all. And
at most one point per replica every :data:`INTERVAL_S` seconds (the live events
come up to ``training.metrics_hz`` times a second and every one is kept in the
run's ``events.jsonl``): on a machine whose cores all train, the summaries'
CPU time comes out of training. :meth:`Summaries.close` writes each replica's
last point and every queued one before it closes the files.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from pathlib import Path

import tensorflow as tf

#: Seconds between two points of one replica in TensorBoard (the last point of a run is always written).
INTERVAL_S = 0.5


def tensorboard_available() -> bool:
    """``tf.summary.scalar`` needs the tensorboard package; without it summaries are skipped."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class Summaries:
    def __init__(self, logdir: str | Path, interval_s: float = INTERVAL_S) -> None:
        self.enabled = tensorboard_available()
        self.interval_s = interval_s
        self._last: dict[int, float] = {}  # replica -> when its last point was queued
        self._held: dict[int, tuple[int, int, dict[str, float | None]]] = {}  # a replica's newest point not queued
        self._writer = tf.summary.create_file_writer(str(logdir), flush_millis=2000) if self.enabled else None
        self._queue: queue.Queue[tuple[int, int, dict[str, float | None]]] = queue.Queue()
        if self._writer is not None:
            threading.Thread(target=self._write, name="summaries", daemon=True).start()

    def replica(self, replica: int, step: int, **scalars: float | None) -> None:
        """Queue one replica's scalars at ``step`` (or hold them, when the replica's last point is younger
        than ``interval_s``: a newer point replaces them, :meth:`close` writes them); returns at once."""
        if self._writer is None:
            return
        now = time.monotonic()
        if now - self._last.get(replica, -math.inf) >= self.interval_s:
            self._last[replica] = now
            self._held.pop(replica, None)
            self._queue.put((replica, step, scalars))
        else:
            self._held[replica] = (replica, step, scalars)

    def validation(self, step: int, **scalars: float | None) -> None:
        """Queue the held-out figures of ``step`` (tags ``validation/<name>``), never held back."""
        if self._writer is not None:
            self._queue.put((-1, step, scalars))

    def _write(self) -> None:
        assert self._writer is not None
        while True:
            replica, step, scalars = self._queue.get()
            try:
                with self._writer.as_default(step=step):
                    for name, value in scalars.items():
                        if value is not None:
                            tag = f"validation/{name}" if replica < 0 else f"replica_{replica}/{name}"
                            tf.summary.scalar(tag, value)
            except Exception:  # noqa: BLE001 - a failed summary must not stop training; events carry the data
                pass
            finally:
                self._queue.task_done()

    def close(self) -> None:
        if self._writer is not None:
            for point in self._held.values():
                self._queue.put(point)
            self._held.clear()
            self._queue.join()
            self._writer.flush()
            self._writer.close()
