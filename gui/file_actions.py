"""The window's file commands: new, open, save, save as, recent files, bundled presets, run folders,
comparisons, the runs folder, export and drops. Each asks the user what it needs (file dialogs,
"save your changes?") and then goes through the controller's public API; a problem is told in a
message box, never raised into Qt.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, QTimer, Signal
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMenu, QMessageBox, QWidget

from engine.contract import presets
from engine.contract.config import ConfigError, Problem, RunConfig
from engine.contract.presets import presets_dir
from engine.contract.run_folder import LIVE_STATES, RunFolder
from engine.control import export
from engine.control.detach import run_state
from engine.control.remote_protocol import RemoteTarget, TargetError
from gui.controller import Controller, auto_ports
from gui.preferences import app_settings
from gui.runs_location import RecentTargets

MAX_RECENT = 8
YAML_FILTER = "ClusterDeck presets (*.yaml *.yml);;All files (*)"
REMOTE_ASK = ("A run on another machine, named as scp names a file — user@host:/path/to/run (a bare name is a run "
              "under the runs folder there).\nIts history, then live steps, come over your own ssh; Stop stops it "
              "there; closing or switching runs detaches (it keeps going).")


def first_sentence(text: str, limit: int = 70) -> str:
    """A description's first sentence (up to its first colon), at most ``limit`` characters."""
    head = text.split(". ")[0].split(": ")[0].rstrip(".")
    return head if len(head) <= limit else head[:limit - 1] + "…"


def dropped_file(mime: QMimeData) -> str | None:
    """The one local file or folder being dragged (None for several, none or a remote one)."""
    urls = mime.urls()
    if len(urls) == 1 and urls[0].isLocalFile():
        return urls[0].toLocalFile()
    return None


class RecentFiles:
    """The presets opened or saved last, newest first, at most ``limit`` (kept in the app's settings)."""

    def __init__(self, key: str = "recentFiles", limit: int = MAX_RECENT) -> None:
        self.key = key
        self.limit = limit

    def paths(self) -> list[str]:
        value = app_settings().value(self.key, [])
        if isinstance(value, str):  # QSettings gives a one-item list back as its item
            return [value]
        return [str(v) for v in value] if isinstance(value, list) else []

    def add(self, path: str | Path) -> None:
        text = str(Path(path).resolve())
        recent = [text] + [p for p in self.paths() if p != text]
        app_settings().setValue(self.key, recent[:self.limit])


class FileActions(QObject):
    """The file commands of ``window`` (the parent of their dialogs) over ``controller``.

    Installed as an event filter on the window, it opens what is dropped onto it."""

    documentOpened = Signal()  # a config was opened or started anew: shown for designing
    runOpened = Signal()  # a run folder was opened: shown for watching
    message = Signal(str, int)  # for the status bar: text, milliseconds

    def __init__(self, controller: Controller, window: QWidget) -> None:
        super().__init__(window)
        self.controller = controller
        self.window = window
        self.recent = RecentFiles()
        self.recent_remote = RecentTargets("remoteRuns")
        controller.document.pathChanged.connect(self._path_changed)
        controller.session.remoteConfig.connect(self._remote_shown)
        controller.session.remote_opener.failed.connect(self._remote_failed)
        window.setAcceptDrops(True)
        window.installEventFilter(self)

    # ------------------------------------------------------------------ the document

    def maybe_save(self) -> bool:
        """True when it is fine to drop the current document (saved, discarded, or unchanged)."""
        document = self.controller.document
        if not document.is_modified:
            return True
        buttons = QMessageBox.StandardButton
        answer = QMessageBox.question(
            self.window, "Unsaved changes", f"The config “{document.config.name}” has unsaved changes. Save them?",
            buttons.Save | buttons.Discard | buttons.Cancel, buttons.Save)
        if answer == buttons.Save:
            return self.save()
        return answer == buttons.Discard

    def new_document(self) -> None:
        if self.maybe_save():
            self.controller.new_document()
            self.documentOpened.emit()

    def open_preset(self) -> None:
        if not self.maybe_save():
            return
        path, _ = QFileDialog.getOpenFileName(self.window, "Open preset", self.last_dir(), YAML_FILTER)
        if path:
            self.open_path(path, ask=False)

    def open_path(self, path: str | Path, ask: bool = True) -> bool:
        """Open a preset; a problem with the file is told in a message box."""
        if ask and not self.maybe_save():
            return False
        try:
            self.controller.open_preset(path)
        except ConfigError as exc:
            QMessageBox.critical(self.window, "Cannot open the preset", str(exc))
            return False
        self.remember_dir(Path(path).parent)
        self.documentOpened.emit()
        self.message.emit(f"Opened {path}", 5000)
        return True

    def save(self) -> bool:
        """Save to the config's file; a new or bundled one asks where (a shipped preset is never overwritten)."""
        document = self.controller.document
        if document.path is None or document.read_only:
            return self.save_as()
        return self._save_to(document.path)

    def save_as(self) -> bool:
        folder = Path(self.last_dir())
        if folder.resolve() == presets_dir().resolve():
            folder = Path.home()
        suggested = str(folder / f"{self.controller.document.config.name}.yaml")
        path, _ = QFileDialog.getSaveFileName(self.window, "Save preset as", suggested, YAML_FILTER)
        if not path:
            return False
        if not Path(path).suffix:
            path += ".yaml"
        return self._save_to(Path(path))

    def _save_to(self, path: Path) -> bool:
        try:
            self.controller.document.save(path)
        except ConfigError as exc:
            QMessageBox.critical(self.window, "Cannot save the preset", str(exc))
            return False
        self.remember_dir(path.parent)
        return True

    def _path_changed(self, path: Path | None) -> None:
        if path is not None:
            self.recent.add(path)

    # ------------------------------------------------------------------ runs

    def own_run_in_progress(self) -> bool:
        """A run started in this window (or its pre-launch check) is in progress: it holds the screen until it
        ends (a run followed through its folder does not: it is let go and runs on). Says so."""
        c = self.controller
        if c.checks.busy or (c.session.run is not None and c.session.attached is None):
            self.message.emit("A run started in this window is in progress: stop it first (Shift+F5), or turn on "
                              "Run ▸ Keep Runs Going After Closing to start runs that other runs may be shown beside",
                              8000)
            return True
        return False

    def open_run_folder(self, path: str | Path | None = None) -> bool:
        """Show a run folder (the picker asks without ``path``): a past run from disk; a running one is attached
        to and followed live (Stop stops it). A run attached before is let go: it runs on."""
        if self.own_run_in_progress() or not self.maybe_save():
            return False
        if path is None:
            path = QFileDialog.getExistingDirectory(self.window, "Open run folder", str(self.controller.runs_root))
            if not path:
                return False
        folder = RunFolder(path)
        session = self.controller.session
        try:
            if not folder.is_run_folder():
                raise ConfigError([Problem("", "not a run folder: it has no config.yaml; expected a folder a run "
                                               "wrote (the Runs panel lists those of the runs folder)")], str(path))
            config = folder.read_config(check=False)
            live = run_state(folder) in LIVE_STATES
            session.release()  # first: the document's change below is no edit of that run
            # the run's ports were fixed at its launch: the copy to edit takes new ones again
            self.controller.document.replace(auto_ports(config), None)
            if live:
                session.attach(folder.path)
            else:
                session.open_folder(folder.path)
        except ConfigError as exc:
            QMessageBox.critical(self.window, "Cannot open the run folder", str(exc))
            return False
        except OSError as exc:
            QMessageBox.critical(self.window, "Cannot open the run folder", f"{path}: cannot be read "
                                 f"({exc.strerror or exc}); expected a run folder you may read")
            return False
        self.runOpened.emit()
        return True

    def open_remote_run(self, target: str | None = None) -> bool:
        """Watch a run on another machine over ssh (asked for without ``target``: ``user@host:/path/to/run``, the
        recent ones offered). Connects off the GUI thread; what cannot be opened is told in a box, in one line."""
        if self.own_run_in_progress() or not self.maybe_save():
            return False
        if target is None:
            recent = self.recent_remote.items()
            text, ok = QInputDialog.getItem(self.window, "Open Remote Run", REMOTE_ASK, recent, 0, True)
            if not ok or not text.strip():
                return False
            target = text.strip()
        try:
            RemoteTarget.parse(target, need_path=True)
        except TargetError as exc:
            QMessageBox.critical(self.window, "Cannot open the remote run", str(exc))
            return False
        self.recent_remote.add(target)
        self.controller.session.attach_remote(target)
        self.message.emit(f"Connecting to {target} over ssh (its history first)…", 0)
        return True

    def _remote_shown(self, config: RunConfig) -> None:
        """A remote run connected: its config becomes the document (with new ports) as an opened folder's does."""
        self.controller.document.replace(auto_ports(config), None)
        self.runOpened.emit()

    def _remote_failed(self, text: str) -> None:
        self.message.emit(text, 10000)
        QMessageBox.warning(self.window, "Cannot open the remote run", text)

    def open_any(self, path: str | Path) -> bool:
        """A run folder or a preset, whichever ``path`` is (command line, drop)."""
        if RunFolder(path).is_run_folder():
            return self.open_run_folder(path)
        if Path(path).is_dir():
            QMessageBox.critical(self.window, "Cannot open", f"{path}: expected a preset (.yaml) or a run folder "
                                 "(with a config.yaml), got a folder without a config.yaml")
            return False
        return self.open_path(path)

    def compare_with_run(self, path: str | Path | None = None) -> bool:
        if not path:
            path = QFileDialog.getExistingDirectory(self.window, "Compare with run", str(self.controller.runs_root))
            if not path:
                return False
        try:
            label = self.controller.session.compare_with(path)
        except ConfigError as exc:
            QMessageBox.critical(self.window, "Cannot compare with this run", str(exc))
            return False
        self.message.emit(f"Comparing with {label} (dashed curves)", 5000)
        return True

    def choose_runs_folder(self, path: str | Path | None = None) -> bool:
        """Where new runs go (remembered); not while a run started in this window is in progress."""
        if self.own_run_in_progress():
            return False
        if path is None:
            path = QFileDialog.getExistingDirectory(self.window, "Folder for new runs", str(self.controller.runs_root))
            if not path:
                return False
        self.controller.session.runs_root = Path(path)
        app_settings().setValue("runsRoot", str(path))
        return True

    def export_config(self, folder: str | Path | None = None, image: str | None = None) -> list[Path]:
        """Export the config (TF_CONFIG files, launch scripts, TFJob with an image); [] when cancelled or failed."""
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self.window, "Export into folder", self.last_dir())
            if not folder:
                return []
        if image is None:
            text, ok = QInputDialog.getText(self.window, "Export", "Container image for a Kubeflow TFJob "
                                            "(leave empty for none):")
            if not ok:
                return []
            image = text.strip()
        try:
            report = export.write_export_report(self.controller.document.config, folder, image=image or None)
        except ConfigError as exc:
            QMessageBox.critical(self.window, "Cannot export the config", str(exc))
            return []
        except OSError as exc:
            QMessageBox.critical(self.window, "Cannot export the config", f"{folder}: {exc.strerror or exc}")
            return []
        self.remember_dir(Path(folder))
        paths = report.paths
        if report.skipped:  # what could be written is; the TFJob's reason is said, and kept in the folder
            reasons = "\n".join(f"• {p}" for p in report.skipped)
            QMessageBox.warning(self.window, "Exported without a TFJob",
                                f"Wrote the TF_CONFIG files and launch scripts to {folder}, but no Kubeflow TFJob:\n"
                                f"{reasons}\n(The reason is also in {export.SKIPPED_NOTE} there.)")
            self.message.emit(f"Exported {len(paths)} files to {folder} — TFJob skipped: {report.skipped[0].message}",
                              12000)
        else:
            self.message.emit(f"Exported {len(paths)} files to {folder}", 8000)
        return paths

    # ------------------------------------------------------------------ menus that fill as they open

    def fill_recent(self, menu: QMenu) -> None:
        menu.clear()
        recent = self.recent.paths()
        for p in recent:
            a = menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.triggered.connect(lambda _=False, p=p: self.open_path(p))
        if not recent:
            menu.addAction("(none)").setEnabled(False)

    def fill_presets(self, menu: QMenu) -> None:
        menu.clear()
        for p in sorted(presets_dir().glob("*.yaml")):
            about = presets.description(p)
            a = menu.addAction(f"{p.stem} — {first_sentence(about)}" if about else p.stem)
            a.setToolTip(f"{about}\n(opens read-only: Save asks for a new file)" if about else str(p))
            a.setStatusTip(about)
            a.triggered.connect(lambda _=False, p=p: self.open_path(p))
        if menu.isEmpty():
            menu.addAction("(no presets found)").setEnabled(False)

    # ------------------------------------------------------------------ folders and drops

    def last_dir(self) -> str:
        """The folder the last file was opened from or written to (the dialogs start there)."""
        return str(app_settings().value("lastDir", str(Path.cwd())))

    def remember_dir(self, folder: Path) -> None:
        app_settings().setValue("lastDir", str(folder))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        """One local file or folder dragged onto the window is accepted, and opened when dropped."""
        kind = event.type()
        if watched is not self.window or kind not in (QEvent.Type.DragEnter, QEvent.Type.Drop):
            return super().eventFilter(watched, event)
        assert isinstance(event, QDropEvent)  # a QDragEnterEvent is one too
        path = dropped_file(event.mimeData())
        if path is None:
            event.ignore()
            return True
        event.acceptProposedAction()
        if kind == QEvent.Type.Drop:
            QTimer.singleShot(0, lambda: self.open_any(path))  # not inside the drop: it may ask questions
        return True
