"""The scrolling list of message cards (GUI thread).

User cards sit on the right, assistant cards on the left. While a reply streams
the view follows the bottom, unless the user scrolled up to read. A long conversation
is shown newest first: the last ``FIRST_BATCH`` cards at once, older ones a batch per
event-loop turn above them, so opening 1 000 messages never freezes the window.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.conversation import DisplayMessage
from app.message_bubble import MessageBubble

MAX_BUBBLE_WIDTH_FRACTION = 0.8
FOLLOW_SLACK_PX = 24
FIRST_BATCH = 30
OLDER_BATCH = 8


class ChatView(QScrollArea):
    """Message cards, one per ``DisplayMessage``, in order."""

    message_action = Signal(str, object)
    """An action chosen on a card ("edit", "regenerate", "delete") and its ``DisplayMessage``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setAccessibleName("Conversation")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._bubbles: list[MessageBubble] = []
        self._follow_bottom = True
        self._older: list[DisplayMessage] = []
        self._older_timer = QTimer(self)
        self._older_timer.setInterval(0)
        self._older_timer.timeout.connect(self._add_older_batch)
        container = QWidget(self)
        container.setObjectName("chatContainer")
        self._column = QVBoxLayout(container)
        self._column.setContentsMargins(16, 16, 16, 16)
        self._column.setSpacing(10)
        self.banner = QLabel("", container)
        self.banner.setObjectName("damageBanner")
        self.banner.setAccessibleName("Conversation problem")
        self.banner.setWordWrap(True)
        self.banner.hide()
        self._column.addWidget(self.banner)
        self._column.addStretch(1)
        self.setWidget(container)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    @property
    def bubbles(self) -> tuple[MessageBubble, ...]:
        return tuple(self._bubbles)

    @property
    def loading(self) -> bool:
        """True while older cards of a long conversation are still being added."""
        return bool(self._older)

    def set_banner(self, text: str) -> None:
        """Show ``text`` above the messages (e.g. why part of the conversation is missing); "" hides it."""
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def add_message(self, message: DisplayMessage) -> MessageBubble:
        """Append a card for ``message`` and scroll to it."""
        bubble = self._insert(len(self._bubbles), message)
        self._follow_bottom = True
        return bubble

    def show_messages(self, messages: tuple[DisplayMessage, ...]) -> None:
        """Show exactly ``messages``: the newest at once, older ones batch by batch above them."""
        self.clear()
        split = max(0, len(messages) - FIRST_BATCH)
        for message in messages[split:]:
            self.add_message(message)
        self._older = list(messages[:split])
        if self._older:
            self._older_timer.start()

    def remove_message(self, message: DisplayMessage) -> None:
        bubble = self.bubble_for(message)
        if bubble is None:
            return
        index = self._bubbles.index(bubble)
        self._bubbles.pop(index)
        row = self._column.takeAt(index + 1)
        bubble.deleteLater()
        if row is not None:
            row.layout().deleteLater()

    def bubble_for(self, message: DisplayMessage) -> MessageBubble | None:
        return next((bubble for bubble in self._bubbles if bubble.message is message), None)

    def refresh_message(self, message: DisplayMessage) -> None:
        bubble = self.bubble_for(message)
        if bubble is not None:
            bubble.refresh()

    def clear(self) -> None:
        self._older.clear()
        self._older_timer.stop()
        for bubble in self._bubbles:
            bubble.deleteLater()
        while self._column.count() > 2:
            row = self._column.takeAt(1)
            row.layout().deleteLater()
        self._bubbles.clear()

    def _insert(self, index: int, message: DisplayMessage) -> MessageBubble:
        bubble = MessageBubble(message)
        bubble.setMaximumWidth(self._max_bubble_width())
        bubble.action_requested.connect(lambda action: self.message_action.emit(action, message))
        row = QHBoxLayout()
        if message.role == "user":
            row.addStretch(1)
        row.addWidget(bubble)
        if message.role != "user":
            row.addStretch(1)
        self._column.insertLayout(index + 1, row)  # after the banner
        self._bubbles.insert(index, bubble)
        return bubble

    def _add_older_batch(self) -> None:
        batch, self._older = self._older[-OLDER_BATCH:], self._older[:-OLDER_BATCH]
        for message in reversed(batch):
            self._insert(0, message)
        if not self._older:
            self._older_timer.stop()

    @property
    def following_bottom(self) -> bool:
        return self._follow_bottom

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        width = self._max_bubble_width()
        for bubble in self._bubbles:
            bubble.setMaximumWidth(width)

    def _max_bubble_width(self) -> int:
        return max(240, int(self.viewport().width() * MAX_BUBBLE_WIDTH_FRACTION))

    def _on_scrolled(self, value: int) -> None:
        self._follow_bottom = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow_bottom:
            self.verticalScrollBar().setValue(maximum)
