"""Where Hearth keeps its files on this machine (any thread).

``HEARTH_HOME`` (``config.EngineConfig.home``) overrides every location at once, which
tests use to stay out of the user's folders. It is read when a location is asked for:
a test run or a benchmark points it elsewhere after the process started.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs

from engine.host.config import EngineConfig

APP_NAME = "hearth"


def _root_override() -> Path | None:
    return EngineConfig.from_environment().home


def cache_dir() -> Path:
    """Downloaded and converted models: safe to delete, rebuilt on demand."""
    root = _root_override()
    path = root / "cache" if root else Path(platformdirs.user_cache_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Conversations and settings: the user's data, never deleted by Hearth."""
    root = _root_override()
    path = root / "data" if root else Path(platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """The default model and converted copies of GGUF files."""
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
