"""Preset fields that would run a program the user never chose, refused before launch (or shown, where the user
opted in).

A preset is a shared file: whoever wrote it can put a value in it that runs code on the submit host or the nodes.
ClusterDeck runs code only where the user chose it (``model.script``, ``data.script``, ``program.script`` and each
host's ``python``, all shown before launch); everything else that would run a program is refused here:

- ``slurm.srun_options`` / ``slurm.sbatch_options`` naming ``--prolog``, ``--epilog``, ``--task-prolog``,
  ``--task-epilog`` (programs Slurm runs for the step), ``--wrap`` (a command), ``--output``/``--error``/``--input``
  and ``-o``/``-e``/``-i`` (files written or read outside the run folder: a job's output appended to
  ``~/.bashrc`` runs at the next login), or ``--export`` of a variable that makes a program load code
  (``LD_PRELOAD``, ``PYTHONSTARTUP``, …). Abbreviations count (Slurm accepts ``--ep=`` for ``--epilog=``), and so do short options bundled
  as getopt reads them (``-vo FILE`` is ``-v -o FILE``); ``--bcast`` (the program copied to a path on the nodes) too.
  ``slurm.allow_program_options: true`` (a field of its own, so a shared preset cannot slip it in unseen: it is
  shown before every launch) lets them through.
- a host's ``python`` must name a Python interpreter (``python``, ``python3``, ``python3.11``, ``pypy3``, as a
  path or a name): ``python: /path/to/script.sh`` is refused. Any other ``python`` is shown before launch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.contract.config import Problem, RunConfig

#: Slurm options that run a program (or write or read files outside the run folder), without their dashes.
PROGRAM_OPTIONS = ("prolog", "epilog", "task-prolog", "task-epilog", "wrap", "output", "error", "input", "bcast")
SHORT_FILE_OPTIONS = ("-o", "-e", "-i")
#: srun/sbatch short options that take an argument: in a bundle such as ``-vo FILE`` the rest of the word after one
#: of these is its argument (getopt's reading), so scanning stops there.
_SHORT_WITH_ARGUMENT = frozenset("AbBcCdDgGJLmMnNpqRStTwWx")
_SHORT_FILE = {"o": "output", "e": "error", "i": "input"}
#: the shortest prefix of a long option Slurm takes (getopt_long takes any unambiguous one; one letter is never)
_MIN_PREFIX = 2
#: Variables that make the programs of a step load code of their own.
CODE_VARIABLES = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME",
                  "PYTHONUSERBASE", "BASH_ENV", "ENV", "PERL5OPT", "NODE_OPTIONS")
INTERPRETER = re.compile(r"^(python|pypy)\d*(\.\d+)*([mdtu]*)?(\.exe)?$")


def _long_name(word: str) -> str:
    return word[2:].split("=", 1)[0].lower() if word.startswith("--") else ""


def _short_file_option(word: str) -> str:
    """The file option a single-dash word holds, read as getopt reads a bundle (``-vo/root/.bashrc`` is ``-v -o
    /root/.bashrc``), or ""."""
    if not word.startswith("-") or word.startswith("--") or len(word) < 2:
        return ""
    for letter in word[1:]:
        if letter in _SHORT_FILE:
            return _SHORT_FILE[letter]
        if letter in _SHORT_WITH_ARGUMENT:
            return ""  # the rest of the word is this option's argument
    return ""


def option_problems(options: Sequence[str], field: str) -> list[Problem]:
    """The options of ``field`` that would run a program or touch files outside the run folder."""
    problems = []
    for i, word in enumerate(options):
        name = _long_name(word)
        hit = ""
        if name and len(name) >= _MIN_PREFIX:
            hit = next((o for o in PROGRAM_OPTIONS if o.startswith(name)), "")
        if not hit:
            hit = _short_file_option(word)
        if hit:
            what = ("runs a program on the nodes" if "log" in hit else "runs a command" if hit == "wrap"
                    else "copies the program to a path on the nodes" if hit == "bcast"
                    else "writes or reads a file outside the run folder")
            problems.append(Problem(field, f"{word!r} (--{hit}) {what}; a preset may not run what you did not choose: "
                                           "remove it, or set slurm.allow_program_options: true"))
            continue
        if name and "export".startswith(name) and len(name) >= _MIN_PREFIX:
            value = word.split("=", 1)[1] if "=" in word else (options[i + 1] if i + 1 < len(options) else "")
            named = {part.split("=", 1)[0].strip() for part in value.split(",")}
            bad = sorted(named & set(CODE_VARIABLES))
            if bad:
                problems.append(Problem(field, f"{word!r} sets {', '.join(bad)}, which make the step's programs load "
                                               "code of their own; remove it, or set slurm.allow_program_options: true"))
    return problems


def python_problems(config: RunConfig) -> list[Problem]:
    """Each host's ``python`` must name a Python interpreter (as a path or a command name)."""
    problems = []
    for i, host in enumerate(config.cluster.hosts):
        python = str(getattr(host, "python", "") or "").strip()
        name = python.replace("\\", "/").rsplit("/", 1)[-1]
        if python and not INTERPRETER.match(name):
            problems.append(Problem(f"cluster.hosts[{i}].python", (
                f"{python!r} is not a Python interpreter's name; expected python, python3 or python3.N (a path to "
                "one, e.g. /opt/venv/bin/python): it runs on the host as the supervisor's and the tasks' Python")))
    return problems


def allowed(slurm: object) -> bool:
    """Whether the user opted in to options that run programs (``slurm.allow_program_options``)."""
    return bool(getattr(slurm, "allow_program_options", False))


def slurm_problems(config: RunConfig) -> list[Problem]:
    """The Slurm options of every Slurm group that run programs, unless that group opted in."""
    problems = []
    for i, host in enumerate(config.cluster.hosts):
        s = getattr(host, "slurm", None)
        if not getattr(host, "is_slurm", False) or s is None or allowed(s):
            continue
        problems += option_problems(tuple(s.srun_options), f"cluster.hosts[{i}].slurm.srun_options")
        problems += option_problems(tuple(s.sbatch_options), f"cluster.hosts[{i}].slurm.sbatch_options")
    return problems


def problems(config: RunConfig) -> list[Problem]:
    """Everything in ``config`` that would run code the user did not choose."""
    return python_problems(config) + slurm_problems(config)


def shown(config: RunConfig) -> list[Problem]:
    """What runs code by the user's choice and is said before every launch: the scripts the config names (the
    check before launch imports them), a host's ``python`` other than the default, and Slurm options let through
    by ``slurm.allow_program_options``."""
    out = []
    scripts = [("model.script", config.model.script, "builds the model") if config.model.name == "script" else None,
               ("data.path", config.data.path, "makes the data") if config.data.source == "script" else None,
               ("program.script", config.program.script, "is the training program")
               if config.program is not None and config.program.script.strip() else None]
    for field_name, path, role in filter(None, scripts):
        out.append(Problem(field_name, f"runs your script {path!r} in every task (it {role})"))
    for i, host in enumerate(config.cluster.hosts):
        python = str(getattr(host, "python", "") or "").strip()
        if python and python != "python3" and not host.is_local:
            out.append(Problem(f"cluster.hosts[{i}].python", f"runs {python!r} on {host.name!r} as the Python of "
                                                              "its supervisor and tasks"))
        s = getattr(host, "slurm", None)
        if s is not None and getattr(host, "is_slurm", False) and allowed(s):
            opts = [*s.sbatch_options, *s.srun_options]
            risky = option_problems(tuple(opts), "")
            if risky:
                out.append(Problem(f"cluster.hosts[{i}].slurm", "slurm.allow_program_options is on: "
                                                                + "; ".join(p.message.split(";")[0] for p in risky)))
    return out
