"""The conversation shown in the window, as plain Python (GUI thread).

It holds what the user sees, message by message, including replies that are still
streaming, were stopped or broke off, and turns it into the history the engine
needs for the next reply. No Qt here, so persistence can store and restore it.

What the model sees (``history``): the system prompt, if any, then every finished
message that has text or tool calls, in order. A reply that was stopped or broke off keeps its
partial text and is sent as an assistant turn (the model continues from what the
user saw); a reply that failed before writing anything is left out. A reply that called
tools is sent with its ``tool_calls``, and each "tool" turn after it with the call it answers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from app.conversations.reply_format import ReplyFormat
from app.storage.records import ToolTurn
from app.storage.settings import SamplingSettings
from engine.protocol.messages import ChatMessage, Role, ToolCall

MessageState = Literal["streaming", "done", "interrupted", "error"]


@dataclass
class DisplayMessage:
    """One message as the window shows it; ``error`` says why a reply broke off."""

    role: Role
    content: str
    state: MessageState = "done"
    error: str = ""
    message_id: str = ""
    """The id the store gave this message ("" until it is saved)."""
    position: int = -1
    """The message's position in the store (gaps are possible after deletions)."""
    dropped: bool = False
    """True when the model's context overflowed and this turn was left out of it."""
    waiting: bool = False
    """True while a streaming reply waits for the engine to begin it (it is writing other replies)."""
    listing_tools: bool = False
    """True while a streaming reply waits for the tool servers to say their tools (they may be starting)."""
    reading: tuple[int, int] | None = None
    """(tokens read, prompt tokens) while the engine reads a long prompt before the reply's first token."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools an assistant reply called (its ``content`` is the text around the calls)."""
    tool: ToolTurn | None = None
    """A "tool" turn's call and how it went; its ``content`` is the result the model reads."""

    def chat_message(self) -> ChatMessage:
        """This message as the model sees it."""
        if self.tool is not None:
            return ChatMessage("tool", self.content, tool_call_id=self.tool.call_id, name=self.tool.function_name)
        return ChatMessage(self.role, self.content, tool_calls=self.tool_calls)


class Conversation:
    """An ordered list of messages with at most one reply streaming, at the end."""

    def __init__(
        self,
        conversation_id: str | None = None,
        messages: tuple[DisplayMessage, ...] = (),
        saved: bool = False,
    ) -> None:
        self.id = conversation_id or uuid.uuid4().hex
        self.saved = saved
        """False for a new conversation that has no row in the store yet (it gets one on the first send)."""
        self.damage = ""
        """Why some of this conversation's saved rows could not be read ("" when all could)."""
        self.system_prompt = ""
        self.sampling: SamplingSettings | None = None
        """This conversation's own sampling; None follows the global defaults."""
        self.reply_format = ReplyFormat()
        """Free text, JSON or JSON of a schema: the constraint of its replies."""
        self.use_tools = False
        """True when its replies may call the tools of the tool hub (``app.chat.tool_round``)."""
        self._messages: list[DisplayMessage] = list(messages)

    @property
    def messages(self) -> tuple[DisplayMessage, ...]:
        return tuple(self._messages)

    @property
    def streaming(self) -> DisplayMessage | None:
        """The reply being written now, if any."""
        last = self._messages[-1] if self._messages else None
        return last if last is not None and last.state == "streaming" else None

    def add_user_message(self, text: str) -> DisplayMessage:
        message = DisplayMessage("user", text)
        self._messages.append(message)
        return message

    def start_reply(self) -> DisplayMessage:
        """Add an empty assistant message that tokens will be appended to."""
        if self.streaming is not None:
            raise RuntimeError("A reply is already streaming in this conversation.")
        message = DisplayMessage("assistant", "", state="streaming")
        self._messages.append(message)
        return message

    def append_to_reply(self, text: str) -> DisplayMessage:
        message = self._require_streaming()
        message.content += text
        return message

    def finish_reply(self, text: str, interrupted: bool = False) -> DisplayMessage:
        """End the streaming reply with its full ``text`` (the engine's, authoritative)."""
        message = self._require_streaming()
        message.content = text
        message.state = "interrupted" if interrupted else "done"
        return message

    def fail_reply(self, error: str, partial_text: str | None = None) -> DisplayMessage:
        """Mark the streaming reply as broken off, keeping what was produced."""
        message = self._require_streaming()
        if partial_text:
            message.content = partial_text
        message.state = "error"
        message.error = error
        return message

    def add_tool_turn(self, turn: ToolTurn, text: str = "") -> DisplayMessage:
        """Add a "tool" turn after the last message: the call ``turn`` and its result ``text``."""
        message = DisplayMessage("tool", text, tool=turn)
        self._messages.append(message)
        return message

    def truncate(self, keep: int) -> None:
        """Keep only the first ``keep`` messages (for edit and regenerate)."""
        del self._messages[keep:]

    def remove(self, message: DisplayMessage) -> None:
        self._messages.remove(message)

    def tool_turns_of(self, message: DisplayMessage) -> list[DisplayMessage]:
        """The "tool" turns that answer ``message``'s calls (none unless it is a reply that called tools)."""
        call_ids = {call.id for call in message.tool_calls}
        return [shown for shown in self._messages if shown.tool is not None and shown.tool.call_id in call_ids]

    def index_of(self, message: DisplayMessage) -> int:
        """The position of ``message`` on screen (by identity, not by equal content)."""
        return next(index for index, shown in enumerate(self._messages) if shown is message)

    def history_sources(self) -> tuple[DisplayMessage, ...]:
        """The messages the model sees, in order (see the module docstring)."""
        return tuple(
            message for message in self._messages
            if message.state != "streaming" and (message.content.strip() or message.tool_calls or message.tool)
        )

    def history(self, system_prompt: str = "") -> tuple[ChatMessage, ...]:
        """What the model should see: the system prompt, if any, then ``history_sources``."""
        system = (ChatMessage("system", system_prompt),) if system_prompt.strip() else ()
        return system + tuple(message.chat_message() for message in self.history_sources())

    def _require_streaming(self) -> DisplayMessage:
        message = self.streaming
        if message is None:
            raise RuntimeError("No reply is streaming in this conversation.")
        return message
