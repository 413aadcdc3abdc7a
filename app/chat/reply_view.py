"""An assistant reply's rendered Markdown, grown in place as the reply streams (GUI thread).

``ReplyView`` is a read-only ``QTextBrowser`` as tall as its text (it never scrolls itself:
the conversation scrolls), so text can be selected and links clicked. ``show_markdown``
compares the reply's chunks (see ``markdown_render``) with those already in the document
and replaces only the ones that changed, normally the last: an update costs what the new
text costs, not what the whole reply costs, in Markdown, HTML parsing and layout alike.
The same lets a long finished reply be shown a few chunks at a time (``most_new_chunks``).
"""

from __future__ import annotations

import math

from PySide6.QtCore import QSizeF, Qt
from PySide6.QtGui import QTextCursor, QTextDocument, QTextDocumentFragment, QWheelEvent
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from app.chat.code_blocks import CodeColours
from app.chat.markdown_render import Chunk, chunk_html, split_chunks


class ReplyView(QTextBrowser):
    """Shows Markdown; ``show_markdown`` again with the grown text appends to what is shown."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(120)
        self.document().setUndoRedoEnabled(False)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._chunks: list[Chunk] = []
        self._chunk_ends: list[int] = []
        """Document position after each shown chunk."""
        self._colours: CodeColours | None = None
        self._fit_height(self.document().size())

    def show_markdown(self, text: str, colours: CodeColours, most_new_chunks: int | None = None) -> bool:
        """Show ``text``; chunks already shown as they are now are kept, the rest re-rendered.

        With ``most_new_chunks``, at most that many of the chunks not shown yet are rendered
        and a later call with the same text adds more. True once all of ``text`` is shown.
        """
        if colours != self._colours:
            self._colours = colours
            self._chunks, self._chunk_ends = [], []
        chunks = split_chunks(text)
        kept = self._kept(chunks)
        if kept == len(chunks) == len(self._chunks):
            return True
        shown_up_to = len(chunks) if most_new_chunks is None else min(len(chunks), kept + most_new_chunks)
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()
        cursor.setPosition(self._chunk_ends[kept - 1] if kept else 0)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        del self._chunks[kept:], self._chunk_ends[kept:]
        for chunk in chunks[kept:shown_up_to]:
            self._append(cursor, chunk, colours)
        cursor.endEditBlock()
        return shown_up_to == len(chunks)

    def unshown_chunks(self, text: str, colours: CodeColours) -> list[Chunk]:
        """The chunks of ``text`` that ``show_markdown`` would render now (all but those shown as they are)."""
        chunks = split_chunks(text)
        return chunks if colours != self._colours else chunks[self._kept(chunks) :]

    def _kept(self, chunks: list[Chunk]) -> int:
        """How many of ``chunks``, from the first, are shown as they are."""
        kept = 0
        while kept < min(len(chunks), len(self._chunks)) and chunks[kept] == self._chunks[kept]:
            kept += 1
        return kept

    def _append(self, cursor: QTextCursor, chunk: Chunk, colours: CodeColours) -> None:
        """Add one chunk as its own blocks, keeping its first block's margins and heading level."""
        rendered = QTextDocument()
        rendered.setHtml(chunk_html(chunk, colours))
        first_format = rendered.firstBlock().blockFormat()
        if cursor.block().length() > 1:
            cursor.insertBlock(first_format)
        else:  # an empty document, or the empty line Qt keeps after a table
            cursor.setBlockFormat(first_format)
        cursor.insertFragment(QTextDocumentFragment(rendered))
        self._chunks.append(chunk)
        self._chunk_ends.append(cursor.position())

    def wheelEvent(self, event: QWheelEvent) -> None:
        """The conversation scrolls, not the reply (which is never taller than its text)."""
        event.ignore()

    def _fit_height(self, size: QSizeF) -> None:
        margins = self.contentsMargins()
        self.setFixedHeight(math.ceil(size.height()) + margins.top() + margins.bottom())
