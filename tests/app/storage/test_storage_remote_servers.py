"""Remembered remote servers in the settings file: newest first, one per address, private to the user."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from app.storage import Settings, load_settings, save_settings
from app.storage.settings import RemoteConnection


def test_connections_load_back_newest_first_one_per_address(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    settings = (
        Settings()
        .with_remote_connection(RemoteConnection("http://gpu-a:8000", "sk-a", "llama-70b"))
        .with_remote_connection(RemoteConnection("http://gpu-b:8080", "", "qwen"))
        .with_remote_connection(RemoteConnection("http://gpu-a:8000", "sk-a2", "llama-405b"))
    )

    save_settings(settings, path)
    loaded = load_settings(path)

    assert loaded.notice is None
    assert [(c.base_url, c.api_key, c.model) for c in loaded.settings.remote_servers] == [
        ("http://gpu-a:8000", "sk-a2", "llama-405b"),
        ("http://gpu-b:8080", "", "qwen"),
    ]
    assert "sk-a2" not in repr(loaded.settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_damaged_server_entry_falls_back_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "remote_servers": [{"api_key": "sk-x"}]}))

    loaded = load_settings(path)

    assert loaded.settings.theme == "dark" and loaded.settings.remote_servers == ()
    assert loaded.notice is not None and "remote_servers: expected a server with a base_url" in loaded.notice
    assert "sk-x" not in loaded.notice
