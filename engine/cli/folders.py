"""Checks of the folders the command writes into, before anything starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def unusable_folder(path: Path) -> str | None:
    """Why run folders cannot be created under ``path`` (created if missing), or None when they can."""
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
