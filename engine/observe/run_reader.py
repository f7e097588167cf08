"""Opening a run folder into (config, RunState) outside any front end, and following its events file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.contract import events
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.contract.run_folder import RunFolder
from engine.observe.telemetry import TERMINAL, RunState

#: States after which a run folder gains no events: ``interrupted`` is a run whose launcher died.
ENDED = (*TERMINAL, "interrupted")


def run_state_for(config: RunConfig) -> RunState:
    """A RunState listing the config's tasks, nothing run yet."""
    return RunState(total_steps=config.total_steps(),
                    tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()])


class EventFileReader:
    """Reads an ``events.jsonl`` incrementally: only complete new lines, bad lines skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.stats = events.ReadStats()

    def read_new(self, limit: int = 64 * 1024 * 1024) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > events.MAX_LINE_BYTES:
            self.partial = b""
        return list(events.parse_lines(lines, self.stats))


def read_run_folder(path: str | Path) -> tuple[RunConfig, RunState, EventFileReader]:
    """The config and the folded events of a run folder; the reader goes on from where this stopped.

    A run whose events do not end it takes its state from the folder (``run.json``, or the folder's
    own judgement of a launcher that died, where :class:`RunFolder` offers one).
    """
    folder = RunFolder(path)
    if not folder.is_run_folder():
        raise ConfigError([Problem("", "not a run folder: it has no config.yaml")], str(folder.path))
    config = folder.read_config(check=False)
    state = run_state_for(config)
    reader = EventFileReader(folder.events)
    for event in reader.read_new():
        state.apply(event)
    if state.state not in TERMINAL:
        effective = getattr(folder, "effective_state", None)
        end = effective() if callable(effective) else folder.read_meta().get("state")
        if isinstance(end, str) and end in ENDED:
            state.state = end
    return config, state, reader
