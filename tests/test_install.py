"""ClusterDeck installed the ways people install it: a wheel built from the source tree, installed with
``pip install --target DIR`` (+ ``PYTHONPATH``) and ``pip install --user`` (``PYTHONUSERBASE``), used from
an unrelated folder. No TensorFlow is imported: presets are listed and validated, the bundled files found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.contract import config as config_mod
from engine.contract import presets, resources
from engine.contract.run_folder import RUNS_ENV, default_runs_root

ROOT = Path(__file__).resolve().parent.parent
#: What the wheel is built from (the rest of the checkout is not needed).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "engine", "gui", "resources", "presets", "examples", "clusterdeck")


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "runs")
    dest.mkdir(parents=True)
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of a copy of the source tree (the checkout itself stays clean of build/)."""
    base = tmp_path_factory.mktemp("wheel")
    _copy_sources(base / "src")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"),
                          str(base / "src")], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return next((base / "dist").glob("clusterdeck-*.whl"))


def _pip_install(wheel: Path, *args: str, env: dict[str, str] | None = None) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", *args, str(wheel)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def test_the_wheel_holds_every_package_the_license_and_the_desktop_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for init in sorted(ROOT.glob("engine/**/__init__.py")) + sorted(ROOT.glob("gui/**/__init__.py")):
        assert init.relative_to(ROOT).as_posix() in names, f"{init.parent.name} is missing from [tool.setuptools] packages"
    for preset in presets.bundled_presets():
        assert f"clusterdeck_data/presets/{preset.name}" in names
    assert "clusterdeck_data/examples/user_script.py" in names
    assert "clusterdeck/__init__.py" in names and "clusterdeck/__main__.py" in names  # the public API
    for program in sorted(ROOT.glob("examples/programs/*.py")):
        assert f"clusterdeck_data/examples/programs/{program.name}" in names
    assert "engine/resources_data/digits.npz" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert "share/applications/clusterdeck.desktop" in data
    for size in resources.ICON_SIZES:
        assert f"share/icons/hicolor/{size}x{size}/apps/clusterdeck.png" in data
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert 'Requires-Dist: tensorflow[and-cuda]==2.21.*; extra == "gpu"' in metadata
    assert "Requires-Dist: platformdirs" in metadata


PROBE = r"""
import json, sys
from importlib import resources as ir
from engine.contract import presets, resources
import engine, clusterdeck_data, clusterdeck
clusterdeck.report(1, loss=0.5)  # outside a run: nothing, and no TensorFlow
cfg = presets.load_preset("data-user-script")
print(json.dumps({
    "engine": engine.__file__, "data": clusterdeck_data.__file__, "api": clusterdeck.__file__,
    "presets": [p.name for p in presets.bundled_presets()], "presets_dir": str(presets.presets_dir()),
    "icon": str(resources.icon_path()), "icons": [str(p) for p in resources.icon_paths()],
    "desktop": str(resources.desktop_file()),
    "example": str(ir.files("clusterdeck_data.examples") / "user_script.py"),
    "script": cfg.model.script, "data_path": cfg.data.path,
    "digits": str(resources.bundled_data("digits.npz")),
    "tf_loaded": "tensorflow" in sys.modules,
}))
"""


def _use_installed(prefix: Path, env: dict[str, str], tmp_path: Path) -> None:
    """From an unrelated folder: every bundled file comes from the install under ``prefix``, and the command works."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout)
    for key in ("engine", "data", "api", "presets_dir", "icon", "desktop", "example", "script", "data_path", "digits"):
        assert Path(found[key]).is_relative_to(prefix), (key, found[key])
    for key in ("icon", "desktop", "example", "script", "digits"):
        assert Path(found[key]).is_file(), (key, found[key])
    assert len(found["icons"]) == 1 + len(resources.ICON_SIZES)
    assert found["presets"] == [p.name for p in presets.bundled_presets()]
    assert found["script"] == found["example"]
    assert not found["tf_loaded"]

    def clusterdeck(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)

    listed = clusterdeck("presets")
    assert listed.returncode == 0, listed.stderr
    assert str(prefix) in listed.stdout
    names = [p.stem for p in presets.bundled_presets()]
    validated = clusterdeck("validate", *names)
    assert validated.returncode == 0, validated.stderr
    assert [x.split(":")[0] for x in validated.stdout.splitlines()] == names
    version = clusterdeck("--version")
    assert version.stdout.strip() == "clusterdeck 0.1.0" or version.stdout.startswith("clusterdeck "), version.stderr
    assert version.stdout.split()[1] != "unknown"


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONUSERBASE", "PYTHONNOUSERSITE")}
    env[RUNS_ENV] = str(tmp_path / "runs")
    return env


def test_a_target_install_finds_its_bundled_files_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    _pip_install(wheel, "--target", str(target))
    env = _clean_env(tmp_path)
    env["PYTHONPATH"] = str(target)
    _use_installed(target, env, tmp_path)
    script = target / "bin" / "clusterdeck"
    assert script.is_file()
    out = subprocess.run([str(script), "validate", "data-user-script"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("data-user-script: ok")


def test_a_user_install_finds_its_bundled_files_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    if sys.prefix != sys.base_prefix:
        pytest.skip("pip install --user is not available inside a virtual environment")
    userbase = tmp_path / "userbase"
    env = _clean_env(tmp_path)
    env["PYTHONUSERBASE"] = str(userbase)
    _pip_install(wheel, "--user", env=env)
    _use_installed(userbase, env, tmp_path)
    share = userbase / "share"
    assert (share / "applications" / "clusterdeck.desktop").is_file()
    assert (share / "icons" / "hicolor" / "48x48" / "apps" / "clusterdeck.png").is_file()


# --------------------------------------------------------------------------- the source tree itself


def test_the_desktop_entry_and_icons_are_well_formed() -> None:
    entry = resources.desktop_file().read_text(encoding="utf-8").splitlines()
    assert entry[0] == "[Desktop Entry]"
    fields = dict(line.split("=", 1) for line in entry[1:] if "=" in line)
    assert fields["Type"] == "Application" and fields["Icon"] == resources.APP_ID
    assert fields["Exec"].split()[0] == "clusterdeck" and fields["Terminal"] == "false"
    for size in resources.ICON_SIZES:
        head = resources.icon_path(size).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        assert (width, height) == (size, size), resources.icon_path(size)
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]


def test_the_editable_install_reads_the_source_tree_through_importlib_resources() -> None:
    from importlib import resources as ir

    try:
        installed = ir.files("clusterdeck_data.presets")
    except ModuleNotFoundError:
        pytest.skip("ClusterDeck is used from the source tree without being installed")
    assert Path(str(installed)).resolve() == (ROOT / "presets").resolve() == presets.presets_dir().resolve()
    assert resources.examples_dir().resolve() == (ROOT / "examples").resolve()


def test_relative_paths_in_a_preset_are_read_from_the_presets_folder(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    preset = folder / "p.yaml"
    text = (presets.presets_dir() / "data-user-script.yaml").read_text(encoding="utf-8")
    preset.write_text(text.replace("../examples/user_script.py", "mine.py"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cfg = config_mod.load(preset)
    assert cfg.model.script == cfg.data.path == str(folder / "mine.py")
    preset.write_text(text.replace("../examples/user_script.py", "/abs/mine.py"), encoding="utf-8")
    assert config_mod.load(preset).model.script == "/abs/mine.py"
    preset.write_text(text.replace("../examples/user_script.py", "~/mine.py"), encoding="utf-8")
    assert config_mod.load(preset).model.script == "~/mine.py"
    bundled = presets.load_preset("data-user-script")
    assert bundled.model.script == str(resources.examples_dir() / "user_script.py")
    assert config_mod.loads(text).model.script == "../examples/user_script.py"  # text alone: nothing to anchor to


def test_runs_go_to_the_per_user_data_folder_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import platformdirs

    monkeypatch.delenv(RUNS_ENV, raising=False)
    assert default_runs_root() == platformdirs.user_data_path("clusterdeck", appauthor=False) / "runs"
    assert default_runs_root().is_absolute()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "mine"))
    assert default_runs_root() == tmp_path / "mine"
    monkeypatch.setenv(RUNS_ENV, "  ")
    assert default_runs_root().name == "runs" and default_runs_root().is_absolute()
