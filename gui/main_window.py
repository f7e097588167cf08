"""The main window: the app's assembly. It creates the views, each given the narrow model it shows,
places them, and wires them to the window's actions (:mod:`gui.window_actions`), layout
(:mod:`gui.window_layout`), file commands (:mod:`gui.file_actions`) and theme (:mod:`gui.window_theme`).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QCloseEvent, QIcon, QShowEvent
from PySide6.QtWidgets import QMainWindow, QMessageBox, QWidget

from engine.contract import resources
from gui.canvas import ClusterCanvas
from gui.controller import Controller
from gui.file_actions import FileActions
from gui.logs import LogView
from gui.messages import RunMessages
from gui.plots import PlotsPanel
from gui.preferences import APPLICATION, ORGANIZATION, app_settings, keep_runs_going, set_keep_runs_going
from gui.problems_list import ProblemsList
from gui.properties_panel import PropertiesPanel
from gui.run_status import RunStatus
from gui.runs_commands import RunsCommands
from gui.runs_launch import WindowRunActions
from gui.runs_panel import RunsPanel
from gui.runs_preferences import PreferencesDialog
from gui.scaling_dialog import ScalingDialog
from gui.settings_panel import SettingsPanel
from gui.status_line import StatusLine
from gui.stragglers_view import StragglerWatch
from gui.task_table import TaskTable
from gui.why_slow import WhySlowPanel
from gui.window_actions import ActionState, WindowActions, show_about
from gui.window_layout import WindowLayout, add_dock, bottom_docks, inspector, scrolled, show_dock, titled
from gui.window_theme import ThemeSwitcher

__all__ = ["APPLICATION", "ORGANIZATION", "MainWindow", "app_icon", "app_settings"]


def app_icon() -> QIcon:
    """The app's icon in every shipped size (read through importlib.resources: any install layout)."""
    icon = QIcon()
    for path in resources.icon_paths():
        icon.addFile(str(path))
    return icon


class MainWindow(QMainWindow):
    """ClusterDeck's window. Takes the controller; every change goes through it."""

    def __init__(self, controller: Controller | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = c = controller if controller is not None else Controller()
        c.setParent(self)
        self.setObjectName("mainWindow")
        self.setWindowIcon(app_icon())
        self.setDockNestingEnabled(True)
        doc, session = c.document, c.session

        # the views, each with the model it shows
        self.canvas = ClusterCanvas(doc, session)
        self.canvas.setToolTip("")
        self.plots = PlotsPanel(session)
        self.properties = PropertiesPanel(doc)
        self.problems = ProblemsList(doc)
        self.settings_panel = SettingsPanel(doc)
        self.stragglers = StragglerWatch(session)
        self.task_table = TaskTable(session, stragglers=self.stragglers)
        self.logs = LogView(session)
        self.messages = RunMessages(session)
        self.run_status = RunStatus(session, c.checks, doc, pre_run=c.pre_run)
        self.runs_panel = RunsPanel(session)
        self.why_slow = WhySlowPanel(session, self.stragglers)
        self.scaling_dialog: ScalingDialog | None = None

        # where they go: the cluster above the plots; the inspector right; tasks, logs and messages below
        self.window_layout = WindowLayout(self, titled("Cluster", self.canvas, "Hosts and their tasks. Right-click "
                                                       "(or the Menu key) to add, drag (or Ctrl+arrows) to move, "
                                                       "arrows to select, Delete to remove."))
        self.splitter = self.window_layout.splitter
        column, self.selection_box = inspector(self.problems, self.properties, self.settings_panel)
        self.settings_dock = add_dock(self, "Settings", "settingsDock", column, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tasks_dock, self.logs_dock, self.messages_dock, self.runs_dock, self.why_slow_dock = bottom_docks(self, (
            ("Tasks", "tasksDock", self.task_table, ""),
            ("Logs", "logsDock", self.logs, ""),
            ("Messages", "messagesDock", self.messages, ""),
            ("Runs", "runsDock", self.runs_panel, "Running and past runs of the runs folder (Ctrl+Shift+O)"),
            ("Why Slow", "whySlowDock", scrolled(self.why_slow),
             "Where each replica's step goes, a profile of every task, every task's stacks (Ctrl+Shift+Y)")))
        self.tasks_dock.raise_()
        # the plots join the window last: Tab goes from the cluster to the settings and the run's tables
        # before it reaches the plots' many small buttons (Qt's focus chain follows the order widgets join)
        self.window_layout.set_bottom(self.plots)

        # what the user does with them
        self.themes = ThemeSwitcher(self)
        self.files = files = FileActions(c, self)
        self.runs = WindowRunActions(c, self)
        self.runs_commands = RunsCommands(c, files, self.runs_panel, self, make_window=type(self))
        self.commands = commands = WindowActions(self, doc.undo_stack)
        commands.connect({
            "new": files.new_document, "open": files.open_preset, "save": files.save, "save_as": files.save_as,
            "export": files.export_config, "scaling": self.open_scaling_dialog, "open_run": files.open_run_folder,
            "compare": files.compare_with_run, "clear_compare": session.clear_comparisons,
            "runs_folder": files.choose_runs_folder, "quit": self.close, "add_host": doc.add_host,
            "add_slurm": lambda: doc.add_host(kind="slurm"), "open_remote": files.open_remote_run,
            "add_task": lambda: self.add_task("worker"), "delete": doc.delete_selection, "run": self.runs.start,
            "stop": c.stop_run, "fit": self.canvas.fit_all, "about": lambda: show_about(self),
            "runs": self.show_runs, "preferences": self.open_preferences,
            "why_slow": lambda: show_dock(self, self.why_slow_dock),
        })
        keep_going = commands["keep_going"]
        keep_going.setCheckable(True)
        keep_going.setChecked(bool(keep_runs_going()))
        keep_going.toggled.connect(set_keep_runs_going)
        for role, action in commands.role_actions.items():
            action.triggered.connect(lambda _checked=False, role=role: self.add_task(role))
        commands.recent_menu.aboutToShow.connect(lambda: files.fill_recent(commands.recent_menu))
        commands.presets_menu.aboutToShow.connect(lambda: files.fill_presets(commands.presets_menu))
        commands.build_menus(self.menuBar(), [self.settings_dock, self.tasks_dock, self.logs_dock, self.messages_dock,
                                              self.runs_dock, self.why_slow_dock], self.themes.actions.values())
        self.toolbar = commands.build_toolbar(self.run_status)
        self.presets_menu = commands.presets_menu
        self.status_line = status = StatusLine(self.statusBar(), session, self.stragglers)
        self.path_label, self.straggler_label = status.path_label, status.straggler_label

        doc.problemsChanged.connect(self._update_actions)
        doc.selectionChanged.connect(self._selection_changed)
        doc.pathChanged.connect(self._update_title)
        doc.changed.connect(self._update_title)
        doc.undo_stack.cleanChanged.connect(self._update_title)
        doc.clusterChanged.connect(self._cluster_edited)
        doc.settingsChanged.connect(self._fit_settings_dock)
        c.runStateChanged.connect(self._run_state_changed)
        c.message.connect(lambda text: status.show(text, 8000))
        self.runs.message.connect(status.show)
        self.runs.closeReady.connect(self.close)
        self.runs.keepGoingChanged.connect(keep_going.setChecked)
        self.runs_commands.message.connect(status.show)
        session.startRefused.connect(self.runs.refused)
        session.stopRefused.connect(lambda text: QMessageBox.warning(self, "Cannot stop the run", text))
        session.runReleased.connect(lambda path: status.show(f"{path.name} keeps going; the Runs panel attaches to it "
                                                             "again", 8000))
        session.comparisonsChanged.connect(self._update_actions)
        self.problems.fieldActivated.connect(self._focus_field)
        c.pre_run.changed.connect(self.problems.set_pre_run)
        self.plots.compareRequested.connect(files.compare_with_run)
        self.plots.exported.connect(lambda text: status.show(text, 10000))
        self.task_table.taskActivated.connect(self.show_log)
        self.canvas.taskActivated.connect(self.show_log)
        self.messages.warning.connect(status.warn)
        files.message.connect(status.show)
        files.documentOpened.connect(lambda: self.window_layout.set_mode("design"))
        files.documentOpened.connect(session.clear_comparisons)  # another config: the overlay was of the old one
        files.runOpened.connect(lambda: self.window_layout.set_mode("watch"))
        self.window_layout.modeChanged.connect(lambda mode: self.canvas.set_compact(mode == "watch"))
        self.themes.applied.connect(self._theme_applied)

        self.window_layout.restore(app_settings(), self.settings_dock, self.tasks_dock)
        self.runs_panel.restore_state(app_settings())
        self.settings_dock.setMinimumWidth(self.settings_panel.needed_width())  # the form is never cut off
        self._selection_changed(doc.selection)
        self._update_title()
        running = sum(1 for e in self.runs_panel.model.entries if e.live)
        if running:  # runs that outlived an earlier window: where to find them
            self.runs_dock.raise_()
            status.show(f"{running} run{'s are' if running != 1 else ' is'} going: the Runs panel attaches to "
                        f"{'them' if running != 1 else 'it'}", 10000)
        else:
            status.show("Ready", 3000)

    # ------------------------------------------------------------------ following the models

    def _update_actions(self, *_args: object) -> None:
        c = self.controller
        self.commands.update(ActionState(
            problems=c.problems, running=c.is_running, stopping=c.run_state == "stopping",
            comparing=bool(c.session.comparisons), read_only=c.document.read_only,
            has_selection=c.selection is not None, attached=c.session.attached is not None))

    def _update_title(self, *_args: object) -> None:
        c = self.controller
        where = str(c.path) if c.path is not None else "untitled"
        if c.document.read_only:
            where += " (bundled preset, read-only)"
        self.setWindowModified(c.document.is_modified)
        self.setWindowTitle(f"{c.config.name} — {where}[*] — ClusterDeck")
        self._update_actions()

    def _run_state_changed(self, state: str) -> None:
        self._update_actions()
        if state == "starting" and self.controller.session.is_running:
            self.window_layout.set_mode("watch")  # the plots get the room; the cluster becomes a status view
        if state == "failed" and not self.controller.is_running:
            self.tasks_dock.raise_()

    def _cluster_edited(self) -> None:
        """Editing the cluster is designing: the canvas gets its room back (a live run keeps its layout)."""
        if not self.controller.session.is_running:
            self.window_layout.set_mode("design")

    def _selection_changed(self, selection: object) -> None:
        self.selection_box.setVisible(selection is not None)
        if isinstance(selection, tuple):
            self.selection_box.setTitle("Selected host" if selection[0] == "host" else "Selected task")
        self._update_actions()

    def _fit_settings_dock(self) -> None:
        needed = self.settings_panel.needed_width()
        self.settings_dock.setMinimumWidth(max(self.settings_dock.minimumWidth(), needed))

    def _focus_field(self, field: str) -> None:
        """A problem was clicked: show and focus the editor of its field (a host's or task's, or a setting)."""
        self.settings_dock.show()
        self.settings_dock.raise_()
        if field.startswith("cluster.hosts["):
            self.properties.focus_field(field)
        else:
            self.settings_panel.focus_field(field)

    def _theme_applied(self) -> None:
        self.canvas.rebuild()
        self.plots.apply_theme()
        self.commands.refresh_icons()

    # ------------------------------------------------------------------ commands

    @property
    def layout_mode(self) -> str:
        """``design`` (the canvas large) or ``watch`` (the plots large)."""
        return self.window_layout.mode

    def set_theme(self, choice: str) -> None:
        self.themes.set(choice)

    def open_path(self, path: str | Path, ask: bool = True) -> bool:
        return self.files.open_path(path, ask)

    def open_run_folder(self, path: str | Path | None = None) -> bool:
        return self.files.open_run_folder(path)

    def open_any(self, path: str | Path) -> bool:
        return self.files.open_any(path)

    def compare_with_run(self, path: str | Path | None = None) -> bool:
        return self.files.compare_with_run(path)

    def choose_runs_folder(self, path: str | Path | None = None) -> bool:
        return self.files.choose_runs_folder(path)

    def export_config(self, folder: str | Path | None = None, image: str | None = None) -> list[Path]:
        return self.files.export_config(folder, image)

    def recent_files(self) -> list[str]:
        return self.files.recent.paths()

    def add_task(self, role: str) -> None:
        """A task on the selected host (on a new host when there is none)."""
        doc = self.controller.document
        if not doc.config.cluster.hosts:
            doc.add_host()
        sel = doc.selection
        host = sel[1] if sel is not None else len(doc.config.cluster.hosts) - 1
        doc.add_task(host, role)

    def show_log(self, task: str) -> None:
        """The Logs dock on ``task``'s log, tall enough to read."""
        if self.logs.show_task(task):
            show_dock(self, self.logs_dock)

    def show_runs(self) -> RunsPanel:
        """The Runs panel, raised, its list focused (arrows pick a run, Enter opens or attaches to it)."""
        show_dock(self, self.runs_dock)
        panel = self.runs_panel
        panel.refresh()
        panel.table.setFocus()
        if not panel.selected() and panel.proxy.rowCount():
            panel.table.selectRow(0)
        return panel

    def open_preferences(self) -> PreferencesDialog:
        dialog = PreferencesDialog(self)
        dialog.changed.connect(self.commands["keep_going"].setChecked)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def open_scaling_dialog(self) -> ScalingDialog:
        """Show the scaling report window (one per main window, kept between openings)."""
        if self.scaling_dialog is None:
            self.scaling_dialog = ScalingDialog(self.controller, self)
        self.scaling_dialog.show()
        self.scaling_dialog.raise_()
        self.scaling_dialog.activateWindow()
        return self.scaling_dialog

    # ------------------------------------------------------------------ showing and closing

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.window_layout.shown()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow():
            self.controller.pre_run.recheck()  # a data file may have been put in place meanwhile

    def save_settings(self) -> None:
        settings = app_settings()
        self.window_layout.save(settings)
        self.runs_panel.save_state(settings)
        settings.sync()

    def start_run(self) -> None:
        """Start the config as the command line's ``--run`` does: the preference is used, never asked."""
        self.runs.start(ask=False)

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.runs.may_close() or (not self.runs.quitting and not self.files.maybe_save()):
            event.ignore()  # kept open (with a run stopping for the quit, it closes once the run has ended)
            return
        self.save_settings()
        self.shutdown()
        event.accept()

    def shutdown(self) -> None:
        """Stop every timer of the window (and the run, without waiting)."""
        self.controller.shutdown()
        self.statusBar().clearMessage()  # its message timeout is a timer too
        self.plots.stop()
        self.logs.stop()
        self.runs_panel.stop()
        self.why_slow.shutdown()
        self.run_status.stop()
        if self.scaling_dialog is not None:
            self.scaling_dialog.shutdown()
