"""The presets shipped with ClusterDeck, and turning a name or path into a config."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.contract import config as config_mod
from engine.contract.config import RunConfig

DEFAULT_PRESET = "data-2workers"


def presets_dir() -> Path:
    """The bundled presets: next to the packages in a checkout, or under share/ when installed."""
    here = Path(__file__).resolve().parents[2] / "presets"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "clusterdeck" / "presets"


def resolve_preset(name: str) -> Path:
    """A path, or the name of a bundled preset (with or without ``.yaml``)."""
    p = Path(name)
    if p.exists():
        return p
    for candidate in (presets_dir() / name, presets_dir() / f"{name}.yaml"):
        if candidate.exists():
            return candidate
    return p


def load_preset(name: str) -> RunConfig:
    """The config of a preset given by path or bundled name (raises :class:`ConfigError`)."""
    return config_mod.load(resolve_preset(name))
