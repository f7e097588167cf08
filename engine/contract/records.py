"""The wire's records, declared once: every event kind and supervisor command with its fields, and the
state enums.

:mod:`engine.contract.events` decodes and checks lines against these declarations; ``docs/events.md`` is
generated from them (``python -m engine.contract.records > docs/events.md``; a test keeps it current).
To add an event field, follow the checklist in docs/architecture.md ("Where to add…", "An event field").
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

#: Versions of the event and command lines (a reader refuses any other).
EVENT_VERSION = 1
COMMAND_VERSION = 1


try:
    from enum import StrEnum
except ImportError:  # Python 3.10: the same, spelled out (str() and f-strings give the value)

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)


class TaskState(StrEnum):
    """A task's state, as its ``status`` events say it (``pending``: not started yet, never sent)."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.FINISHED, TaskState.FAILED, TaskState.STOPPED)


class RunPhase(StrEnum):
    """A run's state, as the launcher's ``run`` events say it."""

    PENDING = "pending"  # waiting for a scheduler's allocation
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


#: The states that end a task or a run.
TERMINAL = (TaskState.FINISHED.value, TaskState.FAILED.value, TaskState.STOPPED.value)

NUMBER = (int, float)
NULLABLE_NUMBER = (int, float, type(None))


@dataclass(frozen=True)
class Field:
    """One field of a record: its name, the JSON types it may hold, whether every record has it, help."""

    name: str
    types: tuple[type, ...]
    required: bool
    help: str


def f(name: str, types: type | tuple[type, ...], help: str, *, required: bool = False) -> Field:
    return Field(name, types if isinstance(types, tuple) else (types,), required, help)


#: Fields of every event.
COMMON = (
    f("v", int, "the event schema version (1)", required=True),
    f("kind", str, "one of the kinds below", required=True),
    f("task", str, "who sent it: a task (`worker:0`), `launcher` or `supervisor@<host>`", required=True),
    f("t", NUMBER, "wall time, seconds since the epoch", required=True),
)

#: Every event kind: what it says, and its own fields. Unknown extra fields are kept (an ``info`` carries any).
EVENTS: dict[str, tuple[str, tuple[Field, ...]]] = {
    "step": ("a replica's figures since its previous report", (
        f("replica", int, "the replica's id, from 0 across the run", required=True),
        f("step", int, "the last step counted", required=True),
        f("loss", NULLABLE_NUMBER, "the replica's own mean loss (regularization included)"),
        f("examples_per_sec", NULLABLE_NUMBER, "the replica's throughput"),
        f("step_time", NULLABLE_NUMBER, "seconds per step"),
        f("sync_wait", NULLABLE_NUMBER, "seconds of a step spent waiting in the gradient all-reduce (data mode)"),
        f("own_time", NULLABLE_NUMBER, "seconds of a step spent on its own work (step_time - sync_wait)"),
        f("input_wait", NULLABLE_NUMBER, "seconds of a step spent waiting for its batch (the input pipeline)"),
        f("dispatch_wait", NULLABLE_NUMBER, "async: seconds per step the worker waited for the chief's next function"),
        f("worker", int, "async: the worker that ran the steps"),
        f("steps", int, "async: steps the worker ran since its previous report"),
        f("sampled", int, "async: the sampled steps the figures are the means of"),
        f("metrics", dict, "the replica's training metrics by name (compiled metrics, or a program's)"),
        f("epoch_loss", NULLABLE_NUMBER, "fit callback: Keras' running mean of the epoch"),
    )),
    "eval": ("held-out evaluation (validation in the loop, or the evaluator task)", (
        f("step", int, "the step of the weights evaluated", required=True),
        f("loss", NULLABLE_NUMBER, "the held-out loss"),
        f("metrics", dict, "the held-out metrics by name"),
        f("examples", int, "held-out examples evaluated"),
        f("accuracy", NULLABLE_NUMBER, "the evaluator's accuracy (also in metrics)"),
        f("seconds", NUMBER, "how long the evaluation took"),
    )),
    "device": ("a task's device use, sampled by its supervisor (or TensorFlow's memory, by the task)", (
        f("cpu_percent", NULLABLE_NUMBER, "CPU use of the task's processes"),
        f("rss_bytes", NULLABLE_NUMBER, "resident memory"),
        f("tf_bytes", NULLABLE_NUMBER, "TensorFlow's allocator: bytes in use on `device`"),
        f("tf_peak_bytes", NULLABLE_NUMBER, "TensorFlow's allocator: the peak"),
        f("gpu_util", NULLABLE_NUMBER, "GPU utilisation, %"),
        f("gpu_mem_bytes", NULLABLE_NUMBER, "GPU memory of the task's processes"),
        f("device", str, "the TensorFlow device of tf_bytes"),
        f("device_index", int, "its index on the task"),
        f("pid", int, "the task's process id"),
    )),
    "status": ("a task's state changed", (
        f("state", str, "one of TaskState: " + ", ".join(s.value for s in TaskState), required=True),
        f("reason", str, "why it failed or stopped"),
        f("log_tail", list, "the last lines of its log"),
        f("pid", int, "its process id"),
        f("exit_code", (int, type(None)), "its exit code"),
        f("host", str, "the host it runs on"),
        f("role", str, "its role"),
        f("restarts", int, "times it was restarted"),
        f("step", int, "the step it is at"),
        f("total", int, "the steps of the run"),
    )),
    "info": ("something a person should read (with any extra fields)", (
        f("message", str, "the text", required=True),
        f("training", dict, "what trains: source, optimizer, learning_rate, loss, metrics, train_step"),
    )),
    "progress": ("the run's progress (async chief, programs)", (
        f("step", int, "steps completed"),
        f("total", int, "steps the run will take"),
        f("scheduled", int, "async: steps scheduled"),
        f("completed", int, "async: steps completed"),
    )),
    "run": ("the run's state, from the launcher", (
        f("state", str, "one of RunPhase: " + ", ".join(s.value for s in RunPhase), required=True),
        f("reason", str, "why it ended as it did (without the failed task's name)"),
        f("failed_task", str, "the task a failure is blamed on"),
        f("job_id", str, "pending: the scheduler's job id"),
    )),
    "placement": ("where variables live (async: the ps tasks; model: the mesh layouts)", (
        f("variables", list, "one entry per variable piece"),
    )),
}

#: Every supervisor command (launcher to supervisor, on its stdin): what it asks, and its fields.
COMMANDS: dict[str, tuple[str, tuple[Field, ...]]] = {
    "stop": ("end every task", (
        f("state", str, "what the tasks end as: stopped or finished"),
        f("reason", str, "why"),
        f("grace_s", NUMBER, "seconds between SIGTERM and SIGKILL"),
    )),
    "restart": ("restart one task", (
        f("task", str, "the task", required=True),
        f("reason", str, "why"),
    )),
    "signal": ("send one task a signal", (
        f("task", str, "the task", required=True),
        f("signal", str, "the signal's name, e.g. SIGKILL", required=True),
    )),
}


#: Each kind's declared fields (common ones included), made once: the decoder checks every event against them.
_FIELDS: dict[str, dict[str, Field]] = {kind: {x.name: x for x in (*COMMON, *fields)}
                                        for kind, (_, fields) in EVENTS.items()}


def fields_of(kind: str) -> dict[str, Field]:
    """The declared fields of an event kind (common ones included)."""
    return _FIELDS[kind]


#: Each kind's check, made once: (required names, {name: types}, {names whose types take no bool}).
_CHECKS: dict[str, tuple[tuple[str, ...], dict[str, tuple[type, ...]], frozenset[str]]] = {
    kind: (tuple(x.name for x in table.values() if x.required),
           {x.name: x.types for x in table.values()},
           frozenset(x.name for x in table.values() if bool not in x.types))
    for kind, table in _FIELDS.items()
}


def well_typed(kind: str, event: dict[str, object]) -> bool:
    """Every declared field of ``event`` present with one of its types (bool is no number), required ones there.

    Walks the event's own fields (a handful) rather than every declared one: this runs for every event the
    launcher reads."""
    required, types_of, no_bool = _CHECKS[kind]
    for name in required:
        if name not in event:
            return False
    for name, value in event.items():
        types = types_of.get(name)
        if types is None:
            continue  # a field no record declares: kept, never trusted
        if value.__class__ is bool and name in no_bool:
            return False
        if not isinstance(value, types):
            return False
    return True


#: The classes a JSON decoder gives (orjson, ``json``): a field no record declares may hold any of them.
_JSON_CLASSES: frozenset[type] = frozenset((dict, list, str, int, float, bool, type(None)))
#: The shapes of decoded events seen so far: (kind, the event's field names in order) -> for each field, the
#: classes its value may be (exact: a decoder gives no subclasses), or None (a required field missing).
_SHAPES: dict[tuple[str, tuple[str, ...]], tuple[frozenset[type], ...] | None] = {}
_MAX_SHAPES = 4096  # more shapes than this are checked without remembering them (a stream of odd names)


def _shape(kind: str, names: tuple[str, ...]) -> tuple[frozenset[type], ...] | None:
    required, types_of, _ = _CHECKS[kind]
    if any(name not in names for name in required):
        return None
    return tuple(frozenset(types_of[name]) if name in types_of else _JSON_CLASSES for name in names)


def well_typed_decoded(kind: str, event: dict[str, object]) -> bool:
    """:func:`well_typed` for an event a JSON decoder made (one kind of :data:`EVENTS`), checked against a table
    made once per shape (its field names in order: a stream's events share a few): each value's exact class
    in its field's declared types, with no loop in Python. A value of any other class (not from a JSON
    decoder) goes to :func:`well_typed`, which gives the same answer for every event."""
    names = tuple(event)
    key = (kind, names)
    shape = _SHAPES.get(key, _MISSING)
    if shape is _MISSING:
        shape = _shape(kind, names)
        if len(_SHAPES) < _MAX_SHAPES:
            _SHAPES[key] = shape
    if shape is None:
        return False
    if all(map(frozenset.__contains__, shape, map(type, event.values()))):  # type: ignore[arg-type]
        return True
    return well_typed(kind, event)


_MISSING: tuple[frozenset[type], ...] = ()


def _type_text(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", dict: "object", list: "array", type(None): "null"}
    words = [names.get(t, t.__name__) for t in types]
    if "integer" in words and "number" in words:
        words.remove("integer")
    return " or ".join(words)


def _table(title: str, fields: tuple[Field, ...]) -> list[str]:
    return ["", title, "", "| field | type | required | |", "| --- | --- | --- | --- |",
            *(f"| `{x.name}` | {_type_text(x.types)} | {'yes' if x.required else ''} | {x.help} |" for x in fields)]


def markdown() -> str:
    """``docs/events.md``: every event kind and command with its fields."""
    out = ["# Events and commands", "",
           "Generated from `engine/contract/records.py` (`python -m engine.contract.records > docs/events.md`).",
           "", f"Every event is one JSON object on one line, schema version {EVENT_VERSION}; readers never trust a "
           "line (a malformed, over-long or mistyped one is counted and skipped).", "",
           "| field | type | |", "| --- | --- | --- |"]
    out += [f"| `{x.name}` | {_type_text(x.types)} | {x.help} |" for x in COMMON]
    for kind, (what, fields) in EVENTS.items():
        out += _table(f"## `{kind}`: {what}", fields)
    out += ["", "## Supervisor commands", "", f"One JSON object a line on the supervisor's stdin, version "
            f"{COMMAND_VERSION}: `{{\"v\": {COMMAND_VERSION}, \"command\": NAME, ...}}`; an unknown command or field "
            "is refused."]
    for name, (what, fields) in COMMANDS.items():
        out += _table(f"### `{name}`: {what}", fields)
    out += ["", "## States", "", "Task states (`status.state`): " + ", ".join(f"`{s.value}`" for s in TaskState) + ".",
            "", "Run states (`run.state`): " + ", ".join(f"`{s.value}`" for s in RunPhase) + "."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
