"""What the actions on a message card do: edit (in a dialog), regenerate, delete, answer a tool call (GUI thread).

Copy is handled by the card itself; the rest goes to ``ChatSession``, which refuses while a
reply is being written in that conversation (except a tool card's answer, which that reply
waits for). Editing opens a small non-blocking dialog with the message's text.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.chat.chat_session import ChatSession
from app.chat.chat_view import ChatView
from app.chat.tool_round import TOOL_ANSWERS
from app.conversations.conversation import DisplayMessage


class EditDialog(QDialog):
    """Change the text of an earlier message; Ctrl+Enter or Save replaces it."""

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("editDialog")
        self.setWindowTitle("Edit message")
        self.setAccessibleName("Edit message")
        explanation = QLabel("The replies after this message will be replaced by a new one.", self)
        explanation.setWordWrap(True)
        self.editor = QPlainTextEdit(text, self)
        self.editor.setAccessibleName("Message text")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.setAccessibleName("Save or cancel")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(explanation)
        layout.addWidget(self.editor, 1)
        layout.addWidget(buttons)
        self.resize(520, 260)
        self.editor.setFocus()

    def text(self) -> str:
        return self.editor.toPlainText()


class MessageActions(QObject):
    """Turns the cards' ``message_action`` into session calls."""

    def __init__(self, session: ChatSession, view: ChatView, parent: QWidget) -> None:
        super().__init__(parent)
        self._session = session
        self._parent = parent
        self.edit_dialog: EditDialog | None = None
        view.message_action.connect(self.run)

    def run(self, action: str, message: DisplayMessage) -> None:
        if action == "regenerate":
            self._session.regenerate(message)
        elif action == "delete":
            self._session.delete(message)
        elif action == "edit":
            self._open_editor(message)
        elif action in TOOL_ANSWERS:
            self._session.answer_tool(message, action)

    def _open_editor(self, message: DisplayMessage) -> None:
        dialog = EditDialog(message.content, self._parent)
        dialog.accepted.connect(lambda: self._session.edit(message, dialog.text()))
        dialog.finished.connect(dialog.deleteLater)
        self.edit_dialog = dialog
        dialog.open()
