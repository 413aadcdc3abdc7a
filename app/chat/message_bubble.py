"""One message of the conversation as a card (GUI thread).

User messages show their text as typed; assistant replies are rendered from
Markdown by a ``ReplyView``, which re-renders only what changed. While a reply streams,
updates are coalesced to at most one every ``RENDER_INTERVAL_MS`` (the frame rate), so
hundreds of tokens a second stay smooth. Assistant cards take the full width they may
have, so a growing reply never changes the card's width. The header holds
a Copy button and a menu of actions (Edit, Regenerate, Delete) that the card only
announces through ``action_requested``; code blocks' Copy links copy their code.
A reply's card is made with its first ``FIRST_CHUNKS`` Markdown chunks and shows the rest
through ``grow``, which its owner calls in later turns of the event loop (a long reply would
otherwise freeze the window while its card is made); its buttons act on the whole message
meanwhile. That holds for a reply still streaming too (the user switched to a conversation
that is answering): until ``grow`` has caught up with its text, new text waits for ``grow``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextDocument
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMenu, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.chat.code_blocks import DARK_CODE, LIGHT_CODE, CodeColours, code_index, highlighted
from app.chat.markdown_render import Chunk, code_blocks
from app.chat.reply_view import ReplyView
from app.conversations.conversation import DisplayMessage
from app.perf.format import reading_note

RENDER_INTERVAL_MS = 50
COPIED_MS = 1500
FIRST_CHUNKS = 4
"""How many Markdown chunks of a finished reply its card shows when it is made (``grow`` adds the rest)."""
LONG_CODE_CHARS = 800
"""Code blocks longer than this (~10 lines) are left to ``grow``: highlighting a long block would delay the card."""

_ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
_ACCESSIBLE_NAMES = {"user": "Your message", "assistant": "Assistant reply", "system": "System message"}
_ACTIONS = {
    "user": (("edit", "&Edit…"), ("delete", "&Delete")),
    "assistant": (("regenerate", "&Regenerate"), ("delete", "&Delete")),
    "system": (("delete", "&Delete"),),
}
DROPPED_NOTE = "Left out of the model's context: the conversation is longer than the model can read."


def state_note(message: DisplayMessage) -> str:
    """The lines under a message that say how it ended, if not normally, and if the model no longer sees it."""
    notes = {
        "streaming": ("asking the tool servers for their tools…" if message.listing_tools
                      else reading_note(*message.reading) if message.reading
                      else "waiting for its turn…" if message.waiting else "writing…"),
        "interrupted": "Stopped: this reply is incomplete.",
        "error": f"The reply broke off: {message.error}",
    }
    lines = [notes[message.state]] if message.state in notes else []
    if message.tool_calls:
        lines.append("Called " + ", ".join(call.name for call in message.tool_calls) + ":")
    if message.dropped:
        lines.append(DROPPED_NOTE)
    return "\n".join(lines)


def _is_long_code(chunk: Chunk | None) -> bool:
    return chunk is not None and chunk.code is not None and len(chunk.code.code) > LONG_CODE_CHARS


def code_colours(widget: QWidget) -> CodeColours:
    """Code colours that suit the widget's palette (dark or light)."""
    return DARK_CODE if widget.palette().window().color().lightness() < 128 else LIGHT_CODE


class MessageBubble(QFrame):
    """Shows a ``DisplayMessage``; call ``refresh`` after the message changed."""

    action_requested = Signal(str)
    """"edit", "regenerate" or "delete", chosen from the card's menu."""

    def __init__(self, message: DisplayMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.setObjectName(f"{message.role}Bubble")
        self.setAccessibleName(_ACCESSIBLE_NAMES[message.role])
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.title = self._label(_ROLE_TITLES[message.role], "bubbleTitle", "Author")
        self.body = self._reply_view() if message.role == "assistant" else self._text_label()
        self.note = self._label("", "bubbleNote", "Message status")
        self.copy_button = self._tool_button("Copy", "Copy message", self.copy_text)
        self.actions_button = self._tool_button("⋯", "Message actions", self._show_actions)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 10)
        layout.setSpacing(4)
        layout.addLayout(self._header())
        for label in (self.body, self.note):
            layout.addWidget(label)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render)
        self._natural_width = 0
        self._complete = True
        self._highlighted: set[int] = set()
        """The long code blocks ``grow`` highlighted, by index."""
        self._render(FIRST_CHUNKS)

    @property
    def complete(self) -> bool:
        """False while the card shows only the start of a long reply (``grow`` shows more)."""
        return self._complete

    def grow(self, deadline: float) -> bool:
        """Show more of a long reply, a chunk at a time, until ``deadline``; True once all of it is shown.

        A long code block takes a call of its own to be highlighted, and another to be shown.
        """
        colours = code_colours(self)
        shown = 0
        while not self._complete and (not shown or time.perf_counter() < deadline):
            chunk = self._next_chunk(colours)
            long_code = _is_long_code(chunk)
            if long_code and shown:
                break
            if long_code and chunk.code_index not in self._highlighted:
                highlighted(chunk.code, colours)  # cached: showing the block next time costs only its layout
                self._highlighted.add(chunk.code_index)
                break
            self._complete = self.body.show_markdown(self.message.content, colours, most_new_chunks=1)
            shown += 1
            if long_code:
                break
        return self._complete

    def shown_text(self) -> str:
        """The message's text as the card shows it (without Markdown's marks for a reply)."""
        return self.body.toPlainText() if isinstance(self.body, ReplyView) else self.body.text()

    def copy_text(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)
        self._say_copied("Copied")

    def _say_copied(self, text: str) -> None:
        """The Copy button says what was copied for a moment, then is Copy again."""
        self.copy_button.setText(text)
        button = self.copy_button
        QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))  # skipped if the card is gone

    def actions_menu(self) -> QMenu:
        """The card's menu: one entry per action allowed for this kind of message."""
        menu = QMenu(self)
        menu.setAccessibleName("Message actions")
        for name, text in _ACTIONS[self.message.role]:
            menu.addAction(text).triggered.connect(lambda _checked=False, n=name: self.action_requested.emit(n))
        return menu

    def refresh(self) -> None:
        """Show the message's current text and state (coalesced while it streams)."""
        if self.message.state == "streaming":
            if not self._render_timer.isActive():
                self._render_timer.start()
            return
        self._render_timer.stop()
        self._render()

    def sizeHint(self) -> QSize:
        """As wide as the text wants (a reply: the maximum width), as tall as that makes it."""
        margins = self.layout().contentsMargins()
        natural = self.maximumWidth() if isinstance(self.body, ReplyView) else self._natural_width
        width = min(self.maximumWidth(), natural + margins.left() + margins.right())
        width = max(width, super().minimumSizeHint().width())
        return QSize(width, self.heightForWidth(width))

    def _render(self, most_new_chunks: int | None = None) -> None:
        """Show the message's text (a reply: all of it, or its first ``most_new_chunks`` new chunks) and state.

        A reply whose card is still growing keeps its text as shown: ``grow`` shows the rest.
        """
        if isinstance(self.body, ReplyView) and most_new_chunks is not None:
            self._show_first_chunks(most_new_chunks)
        elif isinstance(self.body, ReplyView) and self._complete:
            self._complete = self.body.show_markdown(self.message.content, code_colours(self))
        elif not isinstance(self.body, ReplyView):
            self.body.setText(self.message.content)
            self._natural_width = self._plain_text_width()
        self.updateGeometry()
        self.body.setVisible(bool(self.message.content))
        note = state_note(self.message)
        self.note.setText(note)
        if self.note.property("state") != self.message.state:
            self.note.setProperty("state", self.message.state)
            self.note.style().polish(self.note)
        self.note.setVisible(bool(note))

    def _show_first_chunks(self, most: int) -> None:
        """Show the reply's first ``most`` chunks, stopping before a long code block (``grow`` shows the rest)."""
        colours = code_colours(self)
        chunks = self.body.unshown_chunks(self.message.content, colours)[:most]
        count = next((index for index, chunk in enumerate(chunks) if _is_long_code(chunk)), len(chunks))
        self._complete = self.body.show_markdown(self.message.content, colours, count)

    def _next_chunk(self, colours: CodeColours) -> Chunk | None:
        """The first chunk of the reply not shown yet."""
        return next(iter(self.body.unshown_chunks(self.message.content, colours)), None)

    def _plain_text_width(self) -> int:
        document = QTextDocument()
        document.setDefaultFont(self.body.font())
        document.setPlainText(self.message.content)
        header_width = self.title.sizeHint().width() + 2 * self.copy_button.sizeHint().width() + 16
        return max(int(document.idealWidth()) + 1, header_width)

    def _header(self) -> QHBoxLayout:
        header = QHBoxLayout()
        header.setSpacing(4)
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.copy_button)
        header.addWidget(self.actions_button)
        return header

    def _show_actions(self) -> None:
        menu = self.actions_menu()
        menu.popup(self.actions_button.mapToGlobal(self.actions_button.rect().bottomLeft()))

    def _open_link(self, link: str) -> None:
        """Copy a code block for its Copy link; open any other link in the browser."""
        index = code_index(link)
        if index is None:
            QDesktopServices.openUrl(QUrl(link))
            return
        blocks = code_blocks(self.message.content)
        if index < len(blocks):
            QGuiApplication.clipboard().setText(blocks[index].code)
            self._say_copied("Code copied")

    def _tool_button(self, text: str, accessible_name: str, slot: Callable[[], object]) -> QToolButton:
        button = QToolButton(self)
        button.setText(text)
        button.setObjectName("bubbleButton")
        button.setAccessibleName(accessible_name)
        button.setToolTip(accessible_name)
        button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    def _reply_view(self) -> ReplyView:
        view = ReplyView(self)
        view.setObjectName("bubbleBody")
        view.setAccessibleName("Message text")
        view.anchorClicked.connect(lambda url: self._open_link(url.toString()))
        return view

    def _text_label(self) -> QLabel:
        label = self._label("", "bubbleBody", "Message text")
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        return label

    def _label(self, text: str, object_name: str, accessible_name: str) -> QLabel:
        label = QLabel(text, self)
        label.setTextFormat(Qt.TextFormat.PlainText)
        label.setObjectName(object_name)
        label.setWordWrap(True)
        label.setAccessibleName(accessible_name)
        return label
