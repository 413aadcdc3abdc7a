"""File › Connect to server…: an address, an optional API key, and the server's models to pick from (GUI thread).

"List models" sends ``ListRemoteModels`` through the controller; the remote
engine answers with the server's ``/v1/models`` (``RemoteModelsListed``) or with
a message saying what went wrong (``RemoteModelsFailed``), shown in the dialog,
which stays open to try again. A mistyped address is refused before anything is
sent. "Use model" accepts with the server (its address as the engine
normalized it) and the chosen model id; ``chosen()`` returns both. Saved
connections fill the address list; picking one fills in its key.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controller import EngineController
from app.storage.settings import RemoteConnection
from engine.api.remote.http_stream import normalize_base_url
from engine.protocol.messages import RemoteModelsFailed, RemoteModelsListed, RemoteServer

ADDRESS_HINT = "http://localhost:8000"


class RemoteServerDialog(QDialog):
    """Asks for a server, lists its models, and lets the user pick one."""

    def __init__(
        self, controller: EngineController, saved: tuple[RemoteConnection, ...], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self.setObjectName("remoteServerDialog")
        self._controller = controller
        self._saved = {connection.base_url: connection for connection in saved}
        self._request_id = ""
        self._asked: RemoteServer | None = None  # the server being asked for its models
        self._server: RemoteServer | None = None  # the server that listed the models shown
        self._build()
        controller.remote_models_listed.connect(self._on_listed)
        controller.remote_models_failed.connect(self._on_failed)
        if saved:
            self._fill_saved(saved[0].base_url)

    def chosen(self) -> tuple[RemoteServer, str] | None:
        """The server that listed the models and the model picked, once one is."""
        item = self.models.currentItem()
        if self._server is None or item is None:
            return None
        return self._server, item.text()

    def list_models(self) -> None:
        try:
            base_url = normalize_base_url(self.address.currentText())
        except ValueError as error:
            self._say(str(error))
            return
        self._server = None
        self.models.clear()
        self._asked = RemoteServer(base_url, self.api_key.text().strip())
        self._request_id = self._controller.list_remote_models(self._asked)
        self.list_button.setEnabled(False)
        self._say(f"Asking {base_url} for its models…")

    def _build(self) -> None:
        self.address = QComboBox(self, editable=True, objectName="remoteAddress")
        self.address.addItems(list(self._saved))
        self.address.lineEdit().setPlaceholderText(ADDRESS_HINT)
        self.address.setAccessibleName("Server address")
        self.address.textActivated.connect(self._fill_saved)
        self.api_key = QLineEdit(self, objectName="remoteApiKey", placeholderText="none")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setAccessibleName("API key")
        for field in (self.address.lineEdit(), self.api_key):
            field.returnPressed.connect(self._list_if_none_listed)
        self.list_button = QPushButton("&List models", self, objectName="remoteListModels")
        self.list_button.clicked.connect(self.list_models)
        self.models = QListWidget(self, objectName="remoteModels")
        self.models.setAccessibleName("Models on the server")
        self.models.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.models.itemDoubleClicked.connect(lambda *_: self.accept())
        self.message = QLabel("", self, objectName="remoteMessage", wordWrap=True)
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # it quotes the server, which may send markup
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("&Use model")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._lay_out()
        self._update_buttons()

    def _lay_out(self) -> None:
        form = QFormLayout()
        form.addRow("&Address", self.address)
        form.addRow("API &key", self.api_key)
        form.addRow("", self.list_button)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(self.models, 1)
        column.addWidget(self.message)
        column.addWidget(self.buttons)

    def _list_if_none_listed(self) -> None:
        """Enter in the address or key lists the models; once they are listed, it picks the chosen one."""
        if self.chosen() is None and not self._request_id:
            self.list_models()

    def _fill_saved(self, base_url: str) -> None:
        connection = self._saved.get(base_url)
        if connection is not None:
            self.address.setCurrentText(connection.base_url)
            self.api_key.setText(connection.api_key)

    def _on_listed(self, event: RemoteModelsListed) -> None:
        if event.request_id != self._request_id or self._asked is None:
            return
        self._server = replace(self._asked, base_url=event.base_url)
        self.models.addItems(list(event.models))
        saved = self._saved.get(event.base_url)
        preferred = saved.model if saved and saved.model in event.models else (event.models[:1] or ("",))[0]
        matches = self.models.findItems(preferred, Qt.MatchFlag.MatchExactly) if preferred else []
        if matches:
            self.models.setCurrentItem(matches[0])
        count = len(event.models)
        plural = "s" if count != 1 else ""
        self._say(f"{event.base_url} runs {count} model{plural}." if count else f"{event.base_url} lists no models.")
        self._done_asking()

    def _on_failed(self, event: RemoteModelsFailed) -> None:
        if event.request_id == self._request_id:
            self._say(event.message)
            self._done_asking()

    def _done_asking(self) -> None:
        self._request_id = ""
        self.list_button.setEnabled(True)
        self._update_buttons()

    def _say(self, text: str) -> None:
        self.message.setText(text)

    def _update_buttons(self) -> None:
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(self.chosen() is not None)
