"""TensorBoard summaries of the same per-replica scalars the task streams as events.

TensorBoard's convention: a *run* is one line in every chart, a *tag* one chart. So each replica
writes its own event files under ``<run>/tensorboard/replica_<id>`` with plain tags (``loss``,
``examples_per_sec``, ``step_time``, each training metric), and validation writes
``<run>/tensorboard/validation`` with the same tags: ``tensorboard --logdir RUN_FOLDER`` overlays
every replica and the validation curve in one chart per figure. Each writer also records the run's
hyperparameters (the HParams dashboard).

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
from typing import Any

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


#: The writer of held-out figures (``replica`` -1 in the queue).
VALIDATION = -1


def hparams_of(config: Any) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters as the HParams dashboard takes them (plain scalars)."""
    t, p = config.training, config.parallelism
    return {"mode": p.mode, "model": config.model.name, "data": config.data.source,
            "optimizer": t.optimizer, "learning_rate": float(t.learning_rate),
            "global_batch_size": int(t.global_batch_size), "steps": int(config.total_steps()),
            "replicas": int(config.num_replicas()), "seed": int(t.seed)}


class Summaries:
    """Queued, thinned TensorBoard scalars: one writer per replica (and one for validation) under ``root``."""

    def __init__(self, root: str | Path, interval_s: float = INTERVAL_S,
                 hparams: dict[str, bool | int | float | str] | None = None, trial: str = "") -> None:
        self.enabled = tensorboard_available()
        self.interval_s = interval_s
        self.root = Path(root)
        self.hparams = hparams
        self.trial = trial
        self._last: dict[int, float] = {}  # replica -> when its last point was queued
        self._held: dict[int, tuple[int, int, dict[str, float | None]]] = {}  # a replica's newest point not queued
        self._writers: dict[int, Any] = {}  # made by the writing thread, as points for them come
        self._queue: queue.Queue[tuple[int, int, dict[str, float | None]]] = queue.Queue()
        self._writer = self.enabled or None  # truthy while summaries are written
        if self.enabled:
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
            self._queue.put((VALIDATION, step, scalars))

    def _writer_of(self, replica: int) -> Any:
        writer = self._writers.get(replica)
        if writer is None:
            name = "validation" if replica == VALIDATION else f"replica_{replica}"
            writer = self._writers[replica] = tf.summary.create_file_writer(str(self.root / name), flush_millis=2000)
            if self.hparams:
                try:
                    from tensorboard.plugins.hparams import api as hp

                    with writer.as_default():
                        hp.hparams(self.hparams, trial_id=f"{self.trial}/{name}" if self.trial else name)
                except Exception:  # noqa: BLE001 - the scalars matter more than the dashboard
                    pass
        return writer

    def _write(self) -> None:
        while True:
            replica, step, scalars = self._queue.get()
            try:
                with self._writer_of(replica).as_default(step=step):
                    for name, value in scalars.items():
                        if value is not None:
                            tf.summary.scalar(name, value)
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
            for writer in self._writers.values():
                writer.flush()
                writer.close()
