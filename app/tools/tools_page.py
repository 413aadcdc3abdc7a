"""Settings › Tools: the MCP servers whose tools chats may use (GUI thread).

Lists the servers with a check box each (on or off), adds, edits and removes them,
and Test connects to the selected one on the qasync loop and shows the tools it
offers or why it could not be reached. Nothing is saved here: the Settings dialog
saves ``servers()`` with the rest.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget,
)

from app.storage.settings import TOOL_SERVERS_LIMIT, ToolServerConfig
from app.tools.hub import check_server
from app.tools.results import ListedTool, ServerProblem
from app.tools.server_dialog import ServerDialog

INTRODUCTION = (
    "Tool servers (MCP) give the model tools to call, such as reading files or searching the web. "
    "Hearth asks before each call unless you allow a tool always."
)


class ToolsPage(QWidget):
    """Edits a list of ``ToolServerConfig``s; ``servers()`` is the list as edited."""

    def __init__(self, servers: tuple[ToolServerConfig, ...], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolsPage")
        self._servers = list(servers)
        self.server_dialog: ServerDialog | None = None
        """The Add or Edit dialog while it is open."""
        self.server_list = QListWidget(self)
        self.server_list.setAccessibleName("Tool servers")
        self.server_list.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # long commands: the name and the end stay
        self.server_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.add_button = self._button("&Add…", self._add)
        self.edit_button = self._button("&Edit…", self._edit)
        self.remove_button = self._button("&Remove", self._remove)
        self.test_button = self._button("&Test", self._test)
        self.test_result = QPlainTextEdit(self)
        self.test_result.setObjectName("toolTestResult")
        self.test_result.setAccessibleName("Test result")
        self.test_result.setReadOnly(True)
        self.test_result.setPlaceholderText("Select a server and press Test to see the tools it offers.")
        self._lay_out()
        self._fill_list()
        self.server_list.currentRowChanged.connect(self._enable_buttons)
        self.server_list.itemChanged.connect(self._follow_check_box)
        self.server_list.itemDoubleClicked.connect(self._edit)

    def servers(self) -> tuple[ToolServerConfig, ...]:
        return tuple(self._servers)

    def _button(self, text: str, slot: Callable[[], object]) -> QPushButton:
        button = QPushButton(text, self)
        button.clicked.connect(slot)
        return button

    def _lay_out(self) -> None:
        introduction = QLabel(INTRODUCTION, self)
        introduction.setWordWrap(True)
        buttons = QHBoxLayout()
        for button in (self.add_button, self.edit_button, self.remove_button, self.test_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(introduction)
        layout.addWidget(self.server_list, 2)
        layout.addLayout(buttons)
        layout.addWidget(self.test_result, 1)

    def _fill_list(self, current_row: int = -1) -> None:
        self.server_list.blockSignals(True)
        self.server_list.clear()
        for server in self._servers:
            item = QListWidgetItem(_summary(server), self.server_list)
            item.setToolTip(item.text())
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if server.enabled else Qt.CheckState.Unchecked)
        self.server_list.blockSignals(False)
        self.server_list.setCurrentRow(min(current_row, len(self._servers) - 1))
        self._enable_buttons()

    def _enable_buttons(self) -> None:
        selected = self.server_list.currentRow() >= 0
        for button in (self.edit_button, self.remove_button, self.test_button):
            button.setEnabled(selected)
        self.add_button.setEnabled(len(self._servers) < TOOL_SERVERS_LIMIT)

    def _follow_check_box(self, item: QListWidgetItem) -> None:
        row = self.server_list.row(item)
        self._servers[row] = replace(self._servers[row], enabled=item.checkState() == Qt.CheckState.Checked)

    def _add(self) -> None:
        self._open_server_dialog(None, -1)

    def _edit(self) -> None:
        row = self.server_list.currentRow()
        if row >= 0:
            self._open_server_dialog(self._servers[row], row)

    def _open_server_dialog(self, server: ToolServerConfig | None, row: int) -> None:
        """Open Add (``row`` -1) or Edit without blocking; the entry is kept when it is accepted."""
        taken = {other.name for index, other in enumerate(self._servers) if index != row}
        dialog = ServerDialog(taken, server, self)
        dialog.accepted.connect(lambda: self._keep(dialog.config, row))
        dialog.finished.connect(dialog.deleteLater)
        self.server_dialog = dialog
        dialog.open()

    def _keep(self, config: ToolServerConfig, row: int) -> None:
        if row < 0:
            self._servers.append(config)
            row = len(self._servers) - 1
        else:
            self._servers[row] = config
        self._fill_list(row)

    def _remove(self) -> None:
        row = self.server_list.currentRow()
        if row >= 0:
            del self._servers[row]
            self._fill_list(row)

    def _test(self) -> None:
        """Connect to the selected server on the qasync loop; the result replaces the test text."""
        row = self.server_list.currentRow()
        if row < 0:
            return
        server = self._servers[row]
        self.test_button.setEnabled(False)
        self.test_result.setPlainText(f"Connecting to “{server.name}”…")
        check = asyncio.ensure_future(self._show_check(server))
        self.destroyed.connect(lambda: check.cancel())  # the dialog closed: stop the server being tested

    async def _show_check(self, server: ToolServerConfig) -> None:
        try:
            tools = await check_server(server)
        except ServerProblem as problem:
            self.test_result.setPlainText(str(problem))
        else:
            self.test_result.setPlainText(_tools_found(server, tools))
        self._enable_buttons()


def _summary(server: ToolServerConfig) -> str:
    target = server.url if server.transport == "http" else shlex.join((server.command, *server.args))
    return f"{server.name} — {target}"


def _tools_found(server: ToolServerConfig, tools: tuple[ListedTool, ...]) -> str:
    if not tools:
        return f"Connected to “{server.name}”; it offers no tools."
    lines = [f"{tool.name} — {tool.description}" if tool.description else tool.name for tool in tools]
    return f"Connected to “{server.name}”; it offers {len(tools)} tool{'s' if len(tools) != 1 else ''}:\n" + "\n".join(lines)
