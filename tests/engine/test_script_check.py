"""The pre-launch check of a user's script leaves nothing behind and never waits on the script's children."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import psutil

from engine.control import script_check
from tests.conftest import command_line
from tests.engine.test_user_script import script_config


def leftover(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if marker in command_line(p)]


def test_children_of_a_script_are_ended_and_do_not_hold_the_check(tmp_path: Path) -> None:
    marker = f"clusterdeck-check-child-{time.time_ns()}"
    script = tmp_path / "spawner.py"
    # one child in the check's group holding its stdout open, one that leaves the session: both must go
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}-group"])
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}-session"],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import keras

        def build_model(config):
            return keras.Sequential([keras.Input((32,)), keras.layers.Dense(4)])
    """))
    started = time.monotonic()
    try:
        problems = script_check.check(script_config(script), timeout=110)
        took = time.monotonic() - started
        assert problems == [], [str(p) for p in problems]
        assert took < 100, f"the check waited {took:.0f} s"
        deadline = time.monotonic() + 5
        while leftover(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not leftover(marker), "a process the script started outlived the check"
    finally:
        for p in leftover(marker):
            p.kill()
