"""Tool calls in OpenAI's reply shapes, whole and streamed (server thread).

A streamed call goes out as OpenAI streams one: a first delta with the call's
``index``, ``id``, ``type`` and ``function.name`` (arguments ""), then its
arguments in ``function.arguments`` fragments, which the client concatenates
(``ToolCallParser`` says when each is ready). A reply that made calls ends with
``finish_reason: "tool_calls"``, unless it was cut off (``"length"``).
"""

from __future__ import annotations

from engine.chat.tool_calls import CallArguments, CallStart
from engine.protocol.messages import ToolCall


def tool_calls_field(calls: list[ToolCall]) -> list[dict]:
    """A whole reply's ``message.tool_calls``."""
    return [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]


def call_delta_choice(piece: CallStart | CallArguments) -> dict:
    """The ``choices`` entry that streams ``piece``: a call's opening, or a fragment of its arguments."""
    if isinstance(piece, CallStart):
        part = {"index": piece.index, "id": piece.id, "type": "function",
                "function": {"name": piece.name, "arguments": ""}}
    else:
        part = {"index": piece.index, "function": {"arguments": piece.text}}
    return {"index": 0, "delta": {"tool_calls": [part]}, "finish_reason": None}


def message_choice(content: str, calls: list[ToolCall], reason: str) -> dict:
    """The whole reply's one ``choices`` entry; ``content`` is null when the reply is only calls."""
    message: dict = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = tool_calls_field(calls)
    return {"index": 0, "message": message, "finish_reason": with_calls(reason, calls)}


def with_calls(reason: str, calls: list[ToolCall]) -> str:
    """The finish reason of a reply that made ``calls``."""
    return "tool_calls" if calls and reason == "stop" else reason
