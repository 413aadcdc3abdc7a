"""Opening a model: the Model menu, drops on the window, the load dialog, the outcome (GUI thread).

Every way of picking a model (Open model file…, Open model folder…, Recent
models, a folder or .gguf dropped on the window) ends in ``choose(path)``: the
load dialog shows the memory estimate, and "Load" sends ``LoadModel`` with the
chosen options. ``load(path)`` skips the dialog (the command line does). While
loading, the status bar shows progress with a Cancel button. A model that loads
joins the recent models and its notices are shown; a load that fails opens a
dialog with the engine's message, and the previous model stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu

from app.chat.chat_session import ChatSession
from app.controller import EngineController
from app.models.load_dialog import GGUF_FILTER, LoadDialog
from app.models.load_progress import LoadProgressBar
from app.models.recent_models import RecentModelsMenu, remember_model
from app.storage.errors import StorageError
from app.window.menus import add_action
from app.window.status_line import StatusLine
from engine.protocol.messages import LoadFailed, LoadOptions, ModelLoaded

DEFAULT_MODEL = "default"

ShowError = Callable[[str, str], None]


def dropped_model_path(event: QDragEnterEvent | QDropEvent) -> str | None:
    """The one local folder or .gguf file being dragged, if that is what it is."""
    urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
    if len(urls) != 1 or not urls[0].isLocalFile():
        return None
    path = Path(urls[0].toLocalFile())
    return str(path) if path.is_dir() or path.suffix.lower() == ".gguf" else None


FORMATS_NOTICE_START = "Running "
"""How the engine's notice of the weight formats it chose begins (``memory_estimate.cpu_formats_notice``)."""


def loaded_notice(loaded: ModelLoaded) -> str:
    """The model's notices in the user's words: the formats chosen are summed up, their details left to the tooltip."""
    said = [notice for notice in loaded.notices if not notice.startswith(FORMATS_NOTICE_START)]
    if len(said) < len(loaded.notices):
        said.append("Set up to run fast on this computer (point here for the details).")
    return f"{loaded.name}: {' '.join(said)}"


class ModelLoader(QObject):
    """Turns the user's choice of model into a load, and reports how it went."""

    def __init__(
        self,
        window: QMainWindow,
        session: ChatSession,
        controller: EngineController,
        status: StatusLine,
        show_error: ShowError,
    ) -> None:
        super().__init__(window)
        self._window = window
        self._session = session
        self._status = status
        self._show_error = show_error
        self._paths: dict[str, str] = {}  # request id → path, for loads started here
        self._cancelled: set[str] = set()
        self.progress = LoadProgressBar(controller, window)
        self.progress.cancelled.connect(self._cancelled.add)
        status.addPermanentWidget(self.progress)
        self.recent_menu = RecentModelsMenu(window.settings_holder, window)
        self.recent_menu.model_chosen.connect(self.choose)
        controller.model_loaded.connect(self._on_loaded)
        controller.load_failed.connect(self._on_failed)
        self._controller = controller
        window.setAcceptDrops(True)
        window.installEventFilter(self)

    def fill_menu(self, menu: QMenu) -> None:
        """Add Open model file…, Open model folder…, Recent models and the built-in model to ``menu``."""
        add_action(menu, "&Open model file…", QKeySequence.StandardKey.Open, self.open_file)
        add_action(menu, "Open model &folder…", QKeySequence("Ctrl+Shift+O"), self.open_folder)
        menu.addMenu(self.recent_menu)
        menu.addSeparator()
        add_action(menu, "Load the &built-in model", None, lambda: self.load(DEFAULT_MODEL))

    def open_file(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self._window, "Open a model file", self._window.start_folders.folder("model"), GGUF_FILTER
        )
        if path:
            self._window.start_folders.remember("model", path)
            self.choose(path)

    def open_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self._window, "Open a Hugging Face model folder",
                                                  self._window.start_folders.folder("model"))
        if folder:
            self._window.start_folders.remember("model", str(Path(folder).parent))
            self.choose(folder)

    def choose(self, path: str) -> LoadDialog:
        """Show the load dialog for ``path``, on the draft model last chosen for it; "Load" keeps the draft model
        chosen for next time and starts loading with the dialog's options."""
        holder = self._window.settings_holder
        dialog = LoadDialog(self._controller, path, self._window, holder.settings.draft_model_for(path))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._load_chosen(path, dialog.options()))
        dialog.open()
        return dialog

    def _load_chosen(self, path: str, options: LoadOptions) -> None:
        """Load ``path`` with the dialog's ``options``, its draft model kept in the settings for ``path``."""
        try:
            self._window.settings_holder.replace(self._window.settings_holder.settings.with_draft_model(
                path, options.draft_model))
        except StorageError as error:
            self._status.show_notice(str(error))
        self.load(path, options)

    def load(self, path: str, options: LoadOptions = LoadOptions()) -> str:
        """Load ``path`` now (no dialog); returns the request id."""
        request_id = self._session.load_model(path, options)
        self._paths[request_id] = path
        self.progress.track(request_id, "the built-in model" if path == DEFAULT_MODEL else Path(path).name)
        return request_id

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._window and event.type() in (QEvent.Type.DragEnter, QEvent.Type.Drop):
            path = dropped_model_path(event)
            if path is None:
                return False
            event.acceptProposedAction()
            if event.type() == QEvent.Type.Drop:
                self.choose(path)
            return True
        return super().eventFilter(watched, event)

    def _on_loaded(self, event: ModelLoaded) -> None:
        path = self._paths.pop(event.request_id, None)
        if event.notices:
            self._status.show_notice(loaded_notice(event), "\n".join(event.notices))
        if path is None or path == DEFAULT_MODEL:
            return
        try:
            remember_model(self._window.settings_holder, path)
        except StorageError as error:
            self._status.show_notice(str(error))

    def _on_failed(self, event: LoadFailed) -> None:
        self._paths.pop(event.request_id, None)
        if event.request_id in self._cancelled:
            self._cancelled.discard(event.request_id)
            self._status.show_notice(event.message)
            return
        self._show_error("The model could not be loaded", event.message)
