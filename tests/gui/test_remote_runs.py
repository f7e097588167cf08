"""Runs on another machine, used as a person does: a remote location typed in the Runs panel lists its runs over a
real sshd on 127.0.0.1, a run there is attached to (history, then live), detached by closing the window (no
follower left there), opened again with File ▸ Open Remote Run… and stopped from the app; a dropped connection is
said and caught up, a connection given up reads lost; bad hosts and runs are told in one line, and nothing hangs."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import QApplication, QComboBox, QInputDialog

from gui.runs_model import COLUMNS
from tests.engine.test_detach import TINY, cli, end, no_traceback, stepping, tagged
from tests.engine.test_remote import REMOTE, SimulatedRun, followers, wait_until
from tests.engine.test_ssh import sshd  # noqa: F401 - the real sshd on 127.0.0.1 (fixture)

CTRL_SHIFT = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier


@pytest.fixture
def over_ssh(sshd: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    """ssh reaches 'cdtest' (this machine's sshd); ClusterDeck there is this checkout."""
    monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(sshd))
    monkeypatch.setenv("CLUSTERDECK_REMOTE_COMMAND", REMOTE)
    return sshd


def said(window: Any) -> list[str]:
    """Every status-bar message of ``window`` from now on (they pass quickly)."""
    seen: list[str] = []
    window.statusBar().messageChanged.connect(seen.append)
    return seen


def choose_location(qtbot: Any, panel: Any, text: str) -> float:
    """Type ``text`` into the panel's Location and press Enter; how long the window was busy doing it."""
    edit = panel.location.combo.lineEdit()
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClicks(edit, text)
    started = time.monotonic()
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    return time.monotonic() - started


def answer_remote_dialog(qtbot: Any, text: str, asked: list[str]) -> Callable[[], None]:
    """Type ``text`` into File ▸ Open Remote Run…'s question once it shows (within 5 s), and press Enter."""
    tries = iter(range(100))

    def fill() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            if next(tries, None) is not None:
                QTimer.singleShot(50, fill)
            return
        asked.append(dialog.labelText())
        combo = dialog.findChild(QComboBox)
        assert combo is not None
        edit = combo.lineEdit()
        assert edit is not None
        edit.selectAll()
        qtbot.keyClicks(edit, text)
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return fill


def attached_live(qtbot: Any, window: Any, target: str) -> int:
    """Wait for ``window`` to show ``target`` attached: its history first, then live steps; the step shown first."""
    c = window.controller
    qtbot.waitUntil(lambda: c.session.remote_run == target and c.session.attached is not None, timeout=60_000)
    first = c.state.step
    assert first > 0, "the history comes first"
    qtbot.waitUntil(lambda: c.state.step > first + 5, timeout=30_000)  # then live steps
    qtbot.waitUntil(lambda: window.plots.loss.points("replica/0/loss") > 3, timeout=10_000)
    assert window.run_status.badge.text() == "Running" and window.commands["stop"].isEnabled()
    return first


@pytest.mark.cluster
def test_a_remote_run_is_listed_attached_detached_and_stopped_from_the_app(
        qtbot: Any, window: Any, runs_root: Path, tmp_path: Path, over_ssh: Path) -> None:
    from gui.controller import Controller
    from gui.main_window import MainWindow

    preset = tmp_path / "tiny.yaml"
    preset.write_text(TINY, encoding="utf-8")
    far = tmp_path / "far-runs"  # the runs folder "on the other machine"
    tag = uuid.uuid4().hex
    out = cli(tmp_path, tag, "run", str(preset), "--detach", "--json", "--out", str(far))
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    run_dir = Path(json.loads(out.stdout.strip().splitlines()[-1])["run_dir"])
    target = f"cdtest:{run_dir}"
    again: Any = None
    try:
        stepping(run_dir)
        # the Runs panel at a remote location: listed over ssh, off the GUI thread
        panel = window.show_runs()
        assert choose_location(qtbot, panel, f"cdtest:{far}") < 1.0, "listing over ssh never blocks the window"
        qtbot.waitUntil(lambda: panel.row_of(target) >= 0, timeout=30_000)
        row = panel.row_of(target)
        assert panel.proxy.index(row, COLUMNS.index("State")).data() == "running · detached"
        assert "cdtest" in panel.proxy.index(row, 0).data(Qt.ItemDataRole.ToolTipRole)
        assert panel.count.text() == "1 run · 1 running" and "cdtest" in panel.count.toolTip()
        assert panel.location.recent.items() == [f"cdtest:{far}"] and not panel.location.notice.isVisible()

        # attached to (Enter on its row): history, then live; Stop is the run's; its logs stay there
        assert panel.select(target)
        assert not panel.actions_by_name["delete"].isEnabled() and not panel.actions_by_name["compare"].isEnabled()
        panel.table.setFocus()
        qtbot.keyClick(panel.table, Qt.Key.Key_Return)
        attached_live(qtbot, window, target)
        assert window.layout_mode == "watch" and window.controller.config.name == "tiny-detach"
        font = panel.proxy.index(panel.row_of(target), 0).data(Qt.ItemDataRole.FontRole)
        assert font is not None and font.bold()
        assert "not available" in window.logs.text.toPlainText()
        window.resize(1366, 768)
        qtbot.waitUntil(lambda: (window.width(), window.height()) == (1366, 768), timeout=5000)
        for theme in ("light", "dark"):
            window.set_theme(theme)
            qtbot.wait(100)
            window.grab().save(f"/tmp/remote_runs_{theme}.png")
        window.set_theme("light")
        assert followers(run_dir), "the app follows it through clusterdeck follow there"

        # closing the window detaches: no follower left there, the run goes on
        window.close()
        assert window.isHidden()
        assert wait_until(lambda: not followers(run_dir), 10), "a follower outlived the window"
        assert tagged(tag, "engine.runtime"), "the run goes on"

        # File ▸ Open Remote Run… (Ctrl+Shift+R) in a new window, typed; then Stop stops it there
        again = MainWindow(Controller(runs_root=runs_root))
        again.show()
        qtbot.waitExposed(again)
        again.activateWindow()
        qtbot.waitUntil(again.isActiveWindow, timeout=5000)
        asked: list[str] = []
        QTimer.singleShot(0, answer_remote_dialog(qtbot, target, asked))
        qtbot.keyClick(again, Qt.Key.Key_R, CTRL_SHIFT)
        assert asked and "user@host:/path/to/run" in asked[0]
        attached_live(qtbot, again, target)
        c2 = again.controller
        stop = again.toolbar.widgetForAction(again.commands["stop"])
        qtbot.mouseClick(stop, Qt.MouseButton.LeftButton, pos=QPoint(8, stop.height() // 2))
        assert again.run_status.badge.text() == "Stopping…"
        qtbot.waitUntil(lambda: c2.run is None, timeout=90_000)
        assert c2.state.state == "stopped" and again.run_status.badge.text() == "Stopped"
        assert json.loads((run_dir / "run.json").read_text())["state"] == "stopped"
        assert wait_until(lambda: not tagged(tag, "engine.runtime") and not followers(run_dir), 15)
        assert not again.commands["stop"].isEnabled() and again.commands["run"].isEnabled()
    finally:
        if again is not None:
            again.close()
            again.deleteLater()
        end(run_dir)
    assert wait_until(lambda: not followers(run_dir), 10)


def test_bad_hosts_and_a_lost_connection_are_told_in_one_line_and_nothing_hangs(
        qtbot: Any, window: Any, tmp_path: Path, over_ssh: Path, dialogs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gui import runs_remote

    c = window.controller
    messages = said(window)
    panel = window.show_runs()
    # a host that does not resolve, typed as a location: one line naming it, the window never waits
    assert choose_location(qtbot, panel, "nobody@no-such-host.invalid") < 1.0
    qtbot.waitUntil(panel.location.notice.isVisible, timeout=30_000)
    text = panel.location.notice.text()
    assert text.startswith("nobody@no-such-host.invalid: ssh failed") and "\n" not in text, text
    assert panel.problem == text and not panel.table.isVisible()
    assert panel.location.recent.items() == [], "a location that reached no machine is not remembered"
    # a machine whose ClusterDeck is not where it is said to be
    monkeypatch.setenv("CLUSTERDECK_REMOTE_COMMAND", "/opt/nowhere/clusterdeck")
    choose_location(qtbot, panel, "cdtest")
    qtbot.waitUntil(lambda: (panel.problem or "").startswith("cdtest: /opt/nowhere/clusterdeck was not found"),
                    timeout=30_000)
    monkeypatch.setenv("CLUSTERDECK_REMOTE_COMMAND", REMOTE)
    # what names no machine is said before any ssh
    choose_location(qtbot, panel, "user@:x")
    assert "no host named" in panel.location.notice.text()
    # File ▸ Open Remote Run… of a run that is not there: a box, one line, the window free meanwhile
    started = time.monotonic()
    assert window.files.open_remote_run(f"cdtest:{tmp_path / 'no-such-run'}")
    assert time.monotonic() - started < 1.0
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=30_000)
    kind, title, box = dialogs.calls[-1]
    assert kind == "warning" and box.startswith("cdtest: ") and "\n" not in box, box
    assert c.run is None and window.commands["run"].isEnabled()

    # a dropped connection is said and caught up; one given up reads lost (the run goes on there)
    monkeypatch.setattr(runs_remote, "RECONNECT_S", 3.0)
    sim = SimulatedRun(tmp_path / "far", history_s=20)
    try:
        target = f"cdtest:{sim.folder.path}"
        choose_location(qtbot, panel, f"cdtest:{tmp_path / 'far'}")
        qtbot.waitUntil(lambda: panel.row_of(target) >= 0, timeout=30_000)
        assert not panel.location.notice.isVisible() and panel.select(target)
        qtbot.mouseClick(panel.buttons["attach"], Qt.MouseButton.LeftButton)
        attached_live(qtbot, window, target)
        run = c.session.attached
        os.kill(run.remote.ssh_pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: "Connection to cdtest lost; reconnecting…" in messages, timeout=10_000)
        qtbot.waitUntil(lambda: any(m.startswith("Back on cdtest: ") and m.endswith("events caught up")
                                    for m in messages), timeout=30_000)
        assert c.session.is_running and run.remote.reconnects == 1
        monkeypatch.setenv("CLUSTERDECK_SSH_CONFIG", str(tmp_path / "no-such-ssh-config"))
        os.kill(run.remote.ssh_pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: c.run is None, timeout=30_000)
        assert c.state.state == "lost" and window.run_status.badge.text() == "Lost"
        assert any(m.startswith("Run lost") for m in messages)
        assert any("remote: connection to cdtest lost" in t for t in window.messages.texts())
        assert wait_until(lambda: not followers(sim.folder.path), 10)
    finally:
        sim.end()
