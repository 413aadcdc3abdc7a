"""``POST /v1/messages``: Anthropic's Messages API, as llama-server, Ollama and LM Studio serve it (server loop).

The request runs through the engine like a chat completion (``completions.answer``),
and comes back as one ``message`` or as Anthropic's server-sent events::

    message_start, then per content block: content_block_start, content_block_delta…, content_block_stop,
    then message_delta (stop_reason, output usage) and message_stop

Text streams in ``text_delta``s; each tool call is a ``tool_use`` block whose
input arrives in ``input_json_delta``s: as the model writes it when the tool
grammar constrains the reply (``tool_choice`` any or tool), else once whole. The
same Host, key (``x-api-key`` or Bearer) and CORS rules as the rest of the server
apply (``access``). Refusals use Anthropic's error shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.api.server.anthropic_schema import (
    anthropic_error,
    message_envelope,
    parse_messages,
    stop_reason,
    tool_use_block,
    tool_use_id,
)
from engine.api.server.completions import answer, read_json
from engine.api.server.engine_link import EngineLink, RequestStream
from engine.api.server.errors import ApiError
from engine.api.server.openai_schema import CompletionAsk
from engine.chat.tool_calls import CallArguments, CallStart, Piece, ToolCallParser, split_reply
from engine.protocol.messages import Event, PrefillDone, ReplyFailed, ReplyFinished, TokenStreamed


async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except ApiError as error:
        return JSONResponse(anthropic_error(error.status, error.message, error.param), status_code=error.status)


async def _messages(request: Request) -> Response:
    link: EngineLink = request.app.state.link
    body = await read_json(request)
    model = link.ready_model()
    ask = parse_messages(body, model.name, model.context_length, model.tool_format)
    message_id = "msg_" + uuid.uuid4().hex[:24]
    return await answer(request, ask, lambda stream, first: MessageEvents(link, stream, ask, message_id).events(first),
                        lambda stream, first: _whole_message(stream, ask, message_id, first))


async def _whole_message(stream: RequestStream, ask: CompletionAsk, message_id: str, event: Event) -> JSONResponse:
    while not isinstance(event, (ReplyFinished, ReplyFailed)):
        event = await stream.next()
    if isinstance(event, ReplyFailed):
        raise ApiError(500, event.message)
    tools = ask.tool_use
    if tools is None or tools.choice == "none":
        text, calls = event.text, []
    else:
        text, calls, _ = split_reply(tools.tool_format, event.text, tools.parallel)
    content = ([{"type": "text", "text": text}] if text else []) + [tool_use_block(call) for call in calls]
    reason, sequence = stop_reason(event.stats.finish_reason, ask, calls)
    input_tokens = stream.prefill.prompt_tokens if stream.prefill else 0
    return JSONResponse(message_envelope(message_id, ask.model, content, input_tokens, event.stats.tokens_generated,
                                         reason, sequence))


class MessageEvents:
    """The server-sent events of one streamed message; which content block is open, and its index."""

    def __init__(self, link: EngineLink, stream: RequestStream, ask: CompletionAsk, message_id: str) -> None:
        self._link, self._stream, self._ask, self._message_id = link, stream, ask, message_id
        self._parser: ToolCallParser | None = ask.tool_use.parser() if ask.tool_use else None
        self._blocks = 0  # content blocks started
        self._text_open = False
        self._call_open = False  # a streamed tool_use block awaits the rest of its input

    async def events(self, event: Event) -> AsyncIterator[str]:
        """Every event until ``message_stop``; if the client goes away first, the request is cancelled."""
        finished = False
        try:
            while True:
                for name, data in self._translate(event):
                    yield f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
                if isinstance(event, (ReplyFinished, ReplyFailed)):
                    break
                event = await self._stream.next()
            finished = True
        finally:
            if not finished:
                self._link.cancel(self._stream)

    def _translate(self, event: Event) -> list[tuple[str, dict]]:
        if isinstance(event, PrefillDone):
            start = message_envelope(self._message_id, self._ask.model, [], event.prompt_tokens, 0, None, None)
            return [("message_start", {"type": "message_start", "message": start})]
        if isinstance(event, TokenStreamed):
            return self._pieces(self._parser.feed(event.text) if self._parser else [event.text])
        if isinstance(event, ReplyFinished):
            return self._finish(event)
        if isinstance(event, ReplyFailed):
            return [("error", anthropic_error(500, event.message))]
        return []

    def _pieces(self, pieces: list[Piece]) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        for piece in pieces:
            if isinstance(piece, str):
                out += self._text(piece)
            elif isinstance(piece, CallStart):
                out += self._close_text() + self._tool_use_start(piece)
            elif isinstance(piece, CallArguments):
                delta = {"type": "content_block_delta", "index": self._blocks - 1,
                         "delta": {"type": "input_json_delta", "partial_json": piece.text}}
                out.append(("content_block_delta", delta))
            else:
                out += self._close_call()
        return out

    def _text(self, text: str) -> list[tuple[str, dict]]:
        if not text:
            return []
        out = []
        if not self._text_open:
            out.append(self._block_start({"type": "text", "text": ""}))
            self._text_open = True
        delta = {"type": "content_block_delta", "index": self._blocks - 1, "delta": {"type": "text_delta", "text": text}}
        return out + [("content_block_delta", delta)]

    def _tool_use_start(self, call: CallStart) -> list[tuple[str, dict]]:
        self._call_open = True
        return [self._block_start({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}})]

    def _close_call(self) -> list[tuple[str, dict]]:
        """The open ``tool_use`` block ends: its call is whole, or the reply ended while the model wrote it."""
        if not self._call_open:
            return []
        self._call_open = False
        return [_block_stop(self._blocks - 1)]

    def _block_start(self, block: dict) -> tuple[str, dict]:
        self._blocks += 1
        return "content_block_start", {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}

    def _close_text(self) -> list[tuple[str, dict]]:
        if not self._text_open:
            return []
        self._text_open = False
        return [_block_stop(self._blocks - 1)]

    def _finish(self, event: ReplyFinished) -> list[tuple[str, dict]]:
        out = self._pieces(self._parser.finish()) if self._parser else []
        out += self._close_text() + self._close_call()
        reason, sequence = stop_reason(event.stats.finish_reason, self._ask, self._parser.calls if self._parser else [])
        ending = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                  "usage": {"output_tokens": event.stats.tokens_generated}}
        return out + [("message_delta", ending), ("message_stop", {"type": "message_stop"})]


def _block_stop(index: int) -> tuple[str, dict]:
    return "content_block_stop", {"type": "content_block_stop", "index": index}
