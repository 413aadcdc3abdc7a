"""Using a model that runs on a remote server: the File menu entry and the outcome (GUI thread).

File › Connect to server… opens ``RemoteServerDialog``; its choice is loaded like
a local model (``ChatSession.load_model`` with the server), with the same progress
bar and the same error dialog when it fails (``ModelLoader`` shows those for every
load). Once the model is in use, the connection (address, key, model) is saved
first among the remembered ones in the settings file, which only the user can read.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QMainWindow, QMenu

from app.chat.chat_session import ChatSession
from app.controller import EngineController
from app.models.load_progress import LoadProgressBar
from app.models.remote_dialog import RemoteServerDialog
from app.storage.errors import StorageError
from app.settings.app_settings import SettingsHolder
from app.storage.settings import RemoteConnection
from app.window.menus import add_action
from app.window.status_line import StatusLine
from engine.protocol.messages import LoadFailed, ModelLoaded, RemoteServer


def remember_connection(holder: SettingsHolder, connection: RemoteConnection) -> None:
    """Save ``connection`` first among the remote servers; raises ``StorageError`` when the settings cannot be saved.

    Through the window's one ``SettingsHolder``: a copy saved behind its back would be overwritten by its next save.
    """
    holder.replace(holder.settings.with_remote_connection(connection))


class RemoteModelPicker(QObject):
    """Turns a server and a model picked in the dialog into a load, and remembers what worked."""

    def __init__(
        self,
        window: QMainWindow,
        session: ChatSession,
        controller: EngineController,
        status: StatusLine,
        progress: LoadProgressBar,
    ) -> None:
        super().__init__(window)
        self._window = window
        self._session = session
        self._controller = controller
        self._status = status
        self._progress = progress
        self._pending: dict[str, RemoteConnection] = {}  # request id → the connection it would save
        controller.model_loaded.connect(self._on_loaded)
        controller.load_failed.connect(self._on_failed)

    def fill_menu(self, menu: QMenu) -> None:
        add_action(menu, "Connect to &server…", None, self.open_dialog)

    def open_dialog(self) -> RemoteServerDialog:
        saved = self._window.settings_holder.settings.remote_servers
        dialog = RemoteServerDialog(self._controller, saved, self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._use(dialog.chosen()))
        dialog.open()
        return dialog

    def use(self, server: RemoteServer, model: str) -> str:
        """Use ``model`` on ``server`` from now on (no dialog); returns the request id."""
        request_id = self._session.load_model(model, server=server)
        self._pending[request_id] = RemoteConnection(server.base_url, server.api_key, model)
        self._progress.track(request_id, f"{model} on {server.base_url}")
        return request_id

    def _use(self, choice: tuple[RemoteServer, str] | None) -> None:
        if choice is not None:
            self.use(*choice)

    def _on_loaded(self, event: ModelLoaded) -> None:
        connection = self._pending.pop(event.request_id, None)
        if connection is None:
            return
        try:
            remember_connection(self._window.settings_holder, connection)
        except StorageError as error:
            self._status.show_notice(str(error))

    def _on_failed(self, event: LoadFailed) -> None:
        self._pending.pop(event.request_id, None)
