"""TensorBoard summaries of the same per-replica scalars the task streams as events.

Each task writes its own event files under ``<run>/tensorboard/<role>-<index>``,
so ``tensorboard --logdir RUN_FOLDER`` shows the curves ClusterDeck shows.

Points are written by a background thread: six eager ``tf.summary.scalar`` calls
cost ~2 ms, during which a synchronous training loop would not train at all.
:meth:`Summaries.close` writes every queued point before it closes the files.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import tensorflow as tf


def tensorboard_available() -> bool:
    """``tf.summary.scalar`` needs the tensorboard package; without it summaries are skipped."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class Summaries:
    def __init__(self, logdir: str | Path) -> None:
        self.enabled = tensorboard_available()
        self._writer = tf.summary.create_file_writer(str(logdir), flush_millis=2000) if self.enabled else None
        self._queue: queue.Queue[tuple[int, int, dict[str, float | None]]] = queue.Queue()
        if self._writer is not None:
            threading.Thread(target=self._write, name="summaries", daemon=True).start()

    def replica(self, replica: int, step: int, **scalars: float | None) -> None:
        """Queue one replica's scalars at ``step``; returns at once."""
        if self._writer is not None:
            self._queue.put((replica, step, scalars))

    def _write(self) -> None:
        assert self._writer is not None
        while True:
            replica, step, scalars = self._queue.get()
            try:
                with self._writer.as_default(step=step):
                    for name, value in scalars.items():
                        if value is not None:
                            tf.summary.scalar(f"replica_{replica}/{name}", value)
            except Exception:  # noqa: BLE001 - a failed summary must not stop training; events carry the data
                pass
            finally:
                self._queue.task_done()

    def close(self) -> None:
        if self._writer is not None:
            self._queue.join()
            self._writer.flush()
            self._writer.close()
