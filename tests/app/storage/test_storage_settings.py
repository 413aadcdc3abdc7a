"""Global settings: defaults, atomic saving, and a damaged settings file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.storage import SamplingSettings, Settings, StorageError, load_settings, save_settings
from engine.host import paths
from engine.protocol.messages import SamplingParams


def test_missing_file_gives_defaults_without_notice(tmp_path: Path) -> None:
    loaded = load_settings(tmp_path / "settings.json")
    assert loaded.settings == Settings() and loaded.notice is None


def test_default_location_is_the_data_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    save_settings(Settings(theme="dark"))
    assert (paths.data_dir() / "settings.json").exists()
    assert load_settings().settings.theme == "dark"


def test_saved_settings_load_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    settings = Settings(
        system_prompt="You are kind.",
        sampling=SamplingSettings(temperature=0.3, top_k=20, seed=42, max_new_tokens=256),
        theme="light",
    ).with_recent_model("/models/a.gguf").with_recent_model("/models/b").with_recent_model("/models/a.gguf")

    save_settings(settings, path)
    loaded = load_settings(path)

    assert loaded.notice is None
    assert loaded.settings == settings
    assert loaded.settings.recent_models == ("/models/a.gguf", "/models/b")
    assert loaded.settings.last_model_path == "/models/a.gguf"
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # no temporary file left


def test_each_models_draft_model_loads_back_and_a_bad_one_falls_back_to_none(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    settings = Settings().with_draft_model("/models/a.gguf", "default").with_draft_model("/models/b", "/small.gguf")
    settings = settings.with_draft_model("/models/c.gguf", "default").with_draft_model("/models/c.gguf", None)
    save_settings(settings, path)
    loaded = load_settings(path).settings
    assert loaded == settings
    assert [loaded.draft_model_for(model) for model in ("/models/a.gguf", "/models/b", "/models/c.gguf")] == [
        "default", "/small.gguf", None]
    path.write_text(json.dumps({"theme": "dark", "draft_models": ["default"]}))
    damaged = load_settings(path)
    assert damaged.settings == Settings(theme="dark") and "draft_models" in damaged.notice


def test_sampling_settings_become_engine_sampling_params() -> None:
    assert SamplingSettings().to_sampling_params() == SamplingParams()
    params = SamplingSettings(temperature=0.0, seed=3).to_sampling_params()
    assert params.greedy and params.seed == 3


def test_drafting_is_on_by_default_and_reads_back_only_as_a_flag() -> None:
    assert SamplingSettings().to_sampling_params().speculative
    assert not SamplingSettings.from_dict({"speculative": False}).to_sampling_params().speculative
    with pytest.raises(ValueError):
        SamplingSettings.from_dict({"speculative": 0})


def test_invalid_json_falls_back_to_defaults_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "dark", ')

    loaded = load_settings(path)

    assert loaded.settings == Settings()
    assert loaded.notice is not None and "not valid JSON" in loaded.notice
    kept = list(tmp_path.glob("settings.json.damaged-*"))
    assert len(kept) == 1 and kept[0].read_text() == '{"theme": "dark", ' and str(kept[0]) in loaded.notice


def test_bad_values_fall_back_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "purple", "system_prompt": "Hi", "sampling": {"top_k": 2.5}}))

    loaded = load_settings(path)

    assert loaded.settings.theme == "system" and loaded.settings.system_prompt == "Hi"
    assert loaded.settings.sampling == SamplingSettings()
    assert loaded.notice is not None and "theme" in loaded.notice and "top_k must be a whole number" in loaded.notice


def test_failed_save_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(Settings(theme="dark"), path)
    # Simulation: the target's folder is missing, so the temporary file cannot be created
    # (tests run as root, whom a read-only chmod would not stop).
    with pytest.raises(StorageError, match="Could not save the settings"):
        save_settings(Settings(theme="light"), tmp_path / "gone" / "settings.json")
    assert load_settings(path).settings.theme == "dark"


def test_the_server_settings_default_to_the_servers_own_and_a_bad_port_falls_back_without_showing_the_key(
    tmp_path: Path,
) -> None:
    from app.storage.settings import ServerSettings
    from engine.api.server.config import ServerConfig

    assert ServerSettings().to_config() == ServerConfig()
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "server": {"port": 70000, "api_key": "sk-local-secret"}}))

    loaded = load_settings(path)

    assert loaded.settings.theme == "dark" and loaded.settings.server == ServerSettings()
    assert loaded.notice is not None and "port must be a whole number from 0 to 65535" in loaded.notice
    assert "sk-local-secret" not in loaded.notice
