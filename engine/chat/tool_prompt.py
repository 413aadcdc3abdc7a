"""A conversation with tools as the chat template's variables: ``messages`` turns and ``tools`` (any thread).

Turns take the shape transformers gives templates: an assistant turn's calls as
``tool_calls: [{"id", "type": "function", "function": {"name", "arguments": {…}}}]``
(arguments as an object, which every family's template writes out with
``tojson``), a tool result as ``{"role": "tool", "content", "tool_call_id", "name"}``.

A template that does not render ``tools`` itself (SmolLM2's ChatML, Hearth's
fallback) gets them in Hermes' form instead: the functions described in the
system turn, earlier calls written as ``<tool_call>`` blocks, and results as user
turns in ``<tool_response>`` blocks, so every model is asked the same way and its
calls are read with the ``"hermes"`` parser.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.chat.tool_formats import HERMES_CLOSE, HERMES_OPEN
from engine.protocol.messages import ChatMessage, ToolCall

HERMES_TOOLS_PROMPT = (
    "You can call functions to answer. They are described in JSON Schema inside <tools></tools>:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call one, reply with a JSON object of its name and arguments inside <tool_call></tool_call>, "
    "one block per call:\n"
    '<tool_call>\n{{"name": "<function-name>", "arguments": {{<arguments>}}}}\n</tool_call>'
)

Turn = dict[str, Any]


def template_turns(messages: Sequence[ChatMessage], tools: Sequence[str], shows_tools: bool) -> tuple[list[Turn], list | None]:
    """The ``messages`` and ``tools`` variables for a template that renders tools itself (``shows_tools``) or not."""
    tool_list = [json.loads(tool) for tool in tools]
    if shows_tools:
        return [_turn(message) for message in messages], tool_list or None
    turns = [_hermes_turn(message) for message in messages]
    if tool_list:
        turns = _with_tools_described(turns, tool_list)
    return turns, None


def _turn(message: ChatMessage) -> Turn:
    turn: Turn = {"role": message.role, "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [_call(call) for call in message.tool_calls]
    if message.role == "tool":
        turn.update(tool_call_id=message.tool_call_id, name=message.name)
    return turn


def _call(call: ToolCall) -> Turn:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": _arguments(call)}}


def _arguments(call: ToolCall) -> object:
    """The arguments as an object; JSON text that is not one stays text."""
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


def _hermes_turn(message: ChatMessage) -> Turn:
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    if not message.tool_calls:
        return {"role": message.role, "content": message.content}
    blocks = [json.dumps({"name": call.name, "arguments": _arguments(call)}, ensure_ascii=False)
              for call in message.tool_calls]
    written = "\n".join(f"{HERMES_OPEN}\n{block}\n{HERMES_CLOSE}" for block in blocks)
    return {"role": "assistant", "content": f"{message.content}\n\n{written}" if message.content else written}


def _with_tools_described(turns: list[Turn], tools: list) -> list[Turn]:
    """``turns`` with the tools described at the end of the system turn (a new one when there is none)."""
    described = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{described}"}, *turns[1:]]
    return [{"role": "system", "content": described}, *turns]
