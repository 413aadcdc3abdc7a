"""MCP tool servers in the settings file: saved and read back, private, damaged entries fall back."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from app.storage import Settings, load_settings, save_settings
from app.storage.settings import ToolServerConfig

FILES = ToolServerConfig(
    "files", "stdio", "npx", ("-y", "@modelcontextprotocol/server-filesystem", "/tmp"), (("TOKEN", "secret-1"),)
)
WEB = ToolServerConfig("web", "http", url="http://localhost:8000/mcp", enabled=False)


def test_tool_servers_and_always_allowed_tools_load_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    settings = Settings(tool_servers=(FILES, WEB)).with_tool_allowed("files", "read_file").with_tool_allowed("files", "read_file")

    save_settings(settings, path)
    loaded = load_settings(path)

    assert loaded.notice is None
    assert loaded.settings == settings
    assert loaded.settings.tool_servers[0].always_allowed == ("read_file",)
    assert json.loads(path.read_text())["tool_servers"][0]["env"] == {"TOKEN": "secret-1"}
    assert "secret-1" not in repr(loaded.settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_allowing_a_tool_of_an_unknown_server_changes_nothing() -> None:
    settings = Settings(tool_servers=(FILES,))
    assert settings.with_tool_allowed("nowhere", "read_file") == settings


def test_a_damaged_tool_server_entry_falls_back_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "tool_servers": [{"name": "x", "transport": "ftp"}]}))

    loaded = load_settings(path)

    assert loaded.settings.theme == "dark" and loaded.settings.tool_servers == ()
    assert loaded.notice is not None and "tool_servers" in loaded.notice
