"""The Runs panel's commands (its buttons and its list's context menu): what they look like, and which are enabled
for the runs selected. What each one does is the panel's (:class:`gui.runs_panel.RunsPanel`) and its commands'
(:class:`gui.runs_commands.RunsCommands`)."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QStyle, QToolButton, QWidget

from gui.runs_scan import RunEntry

SP = QStyle.StandardPixmap
#: The panel's commands (name, text, tip, icon, key): its buttons and its list's context menu.
ACTIONS: tuple[tuple[str, str, str, QStyle.StandardPixmap | None, str | None], ...] = (
    ("open", "Open", "Show the selected run: its config, curves, tasks and logs (a running run is attached "
     "to and followed live) — Enter or double-click", SP.SP_DialogOpenButton, "Return"),
    ("attach", "Attach", "Follow the selected running run live in this window; Stop then stops it. The run "
     "shown before keeps going if it was started detached", SP.SP_MediaPlay, None),
    ("window", "Open in New Window", "Show the selected run in a window of its own, beside the run this window shows "
     "(watch several runs at once) — Ctrl+Enter", None, "Ctrl+Return"),
    ("stop", "Stop", "Stop the selected running runs through their control channel (your own runs only)",
     SP.SP_MediaStop, None),
    ("compare", "Compare", "Overlay the selected runs' replica curves, dashed, on the run shown",
     SP.SP_FileDialogContentsView, None),
    ("delete", "Delete…", "Delete the selected runs' folders (asks first; a running run is never deleted) — "
     "Del", SP.SP_TrashIcon, "Delete"),
    ("folder", "Open Folder…", "Open a run folder from anywhere (one not under the runs folder)",
     SP.SP_DirOpenIcon, None),
    ("copy", "Copy Path", "Copy the selected runs' folder paths (user@host:/path for a run on another machine)",
     None, "Ctrl+C"),
    ("reveal", "Show in File Manager", "Open the run's folder in the file manager", None, None),
    ("find", "Filter", "Filter the runs", None, "Ctrl+F"),
)
DELETE_TIP = "Delete the selected runs' folders (asks first) — Del"
LIVE_DELETE_TIP = "A running run is never deleted: stop it first"
REMOTE_TIP = ("A run on another machine is looked at and stopped from here, over ssh; compare, delete and open its "
              "folder there")


def make_actions(owner: QWidget, table: QWidget) -> dict[str, QAction]:
    """The panel's actions by name: keys work in the panel (Return, Del and Ctrl+C in its list only)."""
    out: dict[str, QAction] = {}
    for name, text, tip, icon, key in ACTIONS:
        action = QAction(text, owner)
        action.setObjectName(f"runs_{name}Action")
        action.setToolTip(tip)
        action.setStatusTip(tip)
        if icon is not None:
            action.setIcon(owner.style().standardIcon(icon))
        if key is not None:
            action.setShortcut(QKeySequence(key))
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        out[name] = action
    for name in ("open", "window", "delete", "copy"):  # keys of the list, not of the filter field
        table.addAction(out[name])
        out[name].setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
    owner.addAction(out["find"])
    return out


def tool_button(action: QAction) -> QToolButton:
    """A flat button of the panel's bar for ``action`` (its text beside its icon)."""
    button = QToolButton()
    button.setObjectName(action.objectName().removesuffix("Action") + "Button")
    button.setDefaultAction(action)
    button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    button.setAutoRaise(True)
    button.setIconSize(QSize(16, 16))
    return button


@dataclass(frozen=True)
class Selected:
    """What decides the commands: the runs selected, which of them the window shows, whether it runs there."""

    entries: tuple[RunEntry, ...]
    shown: tuple[bool, ...]  # per entry: the run the window shows
    running: bool  # the window's run is live


def enabled(sel: Selected) -> dict[str, bool]:
    """Which commands apply to the selection (a remote run: open, attach, stop and copy only)."""
    chosen = sel.entries
    one = len(chosen) == 1
    remote = any(e.remote for e in chosen)
    return {
        "open": one,
        "attach": one and chosen[0].live and not (sel.shown[0] and sel.running),
        "window": one and not remote and not sel.shown[0],
        "stop": any(e.live for e in chosen),
        "compare": not remote and any(not shown for shown in sel.shown),
        "delete": bool(chosen) and not remote and not any(e.live for e in chosen),
        "copy": bool(chosen),
        "reveal": one and not remote,
    }


def update(actions: dict[str, QAction], sel: Selected) -> None:
    """Enable the commands that apply; Delete's tip says why it does not."""
    for name, on in enabled(sel).items():
        actions[name].setEnabled(on)
    remote = any(e.remote for e in sel.entries)
    live = any(e.live for e in sel.entries)
    actions["delete"].setToolTip(REMOTE_TIP if remote else LIVE_DELETE_TIP if live else DELETE_TIP)
    actions["compare"].setToolTip(REMOTE_TIP if remote else ACTIONS[3][2])
