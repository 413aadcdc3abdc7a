"""Which conversation is open, and the list of all of them (GUI thread).

``ConversationManager`` answers the sidebar: it opens, creates, renames, deletes (softly,
with Undo) and searches conversations through the store, and keeps the list in step after
each change the chat session saves; conversations that are answering carry a mark there.
A conversation that is answering opens as it stands in memory (its text so far, still
streaming) and cannot be deleted until its reply ends or is stopped. A deleted
conversation's KV cache is released in the engine at once (Undo just rebuilds it on the
next reply); the store purges conversations deleted more than ``PURGE_AFTER`` ago when
Hearth starts. Storage errors become notices.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from PySide6.QtCore import QObject, Signal

from app.chat.chat_session import ChatSession
from app.controller import EngineController
from app.conversations.persistence import ConversationJournal
from app.conversations.sidebar import Sidebar
from app.storage import StorageError
from engine.protocol.messages import ForgetConversation

PURGE_AFTER = timedelta(days=30)
T = TypeVar("T")


class ConversationManager(QObject):
    """Connects the sidebar to the store and the chat session."""

    notice = Signal(str)

    def __init__(
        self,
        journal: ConversationJournal,
        session: ChatSession,
        sidebar: Sidebar,
        controller: EngineController,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._journal = journal
        self._session = session
        self._sidebar = sidebar
        self._controller = controller
        self._deleted: list[tuple[str, str]] = []
        """(id, title) of conversations deleted in this session, most recent last: what Undo restores."""
        sidebar.chosen.connect(self.open)
        sidebar.new_requested.connect(self.new_conversation)
        sidebar.rename_requested.connect(self.rename)
        sidebar.delete_requested.connect(self.delete)
        sidebar.undo_requested.connect(self.undo_delete)
        sidebar.search_changed.connect(lambda _text: self.refresh())
        session.saved.connect(lambda _id: self.refresh())
        session.replies.answering_changed.connect(sidebar.set_answering)

    @property
    def current_id(self) -> str:
        return self._session.conversation.id

    def start(self) -> None:
        """Purge old deletions, then open the most recent conversation (or a new one)."""
        self._change(lambda: self._journal.store.purge_deleted(PURGE_AFTER))
        summaries = self._read(self._journal.store.list_conversations) or []
        if summaries:
            self.open(summaries[0].id)
        else:
            self.refresh()

    def refresh(self) -> None:
        """Show the conversations that match the search box, newest first."""
        text = self._sidebar.search_box.text().strip()
        store = self._journal.store
        summaries = self._read(lambda: store.search(text) if text else store.list_conversations())
        if summaries is not None:
            self._sidebar.set_conversations(summaries, self.current_id)

    def open(self, conversation_id: str) -> None:
        if conversation_id == self.current_id:
            return
        live = self._session.live_conversation(conversation_id)
        conversation = live or self._read(lambda: self._journal.load(conversation_id))
        if conversation is not None:
            self._session.show_conversation(conversation)
        self.refresh()

    def new_conversation(self) -> None:
        """Show an empty conversation; it enters the list with its first message."""
        self._session.show_conversation(self._journal.new_conversation())
        self.refresh()

    def rename(self, conversation_id: str, title: str) -> None:
        self._change(lambda: self._journal.store.rename(conversation_id, title))
        self.refresh()

    def delete(self, conversation_id: str) -> None:
        """Hide the conversation; Undo brings it back. Deleting the open one opens a new one."""
        if self._session.live_conversation(conversation_id) is not None:
            self.notice.emit("This conversation is still answering: stop its reply first, then delete it.")
            return
        item = self._sidebar.item_for(conversation_id)
        title = item.text() if item is not None else ""
        if conversation_id == self.current_id:
            self._session.show_conversation(self._journal.new_conversation())
        if not self._change(lambda: self._journal.store.delete_conversation(conversation_id)):
            return
        self._controller.submit(ForgetConversation(conversation_id))
        self._deleted.append((conversation_id, title))
        self._sidebar.show_undo(title)
        self.refresh()

    def undo_delete(self) -> None:
        """Bring back the conversation deleted last and open it."""
        if not self._deleted:
            return
        conversation_id, _title = self._deleted.pop()
        if not self._change(lambda: self._journal.store.undo_delete(conversation_id)):
            return
        if self._deleted:
            self._sidebar.show_undo(self._deleted[-1][1])
        else:
            self._sidebar.hide_undo()
        self.open(conversation_id)

    def _read(self, read: Callable[[], T]) -> T | None:
        """The result of a store call, or None (after a notice) when it raised ``StorageError``."""
        try:
            return read()
        except StorageError as error:
            self.notice.emit(str(error))
            return None

    def _change(self, change: Callable[[], object]) -> bool:
        """Run a store change; False (after a notice) when it raised ``StorageError``."""
        return self._read(lambda: change() or True) is not None
