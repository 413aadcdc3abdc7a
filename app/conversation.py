"""The conversation shown in the window, as plain Python (GUI thread).

It holds what the user sees, message by message, including replies that are still
streaming, were stopped or broke off, and turns it into the history the engine
needs for the next reply. No Qt here, so persistence can store and restore it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from engine.messages import ChatMessage, Role

MessageState = Literal["streaming", "done", "interrupted", "error"]


@dataclass
class DisplayMessage:
    """One message as the window shows it; ``error`` says why a reply broke off."""

    role: Role
    content: str
    state: MessageState = "done"
    error: str = ""


class Conversation:
    """An ordered list of messages with at most one reply streaming, at the end."""

    def __init__(self, conversation_id: str | None = None) -> None:
        self.id = conversation_id or uuid.uuid4().hex
        self._messages: list[DisplayMessage] = []

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

    def history(self) -> tuple[ChatMessage, ...]:
        """What the model should see: every finished message that has text."""
        return tuple(
            ChatMessage(message.role, message.content)
            for message in self._messages
            if message.state != "streaming" and message.content.strip()
        )

    def _require_streaming(self) -> DisplayMessage:
        message = self.streaming
        if message is None:
            raise RuntimeError("No reply is streaming in this conversation.")
        return message
