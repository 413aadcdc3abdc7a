"""Where the user writes: a multi-line prompt with Send and Stop buttons (GUI thread).

Enter sends, Shift+Enter starts a new line, Esc stops the reply being written, Tab and
Shift+Tab move to the next and previous control (Send, Stop, the list), never insert a tab.
The bar only says what the user asked for (``send_requested``, ``stop_requested``);
whether that is possible now is decided by whoever listens.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

_ENTER_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class PromptEdit(QPlainTextEdit):
    """A text box where Enter submits and Shift+Enter inserts a line break."""

    submitted = Signal()
    escape_pressed = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in _ENTER_KEYS and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.escape_pressed.emit()
            return
        super().keyPressEvent(event)


class InputBar(QWidget):
    """The prompt box and its buttons; ``set_ready`` enables Send and Stop."""

    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("inputBar")
        self.prompt = PromptEdit(self)
        self.prompt.setObjectName("prompt")
        self.prompt.setTabChangesFocus(True)
        self.prompt.setAccessibleName("Message")
        self.prompt.setAccessibleDescription("Enter sends, Shift+Enter starts a new line, Esc stops the reply.")
        self.prompt.setPlaceholderText("Write a message… (Enter sends, Shift+Enter for a new line)")
        self.prompt.setFixedHeight(84)
        self.send_button = self._button("Send", "Send message")
        self.stop_button = self._button("Stop", "Stop reply")
        self.stop_button.setEnabled(False)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 12, 8)
        row.addWidget(self.prompt, 1)
        row.addLayout(buttons)
        self.prompt.submitted.connect(self._request_send)
        self.send_button.clicked.connect(self._request_send)
        self.prompt.escape_pressed.connect(self.stop_requested)
        self.stop_button.clicked.connect(self.stop_requested)

    def text(self) -> str:
        return self.prompt.toPlainText()

    def clear(self) -> None:
        self.prompt.clear()

    def set_ready(self, model_ready: bool, generating: bool, stopping: bool = False) -> None:
        """Send works when a model is loaded and idle; Stop only while a reply is written and not yet asked to stop."""
        self.send_button.setEnabled(model_ready and not generating)
        self.stop_button.setEnabled(generating and not stopping)
        self.stop_button.setText("Stopping…" if generating and stopping else "Stop")

    def _request_send(self) -> None:
        self.send_requested.emit(self.text())

    def _button(self, text: str, accessible_name: str) -> QPushButton:
        button = QPushButton(text, self)
        button.setObjectName(text.lower() + "Button")
        button.setAccessibleName(accessible_name)
        return button
