"""The follower protocol: what ``clusterdeck follow`` says on its stdout and reads on its stdin, over the user's
own OpenSSH, and how a front end names and dials a remote run.

Every line the follower writes is a versioned event, read with the one decoder
(:func:`engine.contract.events.decode`): a run's own events pass as they are, and the follower's own words are
``info`` events from the task :data:`FOLLOWER_TASK` with a ``follow`` field saying what they are:

``hello``
    always first: ``protocol`` (:data:`PROTOCOL`), ``version`` (ClusterDeck's), ``host``, ``pid``; once the run is
    found also ``run_dir`` and ``state`` (the folder's state, ``interrupted`` where its launcher died).
``error``
    ``message`` says what is wrong (not a run folder, another user's run, …); the follower then exits 2.
``blob``
    a part of a named payload too large for one line: ``name``, ``part``, ``parts``, ``data`` (base64); the
    first part carries the payload's own fields. ``config`` is the run's ``config.yaml``; ``series:step`` and
    ``series:device`` are the first view of the curves (:func:`encode_block`: an Arrow IPC stream).
``owners``
    the series' owners (``series/owners.jsonl``), before the series blobs.
``history``
    the history is complete: the run's lifecycle events were sent before it (and on a resumed follower the raw
    samples newer than ``--since``); ``state`` as in ``hello``; ``gap_s`` where samples newer than ``--since``
    are no longer kept at full rate. Live events follow.
``reply``
    the answer to a command (``id``, ``reply``: the launcher's reply object, ``ok`` and ``error`` included).
``row``
    ``clusterdeck follow --list``: one run of the runs folder (``row``: the fields of ``clusterdeck ls --json``).
``end``
    the run ended (``state``); the follower exits 0 after it.

Commands on the follower's stdin are control-socket requests (:mod:`engine.control.control_socket`):
``{"v": 1, "command": "status"|"stop"|"restart", "id": N, "by": "..."}``, forwarded to the run's ``control.sock``, and
``{"v": 1, "command": "ping"}`` every :data:`PING_S` seconds, which it does not answer. The follower exits when
its stdin closes (the front end detached: nothing stays behind), once the run ended, and when it heard nothing
for :data:`SILENCE_S` seconds with no command in flight (a front end cut off by the network).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import version
from engine.contract import events

if TYPE_CHECKING:  # numpy and pyarrow load while ssh connects (a front end imports this module first)
    from engine.contract.series_store import Block, Owner

__all__ = ["FOLLOWER_TASK", "PROTOCOL", "BlobAssembler", "RemoteTarget", "TargetError", "decode_block",
           "encode_block", "is_message", "message", "version"]

#: The follower protocol's version: a front end and a follower must speak the same one.
PROTOCOL = 1
#: The ``task`` of the follower's own lines.
FOLLOWER_TASK = "follower"
#: Base64 characters per ``blob`` line (a line stays well under ``MAX_LINE_BYTES``).
CHUNK_CHARS = 48 * 1024
#: What the remote shell prints when no ``clusterdeck`` command is found there.
MISSING_MARK = "clusterdeck-follow: no clusterdeck command found"
#: The subcommand the front end runs on the remote host.
FOLLOW_COMMAND = "follow"
#: A front end says ``ping`` on the follower's stdin this often (seconds) ...
PING_S = 10.0
#: ... and a follower that heard nothing for this long (no command in flight) ends itself: a front end behind a
#: network partition is gone even when sshd has not noticed yet, and nothing may stay behind it.
SILENCE_S = 45.0
#: Sets :data:`SILENCE_S` of a follower (tests).
SILENCE_ENV = "CLUSTERDECK_FOLLOW_SILENCE_S"


def message(what: str, text: str = "", **fields: Any) -> dict[str, Any]:
    """One of the follower's own lines (an ``info`` event of :data:`FOLLOWER_TASK`)."""
    return events.make("info", FOLLOWER_TASK, message=text or what, follow=what, **fields)


def is_message(event: dict[str, Any]) -> bool:
    return event.get("task") == FOLLOWER_TASK and event.get("kind") == "info" and isinstance(event.get("follow"), str)


def blob(name: str, data: bytes, **fields: Any) -> Iterator[dict[str, Any]]:
    """``data`` as ``blob`` lines of at most :data:`CHUNK_CHARS` base64 characters each."""
    text = base64.b64encode(data).decode("ascii")
    parts = max(1, -(-len(text) // CHUNK_CHARS))
    for i in range(parts):
        extra = fields if i == 0 else {}
        yield message("blob", name, name=name, part=i, parts=parts, data=text[i * CHUNK_CHARS:(i + 1) * CHUNK_CHARS],
                      **extra)


class BlobAssembler:
    """Puts ``blob`` lines back together: :meth:`add` returns ``(name, data, fields)`` once a blob is whole."""

    def __init__(self) -> None:
        self._parts: dict[str, list[str]] = {}
        self._fields: dict[str, dict[str, Any]] = {}

    def add(self, event: dict[str, Any]) -> tuple[str, bytes, dict[str, Any]] | None:
        name, part, parts, data = event.get("name"), event.get("part"), event.get("parts"), event.get("data")
        if not (isinstance(name, str) and isinstance(part, int) and isinstance(parts, int) and isinstance(data, str)):
            raise ValueError("a blob line without its name, part, parts or data")
        if part == 0:
            self._parts[name] = []
            self._fields[name] = {k: v for k, v in event.items()
                                  if k not in ("v", "kind", "task", "t", "message", "follow", "name", "part", "parts",
                                               "data")}
        got = self._parts.get(name)
        if got is None or len(got) != part:
            raise ValueError(f"blob {name!r}: part {part} out of order")
        got.append(data)
        if len(got) < parts:
            return None
        del self._parts[name]
        return name, base64.b64decode("".join(got)), self._fields.pop(name, {})


# --------------------------------------------------------------------------- the curves' first view


def encode_block(block: Block) -> bytes:
    """A view's rows (:class:`~engine.contract.series_store.Block`) as an LZ4-compressed Arrow IPC stream."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    arrays = {"owner": pa.array(block.owner, pa.uint32()), "t_first": pa.array(block.t_first, pa.float64()),
              "t_last": pa.array(block.t_last, pa.float64()), "x_first": pa.array(block.x_first, pa.float64()),
              "x_last": pa.array(block.x_last, pa.float64()), "n": pa.array(block.n, pa.uint32())}
    for c in block.cols:
        arrays[f"{c}:min"] = pa.array(block.min[c], pa.float32())
        arrays[f"{c}:max"] = pa.array(block.max[c], pa.float32())
        arrays[f"{c}:last"] = pa.array(block.last[c], pa.float32())
        arrays[f"{c}:sum"] = pa.array(block.sum[c], pa.float64())
        arrays[f"{c}:count"] = pa.array(block.count[c], pa.uint32())
    batch = pa.RecordBatch.from_pydict(arrays)
    meta = {b"width": repr(float(block.width)).encode(), b"cols": json.dumps(block.cols).encode()}
    schema = batch.schema.with_metadata(meta)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(batch.replace_schema_metadata(meta))
    return bytes(sink.getvalue())


def decode_block(data: bytes) -> Block:
    """:func:`encode_block`'s bytes back as a Block (raises ``ValueError`` on anything else)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from engine.contract.series_store import Block

    try:
        reader = ipc.open_stream(pa.py_buffer(data))
        table = reader.read_all()
        meta = table.schema.metadata or {}
        cols = json.loads(meta.get(b"cols", b"[]"))
        width = float(meta.get(b"width", b"0"))

        def col(name: str, dtype: Any) -> Any:
            return np.asarray(table.column(name).to_numpy(), dtype)

        block = Block(col("owner", np.uint32), col("t_first", np.float64), col("t_last", np.float64),
                      col("x_first", np.float64), col("x_last", np.float64), col("n", np.uint32),
                      [str(c) for c in cols], width)
        for c in block.cols:
            block.min[c], block.max[c] = col(f"{c}:min", np.float32), col(f"{c}:max", np.float32)
            block.last[c], block.sum[c] = col(f"{c}:last", np.float32), col(f"{c}:sum", np.float64)
            block.count[c] = col(f"{c}:count", np.uint32)
    except (pa.ArrowException, KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"the curves' view cannot be read ({exc})") from None
    return block


def owner_fields(owner: Owner) -> dict[str, Any]:
    return {"id": owner.id, "group": owner.group, "task": owner.task, "replica": owner.replica,
            "device": owner.device, "first": owner.first}


def owner_of(fields: dict[str, Any]) -> Owner:
    from engine.contract.series_store import Owner

    return Owner(int(fields["id"]), str(fields["group"]), str(fields.get("task", "")), fields.get("replica"),
                 fields.get("device"), dict(fields.get("first") or {}))


# --------------------------------------------------------------------------- where a remote run is


class TargetError(ValueError):
    """A remote target that cannot be read; the message says what was expected."""


_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.%-]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_EXPECTED = "expected [user@]host:/path/to/run (as scp takes it) or ssh://[user@]host[:port]/path"


@dataclass(frozen=True)
class RemoteTarget:
    """A run folder (or a runs folder) on another machine: what ssh dials, and the path there."""

    host: str
    user: str = ""
    port: int | None = None
    path: str = ""

    @property
    def login(self) -> str:
        """``user@host`` (or ``host``): how messages name the machine."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            return f"ssh://{self.user + '@' if self.user else ''}{host}:{self.port}{'/' if self.path[:1] != '/' else ''}" \
                   f"{self.path}"
        login = f"{self.user}@{host}" if self.user else host
        return f"{login}:{self.path}" if self.path else login

    @classmethod
    def parse(cls, text: str, *, need_path: bool) -> RemoteTarget:
        """``[user@]host:path``, ``[user@]host`` (when ``need_path`` is false) or ``ssh://[user@]host[:port]/path``."""
        word = text.strip()
        if not word or any(ch in word for ch in "\n\r\0"):
            raise TargetError(f"{text!r}: {_EXPECTED}")
        port: int | None = None
        if word.startswith("ssh://"):
            rest = word[6:]
            login, slash, path = rest.partition("/")
            path = "/" + path if slash else ""
            if path.startswith("/~"):
                path = path[1:]
            user, at, hostport = login.rpartition("@")
            if hostport.startswith("["):
                host, _, after = hostport[1:].partition("]")
                port_text = after[1:] if after.startswith(":") else ""
            else:
                host, _, port_text = hostport.partition(":")
            if port_text:
                if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                    raise TargetError(f"{text!r}: the port {port_text!r} is not a number from 1 to 65535; {_EXPECTED}")
                port = int(port_text)
        else:
            if word.startswith("["):  # [::1]:/path
                host, _, after = word[1:].partition("]")
                user, path = "", after[1:] if after.startswith(":") else after
            else:
                login, colon, path = word.partition(":")
                user, _, host = login.rpartition("@")
                if not colon:
                    path = ""
        if not host:
            raise TargetError(f"{text!r}: no host named; {_EXPECTED}")
        if host.startswith("-") or not (_HOST.match(host) or re.match(r"^[0-9A-Fa-f:.]+$", host)):
            raise TargetError(f"{text!r}: {host!r} is not a host name or address; {_EXPECTED}")
        if user and not _USER.match(user):
            raise TargetError(f"{text!r}: {user!r} is not a user name; {_EXPECTED}")
        if need_path and not path:
            raise TargetError(f"{text!r}: no run named after the host; {_EXPECTED}")
        return cls(host=host, user=user, port=port, path=path)


def looks_remote(word: str) -> bool:
    """Whether a word a user gave for a run names one on another machine (``host:path``, ``user@host:…``,
    ``ssh://…``) rather than a folder or a run's name here. A path that exists here is always local."""
    if os.path.lexists(os.path.expanduser(word)):
        return False
    if word.startswith("ssh://"):
        return True
    head = word.split("/", 1)[0]
    return ":" in head or "@" in head


# --------------------------------------------------------------------------- the ssh command line


#: Seconds ssh may take to open the TCP connection (``ConnectTimeout``).
CONNECT_TIMEOUT_S = 10


def remote_shell(remote_command: str | None, args: list[str]) -> str:
    """The command line the remote shell runs: ``clusterdeck follow ARGS`` (``remote_command``: another command
    that starts ClusterDeck there, a shell prefix such as ``~/venv/bin/clusterdeck`` or ``python3 -m engine.cli``).
    Without one, ``clusterdeck`` on the PATH of a non-interactive login, else ``~/.local/bin/clusterdeck``; where
    neither is, :data:`MISSING_MARK` on stderr and exit 127."""
    quoted = shlex.join([FOLLOW_COMMAND, *args])
    if remote_command:
        return f"exec {remote_command} {quoted}"
    return (f"if command -v clusterdeck >/dev/null 2>&1; then exec clusterdeck {quoted}; fi; "
            f"if [ -x \"$HOME/.local/bin/clusterdeck\" ]; then exec \"$HOME/.local/bin/clusterdeck\" {quoted}; fi; "
            f"echo '{MISSING_MARK}' >&2; exit 127")


def ssh_argv(target: RemoteTarget, shell_line: str) -> list[str]:
    """The user's own OpenSSH client running ``shell_line`` on the target: the options ClusterDeck uses for its
    SSH hosts (:func:`engine.control.transports.ssh_command`: BatchMode, keep-alives, ``$CLUSTERDECK_SSH_CONFIG``,
    ``--`` before the destination) and a connect timeout."""
    from engine.contract.config import Host
    from engine.control.transports import ssh_command

    host = Host(name="remote", address=target.host, ssh_host=target.host, ssh_user=target.user,
                ssh_port=target.port or 22)
    argv = ssh_command(host, ["sh", "-c", shell_line])
    if not any(word.startswith("ConnectTimeout=") for word in argv[:argv.index("--")]):
        argv[1:1] = ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    return argv


def command_line(command: str, ident: int, **fields: Any) -> bytes:
    """A command for the follower's stdin (a control-socket request with an ``id``)."""
    from engine.control.control_socket import CONTROL_VERSION

    return json.dumps({"v": CONTROL_VERSION, "command": command, "id": ident, **fields}).encode("utf-8") + b"\n"
