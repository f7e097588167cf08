"""``NO_COLOR`` (https://no-color.org) is honoured where the command line styles its output: the CLI
prints through rich's ``Console`` without overriding its colour choice, and rich leaves colour out when
``NO_COLOR`` is set, even on a terminal."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def coloured(text: str) -> bool:
    """Whether ``text`` sets a foreground or background colour (bold and the like are not colour)."""
    params = [int(p) for m in SGR.finditer(text) for p in m.group(1).split(";") if p]
    return any(30 <= p <= 49 or 90 <= p <= 107 for p in params)


def consoles_of_the_cli() -> list[str]:
    """Every ``Console(...)`` call of the command line's modules, as written."""
    calls: list[str] = []
    for path in sorted((ROOT / "engine" / "cli").glob("*.py")):
        calls += re.findall(r"Console\([^)]*\)", path.read_text(encoding="utf-8"))
    return calls


def test_the_cli_leaves_the_colour_choice_to_rich() -> None:
    calls = consoles_of_the_cli()
    assert calls, "the CLI styles its output through rich's Console"
    for call in calls:  # forcing colours or a colour system would override NO_COLOR
        assert "no_color" not in call and "color_system" not in call and "force_terminal" not in call, call


@pytest.mark.parametrize("no_color", ["1", ""])
def test_rich_honours_no_color_on_a_terminal(monkeypatch: pytest.MonkeyPatch, no_color: str) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    if no_color:
        monkeypatch.setenv("NO_COLOR", no_color)
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True)  # a terminal, as a user's shell is
    console.print("[yellow]replica 1 (worker:1) is straggling[/] [bold red]failed[/]")
    assert coloured(out.getvalue()) is (not no_color)
    assert "replica 1 (worker:1) is straggling" in SGR.sub("", out.getvalue())
