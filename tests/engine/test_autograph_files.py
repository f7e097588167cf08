"""A task leaves no autograph source files in the temporary folder (it exits with ``os._exit``, which runs none
of the ``atexit`` handlers that would have removed them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.engine.test_cli import cli, env_for

CONVERT_AND_LEAVE = """
import os, sys, tempfile
import tensorflow as tf
from engine.runtime.stop import remove_autograph_files

@tf.function
def f(x):
    for i in tf.range(3):  # converted by autograph: its source goes to a file in the temporary folder
        x = x + tf.cast(i, x.dtype)
    return x

f(tf.constant(1.0))
before = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("__autograph_generated_file")]
print("before", len(before), flush=True)
if sys.argv[1] == "clean":
    remove_autograph_files()
os._exit(0)
"""


def _autograph_files(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("__autograph_generated_file"))


@pytest.mark.parametrize("leave", ["clean", "plain"])
def test_os_exit_after_a_converted_function_leaves_its_file_only_without_the_cleanup(tmp_path: Path,
                                                                                     leave: str) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "convert.py"  # a file: autograph reads a function's source to convert it
    script.write_text(CONVERT_AND_LEAVE, encoding="utf-8")
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, str(script), leave], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    made = int(out.stdout.split("before", 1)[1].split()[0])
    assert made >= 1, "autograph wrote no file: the test would prove nothing"
    assert len(_autograph_files(tmp)) == (0 if leave == "clean" else made)


# data-1worker-2gpus: one task, whose "finished" ends the run: its files must be gone before it says it
@pytest.mark.parametrize("preset", ["data-2workers", "data-1worker-2gpus"])
def test_a_real_run_leaves_no_autograph_file_in_the_temporary_folder(tmp_path: Path, preset: str) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = cli(tmp_path, "run", preset, "--steps", "40", "--out", str(tmp_path / "runs"),
              env=env_for(tmp_path, TMPDIR=str(tmp)), timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "finished" in out.stdout
    assert _autograph_files(tmp) == []
