"""Hearth's main window: lays out the conversation, the input bar and the status line (GUI thread).

The window only assembles parts: ``ChatSession`` runs the conversation, ``StatusLine``
reports the engine, ``ModelLoader`` opens models (File menu, drops) and
``RemoteModelPicker`` picks one on a remote server (File › Connect to server…), the
performance dock shows every engine event, the Server menu runs the API server
on the same engine (``server_menu``), ``tool_hub`` reaches the MCP tool servers of
Settings › Tools (``run_window`` closes it), and errors that need attention open a
non-blocking dialog.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence
from PySide6.QtWidgets import QLabel, QMainWindow, QMessageBox, QVBoxLayout, QWidget

from app.chat.chat_session import ChatSession
from app.chat.chat_view import ChatView
from app.chat.input_box import InputBar
from app.chat.welcome import WelcomePane
from app.controller import EngineController
from app.conversations.conversation_ui import install_conversations
from app.conversations.persistence import open_journal
from app.models.model_picker import ModelLoader
from app.models.remote_picker import RemoteModelPicker
from app.perf.dock import PerformanceDock
from app.settings.app_settings import SettingsHolder
from app.settings.theme import STYLE_SHEET
from app.tools.hub import ToolHub
from app.window.geometry import restore_geometry, save_geometry
from app.window.menus import MENU_ORDER, add_action, menu_named
from app.window.server_menu import install_server_menu
from app.window.start_folder import StartFolders
from app.window.status_line import StatusLine

PERFORMANCE_DOCK_WIDTH = 380
UNSAVED_RETRY_MS = 5000


class MainWindow(QMainWindow):
    """Conversation above, prompt below, engine status at the bottom."""

    closed = Signal()

    def __init__(self, controller: EngineController) -> None:
        super().__init__()
        self.setWindowTitle("Hearth")
        self.setObjectName("mainWindow")
        self.setStyleSheet(STYLE_SHEET)
        if not restore_geometry(self):
            self.resize(900, 700)
        self.chat_view = ChatView(self)
        self.input_bar = InputBar(self)
        self.status_line = StatusLine(controller, self)
        self.setStatusBar(self.status_line)
        self.settings_holder = SettingsHolder(parent=self)
        self.tool_hub = ToolHub(self.settings_holder)
        self.start_folders = StartFolders()
        self.journal, startup_notices = open_journal(lambda: self.settings_holder.settings)
        startup_notices += [self.settings_holder.load_notice] if self.settings_holder.load_notice else []
        self._watch_unsaved_replies()
        self.session = ChatSession(controller, self.chat_view, self.input_bar, self.journal, self)
        self.session.replies.tool_hub = self.tool_hub
        self.session.notice.connect(self.status_line.show_notice)
        self.session.shown.connect(self.status_line.show_conversation)
        self.session.replies.reply_started.connect(self.status_line.track_reply)
        self.status_line.show_conversation(self.session.conversation.id)
        controller.engine_error.connect(lambda event: self.show_error("The engine reported an error", event.message))
        self._build_central()
        self._build_menus()
        self.conversations = install_conversations(self, controller, startup_notices)
        self._build_model_menu(controller)
        self._build_performance_dock(controller)
        self.server_menu = install_server_menu(
            self, controller, self.performance_dock.panel, self.settings_holder, self.show_error
        )
        self.input_bar.prompt.setFocus()

    def closeEvent(self, event: QCloseEvent) -> None:
        save_geometry(self)
        super().closeEvent(event)
        self.closed.emit()

    def _watch_unsaved_replies(self) -> None:
        """While a finished reply is not saved (a full disk), say so in the status bar and retry every few
        seconds and at close (``ChatStore.unsaved``)."""
        store, warning_label, retry = self.journal.store, QLabel(self), QTimer(self)
        warning_label.setObjectName("unsavedWarning")
        self.status_line.addPermanentWidget(warning_label)
        retry.setInterval(UNSAVED_RETRY_MS)
        retry.timeout.connect(store.save_unsaved)

        def show(warning: str | None) -> None:
            warning_label.setText(warning or "")
            warning_label.setVisible(warning is not None)
            retry.start() if warning else retry.stop()

        store.unsaved.watch(show)
        self.closed.connect(store.save_unsaved)

    def _build_central(self) -> None:
        """The messages (or, for an empty conversation, the welcome pane) above the input bar."""
        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.welcome = WelcomePane(central)
        self.welcome.prompt_chosen.connect(self._start_from)
        layout.addWidget(self.welcome, 1)
        layout.addWidget(self.chat_view, 1)
        layout.addWidget(self.input_bar)
        self.setCentralWidget(central)
        self.session.shown.connect(self._show_welcome_if_empty)
        self.session.saved.connect(self._show_welcome_if_empty)
        self._show_welcome_if_empty()

    def _show_welcome_if_empty(self) -> None:
        empty = not self.session.conversation.messages
        self.welcome.setVisible(empty)
        self.chat_view.setVisible(not empty)

    def _start_from(self, prompt: str) -> None:
        """A suggested prompt goes into the message box, to edit or send."""
        self.input_bar.prompt.setPlainText(prompt)
        self.input_bar.prompt.setFocus()

    def _build_menus(self) -> None:
        """The menus in their order; each part of the window adds its own entries to them."""
        for title in MENU_ORDER:
            menu_named(self, title)
        add_action(menu_named(self, "&Conversation"), "&New conversation", QKeySequence.StandardKey.New, self._new_conversation)

    def _build_model_menu(self, controller: EngineController) -> None:
        self.model_loader = ModelLoader(self, self.session, controller, self.status_line, self.show_error)
        file_menu = menu_named(self, "&File")
        self.model_loader.fill_menu(file_menu)
        self.remote_picker = RemoteModelPicker(self, self.session, controller, self.status_line, self.model_loader.progress)
        self.remote_picker.fill_menu(file_menu)
        file_menu.addSeparator()
        add_action(file_menu, "&Quit", QKeySequence.StandardKey.Quit, self.close)

    def _build_performance_dock(self, controller: EngineController) -> None:
        """The performance panel, docked on the right, closed until View > Performance opens it."""
        self.performance_dock = PerformanceDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.performance_dock)
        self.resizeDocks([self.performance_dock], [PERFORMANCE_DOCK_WIDTH], Qt.Orientation.Horizontal)
        self.performance_dock.hide()
        menu_named(self, "&View").addAction(self.performance_dock.toggleViewAction())
        panel = self.performance_dock.panel
        controller.event_received.connect(panel.on_event)
        panel.show_conversation(self.session.conversation.id)
        self.session.shown.connect(panel.show_conversation)
        self.session.replies.reply_started.connect(panel.track_reply)

    def _new_conversation(self) -> None:
        self.conversations.new_conversation()

    def show_error(self, title: str, message: str) -> None:
        """A non-blocking warning dialog: the app stays usable while it is open."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
        box.setAccessibleName(title)
        box.setObjectName("errorDialog")
        box.open()
