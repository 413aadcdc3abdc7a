"""OpenAI's request bodies in, OpenAI's reply shapes out (server thread).

Every field is checked: its type and range here (``max_tokens: -5``, an unknown
model, ``n: 3``, a tool that is not a function), and which fields may appear at
all, which are ignored and which refused, in ``request_fields``; each bad one is
a 400 naming the field in ``param``. ``response_format`` and
``logprobs`` are read by ``output_options``; tools and tool turns by ``tool_use`` and
here, and the calls a reply makes come back as ``tool_calls`` (``tool_replies``).
A ``null`` field means the field is unset. Sampling follows OpenAI's defaults
(temperature 1, top_p 1, no top-k or min-p cut); a request without ``max_tokens``
gets ``default_max_tokens``, which ``GET /v1/models`` states.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from engine.api.server import request_fields
from engine.api.server.errors import ApiError
from engine.api.server.output_options import OutputOptions, chat_output_options, completion_output_options
from engine.api.server.tool_use import ToolUse, parse_openai_tools
from engine.protocol.messages import ChatMessage, Constraint, FinishReason, PrefillDone, SamplingParams, ToolCall

MAX_STOP_STRINGS = 4
DEFAULT_MAX_TOKENS = 2048
MODEL_ALIAS = "default"  # what ``serve --model`` calls the built-in model; a request may name it so
SEED_RANGE = range(-(2**63), 2**63)  # OpenAI's 64-bit seed; torch's generator takes no more
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_FINISH = {"eos": "stop", "stop_string": "stop", "constraint": "stop", "max_tokens": "length", "context_full": "length"}

@dataclass(frozen=True)
class CompletionAsk:
    """One validated request: a chat (``messages``) or a raw ``prompt`` to continue; ``constraint``: what the reply
    must match (``response_format``, or the tool grammar of a required or named call), None for free text;
    ``tool_use``: the tools offered, None when none are."""

    model: str
    messages: tuple[ChatMessage, ...]
    prompt: str | None
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    constraint: Constraint | None = None
    tool_use: ToolUse | None = None


def default_max_tokens(context_length: int) -> int:
    """The reply length of a request that sets none: ``DEFAULT_MAX_TOKENS``, at most half the context."""
    return max(1, min(DEFAULT_MAX_TOKENS, context_length // 2))


def parse_chat(body: Any, model_id: str, context_length: int, tool_format: str = "hermes") -> CompletionAsk:
    """A chat request; ``tool_format``: how the served model writes tool calls (``tool_formats.FORMATS``)."""
    body = _object(body)
    request_fields.CHAT.check(body)
    messages = _messages(body.get("messages"))
    output = chat_output_options(body)
    tools = parse_openai_tools(body, tool_format)
    if tools and tools.constraint:
        if output.constraint:
            raise ApiError(400, "'response_format' cannot shape a reply that 'tool_choice' requires to be a call.",
                           "response_format")
        output = replace(output, constraint=tools.constraint)
    return replace(_ask(body, model_id, context_length, messages, None, output), tool_use=tools)


def parse_completion(body: Any, model_id: str, context_length: int) -> CompletionAsk:
    body = _object(body)
    request_fields.COMPLETION.check(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request).", "prompt")
    return _ask(body, model_id, context_length, (), unicode_text(prompt, "prompt"), completion_output_options(body))


def _ask(
    body: dict, model_id: str, context_length: int, messages: tuple[ChatMessage, ...], prompt: str | None,
    output: OutputOptions,
) -> CompletionAsk:
    check_model(body.get("model"), model_id)
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise ApiError(400, "Only n = 1 is supported: ask once per reply.", "n", "unsupported_parameter")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", "stream")
    include_usage = _include_usage(body.get("stream_options"), bool(stream))
    sampling = replace(_sampling(body, context_length), logprobs=output.logprobs)
    return CompletionAsk(model_id, messages, prompt, sampling, bool(stream), include_usage, output.constraint)


def _include_usage(options: Any, stream: bool) -> bool:
    """``stream_options.include_usage``; the options are for a streamed reply only, as OpenAI has it."""
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", "stream_options")
    if not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", "stream_options")
    request_fields.STREAM_OPTIONS.check(options, "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError(400, "'stream_options.include_usage' must be true or false.", "stream_options.include_usage")
    return bool(include_usage)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def check_model(model: Any, model_id: str) -> None:
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: use the id that GET /v1/models lists.", "model")
    if model not in (model_id, MODEL_ALIAS):
        message = f"The model '{model}' does not exist here; this server serves '{model_id}'."
        raise ApiError(404, message, "model", "model_not_found")


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", "messages")
    return tuple(_message(item, index) for index, item in enumerate(value))


def _message(item: Any, index: int) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(item, dict):
        raise ApiError(400, f"{param} must be an object with 'role' and 'content'.", param)
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise ApiError(400, f"{param}.role must be system, developer, user, assistant or tool.", f"{param}.role")
    request_fields.MESSAGE[role].check(item, param)
    calls = _tool_calls(item.get("tool_calls"), param) if role == "assistant" else ()
    content = item.get("content")
    text = "" if content is None and calls else _content(content, f"{param}.content")
    if role != "tool":
        return ChatMessage(_ROLES[role], text, tool_calls=calls)  # type: ignore[arg-type]
    call_id = item.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(400, f"{param}.tool_call_id must name the call this result answers.", f"{param}.tool_call_id")
    name = item.get("name", "")
    if not isinstance(name, str):
        raise ApiError(400, f"{param}.name must be the function's name.", f"{param}.name")
    return ChatMessage("tool", text, tool_call_id=call_id, name=name)


def _tool_calls(value: Any, param: str) -> tuple[ToolCall, ...]:
    """An assistant turn's ``tool_calls``: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, f"{param}.tool_calls must be a list.", f"{param}.tool_calls")
    calls = []
    for index, call in enumerate(value):
        where = f"{param}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                f"\"arguments\"}}}}.", where)
        request_fields.TOOL_CALL.check(call, where)
        request_fields.CALLED_FUNCTION.check(function, f"{where}.function")
        if call.get("type", "function") != "function":
            raise ApiError(400, f"{where}.type must be 'function'.", f"{where}.type")
        call_id = call.get("id") or f"call_{index}"
        if not isinstance(call_id, str):
            raise ApiError(400, f"{where}.id must be a string.", f"{where}.id")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise ApiError(400, f"{where}.function.arguments must be JSON text.", f"{where}.function.arguments")
        calls.append(ToolCall(call_id, function["name"], unicode_text(arguments, f"{where}.function.arguments")))
    return tuple(calls)


def _content(content: Any, param: str) -> str:
    """A string, or a list of text parts (images and audio are refused)."""
    if isinstance(content, str):
        return unicode_text(content, param)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        for index, part in enumerate(content):
            request_fields.TEXT_PART.check(part, f"{param}[{index}]")
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"{param}[{index}].text must be a string.", f"{param}[{index}].text")
        return unicode_text("".join(part["text"] for part in content), param)
    raise ApiError(400, f"{param} must be a string or a list of text parts; Hearth's models read text only.", param)


def unicode_text(value: str, param: str) -> str:
    """``value`` if it is Unicode text that UTF-8 can hold (JSON lets a lone surrogate such as ``\\ud800`` through)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} holds an invalid Unicode escape (a lone surrogate such as \\ud800).", param) from None
    return value


def _sampling(body: dict, context_length: int) -> SamplingParams:
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(param)
    if max_tokens is None:
        max_tokens = default_max_tokens(context_length)
    elif not is_int(max_tokens) or not 1 <= max_tokens <= context_length:
        raise ApiError(400, f"'{param}' must be a whole number from 1 to the model's context of {context_length}.", param)
    seed = body.get("seed")
    if seed is not None and (not is_int(seed) or seed not in SEED_RANGE):
        raise ApiError(400, "'seed' must be a whole number from -2^63 to 2^63 - 1.", "seed")
    top_k = body.get("top_k", 0)
    if not is_int(top_k) or top_k < 0:
        raise ApiError(400, "'top_k' must be a whole number of at least 0 (0: every token).", "top_k")
    return SamplingParams(
        temperature=number_field(body, "temperature", 1.0, 0.0, 2.0),
        top_k=top_k,
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0),
        min_p=number_field(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number_field(body, "repetition_penalty", 1.0, 0.01, 2.0),
        max_new_tokens=max_tokens,
        seed=seed,
        stop=_stop(body.get("stop")),
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_field(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them.", "stop")
    return tuple(unicode_text(stop, "stop") for stop in stops)


# ---------------------------------------------------------------- replies


def finish_reason(reason: FinishReason) -> str:
    return _FINISH.get(reason, "stop")


def usage(prefill: PrefillDone | None, completion_tokens: int) -> dict:
    prompt_tokens = prefill.prompt_tokens if prefill else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": prefill.reused_tokens if prefill else 0},
    }


def envelope(request_id: str, model: str, chat: bool, streamed: bool) -> dict:
    kind = ("chat.completion.chunk" if streamed else "chat.completion") if chat else "text_completion"
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": model}


def choice(chat: bool, streamed: bool, text: str | None, reason: str | None, first: bool = False,
           logprobs: dict | None = None) -> dict:
    """One entry of ``choices``; ``text`` None in a chunk means no new text; ``logprobs`` in ``logprob_shapes``'
    shape (None when not asked for)."""
    if not chat:
        return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
    if not streamed:
        message = {"role": "assistant", "content": text or ""}
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
    delta: dict = {"role": "assistant"} if first else {}
    if text is not None:
        delta["content"] = text
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
