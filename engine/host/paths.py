"""Where Hearth keeps its files on this machine (any thread).

``HEARTH_HOME`` overrides every location at once, which tests use to stay out of
the user's folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "hearth"


def _root_override() -> Path | None:
    value = os.environ.get("HEARTH_HOME")
    return Path(value) if value else None


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
