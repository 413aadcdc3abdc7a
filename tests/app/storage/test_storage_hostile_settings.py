"""Hostile settings files: deep nesting, huge files and fields, and a read-only file."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

from app.storage import Settings, load_settings, save_settings
from app.storage.settings import MAX_SYSTEM_PROMPT_CHARS


def _load_bounded(path: Path):
    """``load_settings(path)``, asserting it takes under 10 s and 512 MB."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        loaded = load_settings(path)
        assert time.monotonic() - started < 10
        assert tracemalloc.get_traced_memory()[1] < 512 * 1024**2
    finally:
        tracemalloc.stop()
    return loaded


def _kept_aside(folder: Path) -> list[Path]:
    return list(folder.glob("settings.json.damaged-*"))


def test_deeply_nested_file_falls_back_to_defaults_and_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    loaded = _load_bounded(path)
    assert loaded.settings == Settings()
    assert loaded.notice is not None and "not valid JSON" in loaded.notice
    assert len(_kept_aside(tmp_path)) == 1


def test_file_over_the_size_bound_is_set_aside_not_used(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"system_prompt": "x" * 100_000_000}))
    loaded = _load_bounded(path)
    assert loaded.settings.system_prompt == ""
    assert loaded.notice is not None and "larger than 1 MB" in loaded.notice
    assert len(_kept_aside(tmp_path)) == 1


def test_fields_over_their_bounds_fall_back_and_the_rest_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({
        "system_prompt": "x" * (MAX_SYSTEM_PROMPT_CHARS + 1),
        "last_model_path": "/m/" + "a" * 10_000,
        "theme": "dark",
    }))
    loaded = _load_bounded(path)
    assert loaded.settings == Settings(theme="dark")
    assert loaded.notice is not None and "system_prompt: text of 100001 characters" in loaded.notice
    assert "last_model_path" in loaded.notice and len(loaded.notice) < 2000
    assert len(_kept_aside(tmp_path)) == 1


def test_read_only_file_is_never_replaced_and_said_once(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(Settings(theme="dark"), path)
    path.chmod(0o444)
    loaded = load_settings(path)
    assert loaded.settings.theme == "dark"
    assert loaded.notice is not None and "read-only" in loaded.notice
    before = path.read_bytes()
    save_settings(Settings(theme="light"), path)
    assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o444
