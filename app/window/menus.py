"""Menu bar helpers shared by every part that adds menu entries (GUI thread)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

MENU_ORDER = ("&File", "&Conversation", "&View", "&Settings")


def menu_named(window: QMainWindow, title: str) -> QMenu:
    """The menu bar's menu called ``title``, created at the end if there is none yet."""
    for action in window.menuBar().actions():
        if action.menu() is not None and action.text() == title:
            return action.menu()
    return window.menuBar().addMenu(title)


def add_action(
    menu: QMenu, text: str, shortcut: QKeySequence | QKeySequence.StandardKey | str | None, slot: Callable[[], object]
) -> QAction:
    action = QAction(text, menu)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(slot)
    menu.addAction(action)
    return action
