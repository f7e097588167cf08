"""The window's commands: its QActions (text, tip, shortcut, icon) from one table, and the menus and
toolbar that show them, from two more. Which slot an action runs is wired by the window that
assembles the app (:class:`gui.main_window.MainWindow`); here only what the actions look like and
when they are enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QUndoStack
from PySide6.QtWidgets import (
    QDockWidget,
    QMainWindow,
    QMenu,
    QMenuBar,
    QMessageBox,
    QStyle,
    QToolBar,
    QToolButton,
    QWidget,
)

from engine.contract.config import ROLES, Problem
from gui import theme
from gui.about import about_html

SP = QStyle.StandardPixmap
K = QKeySequence.StandardKey
RUN_TIP = "Launch the cluster and train (F5)"
SAVE_TIP = "Save the config to its file"


@dataclass(frozen=True)
class ActionSpec:
    """One command of the window: ``name`` is how the window and its menus refer to it."""

    name: str
    text: str
    tip: str
    shortcut: QKeySequence.StandardKey | str | None = None
    icon: QStyle.StandardPixmap | None = None


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("new", "&New", "Start a new config (two local workers)", K.New, SP.SP_FileIcon),
    ActionSpec("open", "&Open…", "Open a YAML preset", K.Open, SP.SP_DialogOpenButton),
    ActionSpec("save", "&Save", SAVE_TIP, K.Save, SP.SP_DialogSaveButton),
    ActionSpec("save_as", "Save &As…", "Save the config to a new file", K.SaveAs),
    ActionSpec("export", "&Export…", "Write TF_CONFIG files, per-host launch scripts and (given an image) a "
               "Kubeflow TFJob for this config into a folder", "Ctrl+E"),
    ActionSpec("why_slow", "&Why Slow?", "Why the run is slow or stuck: where each replica's step goes, a profile of "
               "every task, every task's stacks (Ctrl+Shift+Y)", "Ctrl+Shift+Y"),
    ActionSpec("scaling", "Scaling &Report…", "Run this config at 1, 2, 4, … workers and plot throughput and "
               "scaling efficiency"),
    ActionSpec("runs", "&Runs…", "Show the Runs panel: running and past runs of the runs folder, to open, attach "
               "to, stop, compare or delete (Ctrl+Shift+O)", "Ctrl+Shift+O"),
    ActionSpec("open_run", "Open Run &Folder…", "Show a run folder from anywhere: its config, tasks, curves and logs "
               "(a running run is followed live); the Runs panel lists those of the runs folder", None,
               SP.SP_DirOpenIcon),
    ActionSpec("open_remote", "Open Re&mote Run…", "Watch a run on another machine over your ssh (user@host:/path/to/run): "
               "its history, then live steps; Stop stops it there, closing detaches (Ctrl+Shift+R)", "Ctrl+Shift+R",
               SP.SP_DriveNetIcon),
    ActionSpec("compare", "&Compare with Run…", "Overlay another run's replica curves, dashed"),
    ActionSpec("clear_compare", "Clear Comparison", "Remove the overlaid runs"),
    ActionSpec("runs_folder", "Runs &Folder…", "Choose the folder new runs are written to"),
    ActionSpec("quit", "&Quit", "Quit ClusterDeck", K.Quit),
    ActionSpec("add_host", "Add &Host", "Add a host (localhost) to the cluster", "Ctrl+Shift+H"),
    ActionSpec("add_slurm", "Add &Slurm Group", "Add a group of nodes that Slurm allocates (partition, nodes, "
                                                 "GPUs per node: set them in the group's properties)"),
    ActionSpec("add_task", "Add &Task", "Add a worker to the selected host (the arrow offers other roles)",
               "Ctrl+Shift+T"),
    # the canvas handles Del itself (a window-wide shortcut would take Del from every text field): the
    # menu shows the key after a tab, without binding it
    ActionSpec("delete", "&Delete Selected\tDel", "Delete the selected host or task (Del on the canvas)"),
    ActionSpec("run", "&Run", RUN_TIP, "F5", SP.SP_MediaPlay),
    ActionSpec("stop", "S&top", "Stop the run: every task ends (Shift+F5)", "Shift+F5", SP.SP_MediaStop),
    ActionSpec("keep_going", "&Keep Runs Going After Closing", "On: Run starts each run in a launcher of its own, "
               "which keeps it going after ClusterDeck closes (find it again in the Runs panel). Off: a run lives in "
               "its window"),
    ActionSpec("preferences", "&Preferences…", "The app's preferences: whether runs keep going after ClusterDeck "
               "closes (Ctrl+,)", "Ctrl+,"),
    ActionSpec("fit", "Fit Cluster in View", "Zoom the canvas so every host shows", "Ctrl+0"),
    ActionSpec("about", "&About ClusterDeck", "What ClusterDeck is"),
)

#: The menu bar: each menu's entries by action name. "-" is a separator; "@" names what is not a
#: plain action: @recent and @presets (submenus filled as they open), @add_task (one entry per
#: role), @docks (show or hide each dock), @theme (the colour schemes).
MENUS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("&File", ("new", "open", "@recent", "@presets", "-", "save", "save_as", "export", "-",
               "runs", "open_run", "open_remote", "compare", "clear_compare", "runs_folder", "-", "quit")),
    ("&Edit", ("undo", "redo", "-", "add_host", "add_slurm", "@add_task", "delete", "-", "preferences")),
    ("&Run", ("run", "stop", "keep_going", "-", "why_slow", "scaling")),
    ("&View", ("@docks", "-", "fit", "@theme")),
    ("&Help", ("about",)),
)

#: The toolbar; @status is the run's status widget.
TOOLBAR: tuple[str, ...] = ("new", "open", "save", "-", "undo", "redo", "-", "add_host", "add_task", "-",
                            "run", "stop", "@status")


@dataclass(frozen=True)
class ActionState:
    """What decides which actions are enabled (and what the Run and Save actions say)."""

    problems: Sequence[Problem] = ()
    running: bool = False
    stopping: bool = False
    comparing: bool = False
    read_only: bool = False
    has_selection: bool = False
    attached: bool = False  # the live run is followed through its folder: another may be shown or started


def show_about(parent: QWidget) -> None:
    QMessageBox.about(parent, "About ClusterDeck", about_html())


class WindowActions:
    """The window's actions by name (``actions["run"]``), with its menus and toolbar.

    Every action is added to ``window`` (so its shortcut works wherever the focus is); undo and
    redo are the document's undo stack's own actions."""

    def __init__(self, window: QMainWindow, undo_stack: QUndoStack) -> None:
        self.window = window
        self._actions: dict[str, QAction] = {spec.name: self._make(spec) for spec in ACTIONS}
        quit_action = self._actions["quit"]
        if quit_action.shortcut().isEmpty():  # some platforms bind no standard Quit key
            quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        undo = undo_stack.createUndoAction(window, "&Undo")
        undo.setShortcuts(QKeySequence.keyBindings(K.Undo))
        undo.setToolTip("Undo the last edit (Ctrl+Z)")
        redo = undo_stack.createRedoAction(window, "&Redo")
        bindings = QKeySequence.keyBindings(K.Redo)
        extra = QKeySequence("Ctrl+Shift+Z")
        redo.setShortcuts(bindings if extra in bindings else [*bindings, extra])
        redo.setToolTip("Redo the last undone edit (Ctrl+Shift+Z)")
        for name, action in (("undo", undo), ("redo", redo)):
            window.addAction(action)
            self._actions[name] = action
        self.refresh_icons()
        self.add_task_menu = QMenu("Add task", window)
        self.add_task_menu.setToolTipsVisible(True)
        self.role_actions: dict[str, QAction] = {}
        for role in ROLES:
            a = self.add_task_menu.addAction(f"Add {role}")
            a.setToolTip(f"Add {'an' if role[0] in 'aeiou' else 'a'} {role} task to the selected host")
            self.role_actions[role] = a
        self.recent_menu = self._menu("Open &Recent")
        self.presets_menu = self._menu("&Presets")
        self.toolbar: QToolBar | None = None

    def _make(self, spec: ActionSpec) -> QAction:
        action = QAction(spec.text, self.window)
        action.setObjectName(f"{spec.name}Action")
        action.setToolTip(spec.tip)
        action.setStatusTip(spec.tip)
        if spec.shortcut is not None:
            action.setShortcut(QKeySequence(spec.shortcut))
        if spec.icon is not None:
            action.setIcon(self.window.style().standardIcon(spec.icon))
        self.window.addAction(action)
        return action

    def _menu(self, title: str) -> QMenu:
        menu = QMenu(title, self.window)
        menu.setToolTipsVisible(True)
        return menu

    def __getitem__(self, name: str) -> QAction:
        return self._actions[name]

    def items(self) -> Iterable[tuple[str, QAction]]:
        return self._actions.items()

    def connect(self, slots: Mapping[str, Callable[[], object]]) -> None:
        """Run ``slots[name]`` when the action ``name`` is triggered (its ``checked`` flag is not passed on)."""
        for name, slot in slots.items():
            self._actions[name].triggered.connect(lambda _checked=False, slot=slot: slot())

    def refresh_icons(self) -> None:
        """Undo and redo draw their arrows in the palette's colours: again after a theme change."""
        self._actions["undo"].setIcon(theme.undo_icon())
        self._actions["redo"].setIcon(theme.undo_icon(redo=True))

    # ------------------------------------------------------------------ menus and toolbar

    def build_menus(self, bar: QMenuBar, docks: Sequence[QDockWidget], themes: Iterable[QAction]) -> None:
        groups: dict[str, Callable[[QMenu], object]] = {
            "@recent": lambda m: m.addMenu(self.recent_menu),
            "@presets": lambda m: m.addMenu(self.presets_menu),
            "@add_task": lambda m: m.addMenu(self.add_task_menu),
            "@docks": lambda m: m.addActions([dock.toggleViewAction() for dock in docks]),
            "@theme": lambda m: m.addMenu("&Theme").addActions(list(themes)),
        }
        for title, entries in MENUS:
            menu = bar.addMenu(title)
            menu.setToolTipsVisible(True)
            for entry in entries:
                if entry == "-":
                    menu.addSeparator()
                elif entry in groups:
                    groups[entry](menu)
                else:
                    menu.addAction(self._actions[entry])

    def build_toolbar(self, status: QWidget) -> QToolBar:
        tb = self.window.addToolBar("Main")
        tb.setObjectName("mainToolbar")
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for entry in TOOLBAR:
            if entry == "-":
                tb.addSeparator()
            elif entry == "@status":
                tb.addWidget(status)
            else:
                tb.addAction(self._actions[entry])
        for name in ("undo", "redo"):
            button = tb.widgetForAction(self._actions[name])
            if isinstance(button, QToolButton):  # its text names the edit; the icon keeps the bar steady
                button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        button = tb.widgetForAction(self._actions["add_task"])
        if isinstance(button, QToolButton):
            button.setMenu(self.add_task_menu)
            button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        self.toolbar = tb
        return tb

    # ------------------------------------------------------------------ state

    def update(self, state: ActionState) -> None:
        """Enable what can be done now; the Run action's tip says why it cannot."""
        run = self._actions["run"]
        own_run = state.running and not state.attached  # a run of this window holds it until it ends
        run.setEnabled(not state.problems and not own_run)
        if state.problems:
            text = "Cannot run:\n" + "\n".join(f"• {p}" for p in state.problems)
        elif own_run:
            text = "A run is in progress; stop it first (Shift+F5)"
        elif state.running:
            text = RUN_TIP + ": a new run; the run shown keeps going (it outlives this window)"
        else:
            text = RUN_TIP
        run.setToolTip(text)
        button = self.toolbar.widgetForAction(run) if self.toolbar is not None else None
        if button is not None:
            button.setToolTip(text)
        self._actions["stop"].setEnabled(state.running and not state.stopping)
        self._actions["open_run"].setEnabled(not own_run)
        self._actions["open_remote"].setEnabled(not own_run)
        self._actions["runs_folder"].setEnabled(not own_run)
        self._actions["clear_compare"].setEnabled(state.comparing)
        save = self._actions["save"]
        save.setText("&Save As…" if state.read_only else "&Save")
        save.setToolTip("A bundled preset is never overwritten: save your copy to a new file"
                        if state.read_only else SAVE_TIP)
        self._actions["delete"].setEnabled(state.has_selection)
