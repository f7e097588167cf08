"""A run's ``checkpoints/checkpoint`` state file, read and mended without TensorFlow.

TensorFlow's ``CheckpointManager`` writes the state file from a callback of the write, before the
write's last operations are done, and every DTensor client writes it. A task stopped or lost in the
middle of a save can so leave a state naming a checkpoint whose ``.index`` never came. A run's state
never names such a checkpoint: :func:`repair` rewrites it to name the complete checkpoints (or
removes it where none is); a task calls it after each save, and the launcher once every process of
the run is gone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["complete", "latest", "repair"]

_NAMED = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.MULTILINE)


def complete(folder: Path) -> list[tuple[int, str]]:
    """(step, prefix) of every complete checkpoint in ``folder`` (its ``.index`` file is there), oldest first."""
    found = []
    for index in folder.glob("ckpt-*.index"):
        try:
            found.append((int(index.name[len("ckpt-"):-len(".index")]), str(index)[:-len(".index")]))
        except ValueError:
            continue
    return sorted(found)


def latest(folder: Path) -> str | None:
    """The prefix of the newest complete checkpoint in ``folder``, or None."""
    found = complete(folder)
    return found[-1][1] if found else None


def _named(folder: Path) -> str | None:
    """The prefix the state file names, or None (no state, or one that names nothing)."""
    try:
        text = (folder / "checkpoint").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _NAMED.search(text)
    if not match:
        return None
    name = match.group(1)
    return name if os.path.isabs(name) else str(folder / name)


def repair(folder: Path) -> bool:
    """Make ``folder``'s state name only complete checkpoints; True where it was rewritten or removed."""
    state = folder / "checkpoint"
    if not state.exists():
        return False
    named = _named(folder)
    if named is not None and os.path.exists(named + ".index"):
        return False
    found = complete(folder)
    if not found:
        state.unlink(missing_ok=True)
        return True
    names = [os.path.basename(prefix) for _, prefix in found]
    text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(f'all_model_checkpoint_paths: "{n}"\n' for n in names)
    tmp = state.with_name(".checkpoint.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, state)
    return True
