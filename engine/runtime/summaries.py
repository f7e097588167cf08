"""TensorBoard summaries of the same per-replica scalars the task streams as events.

Each task writes its own event files under ``<run>/tensorboard/<role>-<index>``,
so ``tensorboard --logdir RUN_FOLDER`` shows the curves ClusterDeck shows.
"""

from __future__ import annotations

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

    def replica(self, replica: int, step: int, **scalars: float | None) -> None:
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in scalars.items():
                if value is not None:
                    tf.summary.scalar(f"replica_{replica}/{name}", value)

    def task(self, step: int, **scalars: float | None) -> None:
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in scalars.items():
                if value is not None:
                    tf.summary.scalar(f"task/{name}", value)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
