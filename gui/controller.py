"""The app's one controller: the edited document, its undo stack, validation and the live run.

Widgets take the controller in their constructor, listen to its signals and
change state only through its methods. It never shows a dialog: methods raise
(:class:`~engine.contract.config.ConfigError` for anything a user can fix) and the main
window decides how to tell the user.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack

from engine.contract import config as cfg
from engine.contract import events
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.control import script_check
from engine.control.launcher import Run, default_runs_root, launch_problems
from engine.observe.telemetry import TERMINAL, RunState
from gui import document as doc_ops
from gui.document import Document

DRAIN_INTERVAL_MS = 33  # <= 30 Hz: events are folded and views told at most this often
FOLLOW_INTERVAL_MS = 500

#: Selection on the canvas: None, ("host", i) or ("task", i, j).
Selection = tuple[Any, ...] | None

_HOST_FIELD = re.compile(r"^cluster\.hosts\[(\d+)\](?:\.tasks\[(\d+)\])?")


def problem_target(problem: Problem) -> Selection:
    """The host or task a problem is about (None when it is about something else)."""
    m = _HOST_FIELD.match(problem.field)
    if not m:
        return None
    if m.group(2) is not None:
        return ("task", int(m.group(1)), int(m.group(2)))
    return ("host", int(m.group(1)))


def run_state_for(config: RunConfig) -> RunState:
    return RunState(total_steps=config.total_steps(), tasks=[(t.name, t.role, h.name) for h, t in config.cluster.tasks()])


class EventFileReader:
    """Reads an ``events.jsonl`` incrementally: only complete new lines, bad lines skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.stats = events.ReadStats()

    def read_new(self, limit: int = 64 * 1024 * 1024) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > events.MAX_LINE_BYTES:
            self.partial = b""
        return list(events.parse_lines(lines, self.stats))


def read_run_folder(path: Path) -> tuple[RunConfig, RunState, EventFileReader]:
    """The config and the folded events of a run folder (``config.yaml``, ``events.jsonl``)."""
    path = Path(path)
    if not (path / "config.yaml").is_file():
        raise ConfigError([Problem("", "not a run folder: it has no config.yaml")], str(path))
    config = cfg.load(path / "config.yaml", check=False)
    state = run_state_for(config)
    reader = EventFileReader(path / "events.jsonl")
    for event in reader.read_new():
        state.apply(event)
    if state.state not in TERMINAL:
        # a run whose launcher is gone leaves "running" in its events; run.json tells the end
        try:
            meta = json.loads((path / "run.json").read_text(encoding="utf-8"))
            if meta.get("state") in TERMINAL:
                state.state = str(meta["state"])
        except (OSError, ValueError):
            pass
    return config, state, reader


class DocumentCommand(QUndoCommand):
    """One undoable edit: the document before and after. Edits of the same field merge."""

    _ids: dict[str, int] = {}

    def __init__(self, controller: Controller, before: Document, after: Document, text: str,
                 merge_key: str = "") -> None:
        super().__init__(text)
        self.controller = controller
        self.before = before
        self.after = after
        self.merge_key = merge_key

    def id(self) -> int:
        if not self.merge_key:
            return -1
        return DocumentCommand._ids.setdefault(self.merge_key, len(DocumentCommand._ids) + 1)

    def mergeWith(self, other: QUndoCommand) -> bool:
        if not isinstance(other, DocumentCommand) or other.merge_key != self.merge_key or other.before != self.after:
            return False
        self.after = other.after
        return True

    def redo(self) -> None:
        self.controller._set_document(self.after)

    def undo(self) -> None:
        self.controller._set_document(self.before)


class Controller(QObject):
    """Owns the current :class:`RunConfig` (through a :class:`Document`), the undo stack and the run."""

    documentChanged = Signal()  # config or layout changed
    problemsChanged = Signal(list)  # list[Problem]
    selectionChanged = Signal(object)  # Selection
    pathChanged = Signal(object)  # Path | None
    runLoaded = Signal()  # self.state is a new RunState (new run, opened run folder, reset)
    runUpdated = Signal()  # new events folded into self.state
    runStateChanged = Signal(str)  # "starting", "running", "stopping", "finished", "failed", "stopped"
    comparisonsChanged = Signal()
    message = Signal(str)  # for the status bar
    startFailed = Signal(list)  # list[Problem]: a run checked in the background could not start

    def __init__(self, config: RunConfig | None = None, *, runs_root: Path | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.undo_stack = QUndoStack(self)
        self._checking: tuple[RunConfig, concurrent.futures.Future[list[Problem]]] | None = None
        self._check_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
        self._check_timer = QTimer(self)
        self._check_timer.setInterval(50)
        self._check_timer.timeout.connect(self._check_tick)
        self._doc = Document.of(config if config is not None else cfg.default_config())
        self._problems: list[Problem] = launch_problems(self._doc.config)
        self._selection: Selection = None
        self._path: Path | None = None
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
        self.state: RunState = run_state_for(self._doc.config)
        self.run_dir: Path | None = None
        self.run: Run | None = None
        self._events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stopping = False
        self._follow: EventFileReader | None = None
        self.comparisons: dict[str, RunState] = {}
        self._drain_timer = QTimer(self)
        self._drain_timer.setObjectName("drainTimer")
        self._drain_timer.setInterval(DRAIN_INTERVAL_MS)
        self._drain_timer.timeout.connect(self._drain)
        self._follow_timer = QTimer(self)
        self._follow_timer.setObjectName("followTimer")
        self._follow_timer.setInterval(FOLLOW_INTERVAL_MS)
        self._follow_timer.timeout.connect(self._follow_tick)

    # ------------------------------------------------------------------ document

    @property
    def config(self) -> RunConfig:
        return self._doc.config

    @property
    def document(self) -> Document:
        return self._doc

    @property
    def problems(self) -> list[Problem]:
        return list(self._problems)

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def is_modified(self) -> bool:
        return not self.undo_stack.isClean()

    def _set_document(self, doc: Document) -> None:
        """Apply a snapshot (undo commands call this); everything derived follows."""
        self._doc = doc
        problems = launch_problems(doc.config)
        self._fix_selection()
        if self.run is None and self.run_dir is None:
            # nothing launched or opened yet: the task table and progress show the config's tasks
            self.state = run_state_for(doc.config)
            self.runLoaded.emit()
        self.documentChanged.emit()
        if problems != self._problems:
            self._problems = problems
            self.problemsChanged.emit(self.problems)

    def _fix_selection(self) -> None:
        sel = self._selection
        hosts = self._doc.config.cluster.hosts
        ok = sel is None or (sel[1] < len(hosts) and (sel[0] == "host" or sel[2] < len(hosts[sel[1]].tasks)))
        if not ok:
            self._selection = None
            self.selectionChanged.emit(None)

    def edit(self, after: Document, text: str, merge_key: str = "") -> None:
        """Push an edit onto the undo stack (nothing when it changes nothing)."""
        if after == self._doc:
            return
        self.undo_stack.push(DocumentCommand(self, self._doc, after, text, merge_key))

    def set_config(self, config: RunConfig, text: str = "Edit config", merge_key: str = "") -> None:
        self.edit(Document(config, self._doc.layout).with_cluster(config.cluster), text, merge_key)

    def set_value(self, path: str, value: Any) -> None:
        """Set one field by its config path (``training.steps``, ``parallelism.mesh_batch``, ``name``)."""
        parts = path.split(".")
        config = self._doc.config
        if len(parts) == 1:
            new = cfg.replace(config, **{parts[0]: value})
        elif len(parts) == 2:
            section = getattr(config, parts[0])
            new = cfg.replace(config, **{parts[0]: cfg.replace(section, **{parts[1]: value})})
        else:
            raise ValueError(f"path: expected 'section.field' or 'field', got {path!r}")
        self.set_config(new, f"Set {path}", merge_key=path)

    def set_mode(self, mode: str, fix_cluster: bool = False) -> None:
        """Switch parallelism (and, with ``fix_cluster``, change the cluster to what the mode needs)."""
        config = self._doc.config
        parallelism = cfg.replace(config.parallelism, mode=mode)
        new = cfg.replace(config, parallelism=parallelism)
        if fix_cluster:
            cluster, _ = doc_ops.cluster_fix(new, mode)
            new = cfg.replace(new, cluster=cluster)
            if mode == "model":
                batch, model = doc_ops.mesh_fix(new)
                new = cfg.replace(new, parallelism=cfg.replace(parallelism, mesh_batch=batch, mesh_model=model))
        self.set_config(new, f"Parallelism: {mode}" + (" (cluster fixed)" if fix_cluster else ""))

    def add_host(self, position: tuple[float, float] | None = None) -> int:
        self.edit(doc_ops.add_host(self._doc, position), "Add host")
        i = len(self.config.cluster.hosts) - 1
        self.select(("host", i))
        return i

    def remove_host(self, i: int) -> None:
        self.select(None)
        self.edit(doc_ops.remove_host(self._doc, i), f"Delete host {self.config.cluster.hosts[i].name}")

    def update_host(self, i: int, **changes: Any) -> None:
        key = f"host[{i}]." + ",".join(sorted(changes))
        self.edit(doc_ops.update_host(self._doc, i, **changes), f"Edit host {self.config.cluster.hosts[i].name}", key)

    def move_host(self, i: int, position: tuple[float, float]) -> None:
        self.edit(doc_ops.move_host(self._doc, i, position), f"Move host {self.config.cluster.hosts[i].name}")

    def add_task(self, i: int, role: str = "worker") -> tuple[int, int]:
        self.edit(doc_ops.add_task(self._doc, i, role), f"Add {role} task")
        j = len(self.config.cluster.hosts[i].tasks) - 1
        self.select(("task", i, j))
        return i, j

    def remove_task(self, i: int, j: int) -> None:
        self.select(None)
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.remove_task(self._doc, i, j), f"Delete task {name}")

    def update_task(self, i: int, j: int, **changes: Any) -> None:
        key = f"task[{i},{j}]." + ",".join(sorted(changes))
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.update_task(self._doc, i, j, **changes), f"Edit task {name}", key)

    def move_task(self, i: int, j: int, k: int) -> None:
        if i == k:
            return
        name = self.config.cluster.hosts[i].tasks[j].name
        self.edit(doc_ops.move_task(self._doc, i, j, k), f"Move {name} to {self.config.cluster.hosts[k].name}")
        self.select(("task", k, len(self.config.cluster.hosts[k].tasks) - 1))

    def delete_selection(self) -> None:
        sel = self._selection
        if sel is None:
            return
        if sel[0] == "host":
            self.remove_host(sel[1])
        else:
            self.remove_task(sel[1], sel[2])

    # ------------------------------------------------------------------ selection

    @property
    def selection(self) -> Selection:
        return self._selection

    def select(self, selection: Selection) -> None:
        if selection != self._selection:
            self._selection = selection
            self.selectionChanged.emit(selection)

    # ------------------------------------------------------------------ files

    def new_document(self, config: RunConfig | None = None) -> None:
        self._replace(config if config is not None else cfg.default_config(), None)

    def open_preset(self, path: str | Path) -> RunConfig:
        """Load a YAML preset (raises :class:`ConfigError` naming the field)."""
        path = Path(path)
        config = cfg.load(path, check=False)
        self._replace(config, path)
        return config

    def save(self, path: str | Path | None = None) -> Path:
        """Save to ``path`` (or the current file); the undo stack becomes clean."""
        target = Path(path) if path is not None else self._path
        if target is None:
            raise ValueError("path: expected a file name for a document never saved, got None")
        try:
            cfg.save(self.config, target)
        except OSError as exc:
            raise ConfigError([Problem("", f"cannot be written: {exc.strerror or exc}")], str(target)) from None
        self.undo_stack.setClean()
        if target != self._path:
            self._path = target
            self.pathChanged.emit(target)
        self.message.emit(f"Saved {target}")
        return target

    def _replace(self, config: RunConfig, path: Path | None) -> None:
        self.undo_stack.clear()
        self._selection = None
        self.selectionChanged.emit(None)
        self._path = path
        self._set_document(Document.of(config))
        self.undo_stack.setClean()
        self.pathChanged.emit(path)

    # ------------------------------------------------------------------ runs

    @property
    def is_running(self) -> bool:
        """A launched run whose end the controller has not folded in yet (or its pre-launch check)."""
        return self.run is not None or self._checking is not None

    @property
    def run_state(self) -> str:
        if self._checking is not None:
            return "checking"
        if self._stopping and self.run is not None:
            return "stopping"
        return self.state.state

    def start_run(self) -> Path | None:
        """Launch the current config; returns the run folder. Raises ConfigError when it cannot start.

        A config naming the user's script is checked first in a background thread (the check
        imports TensorFlow in a subprocess: seconds); then None is returned, and the run starts
        when the check passes, or ``startFailed`` reports its problems.
        """
        if self.run is not None or self._checking is not None:
            raise RuntimeError("a run is in progress; stop it first")
        problems = launch_problems(self.config)
        if problems:
            raise ConfigError(problems)
        if script_check.uses_script(self.config):
            config = self.config
            self._checking = (config, self._check_pool.submit(launch_problems, config, deep=True))
            self._check_timer.start()
            self.runStateChanged.emit("checking")
            self.message.emit("Checking your script before the run starts…")
            return None
        return self._launch(self.config, checked=False)

    def _check_tick(self) -> None:
        if self._checking is None:
            self._check_timer.stop()
            return
        config, future = self._checking
        if not future.done():
            return
        self._check_timer.stop()
        self._checking = None
        try:
            problems = future.result()
        except Exception as exc:  # noqa: BLE001 - any failure of the check is shown, never raised into Qt
            problems = [Problem("", f"the check could not run: {exc}")]
        if problems:
            self.runStateChanged.emit("idle")
            self.startFailed.emit(problems)
            return
        try:
            self._launch(config, checked=True)
        except ConfigError as exc:
            self.runStateChanged.emit("idle")
            self.startFailed.emit(exc.problems)

    def _launch(self, config: RunConfig, *, checked: bool) -> Path:
        self._stop_follow()
        run = Run(config, runs_root=self.runs_root, checked=checked)
        self._events = queue.SimpleQueue()
        run.add_listener(self._events.put)  # called on the run's dispatcher thread: only enqueue there
        self.state = run_state_for(config)
        self.state.state = "starting"
        try:
            run_dir = run.start()
        except OSError as exc:
            raise ConfigError([Problem("", f"the run could not start: {exc}")]) from None
        self.run = run
        self.run_dir = run_dir
        self._stopping = False
        self._drain_timer.start()
        self.runLoaded.emit()
        self.runStateChanged.emit("starting")
        self.message.emit(f"Run started in {run_dir}")
        return run_dir

    def stop_run(self) -> None:
        """Ask the run to stop; returns at once (the end arrives as a ``run`` event)."""
        if self._checking is not None:  # not started yet: forget the check's outcome
            self._checking = None
            self._check_timer.stop()
            self.runStateChanged.emit("idle")
            self.message.emit("Run cancelled before it started")
            return
        if self.run is None or self._stopping:
            return
        self._stopping = True
        self.run.stop(wait=False)
        self.runStateChanged.emit("stopping")
        self.message.emit("Stopping the run…")

    def _drain(self) -> None:
        """Fold queued events into our RunState (GUI thread, timer-driven)."""
        run = self.run
        if run is None:
            self._drain_timer.stop()
            return
        was = self.state.state
        done = run.done  # read before draining: every event precedes ``done``
        count = 0
        while count < 50_000:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            self.state.apply(event)
            count += 1
        if count:
            self.runUpdated.emit()
        if self.state.state != was and not self._stopping:
            self.runStateChanged.emit(self.state.state)
        if done and self._events.empty():
            self._drain_timer.stop()
            self.run = None
            self._stopping = False
            self.runStateChanged.emit(self.state.state)
            self.message.emit(self._end_message())

    def _end_message(self) -> str:
        s = self.state
        if s.state == "finished":
            return f"Run finished: {s.step} steps"
        if s.state == "failed":
            return f"Run failed: {s.reason}"
        return f"Run {s.state}" + (f": {s.reason}" if s.reason else "")

    def open_run(self, path: str | Path) -> None:
        """Show a past (or still running) run folder: its config, task states and curves."""
        if self.run is not None:
            raise RuntimeError("a run is in progress; stop it first")
        path = Path(path)
        config, state, reader = read_run_folder(path)
        self._stop_follow()
        self._replace(config, None)
        self.state = state
        self.run_dir = path
        self.runLoaded.emit()
        self.runStateChanged.emit(state.state)
        if state.state not in TERMINAL:
            self._follow = reader
            self._follow_timer.start()
        self.message.emit(f"Opened run {path.name}: {state.state}, {state.step} steps")

    def _follow_tick(self) -> None:
        if self._follow is None:
            self._follow_timer.stop()
            return
        new = self._follow.read_new()
        for event in new:
            self.state.apply(event)
        if new:
            self.runUpdated.emit()
            if self.state.state in TERMINAL:
                self.runStateChanged.emit(self.state.state)
                self._stop_follow()

    def _stop_follow(self) -> None:
        self._follow_timer.stop()
        self._follow = None

    def compare_with(self, path: str | Path) -> str:
        """Overlay another run's curves; returns its label."""
        path = Path(path)
        _, state, _ = read_run_folder(path)
        if not state.history.series:
            raise ConfigError([Problem("", "this run has no recorded steps to compare with")], str(path))
        label = path.name
        self.comparisons[label] = state
        self.comparisonsChanged.emit()
        return label

    def clear_comparisons(self) -> None:
        if self.comparisons:
            self.comparisons.clear()
            self.comparisonsChanged.emit()

    def reset_run_view(self) -> None:
        """Forget the shown run (not allowed while one is in progress)."""
        if self.run is not None:
            return
        self._stop_follow()
        self.state = run_state_for(self.config)
        self.run_dir = None
        self.runLoaded.emit()
        self.runStateChanged.emit(self.state.state)

    def shutdown(self) -> None:
        """Stop timers, and the run if any (without waiting for it)."""
        self._stop_follow()
        self._check_timer.stop()
        self._checking = None
        self._check_pool.shutdown(wait=False, cancel_futures=True)
        if self.run is not None:
            self.stop_run()
        else:
            self._drain_timer.stop()
