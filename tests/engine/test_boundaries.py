"""Who may import what: the engine never imports Qt, and its control half never imports TensorFlow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

CONTROL = ["engine", "engine.config", "engine.cluster", "engine.events", "engine.telemetry", "engine.launcher",
           "engine.supervisor", "engine.gpu", "engine.cli", "engine.export", "engine.stragglers", "engine.netns",
           "engine.scaling", "engine.datasets", "engine.script_check"]
HEAVY = ("tensorflow", "keras", "PySide6", "pyqtgraph", "shiboken6")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_importing_the_control_half_loads_no_tensorflow_and_no_qt() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in CONTROL)
            + f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            + "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"


def test_no_engine_file_imports_qt_and_only_runtime_imports_tensorflow() -> None:
    for path in sorted((ROOT / "engine").rglob("*.py")):
        names = imported_modules(path)
        assert not names & {"PySide6", "pyqtgraph", "shiboken6"}, f"{path} imports Qt"
        if "runtime" not in path.relative_to(ROOT).parts:
            assert not names & {"tensorflow", "keras"}, f"{path} imports TensorFlow outside engine/runtime"


def test_this_check_would_notice_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from PySide6 import QtCore\nimport tensorflow as tf\n", encoding="utf-8")
    assert {"PySide6", "tensorflow"} <= imported_modules(bad)
