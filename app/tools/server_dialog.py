"""Settings › Tools › Add… and Edit…: one MCP server's entry, checked before it is kept (GUI thread)."""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import replace
from urllib.parse import urlsplit

from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QPlainTextEdit, QVBoxLayout,
    QWidget,
)

from app.storage.settings import ToolServerConfig

TRANSPORT_LABELS = {"stdio": "Command Hearth starts (stdio)", "http": "Address of a running server (HTTP)"}
URL_EXAMPLE = "http://localhost:8000/mcp"
MIN_WIDTH = 560  # room for a command with its arguments


def read_server(
    name: str, transport: str, command: str, arguments: str, environment: str, url: str, enabled: bool,
    taken_names: Collection[str],
) -> ToolServerConfig:
    """The entry the fields describe; raises ValueError with a sentence for the user when a field is wrong."""
    name = name.strip()
    if not name:
        raise ValueError("Give the server a name.")
    if name in taken_names:
        raise ValueError(f"There is already a server named “{name}”: choose another name.")
    if transport == "http":
        return ToolServerConfig(name, "http", url=_read_url(url), enabled=enabled)
    if not command.strip():
        raise ValueError("Enter the command that starts the server, for example npx, uvx or python.")
    return ToolServerConfig(
        name, "stdio", command.strip(), _read_arguments(arguments), _read_environment(environment), enabled=enabled
    )


def _read_url(url: str) -> str:
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Enter the server's address, starting with http:// or https:// (for example {URL_EXAMPLE}).")
    return url


def _read_arguments(arguments: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(arguments))
    except ValueError as error:
        raise ValueError(f"The arguments could not be read ({error}): close every quotation mark.") from None


def _read_environment(environment: str) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(environment.splitlines(), start=1):
        if not line.strip():
            continue
        key, equals, value = line.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"Environment line {number} (“{line.strip()}”) is not NAME=value.")
        pairs.append((key.strip(), value))
    return tuple(pairs)


class ServerDialog(QDialog):
    """Edits one server's entry; ``config`` holds it once the dialog is accepted.

    A wrong field keeps the dialog open and says what is wrong. Tools allowed without
    asking stay allowed only while the server's command or address stays the same.
    """

    def __init__(
        self, taken_names: Collection[str], server: ToolServerConfig | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("toolServerDialog")
        self.setWindowTitle("Edit tool server" if server else "Add tool server")
        self.setAccessibleName(self.windowTitle())
        self.setMinimumWidth(MIN_WIDTH)
        self.config: ToolServerConfig | None = None
        self._taken_names = taken_names
        self._original = server
        server = server or ToolServerConfig("")
        self.name_edit = self._line(server.name, "Server name", "files")
        self.transport_box = QComboBox(self)
        self.transport_box.setAccessibleName("How to reach the server")
        for transport, label in TRANSPORT_LABELS.items():
            self.transport_box.addItem(label, transport)
        self.transport_box.setCurrentIndex(self.transport_box.findData(server.transport))
        self.command_edit = self._line(server.command, "Command", "npx")
        self.arguments_edit = self._line(shlex.join(server.args), "Arguments", "-y @modelcontextprotocol/server-filesystem ~/notes")
        self.environment_edit = QPlainTextEdit("\n".join(f"{key}={value}" for key, value in server.env), self)
        self.environment_edit.setAccessibleName("Environment")
        self.environment_edit.setPlaceholderText("NAME=value, one a line")
        self.environment_edit.setTabChangesFocus(True)
        self.url_edit = self._line(server.url, "Address", URL_EXAMPLE)
        self.enabled_box = QCheckBox("&Use this server's tools in chats", self)
        self.enabled_box.setChecked(server.enabled)
        self.error_label = QLabel("", self)
        self.error_label.setObjectName("toolServerError")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        self._lay_out()
        self.transport_box.currentIndexChanged.connect(self._show_transport_fields)
        self._show_transport_fields()

    def accept(self) -> None:
        """Keep the entry if every field is right; else say what is wrong and stay open."""
        try:
            config = read_server(
                self.name_edit.text(), self.transport_box.currentData(), self.command_edit.text(),
                self.arguments_edit.text(), self.environment_edit.toPlainText(), self.url_edit.text(),
                self.enabled_box.isChecked(), self._taken_names,
            )
        except ValueError as error:
            self.error_label.setText(str(error))
            self.error_label.show()
            return
        if self._original is not None and config.same_target(self._original):
            config = replace(config, always_allowed=self._original.always_allowed)
        self.config = config
        super().accept()

    def _line(self, text: str, accessible_name: str, placeholder: str) -> QLineEdit:
        edit = QLineEdit(text, self)
        edit.setAccessibleName(accessible_name)
        edit.setPlaceholderText(placeholder)
        return edit

    def _lay_out(self) -> None:
        self.form = QFormLayout()
        self.form.addRow("&Name", self.name_edit)
        self.form.addRow("&Connection", self.transport_box)
        self.form.addRow("Co&mmand", self.command_edit)
        self.form.addRow("&Arguments", self.arguments_edit)
        self.form.addRow("&Environment", self.environment_edit)
        self.form.addRow("A&ddress", self.url_edit)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(self.form)
        layout.addWidget(self.enabled_box)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)

    def _show_transport_fields(self) -> None:
        stdio = self.transport_box.currentData() == "stdio"
        for field in (self.command_edit, self.arguments_edit, self.environment_edit):
            self.form.setRowVisible(field, stdio)
        self.form.setRowVisible(self.url_edit, not stdio)
