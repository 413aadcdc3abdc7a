"""Every reply being written, in whichever conversation, and where its events go (GUI thread).

``ReplyRouter`` starts a reply (records an empty streaming message through the journal
and sends the conversation to the engine) and then routes the engine's events for it by
``request_id``: streamed text is appended to that reply's own ``Conversation`` and saved
by that reply's own recorder at least once a second, whether or not the conversation is
on screen; the end (finished, stopped, failed) is committed the same way. A conversation
has at most one reply in flight; several conversations may each have one, and the
engine streams them at once (or, without batching, one after another).

It knows nothing of the screen: ``text_changed``, ``turns_marked`` and ``ended`` tell
``ChatSession`` what changed, and it redraws what is on screen. ``answering_changed``
tells the sidebar which conversations are answering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.controller import EngineController
from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.persistence import ConversationJournal
from app.storage import StorageError
from engine.protocol.messages import EngineError, PrefillDone, ReplyFailed, ReplyFinished, RequestStats, TokenStreamed


@dataclass
class LiveReply:
    """A reply the engine is writing (or will write, once it has room) into ``conversation``."""

    request_id: str
    conversation: Conversation
    message: DisplayMessage
    history_sources: tuple[DisplayMessage, ...]
    """The messages the engine was sent, in order (``PrefillDone.dropped_turns`` indexes them)."""

    @property
    def started(self) -> bool:
        """True once the engine began it (its PrefillDone arrived)."""
        return not self.message.waiting


class ReplyRouter(QObject):
    """The replies in flight, by request id and by conversation id."""

    text_changed = Signal(object)
    """A ``LiveReply`` got more text."""
    turns_marked = Signal(object, object)
    """A ``Conversation`` and the list of its messages whose "dropped from the context" mark changed."""
    ended = Signal(object)
    """A ``LiveReply`` ended (finished, stopped or failed) and was saved."""
    answering_changed = Signal(object)
    """The frozenset of ids of the conversations that have a reply in flight."""
    reply_started = Signal(str, str)
    """A request id and the id of the conversation it answers (sent before any of its events)."""
    notice = Signal(str)

    def __init__(self, controller: EngineController, journal: ConversationJournal, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._journal = journal
        self._by_request: dict[str, LiveReply] = {}
        self._by_conversation: dict[str, LiveReply] = {}
        controller.prefill_done.connect(self._on_prefill_done)
        controller.token_streamed.connect(self._on_token)
        controller.reply_finished.connect(self._on_finished)
        controller.reply_failed.connect(self._on_failed)
        controller.engine_error.connect(self._on_engine_error)

    @property
    def answering(self) -> frozenset[str]:
        """Ids of the conversations that have a reply in flight."""
        return frozenset(self._by_conversation)

    def reply_in(self, conversation_id: str) -> LiveReply | None:
        return self._by_conversation.get(conversation_id)

    def start(self, conversation: Conversation) -> LiveReply | None:
        """Ask the engine to answer ``conversation`` as it stands; None (after a notice) if it could not be saved."""
        if conversation.id in self._by_conversation:
            raise RuntimeError("This conversation already has a reply in flight.")
        sources = conversation.history_sources()
        history = conversation.history(conversation.system_prompt)
        try:
            message = self._journal.begin_reply(conversation)
        except StorageError as error:
            self.notice.emit(f"{error} Press Regenerate on your message to try again.")
            return None
        message.waiting = True
        sampling = self._journal.sampling_for(conversation)
        constraint = conversation.reply_format.constraint()
        request_id = self._controller.send_prompt(conversation.id, history, sampling, constraint)
        reply = LiveReply(request_id, conversation, message, sources)
        self._by_request[request_id] = reply
        self._by_conversation[conversation.id] = reply
        self.reply_started.emit(request_id, conversation.id)
        self.answering_changed.emit(self.answering)
        return reply

    def stop(self, conversation_id: str) -> None:
        """Ask the engine to stop the reply of ``conversation_id`` (it ends with what was written)."""
        reply = self._by_conversation.get(conversation_id)
        if reply is not None:
            self._controller.stop(reply.request_id)

    def _on_prefill_done(self, event: PrefillDone) -> None:
        """Mark the turns the engine left out of the context (indices into the request's messages)."""
        reply = self._by_request.get(event.request_id)
        if reply is None:
            return
        reply.message.waiting = False
        self.text_changed.emit(reply)
        offset = 1 if reply.conversation.system_prompt.strip() else 0
        dropped = tuple(index - offset for index in event.dropped_turns)
        try:
            changed = self._journal.mark_dropped(reply.history_sources, dropped)
        except StorageError as error:
            self.notice.emit(str(error))
            return
        if changed:
            self.turns_marked.emit(reply.conversation, changed)

    def _on_token(self, event: TokenStreamed) -> None:
        reply = self._by_request.get(event.request_id)
        if reply is None:
            return
        reply.message.waiting = False  # begun, even by an engine that sent no PrefillDone
        reply.conversation.append_to_reply(event.text)
        self._record(lambda: self._journal.record_text(reply.message, event.text))
        self.text_changed.emit(reply)

    def _on_finished(self, event: ReplyFinished) -> None:
        reply = self._by_request.get(event.request_id)
        if reply is not None:
            reply.conversation.finish_reply(event.text, interrupted=event.stats.finish_reason == "cancelled")
            self._end(reply, event.stats)

    def _on_failed(self, event: ReplyFailed) -> None:
        reply = self._by_request.get(event.request_id)
        if reply is not None:
            reply.conversation.fail_reply(event.message, event.partial_text)
            self._end(reply)

    def _on_engine_error(self, event: EngineError) -> None:
        """An error outside any one request ends the replies the engine was writing.

        Those are the ones it had begun; when it had begun none, the oldest (the engine
        takes requests in order, so that is the one it was starting).
        """
        replies = list(self._by_request.values())
        broken = [reply for reply in replies if reply.started] or replies[:1]
        for reply in broken:
            reply.conversation.fail_reply(event.message)
            self._end(reply)

    def _end(self, reply: LiveReply, stats: RequestStats | None = None) -> None:
        reply.message.waiting = False
        del self._by_request[reply.request_id]
        del self._by_conversation[reply.conversation.id]
        self._record(lambda: self._journal.finish_reply(reply.message, stats))
        self.ended.emit(reply)
        self.answering_changed.emit(self.answering)

    def _record(self, save: Callable[[], None]) -> None:
        """Run a save of a streaming reply; a failure is reported and the reply goes on on screen."""
        try:
            save()
        except StorageError as error:
            self.notice.emit(str(error))
