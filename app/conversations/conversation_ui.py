"""Puts the conversation features into the main window: sidebar, menus, start-up notices (GUI thread).

``install_conversations`` is the one call ``MainWindow`` makes: it docks the sidebar on the
left, adds File > Export…, the conversation actions (rename, delete, undo, settings), the
Settings dialog and the theme choice, shows what start-up found (a damaged database set
aside, a damaged settings file, replies cut off by a crash), and opens the most recent
conversation.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QDockWidget, QMessageBox

from app.chat.message_actions import MessageActions
from app.conversations.conversation_manager import ConversationManager
from app.conversations.conversation_settings import open_conversation_settings
from app.conversations.export_dialog import export_conversation
from app.conversations.sidebar import Sidebar
from app.settings.appearance import ThemeSwitcher
from app.settings.settings_dialog import open_settings_dialog
from app.window.menus import add_action, menu_named


def install_conversations(window, controller, startup_notices: list[str]) -> ConversationManager:
    """Add the sidebar, menus and dialogs to ``window`` and open the most recent conversation."""
    sidebar = Sidebar(window)
    dock = QDockWidget("Conversations", window)
    dock.setObjectName("conversationsDock")
    dock.setAccessibleName("Conversations sidebar")
    dock.setFeatures(QDockWidget.DockWidgetFeature.NoDockWidgetFeatures)
    dock.setWidget(sidebar)
    window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
    manager = ConversationManager(window.journal, window.session, sidebar, controller, window)
    manager.notice.connect(window.status_line.show_notice)
    window.message_actions = MessageActions(window.session, window.chat_view, window)
    _add_menus(window, manager, sidebar)
    window.theme_switcher = ThemeSwitcher(window, window.settings_holder, menu_named(window, "&View"))
    manager.start()
    _show_startup_notices(window, startup_notices)
    return manager


def _add_menus(window, manager: ConversationManager, sidebar: Sidebar) -> None:
    file_menu = menu_named(window, "&File")
    add_action(file_menu, "&Export conversation…", "Ctrl+E", lambda: _export(window, manager, sidebar))
    chat_menu = menu_named(window, "&Conversation")
    add_action(chat_menu, "&Rename conversation", "F2", lambda: sidebar.start_rename(manager.current_id))
    add_action(chat_menu, "&Delete conversation", "Ctrl+Shift+D", lambda: manager.delete(manager.current_id))
    add_action(chat_menu, "&Undo delete", "Ctrl+Shift+Z", manager.undo_delete)
    add_action(chat_menu, "Conversation &settings…", "Ctrl+Shift+,", lambda: open_conversation_settings(window))
    add_action(chat_menu, "Search conversations", "Ctrl+F", sidebar.search_box.setFocus)
    add_action(chat_menu, "Go to the conversation list", "Ctrl+L", sidebar.list.setFocus)
    add_action(chat_menu, "Go to the message box", "Ctrl+M", window.input_bar.prompt.setFocus)
    settings_menu = menu_named(window, "&Settings")
    add_action(settings_menu, "&Default settings…", QKeySequence.StandardKey.Preferences, lambda: open_settings_dialog(window))
    add_action(settings_menu, "&Tools (MCP servers)…", None, lambda: open_settings_dialog(window).show_tools())


def _export(window, manager: ConversationManager, sidebar: Sidebar) -> None:
    if not window.session.conversation.saved:
        window.status_line.show_notice("This conversation is empty: there is nothing to export yet.")
        return
    item = sidebar.item_for(manager.current_id)
    title = item.text() if item is not None else "conversation"
    message = export_conversation(window, window.journal.store, manager.current_id, title, window.start_folders)
    if message:
        window.status_line.show_notice(message)


def _show_startup_notices(window, notices: list[str]) -> None:
    """What start-up found, in the status line and in a dialog that does not block the window."""
    for notice in notices:
        window.status_line.show_notice(notice)
    if notices:
        box = QMessageBox(QMessageBox.Icon.Warning, "Hearth", "\n\n".join(notices), QMessageBox.StandardButton.Ok, window)
        box.setObjectName("startupNotice")
        box.setAccessibleName("Start-up notice")
        box.open()
