"""The server's door into the engine thread: one ``EngineHub`` listener, one event queue per request.

``_from_engine`` runs on the engine thread and only hands each event to the server's
loop (``call_soon_threadsafe``); everything else here runs on that loop. The link
keeps what the server must know between requests (the model served, whether it is
ready) and the figures of ``metrics``, and tells ``on_activity`` (the app's panel)
how each request is doing, how far its prompt is read included, at most a few times a second per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

from engine.api.server.errors import ApiError
from engine.api.server.metrics import ServerMetrics, ServerRequestInfo
from engine.api.server.openai_schema import CompletionAsk
from engine.protocol.messages import (
    BatchSampled,
    Cancel,
    Event,
    Generate,
    MemorySampled,
    ModelLoaded,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    StatusChanged,
    TokenStreamed,
)
from engine.service.fanout import EngineHub

ACTIVITY_INTERVAL_S = 0.25
RAW_PREFIX_CHARS = 256
OnActivity = Callable[[ServerRequestInfo], None]


@dataclass(frozen=True)
class ServedModel:
    name: str
    context_length: int
    tool_format: str = "hermes"  # how it writes tool calls (``tool_formats.FORMATS``)
    kv_cache: str = ""  # its KV cache's precision (``ModelLoaded.kv_cache``)
    context_reason: str = ""  # why its context is as long as it is (``ModelLoaded.context_reason``)


def conversation_key(ask: CompletionAsk) -> str:
    """The engine conversation whose KV cache this request reuses.

    A client resends the whole chat each turn, so turn N+1 starts with turn N's
    prompt. Keying on what never changes across those turns (the system prompt and
    the first user message; for raw text its first characters) sends every turn of
    one chat to the same cache, where the engine reuses the longest shared prefix,
    while unrelated chats get caches of their own instead of evicting each other's.
    """
    if ask.prompt is not None:
        seed = ask.prompt[:RAW_PREFIX_CHARS]
    else:
        first_user = next((i for i, m in enumerate(ask.messages) if m.role == "user"), len(ask.messages) - 1)
        seed = json.dumps([[m.role, m.content] for m in ask.messages[: first_user + 1]])
    return "api-" + hashlib.sha256(f"{ask.model}\0{seed}".encode()).hexdigest()[:24]


class RequestStream:
    """The events of one request, as they arrive on the server's loop."""

    def __init__(self, request_id: str, client: str, endpoint: str) -> None:
        self.request_id = request_id
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.info = ServerRequestInfo(request_id, client, endpoint, "waiting")
        self.submitted_at = time.perf_counter()
        self.first_token_at = 0.0
        self.reported_at = 0.0
        self.prefill: PrefillDone | None = None

    async def next(self) -> Event:
        return await self.events.get()


class EngineLink:
    """Listens to the hub for the server; create and use it on the server's loop."""

    def __init__(self, hub: EngineHub, metrics: ServerMetrics, on_activity: OnActivity | None = None) -> None:
        self._hub = hub
        self._loop = asyncio.get_running_loop()
        self._metrics = metrics
        self._on_activity = on_activity
        self._streams: dict[str, RequestStream] = {}
        self._model: ServedModel | None = None
        self._state = "idle"

    def attach(self) -> None:
        self._hub.listen(self._from_engine)

    def detach(self) -> None:
        self._hub.unlisten(self._from_engine)
        for stream in list(self._streams.values()):
            self.cancel(stream)

    @property
    def state(self) -> str:
        return self._state

    @property
    def model(self) -> ServedModel | None:
        return self._model

    def ready_model(self) -> ServedModel:
        """The model to answer with, or a 503 while none is ready."""
        if self._model is None or self._state not in ("ready", "generating"):
            what = "a model is loading" if self._state in ("loading", "fetching") else "no model is ready"
            raise ApiError(503, f"The server cannot answer now: {what}. Try again shortly.", code="model_not_ready")
        return self._model

    def open(self, ask: CompletionAsk, client: str, endpoint: str) -> RequestStream:
        stream = RequestStream(f"{'chatcmpl' if ask.prompt is None else 'cmpl'}-{uuid.uuid4().hex}", client, endpoint)
        self._streams[stream.request_id] = stream
        self._metrics.waiting += 1
        self._report(stream, force=True)
        tools = ask.tool_use.tools if ask.tool_use else ()
        request = Generate(stream.request_id, conversation_key(ask), ask.messages, ask.sampling, "stop", ask.prompt,
                           ask.constraint, tools)
        self._hub.submit(request, self._from_engine)
        return stream

    def cancel(self, stream: RequestStream) -> None:
        """The client went away: the engine stops at its next decode step."""
        if stream.request_id in self._streams:
            self._hub.submit(Cancel(stream.request_id))

    def _from_engine(self, event: Event) -> None:
        """Runs on the engine thread (or the caller of ``EngineHub.listen``)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._route, event)

    def _route(self, event: Event) -> None:
        if isinstance(event, StatusChanged):
            self._state = event.state
        elif isinstance(event, ModelLoaded):
            self._model = ServedModel(event.name, event.context_length, event.tool_format, event.kv_cache,
                                      event.context_reason)
        elif isinstance(event, (MemorySampled, BatchSampled)):
            self._metrics.sampled(event)
        stream = self._streams.get(getattr(event, "request_id", ""))
        if stream is not None:
            self._track(stream, event)
            stream.events.put_nowait(event)

    def _track(self, stream: RequestStream, event: Event) -> None:
        info = stream.info
        if isinstance(event, PrefillDone):
            stream.prefill, stream.first_token_at = event, time.perf_counter()
            self._metrics.waiting -= 1
            self._metrics.running += 1
            self._metrics.first_token(stream.first_token_at - stream.submitted_at)
            stream.info = replace(info, state="running", prompt_tokens=event.prompt_tokens, cached_tokens=event.reused_tokens,
                                  ttft_ms=(stream.first_token_at - stream.submitted_at) * 1000)
        elif isinstance(event, PromptProgress):
            stream.info = replace(info, state="reading", prompt_tokens=event.prompt_tokens,
                                  read_tokens=event.computed_tokens)
        elif isinstance(event, TokenStreamed):
            stream.info = replace(info, completion_tokens=event.tokens_generated, tok_s=event.decode_tok_s)
        elif isinstance(event, (ReplyFinished, ReplyFailed)):
            self._close(stream, event)
            return
        self._report(stream, force=isinstance(event, (PrefillDone, PromptProgress)))  # progress: paced by the engine

    def _close(self, stream: RequestStream, event: ReplyFinished | ReplyFailed) -> None:
        del self._streams[stream.request_id]
        if stream.prefill is None:
            self._metrics.waiting -= 1
        else:
            self._metrics.running -= 1
        if isinstance(event, ReplyFinished):
            state = "cancelled" if event.stats.finish_reason == "cancelled" else "done"
            outcome = event.stats.finish_reason
            stream.info = replace(stream.info, state=state, completion_tokens=event.stats.tokens_generated,
                                  tok_s=event.stats.decode_tok_s)
        else:
            state, outcome = "failed", "failed"
            stream.info = replace(stream.info, state=state)
        self._metrics.finished(outcome, stream.info)
        self._report(stream, force=True)

    def _report(self, stream: RequestStream, force: bool = False) -> None:
        now = time.perf_counter()
        if self._on_activity is None or (not force and now - stream.reported_at < ACTIVITY_INTERVAL_S):
            return
        stream.reported_at = now
        self._on_activity(stream.info)
