"""The rooms of the code and their fences (``[tool.importlinter]`` in pyproject.toml, docs/architecture.md).

import-linter checks every import statement, lazy ones inside functions included; these tests run it and
prove that it notices a broken fence. A last test imports every module outside the runtime in a fresh
interpreter and finds neither TensorFlow nor Qt loaded.
"""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                              "sys.exit(lint_imports_command())"]


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LINT, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def copy_tree(dest: Path) -> Path:
    for name in ("engine", "gui"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "clusterdeck", dest / "clusterdeck",  # a root package of the contracts too
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_every_import_contract_holds() -> None:
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(("module", "code", "contract"), [
    ("engine/contract/_probe.py", "def f():\n    import gui.theme  # a lazy import counts too\n",
     "The engine never imports the desktop app or Qt"),
    ("engine/control/_probe.py", "import tensorflow\n", "Only the runtime imports TensorFlow or Keras"),
    ("gui/_probe.py", "from engine.runtime import models\n", "Only the runtime imports TensorFlow or Keras"),
    ("engine/contract/_probe.py", "from engine.control import launcher\n", "Rooms:"),
    ("engine/runtime/_probe.py", "from engine.control import supervisor\n", "Control and runtime are independent"),
    ("engine/runtime/_probe.py", "from engine.runtime import task\n", "No import cycles"),
    ("gui/_probe.py", "def f():\n    import clusterdeck\n", "The public API (clusterdeck)"),
    ("engine/runtime/_probe.py", "from clusterdeck import report\n", "The public API (clusterdeck)"),
])
def test_a_broken_fence_is_reported(tmp_path: Path, module: str, code: str, contract: str) -> None:
    tree = copy_tree(tmp_path)
    (tree / module).write_text("from __future__ import annotations\n" + code, encoding="utf-8")
    if "cycles" in contract:  # make the probe and task import each other
        task = tree / "engine/runtime/task.py"
        task.write_text(task.read_text(encoding="utf-8") + "\n\ndef _probe():\n    from engine.runtime import _probe\n",
                        encoding="utf-8")
    out = lint(tree)
    assert out.returncode != 0, out.stdout[-2000:]
    broken = [line for line in out.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(contract in line for line in broken) or contract in out.stdout.split("Broken contracts")[-1], \
        out.stdout[-3000:]


def outside_runtime() -> list[str]:
    names = []
    for pkg in ("engine.contract", "engine.observe", "engine.control", "engine.cli"):
        path = ROOT / pkg.replace(".", "/")
        names.append(pkg)
        names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules([str(path)]) if m.name != "__main__"]
    return names


def test_importing_everything_outside_the_runtime_loads_no_tensorflow_and_no_qt() -> None:
    modules = outside_runtime()
    assert len(modules) > 20
    heavy = ("tensorflow", "keras", "PySide6", "pyqtgraph", "shiboken6")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})\n"
            + "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"
