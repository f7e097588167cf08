"""What trains: the model as the user compiled it, or the run's own optimizer and loss.

A model that ``build_model`` returns compiled (``model.compile(optimizer, loss, metrics, ...)``) trains
with its compiled optimizer (and its learning-rate schedule), its compiled loss with its loss weights,
its regularization losses (``model.losses``) and reports every compiled metric per replica. A model
that overrides ``train_step`` runs its own ``train_step``. Otherwise (a built-in model, an uncompiled
script model) the run's ``training.optimizer`` / ``learning_rate`` and its loss (sparse categorical
cross-entropy on logits, or the script's ``loss``) apply, and the model's regularization losses are
added to the loss all the same.

The step of a compiled model is Keras' own ``train_step`` (``keras/src/backend/tensorflow/trainer.py``)
with one difference: its metrics are computed on each replica's batch without touching the metrics'
state (``stateless_update_state`` from their initial values), so that every replica reports its own
figures in every mode (under ``ParameterServerStrategy`` a metric's state lives on a ps task and is
shared by every worker). A report's metric is that of the last step reported, or the mean over a group
of ``training.steps_per_execution`` steps, as the loss is. A custom ``train_step`` returns its own
logs: its ``loss`` and every other entry are reported as they are (in async mode its metrics' state is
shared by the workers, as the model keeps it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from engine.contract.config import RunConfig
from engine.runtime import models, tf_compat

#: ``compile()`` settings ClusterDeck's loop decides itself, and what it does instead.
NOT_APPLIED = {
    "steps_per_execution": "steps per function come from training.steps_per_execution",
    "run_eagerly": "ClusterDeck's steps always run as tf.function (distribution strategies need it)",
    "jit_compile": "XLA compilation is not applied to ClusterDeck's distributed step",
}


def overrides_train_step(model: keras.Model) -> bool:
    """Whether the model's class defines its own ``train_step``."""
    return getattr(type(model), "train_step", None) is not getattr(keras.Model, "train_step", None)


def is_compiled(model: keras.Model) -> bool:
    return bool(getattr(model, "compiled", False)) and getattr(model, "optimizer", None) is not None


def describe_optimizer(optimizer: Any) -> tuple[str, Any]:
    """The optimizer's class name and its learning rate (a number, or the schedule's class name)."""
    rate = getattr(optimizer, "_learning_rate", None)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        initial = getattr(rate, "initial_learning_rate", None)
        text = type(rate).__name__ + (f"(initial {float(initial):g})" if isinstance(initial, (int, float)) else "")
        return type(optimizer).__name__, text
    try:
        return type(optimizer).__name__, float(tf.convert_to_tensor(optimizer.learning_rate).numpy())
    except (TypeError, ValueError, AttributeError):
        return type(optimizer).__name__, None


def _name_of(obj: Any) -> str:
    if obj is None:
        return ""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, (list, tuple)):
        return ", ".join(_name_of(o) for o in obj)
    if isinstance(obj, dict):
        return ", ".join(f"{k}: {_name_of(v)}" for k, v in obj.items())
    return getattr(obj, "__name__", None) or type(obj).__name__


@dataclass
class Recipe:
    """The model with how it trains (built inside the strategy's scope)."""

    model: keras.Model
    optimizer: Any
    source: str  # "compile": as the user compiled it; "config": the run's optimizer and loss
    step_kind: str  # "keras": Keras' train step (compiled); "custom": the model's train_step; "loop": ClusterDeck's
    loss_name: str
    metric_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _metric_init: list[Any] = field(default_factory=list, repr=False)

    def describe(self) -> dict[str, Any]:
        """The run's ``training`` info: what trains."""
        name, rate = describe_optimizer(self.optimizer)
        return {"source": self.source, "optimizer": name, "learning_rate": rate, "loss": self.loss_name,
                "metrics": list(self.metric_names),
                "train_step": {"custom": "custom", "keras": "keras"}.get(self.step_kind, "clusterdeck"),
                "regularization_losses": len(self.model.losses), "not_applied": list(self.notes)}

    def message(self) -> str:
        name, rate = describe_optimizer(self.optimizer)
        rate_text = f"learning rate {rate:g}" if isinstance(rate, float) else f"learning rate {rate}"
        if self.source == "compile":
            head = f"training the model as compiled: {name} ({rate_text}), loss {self.loss_name or '-'}"
        else:
            head = f"the model is not compiled: {name} ({rate_text}) and loss {self.loss_name} from the run's config"
        parts = [head]
        if self.metric_names:
            parts.append("metrics " + ", ".join(self.metric_names))
        if self.model.losses:
            parts.append(f"{len(self.model.losses)} regularization loss(es) added")
        if self.step_kind == "custom":
            parts.append(f"its own {type(self.model).__name__}.train_step")
        text = "; ".join(parts)
        for note in self.notes:
            text += f"; not applied: {note}"
        return text

    # -- the step (in a replica's context)

    def step(self, data: Any, loss_fn: Callable[[Any, Any], Any] | None, global_batch: int,
             after_apply: Callable[[], Any] | None = None) -> dict[str, tf.Tensor]:
        """One training step on this replica's batch; returns this replica's figures: ``loss`` (its own
        mean loss, regularization included) and each metric, as float64 scalars."""
        if self.step_kind == "custom":
            out = {k: tf.cast(tf.reduce_mean(v), tf.float64) for k, v in _flat_logs(self.model.train_step(data))}
        elif self.step_kind == "keras":
            out = self._keras_step(data)
        else:
            out = self._loop_step(data, loss_fn, global_batch)
        if after_apply is not None:
            out["_wait"] = tf.cast(after_apply(), tf.float64)
        return out

    def _keras_step(self, data: Any) -> dict[str, tf.Tensor]:
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if getattr(model, "_call_has_training_arg", True) else model(x)
            loss = tf_compat.compiled_loss(model, x, y, y_pred, sample_weight)
            mean = tf_compat.unscale_loss(loss)
            scaled = self.optimizer.scale_loss(loss) if hasattr(self.optimizer, "scale_loss") else loss
        weights = model.trainable_weights
        grads = tape.gradient(scaled, weights)
        self.optimizer.apply_gradients(zip(grads, weights, strict=True))
        out = {"loss": tf.cast(mean, tf.float64)}
        out.update(self._metrics(y, y_pred, sample_weight))
        return out

    def _loop_step(self, data: Any, loss_fn: Callable[[Any, Any], Any] | None,
                   global_batch: int) -> dict[str, tf.Tensor]:
        assert loss_fn is not None
        model = self.model
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            regularization = model.losses
            if regularization:
                loss += tf.nn.scale_regularization_loss(tf.add_n([tf.cast(r, loss.dtype) for r in regularization]))
        grads = tape.gradient(loss, model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        mean = tf.reduce_mean(per_example)
        if regularization:
            mean += tf.add_n([tf.cast(r, mean.dtype) for r in regularization])
        return {"loss": tf.cast(mean, tf.float64)}

    def _metrics(self, y: Any, y_pred: Any, sample_weight: Any) -> dict[str, tf.Tensor]:
        """Each compiled metric on this batch alone (its state untouched)."""
        container = tf_compat.compiled_metrics(self.model)
        if container is None or not self._metric_init:
            return {}
        state = [tf.constant(v) for v in self._metric_init]
        new_state = container.stateless_update_state(state, y, y_pred, sample_weight=sample_weight)
        results = container.stateless_result(new_state)
        return {name: tf.cast(tf.reduce_mean(value), tf.float64) for name, value in dict(results).items()}


def _flat_logs(logs: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A ``train_step``'s logs as (name, tensor) pairs: nested mappings (a metrics container's results)
    flattened, values that are not tensors left out."""
    out: list[tuple[str, Any]] = []
    for key, value in dict(logs or {}).items():
        if isinstance(value, dict):
            out += _flat_logs(value)
        elif hasattr(value, "dtype"):
            out.append((f"{prefix}{key}", value))
    return out


def build(config: RunConfig, sample: Any) -> Recipe:
    """Build the run's model (inside the strategy's scope) and decide how it trains.

    ``sample``: one batch (or its structure of tensors) to build an unbuilt model and the compiled
    metrics with; the optimizer is built against the model's variables here.
    """
    model = models.build_model(config)
    x = sample[0] if isinstance(sample, (tuple, list)) else sample
    if not model.built or not model.trainable_variables:
        try:
            model(x, training=False)
        except Exception as exc:  # noqa: BLE001 - said in the user's terms
            raise ValueError(f"model.script: the model has no variables yet and cannot be built on a batch of the "
                             f"data ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                             f"start it with keras.Input(shape=...) so that its variables exist") from exc
    custom = overrides_train_step(model)
    if is_compiled(model):
        notes = [f"compile({key}={value!r}): {why}" for key, why in NOT_APPLIED.items()
                 if (value := tf_compat.compile_setting(model, key)) not in (None, False, 1, "auto")]
        recipe = Recipe(model, model.optimizer, "compile", "custom" if custom else "keras",
                        _name_of(tf_compat.compile_setting(model, "loss")), notes=notes)
    else:
        optimizer = models.build_optimizer(config)
        if custom:  # its train_step reads self.optimizer and self.compute_loss: compile it with the run's
            loss = models.loss_fn(config)
            model.compile(optimizer=optimizer, loss=lambda yt, yp: tf.reduce_mean(loss(yt, yp)))
        recipe = Recipe(model, model.optimizer if custom else optimizer, "config", "custom" if custom else "loop",
                        models.loss_name(config))
    if not getattr(recipe.optimizer, "built", False):
        recipe.optimizer.build(model.trainable_variables)
    if recipe.step_kind == "keras":
        tf_compat.build_compiled(model, sample)
        container = tf_compat.compiled_metrics(model)
        if container is not None:
            container.reset_state()
            recipe._metric_init = [v.numpy() for v in container.variables]
            recipe.metric_names = list(tf_compat.metric_names(container))
    elif recipe.step_kind == "custom":
        tf_compat.build_compiled(model, sample)
        container = tf_compat.compiled_metrics(model)
        recipe.metric_names = [name for m in model.metrics if m.name != "loss"
                               for name in (tf_compat.metric_names(m) if m is container else [m.name])]
    return recipe
