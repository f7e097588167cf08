"""An existing ``model.fit`` under MirroredStrategy, streamed into a ClusterDeck run folder.

    python examples/keras_fit_callback.py --run-dir runs/keras-fit --steps 40

Two logical CPU devices stand in for two GPUs, so it runs anywhere. The only ClusterDeck line
in the training code is the callback; reopen the folder in the app (File > Open run) or read it
with ``engine.contract.events.read_file(RUN_DIR / "events.jsonl")``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from clusterdeck import ClusterDeckCallback  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=None, help="the run folder (default: a new one under runs/)")
    parser.add_argument("--steps", type=int, default=40, help="training steps in all (two epochs)")
    parser.add_argument("--devices", type=int, default=2, help="logical CPU devices, one replica each")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    args = parser.parse_args(argv)

    # logical devices must be set before TensorFlow touches the CPU
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])

    # a learnable task: 64 features labelled by a fixed random teacher
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 64)).astype("float32")
    y = np.argmax(x @ rng.standard_normal((64, 10)).astype("float32"), axis=1).astype("int32")

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    callback = ClusterDeckCallback(run_dir=args.run_dir, task="worker:0", metrics_hz=20, name="keras-fit")
    epochs = 2
    model.fit(x, y, batch_size=args.batch, epochs=epochs, steps_per_epoch=max(1, args.steps // epochs),
              shuffle=False, callbacks=[callback], verbose=0)
    print(callback.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
