"""A real detached run (TensorFlow on CPU) watched, listed and stopped over SSH from "another machine": a real
sshd on 127.0.0.1, the user's own ssh client, ``clusterdeck follow`` on the far side."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from engine.control.remote import RemoteRun, remote_list
from tests.engine.test_detach import TINY, cli, detach, end, env_for, no_traceback, stepping, tagged
from tests.engine.test_remote import REMOTE, followers, wait_until
from tests.engine.test_ssh import sshd  # noqa: F401 - the real sshd on 127.0.0.1 (fixture)


@pytest.mark.cluster
def test_a_detached_run_is_listed_watched_live_and_stopped_over_ssh(sshd: Path, tmp_path: Path,  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    monkeypatch.setenv("CLUSTERDECK_REMOTE_COMMAND", REMOTE)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(TINY, encoding="utf-8")
    tag = uuid.uuid4().hex
    run_dir = detach(tmp_path, tag, preset)
    env = {**env_for(tmp_path, tag), "CLUSTERDECK_SSH_CONFIG": str(sshd), "CLUSTERDECK_REMOTE_COMMAND": REMOTE,
           "COLUMNS": "400"}  # rich wraps at 80 columns off a terminal
    where = f"cdtest:{run_dir}"
    try:
        stepping(run_dir)
        # ls over ssh: the run, running and detached, as ls says it there
        rows = remote_list(f"cdtest:{run_dir.parent}")
        assert [(r.run, r.state, r.detached, r.host) for r in rows] == [(run_dir.name, "running", True, "cdtest")]

        # the CLI's view over ssh: history, then live; Ctrl+C detaches and nothing is left on the far side
        watcher = subprocess.Popen([sys.executable, "-m", "engine.cli", "attach", where], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert watcher.stdout is not None
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(watcher.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        assert wait_until(lambda: any("attached to" in line for line in said), 60), said
        time.sleep(3)  # live a while
        watcher.send_signal(signal.SIGINT)
        watcher.wait(30)
        reader.join(10)
        shown, err = "".join(said), watcher.stderr.read() if watcher.stderr else ""
        assert watcher.returncode == 0 and "Traceback" not in shown + err, err[-3000:]
        assert "over ssh" in shown and "detached from cdtest:" in shown and "worker:0" in shown, shown[-3000:]
        assert wait_until(lambda: not followers(run_dir), 5), "a follower outlived its front end"

        # the API: live steps as they come, then three front ends stop it at once (over the live link, over
        # ssh from the command line, and here), while it is watched: the watcher ends with it
        run = RemoteRun(where).open()
        try:
            attached = time.time()
            live: list[dict[str, Any]] = []
            run.add_listener(lambda e: live.append(e) if e["kind"] == "step" and e["t"] > attached else None)
            deadline = time.monotonic() + 30
            while len(live) < 5 and time.monotonic() < deadline:
                run.wait(0.2)
            assert len(live) >= 5, f"no live steps over ssh: {run.state.summary()}"
            assert [e["step"] for e in live] == sorted(e["step"] for e in live)
            replies: list[Any] = []
            stoppers = [threading.Thread(target=lambda: replies.append(run.stop())),
                        threading.Thread(target=lambda: replies.append(cli(tmp_path, tag, "stop", where))),
                        threading.Thread(target=lambda: replies.append(cli(tmp_path, tag, "stop", str(run_dir))))]
            started = time.monotonic()
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join(120)
            assert time.monotonic() - started < 60, "stopping at once hung"
            [api] = [r for r in replies if isinstance(r, dict)]
            outs = [r for r in replies if not isinstance(r, dict)]
            assert len(outs) == 2
            assert api["ok"] and (api.get("state") == "stopped" or api.get("already_ended")), api
            for out in outs:
                no_traceback(out)
                assert out.returncode == 0, out.stdout + out.stderr
                assert "stopped at step" in out.stdout or "has ended (stopped)" in out.stdout, out.stdout
            assert run.wait(30) == "stopped" and run.done
        finally:
            run.close()
        out = cli(tmp_path, tag, "stop", where)
        assert out.returncode == 0 and "has ended (stopped)" in out.stdout, out.stdout + out.stderr
        assert json.loads((run_dir / "run.json").read_text())["state"] == "stopped"
        assert wait_until(lambda: not tagged(tag, "engine.runtime") and not followers(run_dir), 10)
    finally:
        end(run_dir)
