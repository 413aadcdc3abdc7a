"""The Server menu: run Hearth's OpenAI-compatible API server on the app's own engine thread (GUI thread).

Start and stop, the port and API key (``ServerSettingsDialog``), and the URL to
copy. The port, the bind address and the key are kept in the settings file (through
the window's ``SettingsHolder``; readable by the user alone), so they come back at
the next start; the server itself starts only when asked. The server shares the
engine thread with the window through the engine's ``EngineHub``, so its requests
queue with the window's chats and reuse the same loaded model. Its per-request
figures come from the server thread through a queued Qt signal into the performance
panel's ``ServerRequestList``.

Starting never blocks the window: the server binds its port at once (a port in use
is refused there), then says from its own thread, through ``serving_reported``,
whether it began serving; until then the menu shows "Starting…". Copy URL is
offered only while a server is serving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLineEdit, QMainWindow, QSpinBox, QWidget

from app.controller import EngineController
from app.perf.server_requests import ServerRequestList
from app.settings.app_settings import SettingsHolder
from app.storage import StorageError
from app.storage.settings import ServerSettings
from app.window.menus import add_action, menu_named
from engine.api.server.config import ServerConfig

if TYPE_CHECKING:
    from engine.api.server.server import ApiServer

ALL_INTERFACES = "0.0.0.0"


class ServerSettingsDialog(QDialog):
    """Port, API key, and whether other machines may connect (which needs the key)."""

    def __init__(self, config: ServerConfig, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("API server settings")
        self.port = QSpinBox(minimum=0, maximum=65535, value=config.port, objectName="server_port")
        self.port.setSpecialValueText("any free port")
        self.api_key = QLineEdit(config.api_key or "", objectName="server_api_key", placeholderText="none (this machine only)")
        self.everywhere = QCheckBox("Let other machines connect (needs an API key)", objectName="server_everywhere")
        self.everywhere.setChecked(config.host == ALL_INTERFACES)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        form.addRow(self.everywhere)
        form.addRow(buttons)

    def chosen(self, previous: ServerConfig) -> ServerConfig:
        host = ALL_INTERFACES if self.everywhere.isChecked() else "127.0.0.1"
        key = self.api_key.text().strip() or None
        return ServerConfig(host, self.port.value(), key, previous.cors_origins, previous.max_body_bytes)


class ServerMenu(QObject):
    """Owns the API server while it runs; ``request_seen`` carries each ``ServerRequestInfo`` to the GUI thread."""

    request_seen = Signal(object)
    serving_reported = Signal(object)
    """(server, None) when that server began serving, else (server, why it could not); from the server thread."""
    running_changed = Signal(bool)

    def __init__(self, window: QMainWindow, controller: EngineController, requests: ServerRequestList,
                 holder: SettingsHolder, show_error) -> None:
        super().__init__(window)
        self.config = holder.settings.server.to_config()
        self.server: "ApiServer | None" = None
        self.serving = False
        self._window = window
        self._holder = holder
        self._controller = controller
        self._show_error = show_error
        self.requests = requests
        self.request_seen.connect(requests.on_request)
        self.serving_reported.connect(self._on_serving)
        menu = menu_named(window, "Se&rver")
        self.start_action = add_action(menu, "&Start API server", None, self.start)
        self.stop_action = add_action(menu, "S&top API server", None, self.stop)
        self.url_action = add_action(menu, "&Copy URL", None, self.copy_url)
        menu.addSeparator()
        self.settings_action = add_action(menu, "Server s&ettings…", None, self.edit_settings)
        self._show_state()

    @property
    def url(self) -> str:
        return self.server.url if self.server else self.config.url

    def start(self) -> None:
        hub = self._controller.engine_hub
        if hub is None:
            self._show_error("The API server cannot start", "It serves Hearth's own engine, which is not running now.")
            return
        from engine.api.server.server import ApiServer  # starlette and uvicorn load when first needed, not at app start

        try:  # both callbacks run on the server thread; the signals bring them here
            server = ApiServer(hub, self.config, self.request_seen.emit,
                               lambda failure: self.serving_reported.emit((server, failure)))
            server.launch()
        except (ValueError, OSError) as exc:
            self._show_error("The API server cannot start", str(exc))
            return
        self.server = server
        self._show_state()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.serving = False
        self._show_state()

    def _on_serving(self, report: "tuple[ApiServer, str | None]") -> None:
        """A server's start report; one from a server stopped since is ignored."""
        server, failure = report
        if server is not self.server or self.serving:
            return
        if failure is not None:
            self.server = None
            self._show_state()
            self._show_error("The API server cannot start", failure)
            return
        self.serving = True
        self._show_state()

    def copy_url(self) -> None:
        QGuiApplication.clipboard().setText(self.url)

    def edit_settings(self) -> None:
        dialog = ServerSettingsDialog(self.config, self._window)
        dialog.accepted.connect(lambda: self._apply(dialog.chosen(self.config)))
        dialog.open()

    def _apply(self, config: ServerConfig) -> None:
        try:
            config.check()
        except ValueError as exc:
            self._show_error("These server settings cannot be used", str(exc))
            return
        self.config = config
        try:
            self._holder.update(server=ServerSettings.of(config))
        except StorageError as error:
            self._show_error("The server settings are used for this session only", str(error))
        if self.server is not None:  # a running server takes the new settings at once
            self.stop()
            self.start()
        self._show_state()

    def _show_state(self) -> None:
        starting = self.server is not None and not self.serving
        self.start_action.setEnabled(self.server is None)
        self.start_action.setText("Starting the API server…" if starting else "&Start API server")
        self.stop_action.setEnabled(self.server is not None)
        self.url_action.setEnabled(self.serving)
        self.url_action.setText(f"&Copy URL ({self.url})")
        self.url_action.setStatusTip("Running: " + self.url if self.serving else "Not running; starts at " + self.url)
        self.running_changed.emit(self.serving)


def install_server_menu(window: QMainWindow, controller: EngineController, panel_column: QWidget,
                        holder: SettingsHolder, show_error) -> ServerMenu:
    """The Server menu and the panel's request list; the server stops when the window closes."""
    requests = ServerRequestList(panel_column)
    panel_column.layout().addWidget(requests)
    server_menu = ServerMenu(window, controller, requests, holder, show_error)
    window.closed.connect(server_menu.stop)  # type: ignore[attr-defined]
    return server_menu


