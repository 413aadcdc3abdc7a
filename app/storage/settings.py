"""Global settings in ``data_dir()/settings.json``: load with fallbacks, save atomically (GUI thread).

A settings file that cannot be read is never overwritten blindly: it is copied aside as
``settings.json.damaged-<YYYYmmdd-HHMMSS>``, the values that could be read are kept, the others
fall back to their defaults, and ``LoadedSettings.notice`` says so. A file over
``MAX_SETTINGS_BYTES``, nested too deeply for the JSON parser, or with a field over its bound
(``MAX_TEXT_CHARS``, ``MAX_SYSTEM_PROMPT_CHARS``) counts as damaged too. Keys Hearth does not
know are ignored (and dropped on the next save). A file the user made read-only (no owner
write permission) is never replaced: ``save_settings`` leaves it, and the load notice says so
once. The file may hold the API keys of remote servers and of Hearth's own API server, and the
environment (tokens) of MCP tool servers, so it is written readable by the user alone (mode 0600).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from app.storage.errors import StorageError
from engine.api.server.config import ServerConfig
from engine.host import paths
from engine.protocol.messages import SamplingParams

Theme = Literal["system", "light", "dark"]
THEMES: tuple[str, ...] = ("system", "light", "dark")
SETTINGS_NAME = "settings.json"
RECENT_MODELS_LIMIT = 10
DRAFT_CHOICES_LIMIT = 32  # models whose draft model choice is kept, the latest chosen first
REMOTE_SERVERS_LIMIT = 10
TOOL_SERVERS_LIMIT = 32
SETTINGS_MODE = 0o600
MAX_SETTINGS_BYTES = 1024**2
MAX_SYSTEM_PROMPT_CHARS = 100_000
MAX_TEXT_CHARS = 4096  # a path, an address, a model name or an API key
_DEFAULTS = SamplingParams()
_SERVER_DEFAULTS = ServerConfig()


@dataclass(frozen=True)
class SamplingSettings:
    """The user's sampling choices; the same fields and defaults as ``engine.protocol.messages.SamplingParams``."""

    temperature: float = _DEFAULTS.temperature
    top_p: float = _DEFAULTS.top_p
    top_k: int = _DEFAULTS.top_k
    min_p: float = _DEFAULTS.min_p
    repetition_penalty: float = _DEFAULTS.repetition_penalty
    max_new_tokens: int = _DEFAULTS.max_new_tokens
    seed: int | None = _DEFAULTS.seed
    speculative: bool = _DEFAULTS.speculative

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(**asdict(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> SamplingSettings:
        """Read what ``to_dict`` wrote; missing keys take defaults. Raises ValueError on a bad value."""
        if not isinstance(data, dict):
            raise ValueError("sampling settings are not a JSON object")
        values = {f.name: _checked_value(f.name, data[f.name]) for f in fields(cls) if f.name in data}
        return cls(**values)


_INTEGER_FIELDS = frozenset({"top_k", "max_new_tokens", "seed"})


def _checked_value(name: str, value: object) -> float | int | bool | None:
    """``value`` of the sampling field ``name``: a flag for ``speculative``, else a number."""
    if name != "speculative":
        return _checked_number(name, value)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return value


def _checked_number(name: str, value: object) -> float | int | None:
    if name == "seed" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if name in _INTEGER_FIELDS:
        if value != int(value):
            raise ValueError(f"{name} must be a whole number, not {value!r}")
        return int(value)
    return float(value)


@dataclass(frozen=True)
class RemoteConnection:
    """A remote server the user connected to, and the model last used there.

    ``api_key`` ("" for none) is kept only in the settings file, never in the conversations or an export.
    """

    base_url: str
    api_key: str = field(default="", repr=False)
    model: str = ""

    @classmethod
    def from_dict(cls, data: object) -> RemoteConnection:
        if not isinstance(data, dict) or not isinstance(data.get("base_url"), str):
            raise ValueError("expected a server with a base_url")  # not the entry itself: it may hold a key
        return cls(_read_text(data["base_url"]), _read_text(data.get("api_key", "")), _read_text(data.get("model", "")))


@dataclass(frozen=True)
class ServerSettings:
    """The Server menu's choices: where Hearth's API server listens, and its key ("" for none).

    ``api_key`` is kept only in the settings file, never in the conversations or an export.
    """

    host: str = _SERVER_DEFAULTS.host
    port: int = _SERVER_DEFAULTS.port
    api_key: str = field(default="", repr=False)

    def to_config(self) -> ServerConfig:
        return ServerConfig(self.host, self.port, self.api_key or None)

    @classmethod
    def of(cls, config: ServerConfig) -> ServerSettings:
        return cls(config.host, config.port, config.api_key or "")

    @classmethod
    def from_dict(cls, data: object) -> ServerSettings:
        if not isinstance(data, dict):
            raise ValueError("expected the server's settings as an object")  # not the value itself: it may hold a key
        port = data.get("port", _SERVER_DEFAULTS.port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"the port must be a whole number from 0 to 65535, not {port!r}")
        host, api_key = data.get("host", _SERVER_DEFAULTS.host), data.get("api_key", "")
        if not isinstance(host, str) or not isinstance(api_key, str):
            raise ValueError("the host and the API key must be text")
        return cls(_read_text(host), port, _read_text(api_key))


ToolTransport = Literal["stdio", "http"]
TOOL_TRANSPORTS: tuple[str, ...] = ("stdio", "http")


@dataclass(frozen=True)
class ToolServerConfig:
    """An MCP server from Settings › Tools: a command Hearth starts ("stdio") or an address ("http").

    ``env`` adds environment variables for the command (often tokens: kept only in the settings
    file, never in a repr); ``always_allowed`` names this server's tools that run without asking.
    """

    name: str
    transport: ToolTransport = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str = ""
    enabled: bool = True
    always_allowed: tuple[str, ...] = ()

    def same_target(self, other: ToolServerConfig) -> bool:
        """True when both start the same command or reach the same address (the environment aside)."""
        return (self.transport, self.command, self.args, self.url) == (other.transport, other.command, other.args, other.url)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "args": list(self.args), "env": dict(self.env), "always_allowed": list(self.always_allowed)}

    @classmethod
    def from_dict(cls, data: object) -> ToolServerConfig:
        """Read what ``to_dict`` wrote; raises ValueError on a bad entry (not shown: it may hold a token)."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("expected a tool server with a name")
        transport, env, enabled = data.get("transport", "stdio"), data.get("env", {}), data.get("enabled", True)
        if transport not in TOOL_TRANSPORTS or not isinstance(env, dict) or not isinstance(enabled, bool):
            raise ValueError(f"the tool server {_shortened(data['name'])} has a bad transport, env or enabled")
        return cls(
            name=_read_text(data["name"]),
            transport=transport,
            command=_read_text(data.get("command", "")),
            args=_read_texts(data.get("args", [])),
            env=tuple((_read_text(key), _read_text(value)) for key, value in env.items()),
            url=_read_text(data.get("url", "")),
            enabled=enabled,
            always_allowed=_read_texts(data.get("always_allowed", [])),
        )


@dataclass(frozen=True)
class Settings:
    system_prompt: str = ""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    theme: Theme = "system"
    last_model_path: str | None = None
    recent_models: tuple[str, ...] = ()
    remote_servers: tuple[RemoteConnection, ...] = ()
    server: ServerSettings = field(default_factory=ServerSettings)
    tool_servers: tuple[ToolServerConfig, ...] = ()
    draft_models: tuple[tuple[str, str], ...] = ()
    """(model path, its draft model: "default" or a path) for the models loaded with one, the latest chosen first."""

    def draft_model_for(self, model_path: str) -> str | None:
        """The draft model last chosen for ``model_path``; None for none."""
        return dict(self.draft_models).get(model_path)

    def with_draft_model(self, model_path: str, draft_model: str | None) -> Settings:
        """These settings with ``draft_model`` (None: none) as ``model_path``'s draft model."""
        others = tuple((model, draft) for model, draft in self.draft_models if model != model_path)
        chosen = ((model_path, draft_model),) if draft_model is not None else ()
        return replace(self, draft_models=(*chosen, *others)[:DRAFT_CHOICES_LIMIT])

    def with_tool_allowed(self, server: str, tool: str) -> Settings:
        """These settings with ``tool`` of the server named ``server`` always allowed (unchanged if no such server)."""
        servers = tuple(
            replace(config, always_allowed=(*config.always_allowed, tool))
            if config.name == server and tool not in config.always_allowed
            else config
            for config in self.tool_servers
        )
        return replace(self, tool_servers=servers)

    def with_remote_connection(self, connection: RemoteConnection) -> Settings:
        """These settings with ``connection`` first among the remote servers (one entry per address)."""
        others = (c for c in self.remote_servers if c.base_url != connection.base_url)
        return replace(self, remote_servers=(connection, *others)[:REMOTE_SERVERS_LIMIT])

    def with_recent_model(self, model_path: str) -> Settings:
        """These settings with ``model_path`` as the last model, first in the recent list (no duplicates)."""
        recent = (model_path, *(p for p in self.recent_models if p != model_path))
        return replace(self, last_model_path=model_path, recent_models=recent[:RECENT_MODELS_LIMIT])


@dataclass(frozen=True)
class LoadedSettings:
    """Settings as loaded, with a sentence for the user when the file could not be fully read."""

    settings: Settings
    notice: str | None = None


def default_settings_path() -> Path:
    return paths.data_dir() / SETTINGS_NAME


def load_settings(path: Path | None = None) -> LoadedSettings:
    """Read the settings file; a missing file gives the defaults without a notice."""
    path = path or default_settings_path()
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_SETTINGS_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return LoadedSettings(Settings())
    except (OSError, UnicodeDecodeError) as error:
        return _damaged(path, Settings(), [f"the file could not be read ({error})"])
    if len(raw) > MAX_SETTINGS_BYTES:
        return _damaged(path, Settings(), [f"the file is larger than {MAX_SETTINGS_BYTES // 1024**2} MB"])
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return _damaged(path, Settings(), ["the file is not valid JSON"])
    if not isinstance(data, dict):
        return _damaged(path, Settings(), ["the file does not hold a settings object"])
    settings, problems = _settings_from_dict(data)
    loaded = _damaged(path, settings, problems) if problems else LoadedSettings(settings)
    return _with_read_only_notice(path, loaded) if is_read_only(path) else loaded


def is_read_only(path: Path) -> bool:
    """True when the settings file exists and its owner may not write it (the user's choice to respect)."""
    try:
        return not path.stat().st_mode & stat.S_IWUSR
    except OSError:
        return False


def _with_read_only_notice(path: Path, loaded: LoadedSettings) -> LoadedSettings:
    read_only = f"{path} is read-only, so Hearth will not save changes to the settings."
    return replace(loaded, notice=f"{loaded.notice} {read_only}" if loaded.notice else read_only)


def _settings_from_dict(data: dict[str, Any]) -> tuple[Settings, list[str]]:
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name, read in _FIELD_READERS.items():
        if name not in data:
            continue
        try:
            values[name] = read(data[name])
        except (ValueError, TypeError) as error:
            problems.append(f"{name}: {error}")
    return Settings(**values), problems


def _read_text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, not {_shortened(value)}")
    if len(value) > limit:
        raise ValueError(f"text of {len(value)} characters is longer than the {limit} allowed")
    return value


def _shortened(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:80]}…"


def _read_system_prompt(value: object) -> str:
    return _read_text(value, MAX_SYSTEM_PROMPT_CHARS)


def _read_optional_text(value: object) -> str | None:
    return None if value is None else _read_text(value)


def _read_texts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of texts, not {_shortened(value)}")
    return tuple(_read_text(item) for item in value)


def _read_theme(value: object) -> str:
    if value not in THEMES:
        raise ValueError(f"expected one of {', '.join(THEMES)}, not {_shortened(value)}")
    return str(value)


def _read_recent(value: object) -> tuple[str, ...]:
    return _read_texts(value)[:RECENT_MODELS_LIMIT]


def _read_draft_models(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object of model paths and draft models, not {_shortened(value)}")
    return tuple((_read_text(model), _read_text(draft)) for model, draft in value.items())[:DRAFT_CHOICES_LIMIT]


def _read_remote_servers(value: object) -> tuple[RemoteConnection, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of servers, not {_shortened(value)}")
    return tuple(RemoteConnection.from_dict(item) for item in value)[:REMOTE_SERVERS_LIMIT]


def _read_tool_servers(value: object) -> tuple[ToolServerConfig, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of tool servers, not {_shortened(value)}")
    return tuple(ToolServerConfig.from_dict(item) for item in value)[:TOOL_SERVERS_LIMIT]


_FIELD_READERS = {
    "system_prompt": _read_system_prompt,
    "sampling": SamplingSettings.from_dict,
    "theme": _read_theme,
    "last_model_path": _read_optional_text,
    "recent_models": _read_recent,
    "remote_servers": _read_remote_servers,
    "server": ServerSettings.from_dict,
    "tool_servers": _read_tool_servers,
    "draft_models": _read_draft_models,
}


def _damaged(path: Path, settings: Settings, problems: list[str]) -> LoadedSettings:
    kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        shutil.copy2(path, kept)
        where = f"The damaged file was kept as {kept}."
    except OSError as error:
        where = f"The damaged file could not be copied aside ({error.strerror})."
    notice = f"Some settings in {path} could not be read ({'; '.join(problems)}); defaults are used for them. {where}"
    return LoadedSettings(settings, notice)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write the settings atomically: a temporary file, fsync, then rename over the old file.

    A read-only file (``is_read_only``) is left as it is (``load_settings`` said so). Raises
    ``StorageError`` with a clear message when it cannot be written; the old file is then intact.
    """
    path = path or default_settings_path()
    if is_read_only(path):
        return
    data = asdict(settings)
    data["recent_models"] = list(settings.recent_models)
    data["tool_servers"] = [config.to_dict() for config in settings.tool_servers]
    data["draft_models"] = dict(settings.draft_models)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    try:
        _write_atomically(path, text)
    except OSError as error:
        raise StorageError(f"Could not save the settings to {path}: {error.strerror or error}.") from error


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(temporary, SETTINGS_MODE)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(folder: Path) -> None:
    # The rename itself is durable only once the folder's entry is on disk (POSIX; a no-op elsewhere).
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
