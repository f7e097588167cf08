"""Checks run before a launch: the data files and the user's script (in a subprocess)."""

from __future__ import annotations

from engine.contract import datasets
from engine.contract.config import Problem, RunConfig
from engine.control import script_check


def preflight(config: RunConfig, *, scripts: bool = True, timeout: float | None = None) -> list[Problem]:
    """The checks to run before a launch, after :func:`engine.contract.config.validate` found nothing:
    the data files (:func:`check`) and, where the config names one, the user's script (in a subprocess)."""
    problems = datasets.check(config)
    if scripts and script_check.uses_script(config):
        problems += script_check.check(config, timeout=timeout)
    return problems
