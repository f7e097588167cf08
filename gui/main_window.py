"""The main window: menus, toolbar, the cluster canvas, live plots, settings, tasks and logs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QGroupBox,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QSplitter,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.contract import presets, resources
from engine.contract.config import ROLES, ConfigError, Problem
from engine.contract.presets import presets_dir
from engine.contract.run_folder import RunFolder
from engine.control import export
from gui import theme
from gui.canvas import ClusterCanvas
from gui.controller import Controller
from gui.logs import LogView
from gui.messages import RunMessages
from gui.plots import PlotsPanel
from gui.problems_list import ProblemsList
from gui.properties_panel import PropertiesPanel
from gui.run_status import RunStatus
from gui.scaling_dialog import ScalingDialog
from gui.settings_panel import SettingsPanel
from gui.stragglers_view import StragglerWatch
from gui.task_table import TaskTable

ORGANIZATION = "ClusterDeck"
APPLICATION = "ClusterDeck"
MAX_RECENT = 8
YAML_FILTER = "ClusterDeck presets (*.yaml *.yml);;All files (*)"
#: Share of the central splitter the cluster gets: large while designing, a compact status view
#: while a run is watched (the plots get the room); the user's own sizes per layout are remembered.
LAYOUT_SHARES = {"design": 0.58, "watch": 0.34}


def app_settings() -> QSettings:
    """The app's settings (an INI file under the user's config folder; tests point it elsewhere)."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def first_sentence(text: str, limit: int = 70) -> str:
    head = text.split(". ")[0].split(": ")[0].rstrip(".")
    return head if len(head) <= limit else head[:limit - 1] + "…"


def screen_fit_size(wanted: QSize, available: QSize) -> QSize:
    """``wanted``, shrunk to fit ``available`` (a screen's free area) with a margin."""
    return QSize(min(wanted.width(), int(available.width() * 0.96)),
                 min(wanted.height(), int(available.height() * 0.94)))


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
        self.controller = controller if controller is not None else Controller()
        self.controller.setParent(self)
        self.setObjectName("mainWindow")
        self.setWindowIcon(app_icon())
        self.setDockNestingEnabled(True)
        self.setAcceptDrops(True)
        self._close_when_stopped = False
        self._theme_choice = "system"
        self.layout_mode = "design"
        self._layout_sizes: dict[str, list[int]] = {}
        self._shown_once = False

        c = self.controller
        doc, session = c.document, c.session
        self.canvas = ClusterCanvas(doc, session)
        self.canvas.setToolTip("")
        self.plots = PlotsPanel(session)
        self.properties = PropertiesPanel(doc)
        self.problems = ProblemsList(doc)
        self.settings_panel = SettingsPanel(doc)
        self.stragglers = StragglerWatch(session)
        self.task_table = TaskTable(session, stragglers=self.stragglers)
        self.scaling_dialog: ScalingDialog | None = None
        self.logs = LogView(session)
        self.run_status = RunStatus(session, c.checks, doc)

        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setObjectName("centralSplitter")
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self._titled("Cluster", self.canvas,
                                             "Hosts and their tasks. Right-click to add, drag to move, "
                                             "Delete to remove."))
        self.splitter.addWidget(self.plots)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.splitterMoved.connect(lambda _pos, _i: self._remember_layout())
        self.setCentralWidget(self.splitter)

        # one column on the right: what stops a run, the selected host or task, the run settings
        self.selection_box = QGroupBox("Selected")
        self.selection_box.setObjectName("selectionBox")
        box_layout = QVBoxLayout(self.selection_box)
        box_layout.setContentsMargins(2, 2, 2, 2)
        box_layout.addWidget(self.properties)
        inspector = QWidget()
        inspector.setObjectName("inspector")
        column = QVBoxLayout(inspector)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.problems, 0)
        column.addWidget(self.selection_box, 0)
        column.addWidget(self.settings_panel, 1)
        self.settings_dock = self._dock("Settings", "settingsDock", inspector, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tasks_dock = self._dock("Tasks", "tasksDock", self.task_table, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.logs_dock = self._dock("Logs", "logsDock", self.logs, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.tabifyDockWidget(self.tasks_dock, self.logs_dock)
        self.messages = RunMessages(session)
        self.messages_dock = self._dock("Messages", "messagesDock", self.messages,
                                        Qt.DockWidgetArea.BottomDockWidgetArea)
        self.tabifyDockWidget(self.logs_dock, self.messages_dock)
        self.messages.warning.connect(lambda text: self.statusBar().showMessage(f"⚠ {text}", 15000))
        self.tasks_dock.raise_()

        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self.path_label = QLabel()
        self.path_label.setObjectName("runsFolder")
        self.path_label.setToolTip("Where new runs are written (File › Runs Folder… changes it)")
        self.statusBar().addPermanentWidget(self.path_label)
        self._runs_root_changed(c.runs_root)
        self.straggler_label = QLabel()
        self.straggler_label.setObjectName("stragglerStatus")
        self.straggler_label.setToolTip("A replica that stays slower than the others (see the task table's "
                                        "Straggler column)")
        self.straggler_label.setStyleSheet("color: #b7791f;")
        self.straggler_label.hide()
        self.statusBar().addPermanentWidget(self.straggler_label)
        self.stragglers.changed.connect(self._stragglers_changed)

        doc.problemsChanged.connect(self._update_actions)
        doc.selectionChanged.connect(self._selection_changed)
        doc.pathChanged.connect(self._path_changed)
        doc.changed.connect(self._update_title)
        doc.clusterChanged.connect(self._cluster_edited)
        doc.settingsChanged.connect(
            lambda: self.settings_dock.setMinimumWidth(max(self.settings_dock.minimumWidth(),
                                                           self.settings_panel.needed_width())))
        doc.undo_stack.cleanChanged.connect(lambda _clean: self._update_title())
        c.runStateChanged.connect(self._run_state_changed)
        c.message.connect(lambda text: self.statusBar().showMessage(text, 8000))
        c.startFailed.connect(self.show_start_failed)
        session.runsRootChanged.connect(self._runs_root_changed)
        self.problems.fieldActivated.connect(self._focus_field)
        self.plots.compare_button.clicked.connect(self.compare_with_run)
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _s: self._apply_theme())

        self._restore_settings()
        self._selection_changed(doc.selection)
        self._update_actions()
        self._update_title()
        self.statusBar().showMessage("Ready", 3000)

    # ------------------------------------------------------------------ building

    def _titled(self, title: str, widget: QWidget, tip: str) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(4, 4, 4, 0)
        layout.setSpacing(2)
        label = QLabel(f"<b>{title}</b>")
        label.setToolTip(tip)
        layout.addWidget(label)
        layout.addWidget(widget, 1)
        return box

    def _dock(self, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        dock.setToolTip("")
        self.addDockWidget(area, dock)
        return dock

    def _action(self, text: str, tip: str, slot: Callable[[], object] | None = None,
                shortcut: QKeySequence.StandardKey | str | None = None,
                icon: QStyle.StandardPixmap | None = None) -> QAction:
        action = QAction(text, self)
        action.setToolTip(tip)
        action.setStatusTip(tip)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if icon is not None:
            action.setIcon(self.style().standardIcon(icon))
        if slot is not None:
            action.triggered.connect(lambda _checked=False: slot())
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        c = self.controller
        doc = c.document
        SP = QStyle.StandardPixmap
        K = QKeySequence.StandardKey
        self.new_action = self._action("&New", "Start a new config (two local workers)", self.new_document, K.New,
                                       SP.SP_FileIcon)
        self.open_action = self._action("&Open…", "Open a YAML preset", self.open_preset, K.Open,
                                        SP.SP_DialogOpenButton)
        self.save_action = self._action("&Save", "Save the config to its file", self.save, K.Save,
                                        SP.SP_DialogSaveButton)
        self.save_as_action = self._action("Save &As…", "Save the config to a new file", self.save_as, K.SaveAs)
        self.export_action = self._action("&Export…", "Write TF_CONFIG files, per-host launch scripts and "
                                          "(given an image) a Kubeflow TFJob for this config into a folder",
                                          self.export_config, "Ctrl+E")
        self.scaling_action = self._action("Scaling &Report…", "Run this config at 1, 2, 4, … workers and plot "
                                           "throughput and scaling efficiency", self.open_scaling_dialog)
        self.open_run_action = self._action("Open &Run Folder…", "Show a past run: its config, tasks, curves and "
                                            "logs", self.open_run_folder, "Ctrl+Shift+O", SP.SP_DirOpenIcon)
        self.compare_action = self._action("&Compare with Run…", "Overlay another run's replica curves, dashed",
                                           self.compare_with_run)
        self.clear_compare_action = self._action("Clear Comparison", "Remove the overlaid runs",
                                                 c.session.clear_comparisons)
        self.runs_folder_action = self._action("Runs &Folder…", "Choose the folder new runs are written to",
                                               self.choose_runs_folder)
        self.quit_action = self._action("&Quit", "Quit ClusterDeck", self.close, K.Quit)
        if self.quit_action.shortcut().isEmpty():  # some platforms bind no standard Quit key
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.undo_action = doc.undo_stack.createUndoAction(self, "&Undo")
        self.undo_action.setShortcuts(QKeySequence.keyBindings(K.Undo))
        self.undo_action.setToolTip("Undo the last edit (Ctrl+Z)")
        self.undo_action.setIcon(theme.undo_icon())
        self.redo_action = doc.undo_stack.createRedoAction(self, "&Redo")
        redo = QKeySequence.keyBindings(K.Redo)
        self.redo_action.setShortcuts(redo + [QKeySequence("Ctrl+Shift+Z")] if QKeySequence("Ctrl+Shift+Z") not in redo
                                      else redo)
        self.redo_action.setToolTip("Redo the last undone edit (Ctrl+Shift+Z)")
        self.redo_action.setIcon(theme.undo_icon(redo=True))
        self.addAction(self.undo_action)
        self.addAction(self.redo_action)
        self.add_host_action = self._action("Add &Host", "Add a host (localhost) to the cluster", doc.add_host,
                                            "Ctrl+Shift+H")
        self.add_task_action = self._action("Add &Task", "Add a worker to the selected host (the arrow offers "
                                            "other roles)", lambda: self.add_task("worker"), "Ctrl+Shift+T")
        self.add_task_menu = QMenu("Add task", self)
        self.add_task_menu.setToolTipsVisible(True)
        self.role_actions: dict[str, QAction] = {}
        for role in ROLES:
            a = self.add_task_menu.addAction(f"Add {role}")
            a.setToolTip(f"Add a {role} task to the selected host")
            a.triggered.connect(lambda _=False, r=role: self.add_task(r))
            self.role_actions[role] = a
        self.delete_action = self._action("&Delete Selected", "Delete the selected host or task (Del on the canvas)",
                                          doc.delete_selection)
        self.run_action = self._action("&Run", "Launch the cluster and train (F5)", self.start_run, "F5",
                                       SP.SP_MediaPlay)
        self.stop_action = self._action("S&top", "Stop the run: every task ends (Shift+F5)", c.stop_run, "Shift+F5",
                                        SP.SP_MediaStop)
        self.fit_action = self._action("Fit Cluster in View", "Zoom the canvas so every host shows",
                                       self.canvas.fit_all, "Ctrl+0")
        self.theme_group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for key, text in (("system", "Follow the System"), ("light", "Light"), ("dark", "Dark")):
            a = QAction(text, self, checkable=True)
            a.setToolTip(f"Colour scheme: {text.lower()}")
            a.triggered.connect(lambda _=False, k=key: self.set_theme(k))
            self.theme_group.addAction(a)
            self.theme_actions[key] = a

    def _build_menus(self) -> None:
        bar = self.menuBar()
        m = bar.addMenu("&File")
        m.setToolTipsVisible(True)
        m.addAction(self.new_action)
        m.addAction(self.open_action)
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.setToolTipsVisible(True)
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self.presets_menu = m.addMenu("&Presets")
        self.presets_menu.setToolTipsVisible(True)
        self.presets_menu.aboutToShow.connect(self._fill_presets)
        m.addSeparator()
        m.addAction(self.save_action)
        m.addAction(self.save_as_action)
        m.addAction(self.export_action)
        m.addSeparator()
        m.addAction(self.open_run_action)
        m.addAction(self.compare_action)
        m.addAction(self.clear_compare_action)
        m.addAction(self.runs_folder_action)
        m.addSeparator()
        m.addAction(self.quit_action)
        m = bar.addMenu("&Edit")
        m.addAction(self.undo_action)
        m.addAction(self.redo_action)
        m.addSeparator()
        m.addAction(self.add_host_action)
        m.addMenu(self.add_task_menu)
        m.addAction(self.delete_action)
        m = bar.addMenu("&Run")
        m.addAction(self.run_action)
        m.addAction(self.stop_action)
        m.addSeparator()
        m.addAction(self.scaling_action)
        m = bar.addMenu("&View")
        for dock in (self.settings_dock, self.tasks_dock, self.logs_dock, self.messages_dock):
            m.addAction(dock.toggleViewAction())
        m.addSeparator()
        m.addAction(self.fit_action)
        theme_menu = m.addMenu("&Theme")
        for a in self.theme_actions.values():
            theme_menu.addAction(a)
        m = bar.addMenu("&Help")
        m.addAction(self._action("&About ClusterDeck", "What ClusterDeck is", self._about))

    def _build_toolbar(self) -> None:
        tb = self.addToolBar("Main")
        tb.setObjectName("mainToolbar")
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        tb.addAction(self.new_action)
        tb.addAction(self.open_action)
        tb.addAction(self.save_action)
        tb.addSeparator()
        tb.addAction(self.undo_action)
        tb.addAction(self.redo_action)
        for action in (self.undo_action, self.redo_action):
            button = tb.widgetForAction(action)
            if isinstance(button, QToolButton):  # its text names the edit; the icon keeps the bar steady
                button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        tb.addSeparator()
        tb.addAction(self.add_host_action)
        tb.addAction(self.add_task_action)
        button = tb.widgetForAction(self.add_task_action)
        if isinstance(button, QToolButton):
            button.setMenu(self.add_task_menu)
            button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        tb.addSeparator()
        tb.addAction(self.run_action)
        tb.addAction(self.stop_action)
        tb.addWidget(self.run_status)
        self.toolbar = tb

    # ------------------------------------------------------------------ state of actions and title

    def _update_actions(self, *_args: object) -> None:
        c = self.controller
        problems = c.problems
        running = c.is_running
        self.run_action.setEnabled(not problems and not running)
        if problems:
            text = "Cannot run:\n" + "\n".join(f"• {p}" for p in problems)
        elif running:
            text = "A run is in progress; stop it first (Shift+F5)"
        else:
            text = "Launch the cluster and train (F5)"
        self.run_action.setToolTip(text)
        button = self.toolbar.widgetForAction(self.run_action) if hasattr(self, "toolbar") else None
        if button is not None:
            button.setToolTip(text)
        self.stop_action.setEnabled(running and c.run_state != "stopping")
        self.open_run_action.setEnabled(not running)
        self.runs_folder_action.setEnabled(not running)
        self.clear_compare_action.setEnabled(bool(c.session.comparisons))
        read_only = c.document.read_only
        self.save_action.setText("&Save As…" if read_only else "&Save")
        self.save_action.setToolTip("A bundled preset is never overwritten: save your copy to a new file"
                                    if read_only else "Save the config to its file")
        has_selection = c.selection is not None
        self.delete_action.setEnabled(has_selection)

    def _run_state_changed(self, state: str) -> None:
        self._update_actions()
        if state == "starting" and self.controller.session.is_running:
            self.set_layout_mode("watch")  # the plots get the room; the cluster becomes a status view
        if state in ("failed",) and not self.controller.is_running:
            self.tasks_dock.raise_()
        if self._close_when_stopped and not self.controller.is_running:
            QTimer.singleShot(0, self.close)

    def _cluster_edited(self) -> None:
        """Editing the cluster is designing: the canvas gets its room back (a live run keeps its layout)."""
        if not self.controller.session.is_running:
            self.set_layout_mode("design")

    def _selection_changed(self, selection: object) -> None:
        self.selection_box.setVisible(selection is not None)
        if selection is not None:
            self.selection_box.setTitle("Selected host" if selection[0] == "host" else "Selected task")  # type: ignore[index]
        self._update_actions()

    # ------------------------------------------------------------------ layout

    def set_layout_mode(self, mode: str) -> None:
        """``design`` (the canvas large) or ``watch`` (the plots large); each keeps the user's sizes."""
        if mode == self.layout_mode:
            return
        self._remember_layout()
        self.layout_mode = mode
        self.canvas.set_compact(mode == "watch")
        self._apply_layout()

    def _apply_layout(self) -> None:
        """The current layout's sizes, as proportions of the splitter's height now."""
        total = sum(self.splitter.sizes()) or max(1, self.splitter.height())
        sizes = self._layout_sizes.get(self.layout_mode)
        if sizes and len(sizes) == 2 and sum(sizes) > 0:
            first = round(total * sizes[0] / sum(sizes))
        else:
            first = int(total * LAYOUT_SHARES[self.layout_mode])
        self.splitter.setSizes([first, total - first])

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._shown_once:  # the splitter has its real height only now
            self._shown_once = True
            self._apply_layout()

    def _remember_layout(self) -> None:
        sizes = self.splitter.sizes()
        if sum(sizes) > 0:
            self._layout_sizes[self.layout_mode] = sizes

    def _path_changed(self, path: Path | None) -> None:
        if path is not None:
            self._add_recent(path)
        self._update_title()

    def _update_title(self) -> None:
        c = self.controller
        where = str(c.path) if c.path is not None else "untitled"
        if c.document.read_only:
            where += " (bundled preset, read-only)"
        self.setWindowModified(c.document.is_modified)
        self.setWindowTitle(f"{c.config.name} — {where}[*] — ClusterDeck")
        self._update_actions()

    # ------------------------------------------------------------------ files

    def maybe_save(self) -> bool:
        """True when it is fine to drop the current document (saved, discarded, or unchanged)."""
        if not self.controller.document.is_modified:
            return True
        answer = QMessageBox.question(
            self, "Unsaved changes", f"The config “{self.controller.config.name}” has unsaved changes. Save them?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Save)
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_document(self) -> None:
        if self.maybe_save():
            self.controller.new_document()
            self.set_layout_mode("design")

    def open_preset(self) -> None:
        if not self.maybe_save():
            return
        path, _ = QFileDialog.getOpenFileName(self, "Open preset", self._last_dir(), YAML_FILTER)
        if path:
            self.open_path(path, ask=False)

    def open_path(self, path: str | Path, ask: bool = True) -> bool:
        """Open a preset; a problem with the file is told in a message box."""
        if ask and not self.maybe_save():
            return False
        try:
            self.controller.open_preset(path)
        except ConfigError as exc:
            QMessageBox.critical(self, "Cannot open the preset", str(exc))
            return False
        self._remember_dir(Path(path).parent)
        self.set_layout_mode("design")
        self.statusBar().showMessage(f"Opened {path}", 5000)
        return True

    def save(self) -> bool:
        """Save to the config's file; a new or bundled one asks where (a shipped preset is never overwritten)."""
        if self.controller.path is None or self.controller.document.read_only:
            return self.save_as()
        return self._save_to(self.controller.path)

    def save_as(self) -> bool:
        folder = Path(self._last_dir())
        if folder.resolve() == presets_dir().resolve():
            folder = Path.home()
        suggested = str(folder / f"{self.controller.config.name}.yaml")
        path, _ = QFileDialog.getSaveFileName(self, "Save preset as", suggested, YAML_FILTER)
        if not path:
            return False
        if not Path(path).suffix:
            path += ".yaml"
        return self._save_to(Path(path))

    def _save_to(self, path: Path) -> bool:
        try:
            self.controller.document.save(path)
        except ConfigError as exc:
            QMessageBox.critical(self, "Cannot save the preset", str(exc))
            return False
        self._remember_dir(path.parent)
        return True

    def open_run_folder(self, path: str | Path | None = None) -> bool:
        if self.controller.is_running or not self.maybe_save():
            return False
        if path is None:
            path = QFileDialog.getExistingDirectory(self, "Open run folder", str(self.controller.runs_root))
            if not path:
                return False
        try:
            self.controller.open_run(path)
        except ConfigError as exc:
            QMessageBox.critical(self, "Cannot open the run folder", str(exc))
            return False
        self.set_layout_mode("watch")
        return True

    def choose_runs_folder(self, path: str | Path | None = None) -> bool:
        """Where new runs go (remembered); not while a run is in progress."""
        if self.controller.is_running:
            return False
        if path is None:
            path = QFileDialog.getExistingDirectory(self, "Folder for new runs", str(self.controller.runs_root))
            if not path:
                return False
        self.controller.session.runs_root = Path(path)
        app_settings().setValue("runsRoot", str(path))
        return True

    def _runs_root_changed(self, path: Path) -> None:
        self.path_label.setText(f"runs: {path}")

    def open_any(self, path: str | Path) -> bool:
        """A run folder or a preset, whichever ``path`` is (command line, drop)."""
        if RunFolder(path).is_run_folder():
            return self.open_run_folder(path)
        if Path(path).is_dir():
            QMessageBox.critical(self, "Cannot open", f"{path}: expected a preset (.yaml) or a run folder "
                                 "(with a config.yaml), got a folder without a config.yaml")
            return False
        return self.open_path(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = event.mimeData().urls()
        if len(urls) == 1 and urls[0].isLocalFile():
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = event.mimeData().urls()
        if len(urls) == 1 and urls[0].isLocalFile():
            event.acceptProposedAction()
            path = urls[0].toLocalFile()
            QTimer.singleShot(0, lambda: self.open_any(path))  # not inside the drop: it may ask questions

    def compare_with_run(self, path: str | Path | None = None) -> bool:
        if not path:
            path = QFileDialog.getExistingDirectory(self, "Compare with run", str(self.controller.runs_root))
            if not path:
                return False
        try:
            label = self.controller.session.compare_with(path)
        except ConfigError as exc:
            QMessageBox.critical(self, "Cannot compare with this run", str(exc))
            return False
        self.statusBar().showMessage(f"Comparing with {label} (dashed curves)", 5000)
        self._update_actions()
        return True

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_files()
        for p in recent:
            a = self.recent_menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.triggered.connect(lambda _=False, p=p: self.open_path(p))
        if not recent:
            self.recent_menu.addAction("(none)").setEnabled(False)

    def _fill_presets(self) -> None:
        self.presets_menu.clear()
        for p in sorted(presets_dir().glob("*.yaml")):
            about = presets.description(p)
            a = self.presets_menu.addAction(f"{p.stem} — {first_sentence(about)}" if about else p.stem)
            a.setToolTip(f"{about}\n(opens read-only: Save asks for a new file)" if about else str(p))
            a.setStatusTip(about)
            a.triggered.connect(lambda _=False, p=p: self.open_path(p))
        if self.presets_menu.isEmpty():
            self.presets_menu.addAction("(no presets found)").setEnabled(False)

    def recent_files(self) -> list[str]:
        value = app_settings().value("recentFiles", [])
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value] if isinstance(value, list) else []

    def _add_recent(self, path: Path) -> None:
        text = str(Path(path).resolve())
        recent = [text] + [p for p in self.recent_files() if p != text]
        app_settings().setValue("recentFiles", recent[:MAX_RECENT])

    def _last_dir(self) -> str:
        return str(app_settings().value("lastDir", str(Path.cwd())))

    def _remember_dir(self, folder: Path) -> None:
        app_settings().setValue("lastDir", str(folder))

    # ------------------------------------------------------------------ editing and running

    def add_task(self, role: str) -> None:
        doc = self.controller.document
        sel = doc.selection
        if not doc.config.cluster.hosts:
            doc.add_host()
            sel = doc.selection
        host = sel[1] if sel is not None else len(doc.config.cluster.hosts) - 1
        doc.add_task(host, role)

    def show_start_failed(self, problems: list[Problem]) -> None:
        QMessageBox.warning(self, "Cannot run", str(ConfigError(problems)))
        self._update_actions()

    def start_run(self) -> None:
        try:
            self.controller.start_run()
        except ConfigError as exc:
            QMessageBox.warning(self, "Cannot run", str(exc))
        except RuntimeError as exc:
            self.statusBar().showMessage(str(exc), 5000)
        self._update_actions()

    def export_config(self, folder: str | Path | None = None, image: str | None = None) -> list[Path]:
        """Export the config (TF_CONFIG files, launch scripts, TFJob with an image); [] when cancelled or failed."""
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "Export into folder", self._last_dir())
            if not folder:
                return []
        if image is None:
            text, ok = QInputDialog.getText(self, "Export", "Container image for a Kubeflow TFJob "
                                            "(leave empty for none):")
            if not ok:
                return []
            image = text.strip()
        try:
            paths = export.write_export(self.controller.config, folder, image=image or None)
        except ConfigError as exc:
            QMessageBox.critical(self, "Cannot export the config", str(exc))
            return []
        except OSError as exc:
            QMessageBox.critical(self, "Cannot export the config", f"{folder}: {exc.strerror or exc}")
            return []
        self._remember_dir(Path(folder))
        self.statusBar().showMessage(f"Exported {len(paths)} files to {folder}", 8000)
        return paths

    def open_scaling_dialog(self) -> ScalingDialog:
        """Show the scaling report window (one per main window, kept between openings)."""
        if self.scaling_dialog is None:
            self.scaling_dialog = ScalingDialog(self.controller, self)
        self.scaling_dialog.show()
        self.scaling_dialog.raise_()
        self.scaling_dialog.activateWindow()
        return self.scaling_dialog

    def _stragglers_changed(self) -> None:
        text = self.stragglers.summary()
        self.straggler_label.setText(text)
        self.straggler_label.setVisible(bool(text))

    def _focus_field(self, field: str) -> None:
        """A problem was clicked: show and focus the editor of its field (a host's or task's, or a setting)."""
        self.settings_dock.show()
        self.settings_dock.raise_()
        if field.startswith("cluster.hosts["):
            self.properties.focus_field(field)
        else:
            self.settings_panel.focus_field(field)

    def _about(self) -> None:
        QMessageBox.about(self, "About ClusterDeck",
                          "<b>ClusterDeck</b><br>Draw a TensorFlow training cluster, pick a parallelism, "
                          "launch it and watch every replica train live.")

    # ------------------------------------------------------------------ theme and settings

    def set_theme(self, choice: str) -> None:
        """``system``, ``light`` or ``dark``; remembered."""
        self._theme_choice = choice
        self.theme_actions[choice].setChecked(True)
        app_settings().setValue("theme", choice)
        self._apply_theme()

    def _apply_theme(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            dark = None if self._theme_choice == "system" else self._theme_choice == "dark"
            theme.apply_palette(app, dark)
        self.canvas.rebuild()
        for plot in self.plots.plots.values():
            plot.apply_theme()
        self.undo_action.setIcon(theme.undo_icon())
        self.redo_action.setIcon(theme.undo_icon(redo=True))

    def _restore_settings(self) -> None:
        s = app_settings()
        self._theme_choice = str(s.value("theme", "system"))
        if self._theme_choice not in self.theme_actions:
            self._theme_choice = "system"
        self.theme_actions[self._theme_choice].setChecked(True)
        screen = self.screen() or QGuiApplication.primaryScreen()
        available = screen.availableGeometry().size() if screen is not None else QSize(1500, 940)
        geometry = s.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
            self.resize(screen_fit_size(self.size(), available))  # the screen may be smaller now
        else:
            size = screen_fit_size(QSize(1500, 940), available)
            self.resize(size)
            dock = max(280, min(340, size.width() // 5))
            self.resizeDocks([self.settings_dock], [dock], Qt.Orientation.Horizontal)
            self.resizeDocks([self.tasks_dock], [max(130, size.height() // 6)], Qt.Orientation.Vertical)
        state = s.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state)
        for mode in LAYOUT_SHARES:
            value = s.value(f"window/splitter/{mode}")
            if isinstance(value, list) and len(value) == 2:
                try:
                    self._layout_sizes[mode] = [int(v) for v in value]
                except (TypeError, ValueError):
                    pass
        self._apply_layout()
        # the settings column never cuts its form off: at least as wide as the form needs
        self.settings_dock.setMinimumWidth(self.settings_panel.needed_width())

    def save_settings(self) -> None:
        s = app_settings()
        self._remember_layout()
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        for mode, sizes in self._layout_sizes.items():
            s.setValue(f"window/splitter/{mode}", sizes)
        s.sync()

    # ------------------------------------------------------------------ closing

    def closeEvent(self, event: QCloseEvent) -> None:
        c = self.controller
        if c.is_running:
            if not self._close_when_stopped:
                answer = QMessageBox.question(self, "A run is in progress",
                                              "Stop the run and quit? Every task of the run will end.",
                                              QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                              QMessageBox.StandardButton.No)
                if answer != QMessageBox.StandardButton.Yes:
                    event.ignore()
                    return
                self._close_when_stopped = True
                c.stop_run()
                self.statusBar().showMessage("Stopping the run before quitting…")
            event.ignore()  # closes once the run has ended (see _run_state_changed)
            return
        if not self._close_when_stopped and not self.maybe_save():
            event.ignore()
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
        self.run_status.stop()
        if self.scaling_dialog is not None:
            self.scaling_dialog.shutdown()
