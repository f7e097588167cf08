"""The evaluator side-car: evaluates each new checkpoint on held-out data while training goes on.

It never joins the TF cluster (as in TF's own evaluator pattern): it watches
the run's checkpoint folder, restores the newest checkpoint into its own copy
of the model, and emits an ``eval`` event (step, loss, accuracy). It finishes
once it has evaluated the final step's checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from engine.runtime import data as data_mod
from engine.runtime import models
from engine.runtime.context import TaskContext
from engine.runtime.stop import Stopped

POLL_S = 0.5


def main(ctx: TaskContext) -> dict[str, Any]:
    config = ctx.config
    keras.utils.set_random_seed(config.training.seed)
    model = models.build_model(config)
    optimizer = models.build_optimizer(config)
    optimizer.build(model.trainable_variables)
    # async checkpoints also hold the chief's step count (the optimizer counts every update it applied)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    x, y = data_mod.arrays(config, split="eval")
    loss_obj = models.loss_fn(config)
    total = config.total_steps()
    ctx.emitter.status("running", total=total)
    last_seen = ""
    evaluated = 0
    step = -1
    while step < total:
        if ctx.stop.requested:
            raise Stopped(max(step, 0), None)
        latest = tf.train.latest_checkpoint(str(ctx.checkpoint_dir))
        if not latest or latest == last_seen:
            time.sleep(POLL_S)
            continue
        last_seen = latest
        try:
            ckpt.restore(latest).expect_partial()
        except (tf.errors.OpError, ValueError, AssertionError):
            time.sleep(POLL_S)  # caught mid-write: the next poll sees it whole
            last_seen = ""
            continue
        step = int(step_var.numpy()) or int(optimizer.iterations.numpy())
        logits = model.predict(x, batch_size=512, verbose=0)
        loss = float(np.mean(loss_obj(y, logits)))
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y))
        ctx.emitter.emit("eval", step=step, loss=loss, accuracy=accuracy, examples=len(x))
        evaluated += 1
    return {"steps": step, "evaluations": evaluated}
