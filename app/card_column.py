"""The widget that holds the chat view's message cards, in pages (GUI thread).

Cards sit in pages of about ``PAGE_SIZE``: adding, removing or growing a card lays out
its own page again and only moves the others, so a change costs the same in a
1 000-message conversation as in a short one. Cleared pages are deleted one per turn of
the event loop, so leaving a long conversation does not freeze the window either.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

PAGE_SIZE = 20
CARD_SPACING = 10


class _Page(QWidget):
    """A run of consecutive cards, user cards on the right and the others on the left."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.cards: list[QWidget] = []
        self._rows = QVBoxLayout(self)
        self._rows.setContentsMargins(0, 0, 0, 0)
        self._rows.setSpacing(CARD_SPACING)

    def insert(self, index: int, card: QWidget, on_the_right: bool) -> None:
        row = QHBoxLayout()
        if on_the_right:
            row.addStretch(1)
        row.addWidget(card)
        if not on_the_right:
            row.addStretch(1)
        self._rows.insertLayout(index, row)
        self.cards.insert(index, card)

    def remove(self, card: QWidget) -> None:
        self._rows.takeAt(self.cards.index(card)).layout().deleteLater()
        self.cards.remove(card)
        card.hide()
        card.deleteLater()


class CardColumn(QWidget):
    """``header`` on top, then the cards in order; ``insert``, ``remove`` and ``clear`` change them."""

    def __init__(self, header: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._column = QVBoxLayout(self)
        self._column.setContentsMargins(16, 16, 16, 16)
        self._column.setSpacing(CARD_SPACING)
        header.setParent(self)
        self._column.addWidget(header)
        self._column.addStretch(1)
        self._pages: list[_Page] = []
        self._cleared: list[_Page] = []
        self._deleter = QTimer(self)
        self._deleter.setInterval(0)
        self._deleter.timeout.connect(self._delete_one_page)

    def insert(self, index: int, card: QWidget, on_the_right: bool) -> None:
        """Put ``card`` at position ``index`` among all cards."""
        page, position = self._place_for(index)
        page.insert(position, card, on_the_right)

    def remove(self, card: QWidget) -> None:
        page = next(page for page in self._pages if card in page.cards)
        page.remove(card)
        if not page.cards:
            self._pages.remove(page)
            self._column.removeWidget(page)
            page.deleteLater()

    def clear(self) -> None:
        """Remove every card at once; they are deleted over the next turns of the event loop."""
        for page in self._pages:
            self._column.removeWidget(page)
            page.hide()
        self._cleared.extend(self._pages)
        self._pages.clear()
        if self._cleared:
            self._deleter.start()

    def _place_for(self, index: int) -> tuple[_Page, int]:
        """The page where a card at ``index`` goes and its position there; a new page at either end when full."""
        if index == 0 and (not self._pages or len(self._pages[0].cards) >= PAGE_SIZE):
            return self._new_page(0), 0
        start = 0
        for page in self._pages:
            if index <= start + len(page.cards) and (index < start + len(page.cards) or len(page.cards) < PAGE_SIZE):
                return page, index - start
            start += len(page.cards)
        return self._new_page(len(self._pages)), 0

    def _new_page(self, position: int) -> _Page:
        page = _Page(self)
        self._pages.insert(position, page)
        self._column.insertWidget(position + 1, page)  # after the header
        return page

    def _delete_one_page(self) -> None:
        if self._cleared:
            self._cleared.pop().deleteLater()
        if not self._cleared:
            self._deleter.stop()
