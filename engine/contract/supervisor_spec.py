"""The supervisor's spec: the one JSON line the launcher sends each supervisor first, declared once here.

A launcher and a supervisor may come from different ClusterDeck versions (a remote host updated apart from this
machine). The spec carries its version (``v``, :data:`SPEC_VERSION`); a supervisor refuses a spec of another
version (or none) with a :class:`SpecError` that says which version it got, which it expected and what to do, and
the launcher quotes that (the supervisor's stderr) as the host's failure. Fields:

- ``run_dir``: the run folder on the supervisor's host; ``host``: the supervisor's group name;
- ``tasks``: the host's task plans (:meth:`engine.contract.task_plan.TaskPlan.to_dict`);
- ``python``: the interpreter that starts the tasks; ``env``: variables every task gets;
- ``restart_on_failure`` / ``max_task_restarts``: tasks the supervisor restarts itself when they fail (async
  workers), and how often at most; ``restarts``: each task's count so far (a host started again keeps them);
- ``takeover``: first end what an earlier supervisor of this run and host left there;
- ``config_yaml``: the run's config, written into the folder (a remote host has no copy of it);
- ``sample_interval``: seconds between two samples of the tasks' CPU, memory and GPU use.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.contract.task_plan import TaskPlan

#: The version of the spec's fields; bumped by any change a supervisor of another version would misread.
SPEC_VERSION = 1
#: Seconds between two samples of a supervisor's tasks (CPU, memory, GPU) unless the spec says otherwise.
SAMPLE_INTERVAL = 0.5


class SpecError(ValueError):
    """A spec line this supervisor cannot take: another version, not JSON, a missing or mistyped field."""


@dataclass(frozen=True)
class SupervisorSpec:
    """What one supervisor is asked to run (see the module docstring for each field)."""

    run_dir: str
    tasks: tuple[TaskPlan, ...]
    host: str = "local"
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    restart_on_failure: tuple[str, ...] = ()
    max_task_restarts: int = 10
    takeover: bool = False
    restarts: dict[str, int] = field(default_factory=dict)
    config_yaml: str = ""
    sample_interval: float = SAMPLE_INTERVAL

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tasks"] = [t.to_dict() for t in self.tasks]
        out["restart_on_failure"] = list(self.restart_on_failure)
        return {"v": SPEC_VERSION, **out}

    def to_json(self) -> str:
        """The spec's line (ending in a newline) for the supervisor's stdin."""
        return json.dumps(self.to_dict(), separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, line: str | bytes) -> SupervisorSpec:
        """The spec on ``line``; :class:`SpecError` where it is not one of this version."""
        try:
            data = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError(f"the launcher's spec line is not JSON ({exc}); expected one JSON object") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> SupervisorSpec:
        if not isinstance(data, dict):
            raise SpecError(f"the launcher's spec is a {type(data).__name__}; expected a JSON object")
        version = data.get("v")
        if version != SPEC_VERSION or isinstance(version, bool):
            got = "no version" if version is None else f"version {version!r}"
            raise SpecError(f"the launcher sent a supervisor spec of {got}; this supervisor reads version "
                            f"{SPEC_VERSION} only: the launcher and this host run different ClusterDeck versions "
                            "(install the same version on both)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"v"})
        if unknown:
            raise SpecError(f"the launcher's spec has unknown field(s) {', '.join(unknown)}; expected only "
                            f"{', '.join(sorted(known))}")
        try:
            values = {k: v for k, v in data.items() if k != "v"}
            values["tasks"] = tuple(TaskPlan.from_dict(t) for t in data["tasks"])
            values["restart_on_failure"] = tuple(str(n) for n in data.get("restart_on_failure", ()))
            values["env"] = {str(k): str(v) for k, v in dict(data.get("env", {})).items()}
            values["restarts"] = {str(k): v for k, v in dict(data.get("restarts", {})).items() if isinstance(v, int)}
            values["max_task_restarts"] = int(data.get("max_task_restarts", 10))
            values["sample_interval"] = float(data.get("sample_interval", SAMPLE_INTERVAL))
            values["takeover"] = bool(data.get("takeover", False))
            spec = cls(**values)
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"the launcher's spec is malformed ({exc!r}); expected the fields of "
                            "engine.contract.supervisor_spec.SupervisorSpec") from None
        if not isinstance(spec.run_dir, str) or not spec.run_dir:
            raise SpecError(f"the launcher's spec has run_dir={spec.run_dir!r}; expected a folder path")
        return spec
