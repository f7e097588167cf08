"""``python -m engine.cli`` and the ``clusterdeck`` script: the ``clusterdeck`` command.

Ctrl-C while the command's modules load ends it quietly (exit 130); :func:`engine.cli.main.main`
handles every later one.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted(signum: int, frame: object) -> None:
    try:
        os.write(2, b"clusterdeck: interrupted (Ctrl-C)\n")
    finally:
        os._exit(128 + signum)


def run() -> int:
    """The console script's entry point."""
    signal.signal(signal.SIGINT, _interrupted)
    from engine.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
