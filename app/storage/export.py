"""Export one conversation as Markdown or JSON text (any thread: pure functions of a ``Conversation``)."""

from __future__ import annotations

import json
import time
from typing import Any

from app.storage.records import Conversation, Message

EXPORT_FORMAT_VERSION = 1
_ROLE_HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System"}
_STATE_NOTES = {"interrupted": "(reply interrupted)", "error": "(reply failed)", "streaming": "(reply in progress)"}


def export_markdown(conversation: Conversation) -> str:
    """A readable Markdown document: title, date, system prompt, then each turn under a heading."""
    lines = [f"# {conversation.display_title}", "", f"*{_format_time(conversation.created_at)}*", ""]
    if conversation.system_prompt:
        lines += ["## System prompt", "", conversation.system_prompt, ""]
    for message in conversation.messages:
        lines += _message_markdown(message)
    return "\n".join(lines).rstrip() + "\n"


def _message_markdown(message: Message) -> list[str]:
    heading = f"## {_ROLE_HEADINGS[message.role]}"
    note = _STATE_NOTES.get(message.state)
    lines = [heading, "", message.content]
    if note:
        lines += ["", f"*{note}*"]
    return lines + [""]


def _format_time(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def export_json(conversation: Conversation) -> str:
    """All stored fields of the conversation and its messages as indented JSON (UTF-8 text)."""
    document: dict[str, Any] = {
        "format": "hearth-conversation",
        "format_version": EXPORT_FORMAT_VERSION,
        "id": conversation.id,
        "title": conversation.title,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "system_prompt": conversation.system_prompt,
        "sampling": conversation.sampling.to_dict() if conversation.sampling else None,
        "messages": [_message_dict(m) for m in conversation.messages],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _message_dict(message: Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "position": message.position,
        "role": message.role,
        "content": message.content,
        "state": message.state,
        "created_at": message.created_at,
        "stats": message.stats,
        "dropped_from_context": message.dropped_from_context,
    }
