"""ClusterDeck's bundled files, wherever ClusterDeck is installed.

The wheel ships them as the package ``clusterdeck_data`` (``resources/`` of the source tree), with the
sub-packages ``clusterdeck_data.presets`` (``presets/``) and ``clusterdeck_data.examples``
(``examples/``); they are found through :mod:`importlib.resources`, so an editable install, a wheel in
a venv, ``pip install --user`` and ``pip install --target DIR`` + ``PYTHONPATH`` all work. Code run from a
checkout (installed editable or not) reads the folders next to its own ``engine/``.

The bundled data sets stay inside the ``engine`` package (``engine/resources_data``).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

DATA_PACKAGE = "clusterdeck_data"
#: The PNG sizes of the app icon (``icons/hicolor/<size>x<size>/apps/clusterdeck.png``, the freedesktop icon
#: theme layout); the SVG scales to any size.
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256)
APP_ID = "clusterdeck"

_SOURCE_TREE = Path(__file__).resolve().parents[2]


def _folder(package: str, source_folder: str) -> Path:
    """A bundled folder: the source tree's where this code runs from a checkout (its code and its files go
    together, even where an editable install of another checkout is on the path), else the installed package's."""
    if (_SOURCE_TREE / "pyproject.toml").is_file() and (_SOURCE_TREE / source_folder).is_dir():
        return _SOURCE_TREE / source_folder
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        root = None
    if isinstance(root, Path) and root.is_dir():
        return root
    return _SOURCE_TREE / source_folder


def resources_dir() -> Path:
    """Icons, the ``.desktop`` file and style files (``resources/`` of the source tree)."""
    return _folder(DATA_PACKAGE, "resources")


def presets_dir() -> Path:
    """The folder of the bundled presets (``*.yaml``)."""
    return _folder(f"{DATA_PACKAGE}.presets", "presets")


def examples_dir() -> Path:
    """The folder of the bundled examples (``user_script.py``, ``keras_fit_callback.py``)."""
    return _folder(f"{DATA_PACKAGE}.examples", "examples")


def icon_path(size: int | None = None) -> Path:
    """The app icon: the SVG, or the PNG of ``size`` pixels (one of :data:`ICON_SIZES`)."""
    if size is None:
        return resources_dir() / "icons" / f"{APP_ID}.svg"
    if size not in ICON_SIZES:
        raise ValueError(f"icon size: expected one of {', '.join(map(str, ICON_SIZES))}, got {size}")
    return resources_dir() / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"


def icon_paths() -> list[Path]:
    """Every icon file that exists (the SVG first, then the PNGs small to large), for ``QIcon.addFile``."""
    return [p for p in (icon_path(), *(icon_path(s) for s in ICON_SIZES)) if p.is_file()]


def desktop_file() -> Path:
    """The freedesktop entry (``clusterdeck.desktop``) of the app."""
    return resources_dir() / f"{APP_ID}.desktop"


def bundled_data(name: str) -> Path:
    """A data set shipped inside the ``engine`` package (``engine/resources_data/<name>``, e.g. ``digits.npz``)."""
    root = importlib.resources.files("engine")
    base = root if isinstance(root, Path) else _SOURCE_TREE / "engine"
    return base / "resources_data" / name
