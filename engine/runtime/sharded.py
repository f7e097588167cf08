"""Sharded models for model parallelism (DTensor): the built-in ones and the user's own.

:func:`build_for_config` is what the model-parallel runtime calls to get the model of a run.
"""

from __future__ import annotations

from tensorflow.experimental import dtensor

from engine.contract.config import RunConfig
from engine.runtime import dtensor_layers as layers


def build_for_config(config: RunConfig, mesh: dtensor.Mesh) -> layers.ShardedModel:
    """The sharded model of ``config.model`` on ``mesh``."""
    return layers.build(config, mesh)
