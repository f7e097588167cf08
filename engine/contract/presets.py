"""The presets shipped with ClusterDeck, and turning a name or path into a config."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from engine.contract import config as config_mod
from engine.contract import resources
from engine.contract.config import ConfigError, Problem, RunConfig

DEFAULT_PRESET = "data-2workers"
PRESET_SUFFIXES = (".yaml", ".yml")


def presets_dir() -> Path:
    """The folder of the bundled presets, in every install layout (:func:`engine.contract.resources.presets_dir`)."""
    return resources.presets_dir()


def bundled_presets() -> list[Path]:
    """The bundled presets, sorted by name."""
    folder = presets_dir()
    return sorted(p for p in folder.iterdir() if p.suffix in PRESET_SUFFIXES and p.is_file()) if folder.is_dir() else []


def bundled_names() -> list[str]:
    return [p.stem for p in bundled_presets()]


def is_bundled(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is one of the shipped presets (open it read-only: Save becomes Save As)."""
    try:
        return Path(path).resolve().parent == presets_dir().resolve()
    except OSError:
        return False


def resolve_preset(name: str) -> Path:
    """A path, or the name of a bundled preset (with or without ``.yaml``); ``Path(name)`` when neither."""
    p = Path(name)
    if os.path.lexists(p):
        return p
    if name and os.sep not in name and "/" not in name:
        folder = presets_dir()
        for candidate in (folder / name, *(folder / f"{name}{suffix}" for suffix in PRESET_SUFFIXES)):
            if candidate.is_file():
                return candidate
    return p


def suggest(word: str, choices: list[str]) -> str | None:
    """The choice closest to a mistyped ``word``, if one is close enough."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def not_found(name: str) -> ConfigError:
    """The error for a preset that is neither a file nor a bundled name: it lists the bundled ones."""
    names = bundled_names()
    stem = Path(name).name
    for suffix in PRESET_SUFFIXES:
        stem = stem.removesuffix(suffix)
    close = suggest(stem, names)
    message = "no such file or bundled preset"
    if close is not None:
        message += f"; did you mean {close!r}?"
    message += f" (bundled presets: {', '.join(names) or 'none found'})"
    return ConfigError([Problem("", message)], name)


def load_preset(name: str) -> RunConfig:
    """The config of a preset given by path or bundled name (raises :class:`ConfigError`).

    Relative paths inside the preset are read from the preset's own folder (:func:`config.load`)."""
    path = resolve_preset(name)
    if not os.path.lexists(path):
        raise not_found(name)
    return config_mod.load(path)


def description(path: str | os.PathLike[str], limit: int = 4096) -> str:
    """The first sentence of a preset's leading ``#`` comment ("" when it has none): what the preset is."""
    lines: list[str] = []
    try:
        with open(path, "rb") as f:
            head = f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""
    for line in head.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(x for x in lines if x)
    end = text.find(". ")
    sentence = text if end < 0 else text[: end + 1]
    return sentence.removesuffix(":").strip()
