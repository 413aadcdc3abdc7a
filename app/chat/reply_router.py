"""Every reply being written, in whichever conversation, and where its events go (GUI thread).

``ReplyRouter`` starts a reply (records an empty streaming message through the journal
and sends the conversation to the engine) and then routes the engine's events for it by
``request_id``: streamed text is appended to that reply's own ``Conversation`` and saved
by that reply's own recorder at least once a second, whether or not the conversation is
on screen; the end (finished, stopped, failed) is committed the same way. A conversation
has at most one reply in flight; several conversations may each have one, and the
engine streams them at once (or, without batching, one after another).

A conversation that uses tools (and a ``tool_hub`` is set) is offered the hub's tools; a reply
that calls some ends its message with the calls taken out of its text, ``ToolRound`` answers
them (cards, approval, the calls), and a new reply goes on after the results, in the same
``LiveReply``, up to ``MAX_TOOL_ROUNDS`` rounds. The conversation answers until the last of
them ends; Stop cancels whichever part is under way (the tool list, the engine's reply, or the
round of calls).

It knows nothing of the screen: ``text_changed``, ``turns_marked``, ``turn_added``,
``turn_changed`` and ``ended`` tell ``ChatSession`` what changed, and it redraws what is on
screen. ``answering_changed`` tells the sidebar which conversations are answering.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.chat.tool_round import ToolRound
from app.controller import EngineController
from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.persistence import ConversationJournal
from app.storage import StorageError
from engine.chat.tool_calls import ToolCallParser, split_reply
from engine.protocol.messages import (
    EngineError, ModelLoaded, PrefillDone, PromptProgress, ReplyFailed, ReplyFinished, RequestStats, TokenStreamed,
    ToolCall,
)

if TYPE_CHECKING:
    from app.tools.hub import ToolHub, ToolSpec

MAX_TOOL_ROUNDS = 8


@dataclass
class LiveReply:
    """A reply the engine is writing (or will write, once it has room) into ``conversation``, with its tool rounds."""

    request_id: str
    conversation: Conversation
    message: DisplayMessage
    """The reply being written now (a new one after each round of tool calls)."""
    history_sources: tuple[DisplayMessage, ...] = ()
    """The messages the engine was sent, in order (``PrefillDone.dropped_turns`` indexes them)."""
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    """The tools offered to the model, by the name it calls them (none when the conversation uses no tools)."""
    rounds: int = 0
    """The rounds of tool calls answered so far."""
    task: asyncio.Task[None] | None = None
    """The tool list being fetched or the round of calls being answered: what Stop cancels (None while the
    engine writes)."""
    calls_parser: ToolCallParser | None = None
    """Holds back the tool calls of the reply being written, when tools were offered (their cards show them)."""

    def shown_text(self, streamed: str) -> str:
        """What of ``streamed`` the reply's card shows now: all of it, less what is or may become a tool call."""
        if self.calls_parser is None:
            return streamed
        return "".join(piece for piece in self.calls_parser.feed(streamed) if isinstance(piece, str))

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
    turn_added = Signal(object, object)
    """A ``Conversation`` and a message added to it while answering: a tool card, or the reply after tool results."""
    turn_changed = Signal(object, object)
    """A ``Conversation`` and a message of it that changed while answering (a tool card, a reply that called tools)."""
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
        self.tool_hub: ToolHub | None = None
        """Where the tools come from (set once Settings › Tools has one); None offers no tools."""
        self.tool_round = ToolRound(journal, self)
        self._tool_format = "hermes"
        """How the loaded model writes tool calls (``ModelLoaded.tool_format``)."""
        self.tool_round.turn_added.connect(self.turn_added)
        self.tool_round.turn_changed.connect(self.turn_changed)
        self.tool_round.notice.connect(self.notice)
        controller.model_loaded.connect(self._on_model_loaded)
        controller.prompt_progress.connect(self._on_prompt_progress)
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
        message = self._begin_message(conversation)
        if message is None:
            return None
        reply = LiveReply("", conversation, message)
        self._by_conversation[conversation.id] = reply
        if conversation.use_tools and self.tool_hub is not None:
            message.listing_tools = True
            self._run_task(
                reply, self._offer_tools(reply, self.tool_hub),
                lambda: reply.conversation.finish_reply("", interrupted=True),
            )
        else:
            self._send(reply)
        self.answering_changed.emit(self.answering)
        return reply

    def stop(self, conversation_id: str) -> None:
        """Stop the reply of ``conversation_id``: the engine ends it with what was written, a tool round at once."""
        reply = self._by_conversation.get(conversation_id)
        if reply is not None and reply.task is not None:
            reply.task.cancel()
        elif reply is not None:
            self._controller.stop(reply.request_id)

    def _begin_message(self, conversation: Conversation) -> DisplayMessage | None:
        """A new streaming reply waiting for the engine; None (after a notice) if it could not be saved."""
        try:
            message = self._journal.begin_reply(conversation)
        except StorageError as error:
            self.notice.emit(f"{error} Press Regenerate on your message to try again.")
            return None
        message.waiting = True
        return message

    async def _offer_tools(self, reply: LiveReply, hub: ToolHub) -> None:
        """Ask the hub for its tools, then the engine for the reply."""
        tools = await hub.tools()
        reply.message.listing_tools = False
        self.text_changed.emit(reply)
        problems = hub.problems()
        if problems:
            self.notice.emit("Some tools are not available: " + "; ".join(problems))
        reply.tools = {tool.function_name: tool for tool in tools}
        reply.task = None
        self._send(reply)

    def _run_task(self, reply: LiveReply, work: Coroutine[object, object, None], on_stop: Callable[[], None]) -> None:
        """Run ``work`` as the reply's task. When Stop cancels it (even before it began) or it fails, ``on_stop``
        then ends the reply: it never hangs."""
        task = asyncio.ensure_future(work)
        reply.task = task

        def after(_task: asyncio.Task[None]) -> None:
            if reply.task is not task:  # it finished its part and handed the reply on
                return
            if not task.cancelled():
                self.notice.emit(f"The reply broke off: {task.exception()}")
            on_stop()
            self._end(reply)

        task.add_done_callback(after)

    def _send(self, reply: LiveReply) -> None:
        """Send the conversation as it stands, with the reply's tools, to the engine."""
        conversation = reply.conversation
        reply.history_sources = conversation.history_sources()
        history = conversation.history(conversation.system_prompt)
        sampling = self._journal.sampling_for(conversation)
        constraint = conversation.reply_format.constraint()
        tools = tuple(tool.openai_json() for tool in reply.tools.values())
        reply.calls_parser = ToolCallParser(self._tool_format) if tools else None
        reply.request_id = self._controller.send_prompt(conversation.id, history, sampling, constraint, tools)
        self._by_request[reply.request_id] = reply
        self.reply_started.emit(reply.request_id, conversation.id)

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self._tool_format = event.tool_format

    def _on_prompt_progress(self, event: PromptProgress) -> None:
        """The engine is reading the reply's long prompt: its note says how far."""
        reply = self._by_request.get(event.request_id)
        if reply is None:
            return
        reply.message.waiting = False
        reply.message.reading = (event.computed_tokens, event.prompt_tokens)
        self.text_changed.emit(reply)

    def _on_prefill_done(self, event: PrefillDone) -> None:
        """Mark the turns the engine left out of the context (indices into the request's messages)."""
        reply = self._by_request.get(event.request_id)
        if reply is None:
            return
        reply.message.waiting = False
        reply.message.reading = None
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
        text = reply.shown_text(event.text)
        reply.conversation.append_to_reply(text)
        self._record(lambda: self._journal.record_text(reply.message, text))
        self.text_changed.emit(reply)

    def _on_finished(self, event: ReplyFinished) -> None:
        reply = self._by_request.get(event.request_id)
        if reply is None:
            return
        stopped = event.stats.finish_reason == "cancelled"
        reply.conversation.finish_reply(event.text, interrupted=stopped)
        calls = self._take_tool_calls(reply.message) if reply.tools and not stopped else []
        if not calls:
            self._end(reply, event.stats)
            return
        del self._by_request[reply.request_id]
        self._record(lambda: self._journal.finish_reply(reply.message, event.stats))
        self.turn_changed.emit(reply.conversation, reply.message)
        self._run_task(
            reply, self._answer_calls(reply, calls), lambda: self.tool_round.stop(reply.conversation, calls)
        )

    def _take_tool_calls(self, message: DisplayMessage) -> list[ToolCall]:
        """The calls in the finished reply ``message``, which keeps the text around them and the calls."""
        content, calls, _malformed = split_reply(self._tool_format, message.content)
        if calls:
            message.content, message.tool_calls = content, tuple(calls)
        return calls

    async def _answer_calls(self, reply: LiveReply, calls: list[ToolCall]) -> None:
        """A round of tool calls, then the reply goes on after their results (or ends at the limit or on Stop)."""
        if reply.rounds >= MAX_TOOL_ROUNDS:
            self.tool_round.skip(reply.conversation, calls, MAX_TOOL_ROUNDS)
            self.notice.emit(
                f"The reply stopped after {MAX_TOOL_ROUNDS} rounds of tool calls; send a message to let it go on."
            )
            self._end(reply)
            return
        assert self.tool_hub is not None
        await self.tool_round.run(self.tool_hub, reply.conversation, calls, reply.tools)
        reply.rounds += 1
        reply.task = None
        self._continue(reply)

    def _continue(self, reply: LiveReply) -> None:
        """A new reply in the same conversation, after the tool results."""
        message = self._begin_message(reply.conversation)
        if message is None:
            self._end(reply)
            return
        reply.message = message
        self.turn_added.emit(reply.conversation, message)
        self._send(reply)

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
        reply.task = None
        self._by_request.pop(reply.request_id, None)
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
