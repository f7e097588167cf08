"""``clusterdeck restart RUN``: a running run restarted from its last checkpoint through its control channel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.contract.run_folder import RunFolder
from tests.engine.test_detach import TINY, cli, detach, end, no_traceback, status, stepping, wait_until


@pytest.mark.cluster
def test_a_running_run_restarts_from_its_checkpoint_and_goes_on(tmp_path: Path) -> None:
    preset = tmp_path / "tiny.yaml"
    preset.write_text(TINY.replace("checkpoint_every: 0", "checkpoint_every: 10"), encoding="utf-8")
    run_dir = detach(tmp_path, "restart", preset)
    try:
        before = stepping(run_dir)
        out = cli(tmp_path, "restart", "restart", str(run_dir))
        no_traceback(out)
        assert out.returncode == 0, out.stderr
        assert "restarting from its last checkpoint" in out.stdout and "training.restarts" in out.stdout

        def resumed() -> bool:
            lines = RunFolder(run_dir).events.read_text(encoding="utf-8").splitlines()
            infos = [json.loads(x) for x in lines if '"resumed from checkpoint' in x]
            return bool(infos) and status(run_dir)["step"] > before

        assert wait_until(resumed, 90, 0.3), status(run_dir)
        assert status(run_dir)["state"] == "running"
    finally:
        end(run_dir)
    ended = cli(tmp_path, "restart", "restart", str(run_dir))
    no_traceback(ended)
    assert ended.returncode == 1 and "nothing to restart" in ended.stderr
    missing = cli(tmp_path, "restart", "restart", "no-such-run")
    assert missing.returncode == 2 and "no run named" in missing.stderr
