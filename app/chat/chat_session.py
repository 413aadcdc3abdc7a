"""Follows a prompt from the input bar to the engine, and shows the conversation on screen (GUI thread).

``ChatSession`` keeps the ``Conversation`` on screen, its cards and the store (through
``ConversationJournal``) in step: it saves the message on Send and has ``ReplyRouter``
start the reply, which then streams into its own conversation whether or not that one
is on screen. Several conversations may be answering at once; switching to one that is
shows its text so far and keeps streaming. Stop stops the reply of the conversation on
screen. It refuses to send (keeping the typed text) while no model is loaded, a reply is
being written in this conversation, or the message could not be saved. Regenerate, edit
and delete replace later turns (refused while this conversation is answering); the engine
reuses its KV cache up to the first changed token. While another model loads, the engine
goes on answering with the one it has, and so does the session: replies keep streaming
and new messages are sent to the loaded model; when the load fails, that model stays.
A reply that calls tools shows a card for each call (``answer_tool`` takes the user's
approval from it) and goes on in a new reply card after the results.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.chat.chat_view import Card, ChatView
from app.chat.input_box import InputBar
from app.chat.reply_router import LiveReply, ReplyRouter
from app.chat.tool_round import ToolAnswer
from app.controller import EngineController
from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.persistence import ConversationJournal
from app.storage import StorageError
from engine.protocol.messages import LoadOptions, ModelLoaded, RemoteServer


class ChatSession(QObject):
    """The conversation on screen; its reply, if one is being written, is one of ``replies``."""

    notice = Signal(str)
    """Something the user should read, e.g. why Enter did not send."""
    saved = Signal(str)
    """A conversation (by id) changed in the store: its title, order or existence."""
    shown = Signal(str)
    """The id of the conversation now on screen (also sent when a new one got its id on its first message)."""

    def __init__(
        self,
        controller: EngineController,
        view: ChatView,
        input_bar: InputBar,
        journal: ConversationJournal,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._controller = controller
        self._view = view
        self._input = input_bar
        self._journal = journal
        self.replies = ReplyRouter(controller, journal, self)
        self._conversation = journal.new_conversation()
        self._has_model = False
        self._stopping: set[str] = set()
        """Ids of the conversations whose reply was asked to stop and has not ended yet."""
        self._reply_bubble: Card | None = None
        """The card of the reply being written into the conversation on screen, if any."""
        self._connect()
        self._update_controls()

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    @property
    def generating(self) -> bool:
        """True while a reply is being written into the conversation on screen."""
        return self.replies.reply_in(self._conversation.id) is not None

    def live_conversation(self, conversation_id: str) -> Conversation | None:
        """The conversation ``conversation_id`` as it is being answered now, or None when it is not."""
        reply = self.replies.reply_in(conversation_id)
        return reply.conversation if reply is not None else None

    def show_conversation(self, conversation: Conversation) -> None:
        """Put ``conversation`` on screen; a reply streaming into it goes on streaming there."""
        conversation = self.live_conversation(conversation.id) or conversation
        self._conversation = conversation
        self._view.show_messages(conversation.messages)
        damage = f"Part of this conversation could not be read: {conversation.damage}." if conversation.damage else ""
        self._view.set_banner(damage)
        reply = self.replies.reply_in(conversation.id)
        self._reply_bubble = self._view.bubble_for(reply.message) if reply is not None else None
        self._update_controls()
        self.shown.emit(conversation.id)

    def load_model(self, path: str, options: LoadOptions = LoadOptions(), server: RemoteServer | None = None) -> str:
        """Load another model (with ``server``: use that server's model ``path``) and return the request id.

        Replies go on, and sending works, with the model loaded now until the new one replaces it.
        """
        return self._controller.load_model(path, options, server)

    def send(self, text: str) -> bool:
        """Send ``text`` as the next user message; False (text kept) if not possible now."""
        if not text.strip():
            return False
        refusal = self._refusal()
        if refusal:
            self.notice.emit(f"{refusal} Your message is kept in the box.")
            return False
        try:
            self._view.add_message(self._journal.add_user_message(self._conversation, text.strip()))
        except StorageError as error:
            self.notice.emit(f"{error} Your message is kept in the box.")
            return False
        self._input.clear()
        self.saved.emit(self._conversation.id)
        self._start_reply()
        return True

    def regenerate(self, reply: DisplayMessage) -> None:
        """Write ``reply`` again: it and every later message are replaced by a new reply."""
        if self._refuse_change():
            return
        self._replace_from(self._conversation.index_of(reply))
        self._start_reply()

    def edit(self, message: DisplayMessage, new_text: str) -> None:
        """Replace the user message ``message`` by ``new_text``; later turns are replaced by a new reply."""
        if not new_text.strip() or self._refuse_change():
            return
        try:
            self._journal.truncate(self._conversation, self._conversation.index_of(message))
            self._journal.add_user_message(self._conversation, new_text.strip())
        except StorageError as error:
            self.notice.emit(str(error))
        self._view.show_messages(self._conversation.messages)
        self.saved.emit(self._conversation.id)
        if self._conversation.messages and self._conversation.messages[-1].role == "user":
            self._start_reply()

    def delete(self, message: DisplayMessage) -> None:
        """Delete one message, a reply with the tool cards of its calls (refused while this conversation is
        answering)."""
        if self.generating:
            self.notice.emit("Stop the reply first, then delete messages.")
            return
        for doomed in (message, *self._conversation.tool_turns_of(message)):
            try:
                self._journal.delete_message(self._conversation, doomed)
            except StorageError as error:
                self.notice.emit(str(error))
                return
            self._view.remove_message(doomed)
        self.saved.emit(self._conversation.id)

    def stop(self) -> None:
        """Stop the reply of the conversation on screen; the others go on. Stop says "Stopping…" until it ends."""
        if not self.generating:
            return
        self._stopping.add(self._conversation.id)
        self.replies.stop(self._conversation.id)
        self._update_controls()

    def answer_tool(self, message: DisplayMessage, choice: ToolAnswer) -> None:
        """The user's answer on the card of a tool call that waits for approval."""
        self.replies.tool_round.answer(message, choice)

    def _refuse_change(self) -> bool:
        refusal = self._refusal()
        if refusal:
            self.notice.emit(refusal)
        return bool(refusal)

    def _replace_from(self, index: int) -> None:
        try:
            self._journal.truncate(self._conversation, index)
        except StorageError as error:
            self.notice.emit(str(error))
        self._view.show_messages(self._conversation.messages)

    def _start_reply(self) -> None:
        """Have the conversation on screen answered; the reply is recorded as it streams."""
        self.shown.emit(self._conversation.id)
        reply = self.replies.start(self._conversation)
        if reply is not None:
            self._reply_bubble = self._view.add_message(reply.message)
        self._update_controls()

    def _refusal(self) -> str:
        if not self._has_model:
            return "No model is loaded yet."
        if self.generating:
            return "A reply is still being written here; press Stop or wait."
        return ""

    def _connect(self) -> None:
        self._input.send_requested.connect(self.send)
        self._input.stop_requested.connect(self.stop)
        self._controller.model_loaded.connect(self._on_model_loaded)
        self.replies.text_changed.connect(self._on_reply_text)
        self.replies.turns_marked.connect(self._on_turns_marked)
        self.replies.turn_added.connect(self._on_turn_added)
        self.replies.turn_changed.connect(self._on_turn_changed)
        self.replies.ended.connect(self._on_reply_ended)
        self.replies.notice.connect(self.notice)

    def _update_controls(self) -> None:
        self._input.set_ready(self._has_model, self.generating, self._conversation.id in self._stopping)

    def _on_model_loaded(self, _event: ModelLoaded) -> None:
        self._has_model = True
        self._update_controls()

    def _on_reply_text(self, reply: LiveReply) -> None:
        if reply.conversation is self._conversation and self._reply_bubble is not None:
            self._reply_bubble.refresh()

    def _on_turns_marked(self, conversation: Conversation, changed: list[DisplayMessage]) -> None:
        if conversation is self._conversation:
            for message in changed:
                self._view.refresh_message(message)

    def _on_turn_added(self, conversation: Conversation, message: DisplayMessage) -> None:
        """A tool card, or the reply after tool results (which then streams into its new card)."""
        if conversation is self._conversation:
            card = self._view.add_message(message)
            if message.state == "streaming":
                self._reply_bubble = card

    def _on_turn_changed(self, conversation: Conversation, message: DisplayMessage) -> None:
        if conversation is self._conversation:
            self._view.refresh_message(message)

    def _on_reply_ended(self, reply: LiveReply) -> None:
        """Show the end of the reply if it is on screen; either way its conversation moved up the list."""
        self._stopping.discard(reply.conversation.id)
        if reply.conversation is self._conversation:
            if self._reply_bubble is not None:
                self._reply_bubble.refresh()
            self._reply_bubble = None
            self._update_controls()
        self.saved.emit(reply.conversation.id)
