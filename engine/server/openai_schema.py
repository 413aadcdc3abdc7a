"""OpenAI's request bodies in, OpenAI's reply shapes out (server thread).

Validation is strict where a wrong value would silently do something else
(``max_tokens: -5``, an unknown model, ``n: 3``) and lenient where clients differ
harmlessly: fields Hearth does not use (``user``, ``presence_penalty`` …) are ignored.
Sampling follows OpenAI's defaults (temperature 1, top_p 1, no top-k or min-p cut).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.server.errors import ApiError
from engine.protocol.messages import ChatMessage, FinishReason, PrefillDone, SamplingParams

MAX_STOP_STRINGS = 4
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}


@dataclass(frozen=True)
class CompletionAsk:
    """One validated request: a chat (``messages``) or a raw ``prompt`` to continue."""

    model: str
    messages: tuple[ChatMessage, ...]
    prompt: str | None
    sampling: SamplingParams
    stream: bool
    include_usage: bool


def parse_chat(body: Any, model_id: str, context_length: int) -> CompletionAsk:
    body = _object(body)
    messages = _messages(body.get("messages"))
    return _ask(body, model_id, context_length, messages, None)


def parse_completion(body: Any, model_id: str, context_length: int) -> CompletionAsk:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request).", "prompt")
    for unsupported in ("echo", "logprobs", "suffix"):
        if body.get(unsupported):
            raise ApiError(400, f"'{unsupported}' is not supported by Hearth.", unsupported, "unsupported_parameter")
    return _ask(body, model_id, context_length, (), prompt)


def _ask(
    body: dict, model_id: str, context_length: int, messages: tuple[ChatMessage, ...], prompt: str | None
) -> CompletionAsk:
    _check_model(body.get("model"), model_id)
    if body.get("n", 1) != 1:
        raise ApiError(400, "Only n = 1 is supported: ask once per reply.", "n", "unsupported_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", "stream_options")
    include_usage = bool(options.get("include_usage", False))
    return CompletionAsk(model_id, messages, prompt, _sampling(body, context_length), stream, include_usage)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def _check_model(model: Any, model_id: str) -> None:
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: use the id that GET /v1/models lists.", "model")
    if model != model_id:
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
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise ApiError(400, f"{param}.role must be system, developer, user or assistant.", f"{param}.role")
    return ChatMessage(role, _content(item.get("content"), f"{param}.content"))  # type: ignore[arg-type]


def _content(content: Any, param: str) -> str:
    """A string, or a list of text parts (images and audio are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise ApiError(400, f"{param} must be a string or a list of text parts; Hearth's models read text only.", param)


def _sampling(body: dict, context_length: int) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = context_length // 2
    elif not _is_int(max_tokens) or not 1 <= max_tokens <= context_length:
        raise ApiError(400, f"'{param}' must be a whole number from 1 to the model's context of {context_length}.", param)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise ApiError(400, "'seed' must be a whole number.", "seed")
    return SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_k=0,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        min_p=0.0,
        repetition_penalty=1.0,
        max_new_tokens=max_tokens,
        seed=seed,
        stop=_stop(body.get("stop")),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them.", "stop")
    return tuple(stops)


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


def choice(chat: bool, streamed: bool, text: str | None, reason: str | None, first: bool = False) -> dict:
    """One entry of ``choices``; ``text`` None in a chunk means no new text."""
    if not chat:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    if not streamed:
        return {"index": 0, "message": {"role": "assistant", "content": text or ""}, "finish_reason": reason}
    delta: dict = {"role": "assistant"} if first else {}
    if text is not None:
        delta["content"] = text
    return {"index": 0, "delta": delta, "finish_reason": reason}
