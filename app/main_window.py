"""Hearth's main window: lays out the conversation, the input bar and the status line (GUI thread).

The window only assembles parts: ``ChatSession`` runs the conversation, ``StatusLine``
reports the engine, and errors that need attention open a non-blocking dialog.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QMessageBox, QVBoxLayout, QWidget

from app.chat_session import ChatSession
from app.chat_view import ChatView
from app.controller import EngineController
from app.app_settings import SettingsHolder
from app.conversation_ui import install_conversations
from app.input_box import InputBar
from app.persistence import open_journal
from app.status_line import StatusLine
from app.theme import STYLE_SHEET
from engine.messages import EngineError, LoadFailed

DEFAULT_MODEL = "default"


class MainWindow(QMainWindow):
    """Conversation above, prompt below, engine status at the bottom."""

    closed = Signal()

    def __init__(self, controller: EngineController) -> None:
        super().__init__()
        self.setWindowTitle("Hearth")
        self.setObjectName("mainWindow")
        self.setStyleSheet(STYLE_SHEET)
        self.resize(900, 700)
        self.chat_view = ChatView(self)
        self.input_bar = InputBar(self)
        self.status_line = StatusLine(controller, self)
        self.setStatusBar(self.status_line)
        self.settings_holder = SettingsHolder(parent=self)
        self.journal, startup_notices = open_journal(lambda: self.settings_holder.settings)
        startup_notices += [self.settings_holder.load_notice] if self.settings_holder.load_notice else []
        self.session = ChatSession(controller, self.chat_view, self.input_bar, self.journal, self)
        self.session.notice.connect(self.status_line.show_notice)
        controller.load_failed.connect(lambda event: self._show_error("The model could not be loaded", event))
        controller.engine_error.connect(lambda event: self._show_error("The engine reported an error", event))
        self._build_central()
        self._build_menus()
        self.conversations = install_conversations(self, controller, startup_notices)
        self.input_bar.prompt.setFocus()

    def closeEvent(self, event: QCloseEvent) -> None:
        super().closeEvent(event)
        self.closed.emit()

    def _build_central(self) -> None:
        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.chat_view, 1)
        layout.addWidget(self.input_bar)
        self.setCentralWidget(central)

    def _build_menus(self) -> None:
        chat_menu = self.menuBar().addMenu("&Conversation")
        self._add_action(chat_menu, "&New conversation", QKeySequence.StandardKey.New, self._new_conversation)
        chat_menu.addSeparator()
        self._add_action(chat_menu, "&Quit", QKeySequence.StandardKey.Quit, self.close)
        model_menu = self.menuBar().addMenu("&Model")
        self._add_action(model_menu, "Load the &default model", None, self._load_default_model)
        self._add_action(model_menu, "Load a model &folder…", None, self._choose_model_folder)
        self._add_action(model_menu, "Load a &GGUF file…", None, self._choose_gguf_file)

    def _add_action(
        self, menu: QMenu, text: str, shortcut: QKeySequence.StandardKey | None, slot: Callable[[], object]
    ) -> None:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(slot)
        menu.addAction(action)

    def _new_conversation(self) -> None:
        self.conversations.new_conversation()

    def _load_default_model(self) -> None:
        self.session.load_model(DEFAULT_MODEL)

    def _choose_model_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Load a model folder")
        if folder:
            self.session.load_model(folder)

    def _choose_gguf_file(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(self, "Load a GGUF file", "", "GGUF models (*.gguf)")
        if path:
            self.session.load_model(path)

    def _show_error(self, title: str, event: LoadFailed | EngineError) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, title, event.message, QMessageBox.StandardButton.Ok, self)
        box.setAccessibleName(title)
        box.setObjectName("errorDialog")
        box.open()
