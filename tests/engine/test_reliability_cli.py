"""Reliability, round three, as the user types it: names and folders that once crashed every command."""

from __future__ import annotations

import pytest

from engine.cli.folders import expand_folder, unusable_folder
from engine.contract import config as config_mod
from engine.contract.config import replace
from tests.conftest import PRESETS
from tests.engine.test_cli import cli, env_for, no_traceback

UNKNOWN_HOME = "~nosuchuser-clusterdeck/runs"


def test_an_unknown_users_home_is_named_not_a_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert str(expand_folder(UNKNOWN_HOME)) == UNKNOWN_HOME
    assert "a user this machine does not know" in (unusable_folder(expand_folder(UNKNOWN_HOME)) or "")
    env = env_for(tmp_path, CLUSTERDECK_RUNS=UNKNOWN_HOME)
    out = cli(tmp_path, "--version", env=env)
    assert out.returncode == 0, out.stderr
    no_traceback(out)
    out = cli(tmp_path, "run", "data-2workers", env=env)
    assert out.returncode == 2 and "$CLUSTERDECK_RUNS" in out.stderr and "does not know" in out.stderr
    no_traceback(out)
    out = cli(tmp_path, "run", "data-2workers", "--out", UNKNOWN_HOME)
    assert out.returncode == 2 and "--out" in out.stderr and "does not know" in out.stderr
    no_traceback(out)
    assert not (tmp_path / "elsewhere" / "~nosuchuser-clusterdeck").exists()


@pytest.mark.cluster
def test_a_run_name_with_rich_markup_is_shown_as_text(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = config_mod.load(PRESETS / "data-2workers.yaml")
    cfg = replace(cfg, name="x [/red] y [bold]", training=replace(cfg.training, steps=3, checkpoint_every=0))
    preset = tmp_path / "markup.yaml"
    config_mod.save(cfg, preset)
    out = cli(tmp_path, "run", str(preset), "--out", str(tmp_path / "runs"), timeout=180)
    no_traceback(out)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "finished" in out.stdout
