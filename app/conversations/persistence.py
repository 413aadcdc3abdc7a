"""The glue that records what happens in a conversation into the ``ChatStore`` (GUI thread).

``ConversationJournal`` is called at each step of a turn: the user's message is committed
when it is sent (by ``ChatSession``), and each streamed reply, in whichever conversation it
is written, is checkpointed at least once a second by its own ``ReplyRecorder`` and
committed when it ends (by ``ReplyRouter``); a tool turn is saved when its card appears and
again each time its call moves on (by ``ToolRound``). Every other call either changes the
store and the on-screen ``Conversation`` together, or raises ``StorageError`` and changes
neither, so what the user sees is what was saved. The store's conversation id is also the
engine's ``conversation_id``, so KV caches follow conversations.

``open_journal`` is the start-up sequence: open the database (a damaged file is set aside
and a fresh one started), mark replies a crash left streaming as interrupted, and fall back
to a memory-only store (with a notice) when the data folder cannot be written at all.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.reply_format import ReplyFormat
from app.storage import ChatStore, ReplyRecorder, SamplingSettings, Settings, StorageError
from app.storage import Conversation as StoredConversation
from app.storage import Message as StoredMessage
from app.storage.records import ToolTurn
from app.storage.schema import migrate
from engine.protocol.messages import RequestStats, SamplingParams

Clock = Callable[[], float]


def display_message(message: StoredMessage) -> DisplayMessage:
    state = "interrupted" if message.state == "streaming" else message.state
    error = "the reply failed before it was finished" if state == "error" else ""
    return DisplayMessage(
        message.role, message.content, state, error, message.id, message.position, message.dropped_from_context,
        tool_calls=message.tool_calls, tool=message.tool,
    )


def display_conversation(record: StoredConversation) -> Conversation:
    """The on-screen conversation for a stored one; unreadable rows are named in ``damage``."""
    conversation = Conversation(record.id, tuple(display_message(m) for m in record.messages), saved=True)
    conversation.damage = record.damage_reason
    conversation.system_prompt = record.system_prompt
    conversation.sampling = record.sampling
    conversation.reply_format = ReplyFormat(record.reply_kind, record.reply_schema)
    conversation.use_tools = record.use_tools
    return conversation


def memory_store() -> ChatStore:
    """A store that lives only in memory: used when the data folder cannot be written."""
    connection = sqlite3.connect(":memory:", isolation_level=None)
    migrate(connection)
    return ChatStore(connection)


def open_journal(defaults: Callable[[], Settings]) -> tuple[ConversationJournal, list[str]]:
    """Open the conversation database; return the journal and notices for the user."""
    notices: list[str] = []
    try:
        store, notice = ChatStore.open_or_start_fresh()
        if notice:
            notices.append(notice)
        recovered = store.recover_interrupted()
    except StorageError as error:
        notices.append(f"{error} Conversations of this session will not be saved.")
        return ConversationJournal(memory_store(), defaults), notices
    if recovered:
        notices.append(f"{len(recovered)} reply(s) were cut off when Hearth stopped; they are marked as interrupted.")
    return ConversationJournal(store, defaults), notices


class ConversationJournal:
    """Keeps on-screen conversations and the store in step; each streaming reply has its own recorder."""

    def __init__(self, store: ChatStore, defaults: Callable[[], Settings], clock: Clock = time.monotonic) -> None:
        self.store = store
        self._defaults = defaults
        self._clock = clock
        self._recorders: dict[str, ReplyRecorder] = {}
        """The recorder of each reply being written, by the reply's message id."""

    def new_conversation(self) -> Conversation:
        """An unsaved conversation with the default system prompt; it is saved on its first message."""
        conversation = Conversation()
        conversation.system_prompt = self._defaults().system_prompt
        return conversation

    def load(self, conversation_id: str) -> Conversation:
        return display_conversation(self.store.load_conversation(conversation_id))

    def sampling_for(self, conversation: Conversation) -> SamplingParams:
        return (conversation.sampling or self._defaults().sampling).to_sampling_params()

    def add_user_message(self, conversation: Conversation, text: str) -> DisplayMessage:
        """Commit ``text`` as the next user message (saving a new conversation first) and show it."""
        self._ensure_saved(conversation)
        stored = self.store.add_user_message(conversation.id, text)
        message = conversation.add_user_message(text)
        message.message_id, message.position = stored.id, stored.position
        return message

    def begin_reply(self, conversation: Conversation) -> DisplayMessage:
        """Start recording an empty streaming reply after the last message."""
        recorder = ReplyRecorder.start(self.store, conversation.id, self._clock())
        message = conversation.start_reply()
        message.message_id = recorder.message_id
        self._recorders[recorder.message_id] = recorder
        message.position = max((m.position for m in conversation.messages), default=-1) + 1
        return message

    def record_text(self, reply: DisplayMessage, text: str) -> None:
        """Streamed text of ``reply``; saved at least once a second."""
        recorder = self._recorders.get(reply.message_id)
        if recorder is not None:
            recorder.append(text, self._clock())

    def finish_reply(self, message: DisplayMessage, stats: RequestStats | None = None) -> None:
        """Commit the reply with its final text, state and tool calls (the recorder is released even on failure)."""
        recorder = self._recorders.pop(message.message_id, None)
        if recorder is None:
            return
        recorder.finish(message.state, stats, message.content)
        if message.tool_calls:
            self.store.set_tool_calls(message.message_id, message.tool_calls)

    def add_tool_turn(self, conversation: Conversation, turn: ToolTurn) -> DisplayMessage:
        """Commit a new "tool" turn for the call ``turn`` (no result yet) and show it."""
        stored = self.store.add_tool_turn(conversation.id, turn)
        message = conversation.add_tool_turn(turn)
        message.message_id, message.position = stored.id, stored.position
        return message

    def save_tool_turn(self, message: DisplayMessage) -> None:
        """Save how the tool turn ``message`` stands now (its ``tool`` and result ``content``)."""
        if message.tool is not None:
            self.store.update_tool_turn(message.message_id, message.tool, message.content)

    def truncate(self, conversation: Conversation, keep: int) -> None:
        """Delete every message after the first ``keep`` ones, on screen and in the store."""
        last_kept = conversation.messages[keep - 1].position if keep else -1
        if conversation.saved:
            self.store.truncate_after(conversation.id, last_kept)
        conversation.truncate(keep)

    def delete_message(self, conversation: Conversation, message: DisplayMessage) -> None:
        if message.message_id:
            self.store.delete_message(message.message_id)
        conversation.remove(message)

    def mark_dropped(self, sources: tuple[DisplayMessage, ...], dropped_indices: tuple[int, ...]) -> list[DisplayMessage]:
        """Mark which of the history ``sources`` the engine left out; return the messages that changed."""
        changed = [m for index, m in enumerate(sources) if m.dropped != (index in dropped_indices)]
        now_dropped = [m.message_id for m in changed if not m.dropped and m.message_id]
        now_kept = [m.message_id for m in changed if m.dropped and m.message_id]
        if now_dropped:
            self.store.set_dropped(now_dropped, True)
        if now_kept:
            self.store.set_dropped(now_kept, False)
        for message in changed:
            message.dropped = not message.dropped
        return changed

    def set_conversation_settings(
        self, conversation: Conversation, system_prompt: str, sampling: SamplingSettings | None,
        reply_format: ReplyFormat = ReplyFormat(), use_tools: bool = False,
    ) -> None:
        """Save the conversation's own system prompt, sampling (None: follow the defaults), reply format and
        whether its replies may call tools."""
        self._ensure_saved(conversation)
        self.store.set_conversation_settings(
            conversation.id, system_prompt, sampling, reply_format.kind, reply_format.schema, use_tools
        )
        conversation.system_prompt = system_prompt
        conversation.sampling = sampling
        conversation.reply_format = reply_format
        conversation.use_tools = use_tools

    def _ensure_saved(self, conversation: Conversation) -> None:
        if conversation.saved:
            return
        record = self.store.create_conversation(system_prompt=conversation.system_prompt, sampling=conversation.sampling)
        conversation.id = record.id
        conversation.saved = True
