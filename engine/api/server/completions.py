"""``POST /v1/chat/completions`` and ``POST /v1/completions``: one request through the engine and back (server loop).

Both endpoints submit one ``Generate`` through ``EngineLink`` and turn its events
into OpenAI's JSON, whole or as server-sent events. The first event is awaited
before any reply starts, so a prompt the engine refuses (too long for the
context) still gets a proper 400. A client that goes away, while waiting or while
streaming, cancels its request: the engine stops at its next decode step.
A chat request with tools has its reply read by a ``ToolCallParser``: text goes
out as it settles, each call as ``tool_calls`` deltas, its arguments in fragments
as the model writes them when the tool grammar constrains the reply, else once the
call is whole (``tool_replies``).
``answer`` and ``read_json`` serve ``/v1/messages`` too.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from engine.api.server.engine_link import EngineLink, RequestStream
from engine.api.server.errors import ApiError, error_body
from engine.api.server.logprob_shapes import chat_logprobs, completion_logprobs
from engine.api.server.openai_schema import CompletionAsk, choice, envelope, finish_reason, parse_chat, parse_completion, usage
from engine.api.server.tool_replies import call_delta_choice, message_choice, with_calls
from engine.chat.tool_calls import Piece, ToolCallParser, split_reply
from engine.protocol.messages import (
    ENGINE_FAILURE,
    Event,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    TokenLogprob,
    TokenStreamed,
    ToolCall,
)

T = TypeVar("T")
BODY_TIMEOUT_S = 60.0  # a slow client may not hold a request open longer while sending its body
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed the connection before its reply was ready."""


async def chat_completions(request: Request) -> Response:
    link: EngineLink = request.app.state.link
    body = await read_json(request)
    model = link.ready_model()
    return await _answer(request, parse_chat(body, model.name, model.context_length, model.tool_format), chat=True)


async def completions(request: Request) -> Response:
    link: EngineLink = request.app.state.link
    body = await read_json(request)
    model = link.ready_model()
    return await _answer(request, parse_completion(body, model.name, model.context_length), chat=False)


async def read_json(request: Request) -> object:
    """The body as JSON: 415 unless sent as ``application/json``, 413 over ``max_body_bytes``, 408 when it
    trickles in for longer than ``BODY_TIMEOUT_S``, 400 for anything that is not JSON.

    Requiring the JSON media type keeps web pages out: a browser sends a cross-origin
    ``text/plain`` POST without asking first (no CORS preflight), but never a JSON one.
    """
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, "Send the body as JSON with 'Content-Type: application/json'.", code="unsupported_media_type")
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            body = await _body(request)
    except TimeoutError:
        raise ApiError(408, f"The request body did not arrive within {BODY_TIMEOUT_S:.0f} s.", code="body_timeout") from None
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # ValueError: also a number of over 4300 digits
        reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ApiError(400, f"The request body is not valid JSON: {reason}.", code="invalid_json") from None


async def _body(request: Request) -> bytes:
    limit = request.app.state.config.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"The request body is larger than the server's limit of {limit} bytes.", code="body_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"The request body is larger than the server's limit of {limit} bytes.", code="body_too_large")
    return bytes(body)


def _refuse_constant(name: str) -> object:
    """``NaN`` and ``Infinity`` are not JSON, though Python's parser takes them."""
    raise ValueError(f"{name} is not a JSON number")


async def _start_reply(request: Request, ask: CompletionAsk) -> tuple[RequestStream, Event]:
    """Submit ``ask`` and await its first event; ``ClientGone`` (the request cancelled) if the client leaves first,
    ``ApiError`` when the engine refuses the prompt (400) or breaks (500) before any token."""
    link: EngineLink = request.app.state.link
    stream = link.open(ask, client_label(request), request.url.path)
    try:
        first = await _unless_gone(request, stream.next())
    except ClientGone:
        link.cancel(stream)
        raise
    if isinstance(first, ReplyFailed):
        if first.message.startswith(ENGINE_FAILURE):
            raise ApiError(500, first.message, code="generation_failed")
        raise ApiError(400, first.message, code="prompt_refused")
    return stream, first


async def _answer(request: Request, ask: CompletionAsk, chat: bool) -> Response:
    link: EngineLink = request.app.state.link
    return await answer(request, ask, lambda stream, first: _sse(link, stream, ask, chat, first),
                        lambda stream, first: _whole_reply(stream, ask, chat, first))


async def answer(request: Request, ask: CompletionAsk, events: Callable[[RequestStream, Event], AsyncIterator[str]],
                 whole: Callable[[RequestStream, Event], Awaitable[Response]]) -> Response:
    """The reply to ``ask`` from its first event on: ``events`` streamed as server-sent events, or the ``whole``
    reply; a client gone before the first event, or while the whole reply is made, gets 499 and cancels it."""
    try:
        stream, first = await _start_reply(request, ask)
    except ClientGone:
        return Response(status_code=499)
    if ask.stream:
        return StreamingResponse(events(stream, first), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        return await _unless_gone(request, whole(stream, first))
    except ClientGone:
        request.app.state.link.cancel(stream)
        return Response(status_code=499)


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ``ClientGone`` as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task not in done:
        task.cancel()
        raise ClientGone()
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _whole_reply(stream: RequestStream, ask: CompletionAsk, chat: bool, event: Event) -> JSONResponse:
    entries: list[TokenLogprob] = []
    while not isinstance(event, (ReplyFinished, ReplyFailed)):
        if isinstance(event, TokenStreamed):
            entries.extend(event.logprobs)
        event = await stream.next()
    if isinstance(event, ReplyFailed):
        raise ApiError(500, event.message, code="generation_failed")
    reply = envelope(stream.request_id, ask.model, chat, streamed=False)
    reason = finish_reason(event.stats.finish_reason)
    tools = ask.tool_use if chat else None
    if tools is None or tools.choice == "none":
        reply_choice = choice(chat, False, event.text, reason)
    else:
        content, calls, _ = split_reply(tools.tool_format, event.text, tools.parallel)
        reply_choice = message_choice(content, calls, reason)
    reply_choice["logprobs"] = _logprobs(ask, chat, entries, 0)
    reply["choices"] = [reply_choice]
    reply["usage"] = usage(stream.prefill, event.stats.tokens_generated)
    return JSONResponse(reply)


async def _sse(link: EngineLink, stream: RequestStream, ask: CompletionAsk, chat: bool, event: Event) -> AsyncIterator[str]:
    """Server-sent events until ``[DONE]``; if the client goes away first, the request is cancelled."""
    finished = False
    parser = ask.tool_use.parser() if chat and ask.tool_use else None
    held: list[TokenLogprob] = []  # log-probabilities of tokens whose text no chunk has carried yet
    shown = 0  # characters of reply text streamed before this event
    try:
        while True:
            if isinstance(event, TokenStreamed):
                held.extend(event.logprobs)
            parts = _choices(chat, event, parser)
            if held and parts:
                parts[0]["logprobs"] = _logprobs(ask, chat, held, shown)
                held = []
            if isinstance(event, TokenStreamed):
                shown += len(event.text)
            if isinstance(event, ReplyFailed):
                yield _data(error_body(500, event.message, code="generation_failed"))
            for part in parts:
                yield _data(_chunk(stream, ask, chat, part))
            if isinstance(event, (ReplyFinished, ReplyFailed)):
                break
            event = await stream.next()
        if ask.include_usage and isinstance(event, ReplyFinished):
            last = envelope(stream.request_id, ask.model, chat, streamed=True)
            last.update(choices=[], usage=usage(stream.prefill, event.stats.tokens_generated))
            yield _data(last)
        finished = True
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            link.cancel(stream)


def _choices(chat: bool, event: Event, parser: ToolCallParser | None) -> list[dict]:
    """The ``choices`` entries ``event`` sends; with ``parser``, text goes out as it settles and each call once it
    is whole."""
    if isinstance(event, PrefillDone):
        parts = [choice(chat, True, "", None, first=True)] if chat else []
    elif isinstance(event, TokenStreamed):
        parts = _piece_choices(chat, parser.feed(event.text) if parser else [event.text])
    elif isinstance(event, ReplyFinished):
        parts = _piece_choices(chat, parser.finish()) if parser else []
        reason = with_calls(finish_reason(event.stats.finish_reason), parser.calls if parser else [])
        parts.append(choice(chat, True, None if chat else "", reason))
    else:
        parts = []
    return parts


def _piece_choices(chat: bool, pieces: list[Piece]) -> list[dict]:
    parts = []
    for piece in pieces:
        if isinstance(piece, str):
            if piece:
                parts.append(choice(chat, True, piece, None))
        elif not isinstance(piece, ToolCall):  # a whole call went out as its start and fragments
            parts.append(call_delta_choice(piece))
    return parts


def _chunk(stream: RequestStream, ask: CompletionAsk, chat: bool, part: dict) -> dict:
    chunk = envelope(stream.request_id, ask.model, chat, streamed=True)
    chunk["choices"] = [part]
    if ask.include_usage:
        chunk["usage"] = None
    return chunk


def _logprobs(ask: CompletionAsk, chat: bool, entries: list[TokenLogprob] | tuple[TokenLogprob, ...],
              text_offset: int) -> dict | None:
    """``entries`` in the endpoint's shape, or None when the request did not ask for log-probabilities."""
    if ask.sampling.logprobs is None:
        return None
    return chat_logprobs(entries) if chat else completion_logprobs(entries, text_offset)


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def client_label(request: Request) -> str:
    peer = request.client.host if request.client else "?"
    agent = request.headers.get("user-agent", "")
    return f"{peer} · {agent[:40]}" if agent else peer
