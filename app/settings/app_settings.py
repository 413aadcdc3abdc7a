"""The global settings while the app runs: one holder that loads, changes and saves them (GUI thread).

Every part of the window that reads or changes settings goes through the one ``SettingsHolder``
(``MainWindow.settings_holder``), so two parts never overwrite each other's changes with a stale copy.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.storage import Settings, load_settings, save_settings


class SettingsHolder(QObject):
    """Holds the current ``Settings``; ``update`` saves them at once and emits ``changed``."""

    changed = Signal(object)
    """The new ``Settings``."""

    def __init__(self, path: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._path = path
        loaded = load_settings(path)
        self.settings: Settings = loaded.settings
        self.load_notice: str | None = loaded.notice
        """Why the settings file could not be fully read, or None."""

    def update(self, **changes: Any) -> None:
        """Change some fields and save; raises ``StorageError`` (settings unchanged) if saving fails."""
        new_settings = replace(self.settings, **changes)
        self.replace(new_settings)

    def replace(self, settings: Settings) -> None:
        """Use ``settings`` from now on and save them; ``StorageError`` keeps the old ones."""
        save_settings(settings, self._path)
        self.settings = settings
        self.changed.emit(settings)
