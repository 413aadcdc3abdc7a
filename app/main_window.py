"""Hearth's main window: lays out the conversation, the input bar and the status line (GUI thread).

The window only assembles parts: ``ChatSession`` runs the conversation, ``StatusLine``
reports the engine, ``ModelLoader`` opens models (Model menu, drops), the
performance dock shows every engine event, and errors that need attention open a
non-blocking dialog.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QMessageBox, QVBoxLayout, QWidget

from app.chat_session import ChatSession
from app.chat_view import ChatView
from app.controller import EngineController
from app.conversation import Conversation
from app.input_box import InputBar
from app.model_picker import ModelLoader
from app.perf.dock import PerformanceDock
from app.status_line import StatusLine
from app.theme import STYLE_SHEET


PERFORMANCE_DOCK_WIDTH = 380


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
        self.session = ChatSession(controller, self.chat_view, self.input_bar, self)
        self.session.notice.connect(self.status_line.show_notice)
        controller.engine_error.connect(lambda event: self.show_error("The engine reported an error", event.message))
        self._build_central()
        self._build_menus()
        self._build_model_menu(controller)
        self._build_performance_dock(controller)
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

    def _build_model_menu(self, controller: EngineController) -> None:
        self.model_loader = ModelLoader(self, self.session, controller, self.status_line, self.show_error)
        self.model_loader.fill_menu(self.menuBar().addMenu("&Model"))

    def _build_performance_dock(self, controller: EngineController) -> None:
        """The performance panel, docked on the right, closed until View > Performance opens it."""
        self.performance_dock = PerformanceDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.performance_dock)
        self.resizeDocks([self.performance_dock], [PERFORMANCE_DOCK_WIDTH], Qt.Orientation.Horizontal)
        self.performance_dock.hide()
        self.menuBar().addMenu("&View").addAction(self.performance_dock.toggleViewAction())
        controller.event_received.connect(self.performance_dock.panel.on_event)

    def _add_action(
        self, menu: QMenu, text: str, shortcut: QKeySequence.StandardKey | None, slot: Callable[[], object]
    ) -> None:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(slot)
        menu.addAction(action)

    def _new_conversation(self) -> None:
        self.session.show_conversation(Conversation())

    def show_error(self, title: str, message: str) -> None:
        """A non-blocking warning dialog: the app stays usable while it is open."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
        box.setAccessibleName(title)
        box.setObjectName("errorDialog")
        box.open()
