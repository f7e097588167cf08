"""Checks run before a launch: this machine (memory, CPUs, fixed ports), the data files, the user's script
and the user's program (its file is there, is Python and compiles: no TensorFlow needed)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.contract import datasets
from engine.contract.config import Problem, RunConfig
from engine.control import machine_fit, reachability, script_check, unchosen_code


def preflight(config: RunConfig, *, scripts: bool = True, timeout: float | None = None) -> list[Problem]:
    """The checks to run before a launch, after :func:`engine.contract.config.validate` found nothing:
    whether the config fits this machine (:func:`engine.control.machine_fit.check`), the data files
    (:func:`engine.contract.datasets.check`) and, where the config names one, the user's script (in a subprocess)."""
    problems = unchosen_code.problems(config)  # code a shared preset would run unchosen: refused first
    problems += machine_fit.check(config) + datasets.check(config) + program_problems(config)
    if not problems:  # other hosts' addresses and task ports, in seconds, instead of a hang 60 s after launch
        problems += reachability.problems(config)
    if not problems:  # and each SSH host logged in to, as its supervisor will be: a host whose sshd is gone is named
        problems += reachability.login_problems(config)
    if scripts and script_check.uses_script(config):
        problems += script_check.check(config, timeout=timeout)
    if problems:  # refused: the connections the login checks left for the supervisors end now
        reachability.close_logins(config)
    return problems


#: Largest program file read for the syntax check.
MAX_PROGRAM_BYTES = 16 << 20


def program_problems(config: RunConfig) -> list[Problem]:
    """The config's ``program.script``: a readable Python file (``.py``) that compiles; empty without a program."""
    if config.program is None or not config.program.script.strip():
        return []
    path = Path(os.path.expanduser(config.program.script))
    shown = str(path)
    not_a_file = script_check.script_file_problem("program.script", config.program.script)
    if not_a_file is not None:  # missing, a folder, a FIFO, a device, '~nosuchuser': named, never opened
        return [Problem("program.script", not_a_file.message.replace("expected a Python script",
                                                                     "expected your training program, a Python file"))]
    if path.suffix not in (".py", ".pyw"):
        return [Problem("program.script", f"{shown!r} is not a Python file (its name ends in {path.suffix or 'nothing'!r}); "
                                          "expected a .py file")]
    try:
        if path.stat().st_size > MAX_PROGRAM_BYTES:
            return [Problem("program.script", f"{shown!r} is larger than {MAX_PROGRAM_BYTES >> 20} MiB; expected a "
                                              "Python program")]
        source = path.read_bytes()
    except OSError as exc:
        return [Problem("program.script", f"{shown!r} cannot be read: {exc.strerror or exc}")]
    try:
        compile(source, shown, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        return [Problem("program.script", f"{shown!r}: syntax error at {where}: {exc.msg}; expected a Python "
                                          "program that compiles")]
    except ValueError as exc:  # e.g. null bytes
        return [Problem("program.script", f"{shown!r} is not Python source ({exc})")]
    return []


def warnings(config: RunConfig) -> list[Problem]:
    """What a launch should say but not refuse (e.g. more local tasks than CPUs): show them, then go on."""
    return machine_fit.warnings(config) + unchosen_code.shown(config)  # what runs code, said before launch
