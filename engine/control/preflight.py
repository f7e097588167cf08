"""Checks run before a launch: this machine (memory, CPUs, fixed ports), the data files and the user's script."""

from __future__ import annotations

from engine.contract import datasets
from engine.contract.config import Problem, RunConfig
from engine.control import machine_fit, script_check


def preflight(config: RunConfig, *, scripts: bool = True, timeout: float | None = None) -> list[Problem]:
    """The checks to run before a launch, after :func:`engine.contract.config.validate` found nothing:
    whether the config fits this machine (:func:`engine.control.machine_fit.check`), the data files
    (:func:`engine.contract.datasets.check`) and, where the config names one, the user's script (in a subprocess)."""
    problems = machine_fit.check(config) + datasets.check(config)
    if scripts and script_check.uses_script(config):
        problems += script_check.check(config, timeout=timeout)
    return problems


def warnings(config: RunConfig) -> list[Problem]:
    """What a launch should say but not refuse (e.g. more local tasks than CPUs): show them, then go on."""
    return machine_fit.warnings(config)
