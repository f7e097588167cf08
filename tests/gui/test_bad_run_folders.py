"""Unreadable or half-written run folders open with a message or a partial view, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.contract import config as config_mod
from engine.contract import events
from engine.contract.config import ConfigError
from engine.contract.run_folder import RunFolder
from engine.observe.run_reader import read_run_folder
from tests.gui.conftest import PRESETS


def make_run_folder(root: Path) -> Path:
    run = RunFolder(root / "run")
    folder = run.path
    folder.mkdir(parents=True, exist_ok=True)
    run.write_config(config_mod.load(PRESETS / "data-2workers.yaml"))
    lines = [events.encode(events.make("step", "worker:0", replica=0, step=s, loss=1.0 / s)) for s in range(1, 6)]
    writer = events.EventWriter(run.events)
    for line in lines:
        writer.write_line(line.rstrip("\n"))
    writer.close()
    run.write_meta(state="finished")
    return folder


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=2000), cut=st.integers(min_value=0, max_value=400),
       target=st.sampled_from(["events.jsonl", "config.yaml", "run.json"]))
def test_corrupt_run_folder_reads_or_is_refused_with_a_config_error(tmp_path: Path, junk: bytes, cut: int,
                                                                    target: str) -> None:
    folder = make_run_folder(tmp_path)
    original = (folder / target).read_bytes()
    (folder / target).write_bytes(original[:cut] + junk)  # half-written, then garbage
    try:
        config, state, _ = read_run_folder(folder)
    except ConfigError as exc:
        assert target == "config.yaml" and str(exc)
        return
    assert config.name
    if target == "events.jsonl":
        assert state.step <= 5  # whatever survived, nothing invented


def test_folder_without_config_or_with_a_folder_for_events(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        read_run_folder(tmp_path)
    folder = make_run_folder(tmp_path)
    (folder / "events.jsonl").unlink()
    (folder / "events.jsonl").mkdir()
    config, state, _ = read_run_folder(folder)
    assert state.step == 0 and config.name == "data-2workers"


def test_opening_a_broken_run_folder_in_the_window_shows_a_message(window: Any, tmp_path: Path,
                                                                   dialogs: Any) -> None:
    folder = make_run_folder(tmp_path)
    (folder / "config.yaml").write_bytes(b"\x00\xff garbage: [")
    window.open_run_folder(folder)
    assert dialogs.calls, "a message box must explain the problem"
    kind, title, text = dialogs.calls[-1]
    assert kind in ("warning", "critical") and "config.yaml" in text
