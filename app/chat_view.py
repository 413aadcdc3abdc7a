"""The scrolling list of message cards (GUI thread).

User cards sit on the right, assistant cards on the left. While a reply streams
the view follows the bottom, unless the user scrolled up to read.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QScrollArea, QVBoxLayout, QWidget

from app.conversation import DisplayMessage
from app.message_bubble import MessageBubble

MAX_BUBBLE_WIDTH_FRACTION = 0.8
FOLLOW_SLACK_PX = 24


class ChatView(QScrollArea):
    """Message cards, one per ``DisplayMessage``, in order."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setAccessibleName("Conversation")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._bubbles: list[MessageBubble] = []
        self._follow_bottom = True
        container = QWidget(self)
        container.setObjectName("chatContainer")
        self._column = QVBoxLayout(container)
        self._column.setContentsMargins(16, 16, 16, 16)
        self._column.setSpacing(10)
        self._column.addStretch(1)
        self.setWidget(container)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    @property
    def bubbles(self) -> tuple[MessageBubble, ...]:
        return tuple(self._bubbles)

    def add_message(self, message: DisplayMessage) -> MessageBubble:
        """Append a card for ``message`` and scroll to it."""
        bubble = MessageBubble(message)
        bubble.setMaximumWidth(self._max_bubble_width())
        row = QHBoxLayout()
        if message.role == "user":
            row.addStretch(1)
        row.addWidget(bubble)
        if message.role != "user":
            row.addStretch(1)
        self._column.insertLayout(self._column.count() - 1, row)
        self._bubbles.append(bubble)
        self._follow_bottom = True
        return bubble

    def clear(self) -> None:
        for bubble in self._bubbles:
            bubble.deleteLater()
        while self._column.count() > 1:
            self._column.takeAt(0)
        self._bubbles.clear()

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
