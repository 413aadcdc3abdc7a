"""Export one conversation as Markdown or JSON text (any thread: pure functions of a ``Conversation``).

Tool use is exported too: an assistant turn lists the tools it called with their arguments, and each
tool turn shows the call's status, time and result.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

from app.storage.records import Conversation, Message, ToolTurn

EXPORT_FORMAT_VERSION = 2
"""2: tool calls and tool turns, the reply format and "Use tools"."""
_ROLE_HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
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
    if message.tool is not None:
        return _tool_markdown(message.tool, message.content)
    heading = f"## {_ROLE_HEADINGS[message.role]}"
    note = _STATE_NOTES.get(message.state)
    lines = [heading, "", message.content] if message.content else [heading]
    for call in message.tool_calls:
        lines += ["", f"*Called `{call.name}` with:*", "", *_fenced(pretty_json(call.arguments), "json")]
    if note:
        lines += ["", f"*{note}*"]
    return lines + [""]


def _tool_markdown(turn: ToolTurn, result: str) -> list[str]:
    heading = f"## {_ROLE_HEADINGS['tool']}: {turn.function_name}"
    where = f" on {turn.server}" if turn.server else ""
    status = f"*{turn.status}{where}, {turn.seconds:.2f} s*"
    return [heading, "", status, "", *_fenced(result, "text"), ""]


def pretty_json(text: str) -> str:
    """JSON text indented for reading (as it is when it does not parse)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _fenced(text: str, language: str) -> list[str]:
    """``text`` in a code fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{language}", text, fence]


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
        "reply_format": {"kind": conversation.reply_kind, "schema": conversation.reply_schema},
        "use_tools": conversation.use_tools,
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
        "tool_calls": [dataclasses.asdict(call) for call in message.tool_calls],
        "tool": dataclasses.asdict(message.tool) if message.tool is not None else None,
    }
