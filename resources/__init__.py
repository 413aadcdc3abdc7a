"""Hearth's icon files, installed as the ``hearth_resources`` package (any thread)."""

from pathlib import Path


def resource_path(name: str) -> Path:
    """Absolute path of a shipped resource file, e.g. ``resource_path("hearth.svg")``."""
    return Path(__file__).with_name(name)
