"""The OpenAI chat-completions wire format, client side (pure functions; run on the engine thread).

``chat_request`` builds the body of ``POST /v1/chat/completions`` with
``stream: true`` and ``stream_options.include_usage``. ``SseDecoder`` turns the
answer's lines into server-sent events (``data: …`` lines up to a blank line);
``parse_chunk`` reads one event's JSON as a ``StreamChunk``: new text, the finish
reason, and the ``usage`` and llama.cpp ``timings`` objects that servers add to
the last chunks. ``remote_figures`` keeps from those the numbers the user sees.
``listed_models`` reads ``GET /v1/models``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from engine.api.remote.http_stream import Oversized, RemoteError, error_text, not_json_message
from engine.protocol.messages import ChatMessage, Constraint, FinishReason, RemoteFigures, SamplingParams

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
DONE = "[DONE]"
MAX_EVENT_CHARS = 1024 * 1024
FINISH_REASONS: dict[str, FinishReason] = {"stop": "eos", "length": "max_tokens"}


def chat_request(model: str, messages: tuple[ChatMessage, ...], sampling: SamplingParams,
                 constraint: Constraint | None = None) -> dict[str, object]:
    """The streamed request, with only the sampling fields the OpenAI API itself defines; a JSON ``constraint`` as
    ``response_format`` (the API has no field for the other kinds: they are not sent)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": message.role, "content": message.content} for message in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": sampling.max_new_tokens,
        "temperature": max(sampling.temperature, 0.0),
        "top_p": sampling.top_p,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if constraint is not None and constraint.kind == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif constraint is not None and constraint.kind == "json_schema":
        schema = {"name": "reply", "schema": json.loads(constraint.spec)}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


class SseDecoder:
    """Server-sent events from lines: ``feed`` returns an event's data once its blank line arrives.

    An event's data beyond ``MAX_EVENT_CHARS`` raises ``Oversized``: no chunk of a reply is that large,
    and a server that never sends the blank line would otherwise be collected without end.
    """

    def __init__(self) -> None:
        self._data: list[str] = []
        self._size = 0

    def feed(self, line: str) -> str | None:
        if line == "":
            return self.flush()
        if line.startswith(":"):
            return None  # a comment, e.g. a keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            value = value[1:] if value.startswith(" ") else value
            self._size += len(value) + 1
            if self._size > MAX_EVENT_CHARS:
                raise Oversized(f"an event larger than {MAX_EVENT_CHARS // 2**20} MiB")
            self._data.append(value)
        return None  # event:, id:, retry: and unknown fields carry nothing a reply needs

    def flush(self) -> str | None:
        """The data of the event in progress (the stream ended without its blank line)."""
        if not self._data:
            return None
        data, self._data, self._size = "\n".join(self._data), [], 0
        return data


@dataclass(frozen=True)
class StreamChunk:
    """What one ``chat.completion.chunk`` carries for the client."""

    text: str = ""
    finish_reason: str | None = None
    usage: Mapping[str, object] | None = None
    timings: Mapping[str, object] | None = None


def parse_chunk(base_url: str, data: str) -> StreamChunk:
    """One event's data as a chunk; raises ``RemoteError`` for non-JSON and for an error the server streamed."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        raise RemoteError(not_json_message(base_url, CHAT_PATH, data)) from None
    if not isinstance(parsed, dict):
        raise RemoteError(not_json_message(base_url, CHAT_PATH, data))
    reported = error_text(parsed)
    if reported:
        raise RemoteError(f"The server at {base_url} stopped the reply with an error: {reported}")
    choices = parsed.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else None
    usage, timings = parsed.get("usage"), parsed.get("timings")
    return StreamChunk(
        text=text if isinstance(text, str) else "",
        finish_reason=choice.get("finish_reason") or None,
        usage=usage if isinstance(usage, dict) else None,
        timings=timings if isinstance(timings, dict) else None,
    )


def remote_figures(
    base_url: str, model: str, usage: Mapping[str, object] | None, timings: Mapping[str, object] | None
) -> RemoteFigures:
    usage, timings = usage or {}, timings or {}
    details = usage.get("prompt_tokens_details")
    return RemoteFigures(
        server=base_url,
        model=model,
        prompt_tokens=_whole(usage.get("prompt_tokens")),
        completion_tokens=_whole(usage.get("completion_tokens")),
        cached_tokens=_whole(details.get("cached_tokens")) if isinstance(details, dict) else None,
        prompt_tok_s=_rate(timings.get("prompt_per_second")),
        decode_tok_s=_rate(timings.get("predicted_per_second")),
        cache_n=_whole(timings.get("cache_n")),
    )


def _whole(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _rate(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        return None
    return float(value)


def listed_models(base_url: str, listing: object) -> dict[str, int]:
    """``GET /v1/models`` as model id → context length (vLLM's ``max_model_len``; 0 when not given)."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise RemoteError(
            f"The server at {base_url} answered {MODELS_PATH} without a list of models: is it an OpenAI-compatible API?"
        )
    models: dict[str, int] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            models[entry["id"]] = _whole(entry.get("max_model_len")) or 0
    return models
