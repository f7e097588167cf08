"""Validation on held-out examples while training: the loss and metrics of the model as it trains.

:class:`Validator` evaluates a :class:`engine.runtime.compiled.Recipe`'s model on
:func:`engine.runtime.data.validation_dataset` (a split kept out of training, a file, or a script's
``make_validation_dataset``) and emits an ``eval`` event: ``step``, ``loss`` (regularization included,
as Keras' ``evaluate`` reports it) and every compiled metric over all the held-out examples. The
training loop calls it every ``validation.every`` steps and at the end, on one task (the chief or the
first worker), after every step so far has finished; the evaluator task uses it on each checkpoint.
The metrics' state is kept apart from training's (``stateless_update_state``), so validation never
disturbs the training figures.
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from engine.contract.config import RunConfig
from engine.runtime import data as data_mod
from engine.runtime import models, tf_compat
from engine.runtime.compiled import Recipe


class Validator:
    """The held-out evaluation of one run."""

    def __init__(self, config: RunConfig, recipe: Recipe, dataset: tf.data.Dataset | None = None) -> None:
        self.config = config
        self.recipe = recipe
        self.dataset = dataset if dataset is not None else data_mod.validation_dataset(config)
        model = recipe.model
        container = tf_compat.compiled_metrics(model) if recipe.source == "compile" else None
        self.names: list[str] = []
        init: list[Any] = []
        if container is not None and recipe.step_kind == "keras" and recipe._metric_init:
            init = list(recipe._metric_init)
            self.names = tf_compat.metric_names(container)
        compiled = recipe.source == "compile" and getattr(model, "_compile_loss", None) is not None
        loss_fn = None if compiled else models.loss_fn(config)
        # an uncompiled classifier on the default loss reports its accuracy too, as its logits allow
        accuracy = not compiled and models.loss_name(config) == models.DEFAULT_LOSS
        if accuracy:
            self.names = ["accuracy"]

        @tf.function
        def batch_figures(x: Any, y: Any, state: list[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, Any]:
            y_pred = model(x, training=False)
            rows = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float64)
            if compiled:
                loss = tf_compat.unscale_loss(tf_compat.compiled_loss(model, x, y, y_pred, None))
            else:
                assert loss_fn is not None
                loss = tf.reduce_mean(loss_fn(y, y_pred))
                if model.losses:
                    loss += tf.add_n([tf.cast(r, loss.dtype) for r in model.losses])
            if container is not None and state:
                state = container.stateless_update_state(state, y, y_pred)
            elif accuracy:
                hits = tf.equal(tf.argmax(y_pred, axis=-1, output_type=tf.int64), tf.cast(tf.reshape(y, [-1]), tf.int64))
                state = [state[0] + tf.reduce_sum(tf.cast(hits, tf.float64))]
            return tf.cast(loss, tf.float64) * rows, rows, state

        self._batch = batch_figures
        self._init: list[Any] = [0.0] if accuracy else init
        self._container = container
        self._accuracy = accuracy

    def evaluate(self) -> dict[str, Any]:
        """Loss and metrics over every held-out example: ``{"loss", "metrics", "examples", "seconds"}``."""
        t0 = time.perf_counter()
        total = tf.constant(0.0, tf.float64)
        rows = tf.constant(0.0, tf.float64)
        state = [tf.constant(v, tf.float64) if self._accuracy else tf.constant(v) for v in self._init]
        for batch in self.dataset:
            x, y = batch[0], batch[1]
            loss, n, state = self._batch(x, y, state)
            total += loss
            rows += n
        examples = int(rows.numpy())
        metrics: dict[str, float] = {}
        if self._container is not None and state:
            results = self._container.stateless_result(state)
            metrics = {name: float(tf.reduce_mean(value).numpy()) for name, value in dict(results).items()}
        elif self._accuracy and examples:
            metrics = {"accuracy": float((state[0] / rows).numpy())}
        loss_value = float((total / rows).numpy()) if examples else None
        return {"loss": loss_value, "metrics": metrics, "examples": examples,
                "seconds": time.perf_counter() - t0}


def emit(ctx: Any, validator: Validator, step: int, summaries: Any = None) -> None:
    """Evaluate and send the ``eval`` event of step ``step`` (and its TensorBoard scalars)."""
    figures = validator.evaluate()
    ctx.emitter.emit("eval", step=step, loss=figures["loss"], metrics=figures["metrics"],
                     examples=figures["examples"], seconds=round(figures["seconds"], 4))
    if summaries is not None:
        summaries.validation(step, loss=figures["loss"], **figures["metrics"])
