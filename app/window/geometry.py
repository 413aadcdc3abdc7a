"""The window's size and place, kept from one run to the next (GUI thread).

Kept in ``window-geometry`` beside the settings file (Qt's own ``saveGeometry``
bytes, which carry the screen they were on: a window saved on a screen that is
gone comes back on one that is there). Best effort: an unreadable or unwritable
file means the default size, never an error for the user.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray
from PySide6.QtWidgets import QWidget

from engine.host.paths import data_dir

GEOMETRY_NAME = "window-geometry"


def geometry_path() -> Path:
    return data_dir() / GEOMETRY_NAME


def restore_geometry(window: QWidget) -> bool:
    """Give ``window`` the size and place it had when last closed; False when none was kept."""
    try:
        saved = geometry_path().read_bytes()
    except OSError:
        return False
    return window.restoreGeometry(QByteArray(saved))


def save_geometry(window: QWidget) -> None:
    try:
        path = geometry_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(window.saveGeometry().data()))
    except OSError:
        pass  # the next start uses the default size
