"""The Keras ``model.fit`` side of the telemetry benchmark, as its own process.

Trains the config's model on the config's data with the config's batch and
devices (``MirroredStrategy`` over the same logical CPU devices the engine
uses), optionally with ``keras.callbacks.TensorBoard(update_freq=1)``, and
writes the steady-state examples/s measured exactly as the engine's loop
measures it (after the same warm-up, to the end of the last step).

    python bench/keras_fit.py --run-dir DIR --summary-out OUT.json [--tensorboard LOGDIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.contract import config as config_mod  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path, help="a folder holding config.yaml")
    parser.add_argument("--summary-out", required=True, type=Path)
    parser.add_argument("--tensorboard", default=None, help="log with keras.callbacks.TensorBoard(update_freq=1) here")
    args = parser.parse_args(argv)
    config = config_mod.load(args.run_dir / "config.yaml")

    import keras
    import tensorflow as tf

    from engine.runtime import data as data_mod
    from engine.runtime import models
    from engine.runtime.devices import setup_devices

    devices = sum(h.gpus for h in config.cluster.hosts) or 1
    setup = setup_devices(devices, gpus_assigned=False)
    strategy = tf.distribute.MirroredStrategy(devices=list(setup.names))
    keras.utils.set_random_seed(config.training.seed)
    with strategy.scope():
        model = models.build_model(config)
        model.compile(optimizer=models.build_optimizer(config),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = data_mod.make_dataset(config, None)  # global batches: fit splits them over the replicas
    total = config.total_steps()
    warm_until = max(1, min(50, total // 5))  # as engine.runtime.data_parallel
    marks: dict[str, float] = {}

    class Window(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if batch + 1 == warm_until:
                marks["start"] = time.perf_counter()

        def on_train_end(self, logs: dict | None = None) -> None:
            marks["end"] = time.perf_counter()

    callbacks: list[keras.callbacks.Callback] = [Window()]
    if args.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=args.tensorboard, update_freq=1))
    model.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0, callbacks=callbacks)
    eps = (total - warm_until) * config.training.global_batch_size / (marks["end"] - marks["start"])
    args.summary_out.write_text(json.dumps({"window_examples_per_sec": eps, "steps": total,
                                            "replicas": strategy.num_replicas_in_sync}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
