"""The widget that holds the chat view's message cards, in pages (GUI thread).

Cards sit in pages of at most ``PAGE_SIZE``, and pages in books of at most ``BOOK_SIZE``:
adding, removing or growing a card lays out its own page and book again and only moves
the others, so a change costs about the same in a 1 000-message conversation as in a
short one (a Qt layout's pass costs time in proportion to the items it holds). The
column places its books itself, with no QLayout: a scroll area asks a layout holding
heights that depend on the width for its minimum height at every change, and a
``QBoxLayout`` answers that by asking every card again, a visible stall in a long
conversation. Cards for older messages are put into a page that is assembled out of
sight (``prepend_hidden``) and shown in one go (``reveal_prepended``): a card added to
a page on screen would lay out the whole page again, and every card shown in a shown
page lays out its ancestors. Cleared pages are moved out of sight at once and deleted
one per turn of the event loop, so leaving a long conversation does not freeze the
window either (hiding them all at once would).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

PAGE_SIZE = 6
BOOK_SIZE = 10
CARD_SPACING = 10
MARGIN = 16


def _column_layout(widget: QWidget) -> QVBoxLayout:
    layout = QVBoxLayout(widget)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(CARD_SPACING)
    return layout


class _Page(QWidget):
    """A run of consecutive cards, user cards on the right and the others on the left."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.cards: list[QWidget] = []
        self._rows = _column_layout(self)

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


class _Book(QWidget):
    """A run of consecutive pages."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.pages: list[_Page] = []
        self._stack = _column_layout(self)

    def insert(self, index: int, page: _Page) -> None:
        self._stack.insertWidget(index, page)
        self.pages.insert(index, page)

    def remove(self, page: _Page) -> None:
        self._stack.removeWidget(page)
        self.pages.remove(page)


class CardColumn(QWidget):
    """``header`` on top, then the cards in order; ``insert``, ``remove`` and ``clear`` change them."""

    def __init__(self, header: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._header = header
        header.setParent(self)
        self._content_height = 2 * MARGIN
        self._books: list[_Book] = []
        self._hidden_page: _Page | None = None
        """The page being assembled out of sight, above all the others."""
        self._cleared: list[QWidget] = []
        """Pages and books out of sight, to delete: pages first, one per turn."""
        self._deleter = QTimer(self)
        self._deleter.setInterval(0)
        self._deleter.timeout.connect(self._delete_one_page)

    @property
    def hidden_cards(self) -> int:
        """How many cards wait out of sight, above all the others, for ``reveal_prepended``."""
        return len(self._hidden_page.cards) if self._hidden_page is not None else 0

    def sizeHint(self) -> QSize:
        return QSize(2 * MARGIN, self._content_height)

    def minimumSizeHint(self) -> QSize:
        """As tall as the cards at the present width (the scroll area asks this at every change)."""
        return self.sizeHint()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:  # a book or the header changed its size or visibility
            self._place_books()
        return super().event(event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_books()

    def insert(self, index: int, card: QWidget, on_the_right: bool) -> None:
        """Put ``card`` at position ``index`` among the cards on screen."""
        page, position = self._place_for(index)
        page.insert(position, card, on_the_right)

    def prepend_hidden(self, card: QWidget, on_the_right: bool) -> None:
        """Put ``card`` above all cards, in a page kept out of sight until ``reveal_prepended``."""
        if self._hidden_page is None:
            self._hidden_page = _Page(self)
            self._hidden_page.hide()
        self._hidden_page.insert(0, card, on_the_right)

    def reveal_prepended(self) -> None:
        """Show the cards added by ``prepend_hidden`` above the others, as one new page."""
        page, self._hidden_page = self._hidden_page, None
        if page is not None:
            self._add_page(0, page)
            page.show()

    def remove(self, card: QWidget) -> None:
        page = next(page for page in self._all_pages() if card in page.cards)
        page.remove(card)
        if page.cards:
            return
        if page is self._hidden_page:
            self._hidden_page = None
        else:
            self._remove_page(page)
        page.deleteLater()

    def clear(self) -> None:
        """Remove every card at once: out of sight now, deleted over the next turns of the event loop."""
        out_of_sight = self._books + ([self._hidden_page] if self._hidden_page is not None else [])
        for widget in out_of_sight:
            widget.move(widget.x(), -widget.height() - 1)  # above the column: not painted, far cheaper than hiding
        self._cleared[:0] = self._books
        self._cleared.extend(self._all_pages())
        self._books.clear()
        self._hidden_page = None
        if self._cleared:
            self._deleter.start()
        self._place_books()

    @property
    def _pages(self) -> list[_Page]:
        """The pages on screen, in order."""
        return [page for book in self._books for page in book.pages]

    def _all_pages(self) -> list[_Page]:
        return self._pages + ([self._hidden_page] if self._hidden_page is not None else [])

    def _add_page(self, position: int, page: _Page) -> None:
        """Put ``page`` first (``position`` 0) or last among the pages on screen, in a new book when that one is full."""
        at_top = position == 0 and bool(self._books)
        book = self._books[0] if at_top else (self._books[-1] if self._books else None)
        if book is None or len(book.pages) >= BOOK_SIZE:
            book = _Book(self)
            self._books.insert(0 if at_top else len(self._books), book)
            book.show()
        book.insert(0 if at_top else len(book.pages), page)

    def _remove_page(self, page: _Page) -> None:
        book = next(book for book in self._books if page in book.pages)
        book.remove(page)
        if not book.pages:
            self._books.remove(book)
            book.hide()
            book.deleteLater()
            self._place_books()

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
        self._add_page(position, page)
        return page

    def _place_books(self) -> None:
        """The header (when shown) and the books from the top, each as tall as it needs at the column's width."""
        width, top = self.width() - 2 * MARGIN, MARGIN
        shown = ([self._header] if self._header.isVisibleTo(self) else []) + self._books
        for widget in shown:
            height = widget.heightForWidth(width) if widget.hasHeightForWidth() else widget.sizeHint().height()
            widget.setGeometry(MARGIN, top, width, height)
            top += widget.height() + CARD_SPACING
        content_height = top - (CARD_SPACING if shown else 0) + MARGIN
        if content_height != self._content_height:
            self._content_height = content_height
            self.updateGeometry()

    def _delete_one_page(self) -> None:
        if self._cleared:
            self._cleared.pop().deleteLater()
        if not self._cleared:
            self._deleter.stop()
