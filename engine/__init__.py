"""ClusterDeck's engine, in five floors (docs/architecture.md is the map).

- ``engine.contract``: what every other floor agrees on: the one config model, the event records, the
  run folder, the task plan;
- ``engine.observe``: the fold of events into a run's state (telemetry, stragglers, run folders read back);
- ``engine.control``: the launcher, the lifecycle policy, transports and supervisors, checks before launch;
- ``engine.cli``: the ``clusterdeck`` command;
- ``engine.runtime``: what runs inside task processes, and the only code that imports TensorFlow.

No module of the engine imports Qt or ``gui``.
"""

__version__ = "0.1.0"


def version() -> str:
    """This ClusterDeck's version: the installed distribution's, else the source tree's ``pyproject.toml``."""
    from importlib import metadata

    try:
        return metadata.version("clusterdeck")
    except metadata.PackageNotFoundError:
        pass
    import re
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else __version__
