"""The live terminal view of a run (rich): a progress bar, a row per replica, the run's notes, a summary.

``clusterdeck run`` shows it for the run it launched, ``clusterdeck attach`` for a run it follows from its
folder: both hand it a *source* with ``config``, ``state`` (a :class:`~engine.observe.telemetry.RunState`),
``done``, ``wait(timeout)``, ``add_listener(fn)`` and ``run_dir``.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine.cli import metrics_view
from engine.observe.telemetry import BREAKDOWN_PARTS, StepBreakdown

#: Cells of a replica's breakdown bar, and how each part is drawn: a glyph (told apart without colour) and
#: a colour.
BAR_CELLS = 8
PART_GLYPHS = {"compute": ("█", "green"), "collective": ("▓", "magenta"), "input": ("▒", "yellow"),
               "dispatch": ("░", "cyan")}
#: The parts a step waits in (the bar's note names the largest by its glyph).
WAITS = ("collective", "input", "dispatch")


class Source(Protocol):
    """What the view reads: a launched :class:`~engine.control.launcher.Run` or a followed run folder."""

    config: Any
    state: Any

    @property
    def done(self) -> bool: ...

    @property
    def run_dir(self) -> Any: ...

    def wait(self, timeout: float | None = None) -> str: ...

    def add_listener(self, listener: Any) -> None: ...


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def fmt_loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def bar_cells(shares: dict[str, float], cells: int = BAR_CELLS) -> list[tuple[str, int]]:
    """How many of ``cells`` each part fills (largest remainders: they always add up to ``cells``; a part
    with any share gets a cell where one is left to give)."""
    exact = [(name, max(0.0, shares.get(name, 0.0)) * cells) for name in BREAKDOWN_PARTS]
    total = sum(v for _, v in exact)
    if total <= 0:
        return []
    exact = [(name, v * cells / total) for name, v in exact]
    counts = {name: int(v) for name, v in exact}
    left = cells - sum(counts.values())
    for name, _ in sorted(exact, key=lambda item: item[1] - int(item[1]), reverse=True)[:left]:
        counts[name] += 1
    return [(name, counts[name]) for name in BREAKDOWN_PARTS if counts[name]]


def breakdown_text(b: StepBreakdown | None, cells: int = BAR_CELLS) -> str:
    """A replica's step as a stacked bar, then its largest wait's glyph and share (rich markup), ``-`` without
    figures: ``[green]█████[/][yellow]▒▒▒[/] [yellow]▒[/]41%`` (13 columns)."""
    if b is None or b.total <= 0:
        return "-"
    shares = b.shares()
    bar = "".join(f"[{PART_GLYPHS[name][1]}]{PART_GLYPHS[name][0] * n}[/]" for name, n in bar_cells(shares, cells))
    waits = [(shares[name], name) for name in WAITS if getattr(b, name) is not None]
    if not waits:
        return bar
    share, name = max(waits)
    glyph, colour = PART_GLYPHS[name]
    return f"{bar} [{colour}]{glyph}[/]{100 * share:.0f}%"


def breakdown_legend(parts: tuple[str, ...]) -> str:
    """The bar's key for the parts the run measures (rich markup)."""
    from engine.observe.telemetry import BREAKDOWN_LABELS

    keys = "  ".join(f"[{PART_GLYPHS[p][1]}]{PART_GLYPHS[p][0]}[/] {BREAKDOWN_LABELS[p]}" for p in parts)
    return f"[dim]step:[/] {keys}"


class Notes:
    """The live view's notes, as rich markup: the same message from several tasks (every worker naming its
    strategy) is one note naming them all, and a task's own text is shown as written (a bracket in it is not
    markup)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._said_by: dict[str, tuple[int, list[str]]] = {}

    def append(self, markup: str) -> None:
        self.lines.append(markup)

    def info(self, task: str, message: str) -> None:
        from rich.markup import escape

        index, tasks = self._said_by.setdefault(message, (len(self.lines), []))
        if index == len(self.lines):
            self.lines.append("")
        tasks.append(task)
        self.lines[index] = f"[dim]{escape(', '.join(tasks))}[/]: {escape(message)}"

    def failed(self, task: str, reason: str) -> None:
        from rich.markup import escape

        self.lines.append(f"[red]{escape(task)} failed[/]: {escape(reason)}")

    def last(self, n: int) -> list[str]:
        return self.lines[-n:]


class LiveView:
    """The view of one run: listens to ``source`` from construction on (make it before the run starts, to miss
    no event); :meth:`follow` draws it until the run is done."""

    def __init__(self, source: Source, console: Any) -> None:
        from rich.markup import escape
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from engine.observe.stragglers import StragglerDetector

        self.source = source
        self.console = console
        self.notes = Notes()
        self.detector = StragglerDetector()
        for info in getattr(source.state, "infos", [])[-4:]:  # a followed run's history says what it said
            if info.get("message"):
                self.notes.info(str(info.get("task", "")), str(info["message"]))
        source.add_listener(self.on_event)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=console, transient=False)
        # a name is text, not markup
        self.bar = self.progress.add_task(escape(source.config.name), total=source.state.total_steps)

    def on_event(self, event: dict[str, Any]) -> None:
        from rich.markup import escape

        for c in self.detector.update(event):
            if c.flagged:
                self.notes.append(f"[yellow]replica {c.replica} ({c.task}) is straggling: step {c.step_time * 1000:.0f} "
                                  f"ms vs median {c.median * 1000:.0f} ms ({c.ratio:.2f}x)"
                                  + (f": {escape(c.cause)}" if c.cause else "") + "[/]")
            else:
                self.notes.append(f"[dim]replica {c.replica} ({c.task}) no longer straggling ({c.reason})[/]")
        kind = event.get("kind")
        total = metrics_view.program_total(event)
        if total is not None and self.source.config.program is not None:  # the program says how far it goes
            self.source.state.total_steps = total
        if kind == "info" and event.get("message"):
            self.notes.info(str(event["task"]), str(event["message"]))
        elif kind == "status" and event.get("state") == "failed":
            self.notes.failed(str(event["task"]), str(event.get("reason", "")))

    def replica_table(self) -> Any:
        from rich.markup import escape
        from rich.table import Table

        # one column apart (not two): the breakdown fits 80 columns beside a metric
        table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), show_header=True, header_style="bold dim")
        replicas = sorted(self.source.state.replicas.values(), key=lambda r: r.replica)
        names = metrics_view.metric_names(replicas)  # accuracy etc., as the replicas report them
        breakdowns = self.source.state.breakdowns.latest() if hasattr(self.source.state, "breakdowns") else {}
        for col in ("replica", "task", "step", "loss", *names, "examples/s", "step ms", "slow"):
            table.add_column(escape(col), justify="right" if col != "task" else "left")
        if breakdowns:
            table.add_column("time in step", justify="left", no_wrap=True)
        slow = self.detector.flagged()
        for r in replicas:
            flag = f"[yellow]{slow[r.replica].ratio:.2f}x[/]" if r.replica in slow else ""
            row = [str(r.replica), r.task, str(r.step), fmt_loss(r.loss),
                   *(metrics_view.fmt_metric(r.metrics.get(n)) for n in names),
                   fmt_rate(r.examples_per_sec), "-" if r.step_time is None else f"{r.step_time * 1000:.1f}", flag]
            if breakdowns:
                row.append(breakdown_text(breakdowns.get(r.replica)))
            table.add_row(*row)
        return table

    def legend(self) -> list[str]:
        """The breakdown bar's key, once the run reports a breakdown."""
        breakdowns = getattr(self.source.state, "breakdowns", None)
        parts = breakdowns.measured() if breakdowns is not None else ()
        return [breakdown_legend(parts)] if parts else []

    def render(self) -> Any:
        from rich.console import Group
        from rich.markup import escape

        state = self.source.state
        self.progress.update(self.bar, completed=state.step, total=state.total_steps or None)
        tasks = "  ".join(f"{t.name}:{t.state}" for t in state.tasks.values())
        lines = [escape(line) for line in figure_lines(state)]
        return Group(self.progress, self.replica_table(), *self.legend(), *(f"[dim]{line}[/]" for line in lines),
                     f"[dim]{tasks}[/]", *self.notes.last(4))

    def follow(self) -> None:
        """Draw the view (8 times a second) until the source is done; Ctrl+C reaches the caller."""
        from rich.live import Live

        with Live(self.render(), console=self.console, refresh_per_second=8, transient=False) as live:
            while not self.source.done:
                self.source.wait(0.125)
                live.update(self.render())
            live.update(self.render())


def print_summary(console: Any, run: Any) -> None:
    from rich.markup import escape
    from rich.text import Text

    s = run.state.summary()
    state = s["state"]
    colour = {"finished": "green", "failed": "red", "stopped": "yellow"}.get(state, "white")
    console.print(f"[bold {colour}]{state}[/] after {s['steps']} of {s['total_steps']} steps"
                  + (f" in {s['duration_s']:.1f} s" if s["duration_s"] else ""))
    if state == "failed":
        console.print(f"[red]failed task: {escape(str(s['failed_task'] or '?'))}[/] - {escape(str(s['reason']))}")
        task = run.state.tasks.get(s["failed_task"])
        if task is not None and task.log_tail:
            console.print("[dim]last log lines:[/]")
            for line in task.log_tail[-10:]:
                console.print(Text("  " + line, style="dim"), highlight=False)
    for rid, r in s["replicas"].items():
        # async: the chief reports for every worker; name the worker that trained
        where = f"worker:{r['worker']}, reported by {r['task']}" if r.get("worker") is not None else r["task"]
        metrics = f", {metrics_view.metrics_text(r['metrics'])}" if r.get("metrics") else ""
        console.print(f"  replica {rid} ({escape(where)}): final loss {fmt_loss(r['loss'])} "
                      f"(from {fmt_loss(r['first_loss'])}){escape(metrics)}, "
                      f"{fmt_rate(r['examples_per_sec'])} examples/s")
    console.print(f"  total: {fmt_rate(s['examples_per_sec'])} examples/s")
    for line in figure_lines(run.state):
        console.print(f"  {escape(line)}")
    console.print(f"run folder: {escape(str(run.run_dir))}")


def figure_lines(state: Any) -> list[str]:
    """The last validation figures and what the run trains with (when its tasks said so)."""
    lines = []
    validation = metrics_view.validation_line(state.summary())
    if validation:
        lines.append(validation)
    training = metrics_view.training_info(state.infos)
    if training:
        lines.append(metrics_view.training_line(training))
    return lines
