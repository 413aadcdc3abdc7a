"""Anthropic's Messages API request bodies in, its reply shapes out (server thread).

A request becomes the same ``CompletionAsk`` an OpenAI chat request does:
``system`` (a string or text blocks) the system turn, ``text`` blocks the turns'
text, an assistant's ``tool_use`` blocks its ``tool_calls``, and a user's
``tool_result`` blocks ``"tool"`` turns (before the user's own text). ``tools``
(``name``, ``description``, ``input_schema``) and ``tool_choice`` (``auto``,
``any``, ``tool``, ``none``) become a ``ToolUse``. ``max_tokens`` is required, as
Anthropic requires it; images, documents and extended thinking are refused.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from engine.api.server import request_fields
from engine.api.server.errors import ApiError
from engine.api.server.openai_schema import CompletionAsk, check_model, is_int, number_field, unicode_text
from engine.api.server.tool_use import ToolUse, check_function, tool_use
from engine.protocol.messages import ChatMessage, FinishReason, SamplingParams, ToolCall

MAX_STOP_SEQUENCES = 16
_CHOICES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
_STOP_REASONS = {"eos": "end_turn", "max_tokens": "max_tokens", "context_full": "max_tokens"}


def parse_messages(body: Any, model_id: str, context_length: int, tool_format: str) -> CompletionAsk:
    """A ``POST /v1/messages`` body as the request to run; a 400 naming the field when one is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    request_fields.MESSAGES.check(body)
    check_model(body.get("model"), model_id)
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise ApiError(400, "Extended thinking is not supported by Hearth; leave 'thinking' out.", "thinking",
                       "unsupported_parameter")
    if thinking is not None:
        request_fields.THINKING.check(thinking, "thinking")
    messages = _system(body.get("system")) + _conversation(body.get("messages"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", "stream")
    tools = _tools(body, tool_format)
    return CompletionAsk(model_id, messages, None, _sampling(body, context_length), bool(stream), False,
                         tools.constraint if tools else None, tools)


def _system(value: Any) -> tuple[ChatMessage, ...]:
    if value is None:
        return ()
    text = value if isinstance(value, str) else _block_text(value, "system")
    return (ChatMessage("system", unicode_text(text, "system")),) if text else ()


def _block_text(blocks: Any, param: str) -> str:
    """The text of a list of ``text`` blocks."""
    if not isinstance(blocks, list) or not all(_is_text_block(block) for block in blocks):
        raise ApiError(400, f"{param} must be a string or a list of text blocks; Hearth's models read text only.", param)
    for index, block in enumerate(blocks):
        request_fields.BLOCKS["text"].check(block, f"{param}[{index}]")
    return "".join(block["text"] for block in blocks)


def _is_text_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def _conversation(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", "messages")
    names: dict[str, str] = {}  # tool_use id → the function it called, for the results that follow
    turns: list[ChatMessage] = []
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"{param} must be an object whose role is user or assistant.", f"{param}.role")
        request_fields.ANTHROPIC_MESSAGE.check(message, param)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise ApiError(400, f"{param}.content must be a string or a list of content blocks.", f"{param}.content")
        turns += _turns(message["role"], blocks, f"{param}.content", names)
    return tuple(turns)


def _turns(role: str, blocks: list, param: str, names: dict[str, str]) -> list[ChatMessage]:
    """One Anthropic message as chat turns: results first, then the text (with an assistant's calls)."""
    texts, calls, results = [], [], []
    for index, block in enumerate(blocks):
        where = f"{param}[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in request_fields.BLOCKS:
            request_fields.BLOCKS[kind].check(block, where)
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(unicode_text(block["text"], where))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
            names[calls[-1].id] = calls[-1].name
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, where, names))
        else:
            raise ApiError(400, f"{where} must be a text block, a tool_use block (assistant) or a tool_result block "
                                "(user); Hearth's models read text only.", where)
    text = "".join(texts)
    spoken = [ChatMessage(role, text, tool_calls=tuple(calls))] if text or calls else []  # type: ignore[arg-type]
    return results + spoken


def _tool_use(block: dict, where: str) -> ToolCall:
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise ApiError(400, f"{where}.{key} must be the tool_use's {key}.", f"{where}.{key}")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where}.input must be an object.", f"{where}.input")
    return ToolCall(block["id"], block["name"], json.dumps(arguments, ensure_ascii=False))


def _tool_result(block: dict, where: str, names: dict[str, str]) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(400, f"{where}.tool_use_id must name the tool_use this result answers.", f"{where}.tool_use_id")
    content = block.get("content", "")
    text = content if isinstance(content, str) else _block_text(content, f"{where}.content")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise ApiError(400, f"{where}.is_error must be true or false.", f"{where}.is_error")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return ChatMessage("tool", unicode_text(text, where), tool_call_id=call_id, name=names.get(call_id, ""))


def _tools(body: dict, tool_format: str) -> ToolUse | None:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of tools.", "tools")
    functions = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = _CHOICES.get(choice.get("type")) if isinstance(choice, dict) else None
    named = choice.get("name") if kind == "named" else ""
    if kind is None or (kind == "named" and named not in [function["name"] for function in functions]):
        raise ApiError(400, "'tool_choice' must be {\"type\": auto, any, none} or {\"type\": \"tool\", \"name\": …} "
                            "naming one of 'tools'.", "tool_choice")
    request_fields.ANTHROPIC_CHOICE.check(choice, "tool_choice")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise ApiError(400, "'tool_choice.disable_parallel_tool_use' must be true or false.",
                       "tool_choice.disable_parallel_tool_use")
    if not functions:
        return None
    return tool_use(functions, kind, named, single is not True, tool_format)


def _tool(tool: Any, param: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        _refuse_tool(param)
    request_fields.ANTHROPIC_TOOL.check(tool, param)
    return check_function(tool, param, "input_schema")


def _refuse_tool(param: str) -> NoReturn:
    raise ApiError(400, f"{param} must be a custom tool with a name and an input_schema; Hearth runs no server tools.",
                   param)


def _sampling(body: dict, context_length: int) -> SamplingParams:
    max_tokens = body.get("max_tokens")
    if not is_int(max_tokens) or not 1 <= max_tokens <= context_length:
        raise ApiError(400, f"'max_tokens' is required: a whole number from 1 to the model's context of {context_length}.",
                       "max_tokens")
    top_k = body.get("top_k", 0)
    if not is_int(top_k) or top_k < 0:
        raise ApiError(400, "'top_k' must be a whole number of at least 0.", "top_k")
    return SamplingParams(
        temperature=number_field(body, "temperature", 1.0, 0.0, 1.0),
        top_k=top_k,
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0),
        min_p=0.0,
        repetition_penalty=1.0,
        max_new_tokens=max_tokens,
        stop=_stop_sequences(body.get("stop_sequences")),
    )


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in value):
        raise ApiError(400, f"'stop_sequences' must be a list of up to {MAX_STOP_SEQUENCES} non-empty strings.",
                       "stop_sequences")
    return tuple(unicode_text(stop, "stop_sequences") for stop in value)


# ---------------------------------------------------------------- replies


def stop_reason(reason: FinishReason, ask: CompletionAsk, calls: list[ToolCall]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``. A stop string ends the turn unless the request set the sequences; the
    engine does not say which one matched, so ``stop_sequence`` is named only when there was just one."""
    if reason == "stop_string" and ask.sampling.stop:
        return "stop_sequence", ask.sampling.stop[0] if len(ask.sampling.stop) == 1 else None
    named = _STOP_REASONS.get(reason, "end_turn")
    return ("tool_use" if calls and named == "end_turn" else named), None


def tool_use_block(call: ToolCall) -> dict:
    """A call as a ``tool_use`` content block, its id in Anthropic's ``toolu_`` form."""
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": json.loads(call.arguments)}


def tool_use_id(call_id: str) -> str:
    """A call's id in Anthropic's ``toolu_`` form."""
    return "toolu_" + call_id.removeprefix("call_")


def message_envelope(message_id: str, model: str, content: list[dict], input_tokens: int, output_tokens: int,
                     reason: str | None, sequence: str | None) -> dict:
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def anthropic_error(status: int, message: str, param: str | None = None) -> dict:
    """Anthropic's error body; its message starts with the field at fault, as Anthropic's own do."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
             413: "request_too_large", 503: "overloaded_error"}
    text = f"{param}: {message.removeprefix(param).lstrip()}" if param else message
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": text}}
