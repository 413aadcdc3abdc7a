"""Tool calls in OpenAI's reply shapes, whole and streamed (server thread).

A streamed call goes out as OpenAI streams one: a first delta with the call's
``index``, ``id``, ``type`` and ``function.name`` (arguments ""), then its
arguments in ``function.arguments`` fragments, which the client concatenates.
A reply that made calls ends with ``finish_reason: "tool_calls"``, unless it was
cut off (``"length"``).
"""

from __future__ import annotations

from engine.protocol.messages import ToolCall


def tool_calls_field(calls: list[ToolCall]) -> list[dict]:
    """A whole reply's ``message.tool_calls``."""
    return [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]


def call_delta_choices(call: ToolCall, index: int) -> list[dict]:
    """The ``choices`` entries that stream ``call``, the ``index``-th call of the reply."""
    opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
    arguments = {"index": index, "function": {"arguments": call.arguments}}
    return [{"index": 0, "delta": {"tool_calls": [part]}, "finish_reason": None} for part in (opening, arguments)]


def message_choice(content: str, calls: list[ToolCall], reason: str) -> dict:
    """The whole reply's one ``choices`` entry; ``content`` is null when the reply is only calls."""
    message: dict = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = tool_calls_field(calls)
    return {"index": 0, "message": message, "finish_reason": with_calls(reason, calls)}


def with_calls(reason: str, calls: list[ToolCall]) -> str:
    """The finish reason of a reply that made ``calls``."""
    return "tool_calls" if calls and reason == "stop" else reason
