"""The evaluator side-car: evaluates each new checkpoint on held-out data while training goes on.

It never joins the TF cluster (as in TF's own evaluator pattern): it watches
the run's checkpoint folder, restores the newest checkpoint into its own copy
of the model, and emits an ``eval`` event (step, loss, the model's compiled
metrics or, for an uncompiled classifier, accuracy). It reads the run's held-out
examples (``validation``) where the config names them, else the source's test
split. It finishes once it has evaluated the final step's checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf

from engine.runtime import compiled, diagnostics
from engine.runtime import data as data_mod
from engine.runtime.context import TaskContext
from engine.runtime.stop import Stopped
from engine.runtime.validation import Validator

POLL_S = 0.5


def main(ctx: TaskContext) -> dict[str, Any]:
    config = ctx.config
    keras.utils.set_random_seed(config.training.seed)
    batch = config.training.global_batch_size
    recipe = compiled.build(config, data_mod.sample_batch(config, batch))
    model, optimizer = recipe.model, recipe.optimizer
    # async checkpoints also hold the chief's step count (the optimizer counts every update it applied)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    v = config.validation
    held_out = v.split > 0 or bool(v.path.strip())
    dataset = None if held_out else tf.data.Dataset.from_tensor_slices(data_mod.arrays(config, split="eval")).batch(512)
    validator = Validator(config, recipe, dataset)
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
            diagnostics.look()  # waiting, it writes no event that would bring a profile request
            continue
        last_seen = latest
        try:
            ckpt.restore(latest).expect_partial()
        except (tf.errors.OpError, ValueError, AssertionError):
            time.sleep(POLL_S)  # caught mid-write: the next poll sees it whole
            last_seen = ""
            continue
        step = int(step_var.numpy()) or int(optimizer.iterations.numpy())
        figures = validator.evaluate()
        metrics = figures["metrics"]
        legacy = {"accuracy": metrics["accuracy"]} if "accuracy" in metrics else {}
        ctx.emitter.emit("eval", step=step, loss=figures["loss"], metrics=metrics, examples=figures["examples"],
                         **legacy)
        evaluated += 1
    return {"steps": step, "evaluations": evaluated}
