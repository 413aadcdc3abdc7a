"""One message of the conversation as a card (GUI thread).

User messages show their text as typed; assistant replies are rendered from
Markdown. While a reply streams, re-rendering is coalesced to at most one every
``RENDER_INTERVAL_MS``, so hundreds of tokens a second stay smooth.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.conversation import DisplayMessage
from app.markdown_render import markdown_to_html

RENDER_INTERVAL_MS = 50

_ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
_ACCESSIBLE_NAMES = {"user": "Your message", "assistant": "Assistant reply", "system": "System message"}


def state_note(message: DisplayMessage) -> str:
    """The line under a message that says how it ended, if not normally."""
    if message.state == "streaming":
        return "writing…"
    if message.state == "interrupted":
        return "Stopped: this reply is incomplete."
    if message.state == "error":
        return f"The reply broke off: {message.error}"
    return ""


class MessageBubble(QFrame):
    """Shows a ``DisplayMessage``; call ``refresh`` after the message changed."""

    def __init__(self, message: DisplayMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.setObjectName(f"{message.role}Bubble")
        self.setAccessibleName(_ACCESSIBLE_NAMES[message.role])
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.title = self._label(_ROLE_TITLES[message.role], "bubbleTitle", "Author")
        self.body = self._label("", "bubbleBody", "Message text")
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.body.setOpenExternalLinks(True)
        self.note = self._label("", "bubbleNote", "Message status")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 10)
        layout.setSpacing(4)
        for label in (self.title, self.body, self.note):
            layout.addWidget(label)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render)
        self._natural_width = 0
        self._render()

    def refresh(self) -> None:
        """Show the message's current text and state (coalesced while it streams)."""
        if self.message.state == "streaming":
            if not self._render_timer.isActive():
                self._render_timer.start()
            return
        self._render_timer.stop()
        self._render()

    def sizeHint(self) -> QSize:
        """As wide as the text wants (up to the maximum width), as tall as that makes it."""
        margins = self.layout().contentsMargins()
        width = min(self.maximumWidth(), self._natural_width + margins.left() + margins.right())
        width = max(width, super().minimumSizeHint().width())
        return QSize(width, self.heightForWidth(width))

    def _render(self) -> None:
        document = QTextDocument()
        document.setDefaultFont(self.body.font())
        if self.message.role == "assistant":
            self.body.setTextFormat(Qt.TextFormat.RichText)
            self.body.setText(markdown_to_html(self.message.content))
            document.setHtml(self.body.text())
        else:
            self.body.setTextFormat(Qt.TextFormat.PlainText)
            self.body.setText(self.message.content)
            document.setPlainText(self.message.content)
        self._natural_width = max(int(document.idealWidth()) + 1, self.title.sizeHint().width())
        self.updateGeometry()
        self.body.setVisible(bool(self.message.content))
        note = state_note(self.message)
        self.note.setText(note)
        self.note.setProperty("state", self.message.state)
        self.note.style().polish(self.note)
        self.note.setVisible(bool(note))

    def _label(self, text: str, object_name: str, accessible_name: str) -> QLabel:
        label = QLabel(text, self)
        label.setObjectName(object_name)
        label.setWordWrap(True)
        label.setAccessibleName(accessible_name)
        return label
