"""The Recent models menu, kept in the settings file across restarts (GUI thread).

Only models that loaded are remembered (``remember_model``, newest first, no
duplicates, at most ``RECENT_MODELS_LIMIT``). The menu rereads the settings each
time it opens, so a change saved elsewhere shows up too.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QWidget

from app.settings.app_settings import SettingsHolder


def remember_model(holder: SettingsHolder, path: str) -> None:
    """Put ``path`` first in the recent models; raises ``StorageError`` when the settings cannot be saved.

    Through the window's one ``SettingsHolder``: a copy saved behind its back would be overwritten by its next save.
    """
    holder.replace(holder.settings.with_recent_model(path))


def menu_text(path: str) -> str:
    """``name  (folder)`` with ``&`` escaped, so Qt shows it instead of making a shortcut."""
    location = Path(path)
    return f"{location.name}  ({location.parent})".replace("&", "&&")


class RecentModelsMenu(QMenu):
    """Lists recently loaded models; choosing one emits ``model_chosen(path)``."""

    model_chosen = Signal(str)

    def __init__(self, holder: SettingsHolder, parent: QWidget | None = None) -> None:
        super().__init__("&Recent models", parent)
        self._holder = holder
        self.setObjectName("recentModelsMenu")
        self.aboutToShow.connect(self.rebuild)
        self.rebuild()

    def rebuild(self) -> None:
        self.clear()
        paths = self._holder.settings.recent_models
        if not paths:
            self.addAction("No models opened yet").setEnabled(False)
            return
        for path in paths:
            action = QAction(menu_text(path), self)
            action.setToolTip(path)
            action.setStatusTip(path)
            action.setData(path)
            action.triggered.connect(lambda _checked=False, chosen=path: self.model_chosen.emit(chosen))
            self.addAction(action)
