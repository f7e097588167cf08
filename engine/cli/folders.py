"""Checks of the folders the command writes into, before anything starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from engine.contract.run_folder import expand_user


def expand_folder(path: str) -> Path:
    """A folder the user named (``--out``, ``$CLUSTERDECK_RUNS``), ``~`` expanded; never raises (an unknown
    ``~user`` stays as written, and :func:`unusable_folder` names it)."""
    return expand_user(path)


def unusable_folder(path: Path) -> str | None:
    """Why run folders cannot be created under ``path`` (created if missing), or None when they can."""
    first = path.parts[0] if path.parts else ""
    if first.startswith("~"):  # left unexpanded: no such user (or no home folder) here
        return (f"{first!r} names the home folder of a user this machine does not know; expected an existing "
                "user's ~name or a path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "it is a file, not a folder"
    except NotADirectoryError:
        for parent in path.parents:
            if parent.exists() and not parent.is_dir():
                return f"{parent} is a file, not a folder"
        return "a part of it is not a folder"
    except OSError as exc:
        return f"it cannot be created ({exc.strerror or exc})"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".clusterdeck-check-", dir=path))
    except OSError as exc:
        return f"no folder can be created in it ({exc.strerror or exc})"
    return None
