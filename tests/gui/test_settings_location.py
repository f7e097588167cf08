"""The app's settings live beside its runs under one XDG name, and an earlier version's settings are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from gui import preferences


def test_settings_are_under_the_lower_case_name_and_earlier_ones_carried_over(tmp_path: Path) -> None:
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path))
    try:
        earlier = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, "ClusterDeck", "ClusterDeck")
        earlier.setValue("theme", "dark")
        earlier.sync()
        settings = preferences.app_settings()
        assert Path(settings.fileName()) == tmp_path / "clusterdeck" / "clusterdeck.ini"
        assert settings.value("theme") == "dark"
        settings.setValue("theme", "light")
        settings.sync()
        assert preferences.app_settings().value("theme") == "light"  # carried over once, not again
    finally:
        QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(Path.home() / ".config"))


@pytest.mark.parametrize("typed,offered", [("at", "attach"), ("val", "validate")])
def test_the_shell_completes_the_commands(typed: str, offered: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    line = f"clusterdeck {typed}"
    env = dict(os.environ, _ARGCOMPLETE="1", _ARGCOMPLETE_IFS="\n", COMP_LINE=line, COMP_POINT=str(len(line)))
    code = "import sys; from engine.cli.main import main; sys.exit(main(sys.argv[1:]))"
    # as bash's completion calls it: the answer on file descriptor 8, debugging on 9
    done = subprocess.run(["bash", "-c", f"{sys.executable} -c '{code}' 8>&1 9>/dev/null"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert offered in done.stdout.split(), done
