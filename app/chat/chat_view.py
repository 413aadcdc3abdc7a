"""The scrolling list of message cards (GUI thread).

User cards sit on the right, assistant cards on the left. While a reply streams the
view follows the bottom, unless the user scrolled up to read. A long conversation opens
at its end: cards are made only for the newest messages that fill the window and one
screen above it; older ones get their cards as the user scrolls up towards them, a
``BUDGET_S`` slice of the event loop at a time, while the text the user reads stays put.
Those cards are assembled out of sight, a page at a time, and each page is shown in a
slice of its own (see ``card_column``). A long reply's card is made with only its first
chunks (see ``message_bubble``) and grows in later slices, once it is on screen, newest
made first; the text the user reads stays put then too. So opening or scrolling 1 000
messages, long ones included, never freezes the window.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QCoreApplication, QEvent, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QScrollArea, QWidget

from app.chat import code_blocks
from app.chat.card_column import MARGIN, PAGE_SIZE, CardColumn
from app.chat.message_bubble import MessageBubble
from app.chat.tool_card import ToolCard
from app.conversations.conversation import DisplayMessage

Card = MessageBubble | ToolCard
"""A message's card: a ``ToolCard`` for a tool call, a ``MessageBubble`` for the others."""

MAX_BUBBLE_WIDTH_FRACTION = 0.8
MIN_BUBBLE_WIDTH = 240
FOLLOW_SLACK_PX = 24
BUDGET_S = 0.010
SLICE_GAP_MS = 1
"""Between two slices the event loop runs other timers too: a zero interval let two slices run back to back."""
"""How long one turn of the event loop may spend making cards."""
FIRST_CARDS_BUDGET_S = 0.006
"""How long opening a conversation may spend making its newest cards (at least one is made)."""
SCREENS_AHEAD = 1.5
"""How many screens of cards are kept ready above the one the user sees."""


class ChatView(QScrollArea):
    """Message cards, one per ``DisplayMessage``, in order (older ones made on demand)."""

    message_action = Signal(str, object)
    """An action chosen on a card ("edit", "regenerate", "delete", or a tool card's answer) and its
    ``DisplayMessage``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        code_blocks.warm_up()  # the first highlighted block must not stall the window
        self.setObjectName("chatView")
        self.setAccessibleName("Conversation")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._bubbles: list[Card] = []
        self._follow_bottom = True
        self._older: list[DisplayMessage] = []
        """Messages above the first card that have no card yet, oldest first."""
        self._growing: list[Card] = []
        """Cards that show only the start of their message yet, in the order they were made."""
        self._anchor: tuple[Card, int] | None = None
        """The first card and its offset from the top of the view, kept while cards are added above it."""
        self._restoring = False
        self._work_timer = QTimer(self)
        self._work_timer.setInterval(SLICE_GAP_MS)
        self._work_timer.timeout.connect(self._work_one_slice)
        self.banner = QLabel("")
        self.banner.setObjectName("damageBanner")
        self.banner.setAccessibleName("Conversation problem")
        self.banner.setWordWrap(True)
        self.banner.hide()
        self._cards = CardColumn(self.banner, self)
        self._cards.setObjectName("chatContainer")
        self.setWidget(self._cards)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    @property
    def bubbles(self) -> tuple[Card, ...]:
        """The cards on screen, in order: the newest messages' cards, and older ones the user scrolled to."""
        return tuple(self._bubbles[self._cards.hidden_cards :])

    @property
    def loading(self) -> bool:
        """True while cards for older messages are being made, or long cards are still growing."""
        return self._work_timer.isActive()

    @property
    def following_bottom(self) -> bool:
        return self._follow_bottom

    def set_banner(self, text: str) -> None:
        """Show ``text`` above the messages (e.g. why part of the conversation is missing); "" hides it."""
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def add_message(self, message: DisplayMessage) -> Card:
        """Append a card for ``message`` and scroll to it."""
        bubble = self._insert(len(self.bubbles), message)
        self._follow_bottom = True
        return bubble

    def show_messages(self, messages: tuple[DisplayMessage, ...]) -> None:
        """Show exactly ``messages``, scrolled to the end; older cards are made as the user scrolls up."""
        self.clear()
        self._follow_bottom = True
        self._older = list(messages)
        deadline = time.perf_counter() + FIRST_CARDS_BUDGET_S
        while self._older and (not self._bubbles or time.perf_counter() < deadline):
            self._insert(0, self._older.pop())
        self._start_work_if_any()

    def remove_message(self, message: DisplayMessage) -> None:
        self._older = [older for older in self._older if older is not message]
        bubble = self.bubble_for(message)
        if bubble is None:
            return
        self._bubbles.remove(bubble)
        if bubble in self._growing:
            self._growing.remove(bubble)
        if self._anchor is not None and self._anchor[0] is bubble:
            self._anchor = None
        self._cards.remove(bubble)

    def bubble_for(self, message: DisplayMessage) -> Card | None:
        return next((bubble for bubble in self._bubbles if bubble.message is message), None)

    def refresh_message(self, message: DisplayMessage) -> None:
        bubble = self.bubble_for(message)
        if bubble is not None:
            bubble.refresh()

    def clear(self) -> None:
        self._older.clear()
        self._work_timer.stop()
        self._anchor = None
        self._growing.clear()
        self._cards.clear()
        self._bubbles.clear()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        width = self._max_bubble_width()
        for bubble in self._bubbles:
            bubble.setMaximumWidth(width)

    def changeEvent(self, event: QEvent) -> None:
        """Cards waiting out of sight take the new colours too (``appearance`` refreshes those on screen)."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            for bubble in self._bubbles[: self._cards.hidden_cards]:
                bubble.refresh()

    def _make_bubble(self, message: DisplayMessage) -> Card:
        bubble = ToolCard(message) if message.tool is not None else MessageBubble(message)
        bubble.setMaximumWidth(self._max_bubble_width())
        bubble.action_requested.connect(lambda action: self.message_action.emit(action, message))
        if not bubble.complete:
            self._growing.append(bubble)
        return bubble

    def _insert(self, index: int, message: DisplayMessage) -> Card:
        """A card for ``message`` at ``index`` among the cards on screen, shown now."""
        bubble = self._make_bubble(message)
        self._cards.insert(index, bubble, on_the_right=message.role == "user")
        self._bubbles.insert(self._cards.hidden_cards + index, bubble)
        bubble.show()  # now, where the time slice counts it (styling it costs as much as making it)
        self._start_work_if_any()
        return bubble

    def _work_one_slice(self) -> None:
        """One time slice of work: grow the long cards on screen, else, while the user is near them, make older cards."""
        if self._next_growing() is not None:
            self._grow_cards(time.perf_counter() + BUDGET_S)
            return
        waiting = self._cards.hidden_cards
        if not (self._older or waiting) or self.verticalScrollBar().value() > self.viewport().height() * SCREENS_AHEAD:
            self._work_timer.stop()
        elif waiting >= PAGE_SIZE or (waiting and not self._older):
            self._reveal_assembled_cards()
        else:
            self._assemble_older_cards(time.perf_counter() + BUDGET_S)

    def _assemble_older_cards(self, deadline: float) -> None:
        """Make cards for the newest older messages, out of sight, until ``deadline`` or a full page."""
        while self._older and self._cards.hidden_cards < PAGE_SIZE and time.perf_counter() < deadline:
            message = self._older.pop()
            bubble = self._make_bubble(message)
            bubble.ensurePolished()  # styling it costs as much as making it: here, not when the page is shown
            self._cards.prepend_hidden(bubble, on_the_right=message.role == "user")
            self._bubbles.insert(0, bubble)

    def _next_growing(self) -> Card | None:
        """The first made of the growing cards on screen (those waiting out of sight grow once shown)."""
        return next((bubble for bubble in self._growing if bubble.isVisibleTo(self._cards)), None)

    def _grow_cards(self, deadline: float) -> None:
        """Show more of the first made long card on screen until ``deadline``, keeping the card the user reads in place."""
        self._pin_reading_card()
        bubble = self._next_growing()
        if bubble is not None and bubble.grow(deadline):
            self._growing.remove(bubble)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)  # their new height, now
        self._restore_anchor()

    def _reveal_assembled_cards(self) -> None:
        """Show the assembled cards above the others, keeping the card the user reads where it is."""
        self._pin_reading_card()
        self._cards.reveal_prepended()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)  # lay the new cards out now
        self._restore_anchor()

    def _pin_reading_card(self) -> None:
        """Remember the first card in view and where it is, until the user scrolls again.

        Cards made above it, and cards above it that settle their height later, must not move it.
        """
        if self._anchor is not None or self._follow_bottom:
            return
        top = self.verticalScrollBar().value()
        reading = next((b for b in self.bubbles if self._top_of(b) + b.height() > top), None)
        if reading is not None:
            self._anchor = (reading, self._top_of(reading) - top)

    def _top_of(self, bubble: Card) -> int:
        return bubble.mapTo(self._cards, QPoint(0, 0)).y()

    def _max_bubble_width(self) -> int:
        """A fraction of the view, at least ``MIN_BUBBLE_WIDTH``, but never wider than the column holds.

        A card wider than its room would be squeezed below its own height for that width
        (its height is at most its size hint's), and its last line would run under its note.
        """
        room = self.viewport().width() - 2 * MARGIN
        return max(1, min(room, max(MIN_BUBBLE_WIDTH, int(self.viewport().width() * MAX_BUBBLE_WIDTH_FRACTION))))

    def _on_scrolled(self, value: int) -> None:
        self._follow_bottom = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK_PX
        self._start_work_if_any()
        if not self._restoring:
            self._anchor = None  # the user moved: pin what they read now, next time cards are made

    def _start_work_if_any(self) -> None:
        """Cards grow, and older messages get cards while the view is within a few screens of the first card."""
        if (self._older or self._cards.hidden_cards or self._growing) and not self._work_timer.isActive():
            self._work_timer.start()

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        """Keep the bottom in view while following it, else keep the text the user reads in place."""
        self._start_work_if_any()
        if self._follow_bottom:
            self._restoring = True
            self.verticalScrollBar().setValue(maximum)
            self._restoring = False
        else:
            self._restore_anchor()

    def _restore_anchor(self) -> None:
        """Scroll so the card the user was reading sits where it was."""
        if self._anchor is None or self._follow_bottom:
            return
        bubble, offset = self._anchor
        self._restoring = True
        self.verticalScrollBar().setValue(self._top_of(bubble) - offset)
        self._restoring = False
