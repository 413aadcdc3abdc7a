"""Follows a prompt from the input bar to the engine and the reply back (GUI thread).

``ChatSession`` keeps the current ``Conversation``, its cards and the store (through
``ConversationJournal``) in step with the engine's events: it saves and sends the history
on Send, appends streamed text, and marks a reply as stopped or broken off while keeping
what was written. It refuses to send (keeping the typed text) while no model is loaded,
a reply is being written, or the message could not be saved. Regenerate, edit and delete
replace later turns; the engine reuses its KV cache up to the first changed token.
When loading another model fails, the engine keeps the previous one, and so does
the session: sending works again with it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.chat.chat_view import ChatView
from app.chat.input_box import InputBar
from app.chat.message_bubble import MessageBubble
from app.controller import EngineController
from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.persistence import ConversationJournal
from app.storage import StorageError
from engine.protocol.messages import (
    EngineError,
    LoadFailed,
    LoadOptions,
    ModelLoaded,
    PrefillDone,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)


class ChatSession(QObject):
    """The conversation on screen and the one request, if any, writing into it."""

    notice = Signal(str)
    """Something the user should read, e.g. why Enter did not send."""
    saved = Signal(str)
    """A conversation (by id) changed in the store: its title, order or existence."""

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
        self._conversation = journal.new_conversation()
        self._model_ready = False
        self._has_model = False
        self._active_request: str | None = None
        self._reply_bubble: MessageBubble | None = None
        self._history_sources: tuple[DisplayMessage, ...] = ()
        self._connect()
        self._update_controls()

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    @property
    def generating(self) -> bool:
        return self._active_request is not None

    def show_conversation(self, conversation: Conversation) -> bool:
        """Switch to ``conversation``; refused (False) while a reply is being written."""
        if self.generating:
            self.notice.emit("Stop the reply first, then switch conversations.")
            return False
        self._conversation = conversation
        self._view.show_messages(conversation.messages)
        damage = f"Part of this conversation could not be read: {conversation.damage}." if conversation.damage else ""
        self._view.set_banner(damage)
        return True

    def load_model(self, path: str, options: LoadOptions = LoadOptions(), server: RemoteServer | None = None) -> str:
        """Load another model (with ``server``: use that server's model ``path``) and return the request id;
        sending waits until it is loaded."""
        self.stop()
        self._model_ready = False
        self._update_controls()
        return self._controller.load_model(path, options, server)

    def send(self, text: str) -> bool:
        """Send ``text`` as the next user message; False (text kept) if not possible now."""
        if not text.strip():
            return False
        refusal = self._refusal()
        if refusal:
            self.notice.emit(refusal)
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
        """Delete one message (refused while a reply is being written)."""
        if self.generating:
            self.notice.emit("Stop the reply first, then delete messages.")
            return
        try:
            self._journal.delete_message(self._conversation, message)
        except StorageError as error:
            self.notice.emit(str(error))
            return
        self._view.remove_message(message)
        self.saved.emit(self._conversation.id)

    def _refuse_change(self) -> bool:
        refusal = self._refusal()
        if refusal:
            self.notice.emit(refusal.replace("your message is kept, send it", "try again"))
        return bool(refusal)

    def _replace_from(self, index: int) -> None:
        try:
            self._journal.truncate(self._conversation, index)
        except StorageError as error:
            self.notice.emit(str(error))
        self._view.show_messages(self._conversation.messages)

    def _start_reply(self) -> None:
        """Ask the engine to answer the conversation as it stands; the reply is recorded as it streams."""
        conversation = self._conversation
        self._history_sources = conversation.history_sources()
        history = conversation.history(conversation.system_prompt)
        try:
            reply = self._journal.begin_reply(conversation)
        except StorageError as error:
            self.notice.emit(f"{error} Press Regenerate on your message to try again.")
            return
        self._reply_bubble = self._view.add_message(reply)
        sampling = self._journal.sampling_for(conversation)
        self._active_request = self._controller.send_prompt(conversation.id, history, sampling)
        self._update_controls()

    def stop(self) -> None:
        if self._active_request is not None:
            self._controller.stop(self._active_request)

    def _refusal(self) -> str:
        if not self._model_ready:
            return "The model is not loaded yet; your message is kept, send it once the model is ready."
        if self.generating:
            return "A reply is still being written; press Stop or wait, your message is kept."
        return ""

    def _connect(self) -> None:
        self._input.send_requested.connect(self.send)
        self._input.stop_requested.connect(self.stop)
        self._controller.model_loaded.connect(self._on_model_loaded)
        self._controller.load_failed.connect(self._on_load_failed)
        self._controller.prefill_done.connect(self._on_prefill_done)
        self._controller.token_streamed.connect(self._on_token)
        self._controller.reply_finished.connect(self._on_finished)
        self._controller.reply_failed.connect(self._on_failed)
        self._controller.engine_error.connect(self._on_engine_error)

    def _update_controls(self) -> None:
        self._input.set_ready(self._model_ready, self.generating)

    def _on_model_loaded(self, _event: ModelLoaded) -> None:
        self._model_ready = self._has_model = True
        self._update_controls()

    def _on_load_failed(self, _event: LoadFailed) -> None:
        self._model_ready = self._has_model
        self._update_controls()

    def _on_prefill_done(self, event: PrefillDone) -> None:
        """Mark the turns the engine left out of the context (indices into the request's messages)."""
        if event.request_id != self._active_request:
            return
        offset = 1 if self._conversation.system_prompt.strip() else 0
        dropped = tuple(index - offset for index in event.dropped_turns)
        try:
            changed = self._journal.mark_dropped(self._history_sources, dropped)
        except StorageError as error:
            self.notice.emit(str(error))
            return
        for message in changed:
            self._view.refresh_message(message)

    def _on_token(self, event: TokenStreamed) -> None:
        if event.request_id == self._active_request:
            self._conversation.append_to_reply(event.text)
            self._refresh_reply()
            self._record(lambda: self._journal.record_text(event.text))

    def _on_finished(self, event: ReplyFinished) -> None:
        if event.request_id == self._active_request:
            self._conversation.finish_reply(event.text, interrupted=event.stats.finish_reason == "cancelled")
            self._end_reply(event.stats)

    def _on_failed(self, event: ReplyFailed) -> None:
        if event.request_id == self._active_request:
            self._conversation.fail_reply(event.message, event.partial_text)
            self._end_reply()

    def _on_engine_error(self, event: EngineError) -> None:
        if self.generating:
            self._conversation.fail_reply(event.message)
            self._end_reply()

    def _end_reply(self, stats: RequestStats | None = None) -> None:
        reply = self._conversation.messages[-1]
        self._record(lambda: self._journal.finish_reply(reply, stats))
        self._active_request = None
        self._refresh_reply()
        self._reply_bubble = None
        self._update_controls()
        self.saved.emit(self._conversation.id)

    def _record(self, save: Callable[[], None]) -> None:
        """Run a save of the streaming reply; a failure is reported and the reply goes on on screen."""
        try:
            save()
        except StorageError as error:
            self.notice.emit(str(error))

    def _refresh_reply(self) -> None:
        if self._reply_bubble is not None:
            self._reply_bubble.refresh()
