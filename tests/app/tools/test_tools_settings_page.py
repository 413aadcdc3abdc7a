"""Settings › Tools: add, check, switch off and remove tool servers; bad entries are refused with a reason."""

from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import Qt

from app.settings.app_settings import SettingsHolder
from app.settings.settings_dialog import SettingsDialog
from app.storage import load_settings
from app.storage.settings import ToolServerConfig
from app.tools.server_dialog import ServerDialog

from .conftest import SERVER_SCRIPT


@pytest.fixture
def dialog(qtbot, holder: SettingsHolder, qasync_loop) -> SettingsDialog:
    settings_dialog = SettingsDialog(holder)
    qtbot.addWidget(settings_dialog)
    settings_dialog.show()
    settings_dialog.show_tools()
    return settings_dialog


def _add_server(dialog: SettingsDialog, qtbot, name: str, command: str, arguments: str = "", environment: str = "") -> None:
    page = dialog.tools_page
    qtbot.mouseClick(page.add_button, Qt.MouseButton.LeftButton)
    server_dialog = page.server_dialog
    server_dialog.name_edit.setText(name)
    server_dialog.command_edit.setText(command)
    server_dialog.arguments_edit.setText(arguments)
    server_dialog.environment_edit.setPlainText(environment)
    server_dialog.accept()
    assert not server_dialog.isVisible(), server_dialog.error_label.text()


def test_a_server_added_in_settings_is_tested_shows_its_tools_and_is_saved(dialog, qtbot, pid_file, tmp_path):
    _add_server(dialog, qtbot, "numbers", sys.executable, f"'{SERVER_SCRIPT}'", f"HEARTH_TEST_PID_FILE={pid_file}")
    page = dialog.tools_page

    qtbot.mouseClick(page.test_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "offers" in page.test_result.toPlainText(), timeout=60_000)
    dialog.accept()

    shown = page.test_result.toPlainText()
    assert "“numbers”; it offers 4 tools" in shown and "add — Add two numbers." in shown
    assert page.server_list.item(0).text() == f"numbers — {sys.executable} {SERVER_SCRIPT}"
    saved = load_settings(tmp_path / "settings.json").settings.tool_servers
    expected = ToolServerConfig("numbers", "stdio", sys.executable, (str(SERVER_SCRIPT),), (("HEARTH_TEST_PID_FILE", str(pid_file)),))
    assert saved == (expected,)


def test_testing_a_command_that_does_not_exist_says_so(dialog, qtbot):
    _add_server(dialog, qtbot, "ghost", "hearth-no-such-mcp-server")
    page = dialog.tools_page

    qtbot.mouseClick(page.test_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "not found" in page.test_result.toPlainText(), timeout=30_000)

    assert '"hearth-no-such-mcp-server" was not found' in page.test_result.toPlainText()
    assert page.test_button.isEnabled()


def test_a_server_switched_off_or_removed_is_saved_so(dialog, qtbot, holder):
    _add_server(dialog, qtbot, "first", "first-server")
    _add_server(dialog, qtbot, "second", "second-server")
    page = dialog.tools_page

    page.server_list.item(1).setCheckState(Qt.CheckState.Unchecked)
    page.server_list.setCurrentRow(0)
    qtbot.mouseClick(page.remove_button, Qt.MouseButton.LeftButton)
    dialog.accept()

    assert holder.settings.tool_servers == (ToolServerConfig("second", command="second-server", enabled=False),)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "  "}, "Give the server a name."),
        ({"name": "taken"}, "There is already a server named “taken”"),
        ({"command": ""}, "Enter the command that starts the server"),
        ({"arguments": "'unclosed"}, "close every quotation mark"),
        ({"environment": "TOKEN=1\nno equals sign"}, "Environment line 2 (“no equals sign”) is not NAME=value."),
        ({"transport": "http", "url": "localhost:8000/mcp"}, "starting with http:// or https://"),
    ],
)
def test_a_wrong_entry_keeps_the_dialog_open_and_says_what_is_wrong(qtbot, fields, message):
    values = {"name": "new", "transport": "stdio", "command": "npx", "arguments": "", "environment": "", "url": "", **fields}
    server_dialog = ServerDialog({"taken"})
    qtbot.addWidget(server_dialog)
    server_dialog.show()
    server_dialog.name_edit.setText(values["name"])
    server_dialog.transport_box.setCurrentIndex(server_dialog.transport_box.findData(values["transport"]))
    server_dialog.command_edit.setText(values["command"])
    server_dialog.arguments_edit.setText(values["arguments"])
    server_dialog.environment_edit.setPlainText(values["environment"])
    server_dialog.url_edit.setText(values["url"])

    server_dialog.accept()

    assert server_dialog.isVisible() and server_dialog.config is None
    assert message in server_dialog.error_label.text()


def test_an_http_server_needs_only_its_address_and_keeps_allowed_tools_while_the_address_stays(qtbot):
    original = ToolServerConfig("web", "http", url="http://localhost:8000/mcp", always_allowed=("search",))
    server_dialog = ServerDialog(set(), original)
    qtbot.addWidget(server_dialog)
    server_dialog.show()
    assert not server_dialog.command_edit.isVisible() and server_dialog.url_edit.isVisible()

    server_dialog.enabled_box.setChecked(False)
    server_dialog.accept()
    kept = server_dialog.config
    moved = ServerDialog(set(), original)
    qtbot.addWidget(moved)
    moved.url_edit.setText("https://elsewhere.example/mcp")
    moved.accept()

    assert kept == ToolServerConfig("web", "http", url="http://localhost:8000/mcp", enabled=False, always_allowed=("search",))
    assert moved.config.always_allowed == ()
