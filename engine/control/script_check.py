"""Check the user's script before a launch, in a subprocess (the script imports TensorFlow; we must not).

The subprocess (``python -m engine.runtime.script_checker --check``) imports the script, builds its
model and/or dataset and runs one batch through model and loss. Its problems come back as
:class:`~engine.contract.config.Problem` values naming the file; a failure inside the script carries the
script's own traceback. Nothing runs unless the config names a script.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

from engine.contract import config as config_mod
from engine.contract import datasets
from engine.contract.config import Problem, RunConfig
from engine.contract.task_logs import is_noise

#: Seconds the check may take: importing TensorFlow alone takes 3 to 9 s on a busy machine.
DEFAULT_TIMEOUT_S = 120.0
#: Environment variable marking the processes of one check.
CHECK_ENV = "CLUSTERDECK_SCRIPT_CHECK"


def uses_script(config: RunConfig) -> bool:
    return config.model.name == "script" or config.data.source == "script"


def script_file_problem(field: str, path: str) -> Problem | None:
    """``path`` as a script ``field`` names: None where it is a regular file; else what it is, in words (a FIFO,
    a device and a folder are refused by their type before anything opens them; "~nosuchuser" is named)."""
    expanded = os.path.expanduser(path)
    nobody = datasets.unknown_home(expanded)
    if nobody is not None:
        return Problem(field, f"{path!r} names the home folder of {nobody!r}, a user this machine does not know; "
                              "expected a Python script")
    try:
        mode = os.stat(expanded).st_mode
    except OSError:
        return Problem(field, f"{path!r}: no such file; expected a Python script")
    if not stat.S_ISREG(mode):
        return Problem(field, f"{path!r} is {datasets.file_kind(mode)}; expected a Python script (a .py file)")
    return None


def check(config: RunConfig, *, timeout: float | None = None, python: str | None = None,
          stop: threading.Event | None = None) -> list[Problem]:
    """Problems of the config's script (empty when it names none, or when the script passes). ``stop``, set from
    another thread (checks run side by side: ``clusterdeck validate``), ends the check and its processes at once."""
    if not uses_script(config):
        return []
    config = _absolute(config)
    scripts = ([("model.script", config.model.script)] if config.model.name == "script" else []) + \
              ([("data.path", config.data.path)] if config.data.source == "script" else [])
    for field, path in scripts:
        problem = script_file_problem(field, path)
        if problem is not None:
            return [problem]
    limit = DEFAULT_TIMEOUT_S if timeout is None else timeout
    named = scripts[0][1]
    with tempfile.TemporaryDirectory(prefix="clusterdeck-check-") as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        out_path = Path(tmp) / "result.json"
        config_mod.save(config, cfg_path)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the engine package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = ""  # a check needs no GPU, and must not hold one a run wants
        token = f"{os.getpid()}-{uuid.uuid4().hex}"
        env[CHECK_ENV] = token  # marks every process of the check, also children that leave its session
        cmd = [python or sys.executable, "-m", "engine.runtime.script_checker", "--check", str(cfg_path),
               "--out", str(out_path)]
        log_path = Path(tmp) / "check.log"
        # output to a file, not a pipe: a child of the script holding the pipe open must not keep us waiting
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)
        try:
            waiting = stop or threading.Event()  # one nobody sets where the caller cannot stop the check
            deadline = time.monotonic() + limit
            while proc.poll() is None:
                if waiting.is_set():
                    return [Problem(scripts[0][0], f"{named!r}: the check of the script was stopped")]
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(cmd, limit)
                waiting.wait(0.1)
        except subprocess.TimeoutExpired:
            return [Problem(scripts[0][0], f"{named!r}: the check of the script did not finish within "
                                           f"{limit:g} s (importing it, building the model or the first batch)")]
        finally:
            _end_every_process(proc, token)
        try:
            result = json.loads(out_path.read_text(encoding="utf-8"))
            raw = result["problems"]
            return [Problem(str(p["field"]), str(p["message"])) for p in raw]
        except (OSError, ValueError, KeyError, TypeError):
            tail = _tail(log_path.read_bytes().decode("utf-8", "replace"))
            return [Problem(scripts[0][0], f"{named!r}: the check of the script ended with exit code "
                                           f"{proc.returncode} and no answer" + (f":\n{tail}" if tail else ""))]


def _end_every_process(proc: subprocess.Popen[bytes], token: str) -> None:
    """Kill the check and everything the user's script started (its process group, and any process that
    carries the check's token in its environment after leaving the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for other in psutil.process_iter():
        try:
            if other.pid != os.getpid() and other.environ().get(CHECK_ENV) == token:
                other.kill()
        except psutil.Error:
            continue


def _absolute(config: RunConfig) -> RunConfig:
    """Script paths made absolute (the check runs in a temporary folder)."""
    def absolute(path: str) -> str:
        expanded = os.path.expanduser(path)
        if not path.strip() or datasets.unknown_home(expanded) is not None:
            return path  # "~nosuchuser/...": kept as written, for the message that names the user
        return os.path.abspath(expanded)

    return config_mod.replace(config, data=config_mod.replace(config.data, path=absolute(config.data.path)),
                              model=config_mod.replace(config.model, script=absolute(config.model.script)))


def _tail(text: str, lines: int = 25) -> str:
    """The end of a log, without TensorFlow's start-up chatter."""
    keep = [ln for ln in text.splitlines() if ln.strip() and not _noise(ln)]
    return "\n".join(keep[-lines:])


def _noise(line: str) -> bool:
    return is_noise(line)
