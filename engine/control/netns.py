"""Private network namespaces for local runs.

TensorFlow's gRPC server listens on ``0.0.0.0:<port>`` whatever address the
cluster names, with no authentication, and runs any graph it is sent. A local
run therefore starts its supervisor (and so every task) inside a new network
namespace (``unshare -rn``) whose only interface is its own loopback: the tasks
reach each other, and nothing outside the namespace reaches them. Events still
flow through pipes, which namespaces do not affect.

:class:`engine.control.transports.NetnsTransport` starts the supervisor directly inside the namespace
(``unshare -rn python -m engine.control.supervisor --loopback-up``, :func:`wrap_supervisor`): the
supervisor brings the loopback up itself before it reads its spec, so no extra interpreter starts.
Any other program is started through the helper ``python -m engine.control.netns PROGRAM ARGS...``
(:func:`wrap`), which brings the loopback up and execs PROGRAM.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import socket
import struct
import subprocess
import sys

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "") where ``unshare -rn`` works for this user; else (False, why). Asked once per process.

    The probe runs ``unshare -rn true`` (a few milliseconds; no interpreter starts): a user allowed a
    user and network namespace of their own is also root inside it, so bringing its loopback up
    (:func:`loopback_up`, done by whatever :func:`wrap` starts) needs nothing more.
    """
    if not sys.platform.startswith("linux"):
        return False, "network namespaces exist only on Linux"
    tool = shutil.which("unshare")
    if tool is None:
        return False, "the 'unshare' command (util-linux) is not installed"
    true = shutil.which("true") or "/bin/true"
    try:
        probe = subprocess.run([tool, "-rn", true], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare failed: {exc}"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"unshare -rn is not allowed here ({why})"
    return True, ""


def wrap(cmd: list[str]) -> list[str]:
    """``cmd`` run inside a fresh private network namespace with its loopback up."""
    tool = shutil.which("unshare") or "unshare"
    return [tool, "-rn", sys.executable, "-m", "engine.control.netns", *cmd]


#: The supervisor's flag: bring the namespace's loopback up before anything else.
LOOPBACK_FLAG = "--loopback-up"


def wrap_supervisor(cmd: list[str]) -> list[str]:
    """The supervisor's command ``cmd`` run directly inside a fresh private network namespace: it brings
    the loopback up itself (:data:`LOOPBACK_FLAG`), saving the helper's interpreter."""
    tool = shutil.which("unshare") or "unshare"
    return [tool, "-rn", *cmd, LOOPBACK_FLAG]


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m engine.control.netns PROGRAM [ARGS...]", file=sys.stderr)
        sys.exit(2)
    loopback_up()
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
