"""``python -m engine.bench serve-api``: what streaming through the API server adds to the engine's own figures.

Main thread. One engine thread (an ``EngineHub`` that also notes when the engine
emits each piece of text) with the model, and Hearth's API server on a free
loopback port sharing it. Each round asks the same greedy question twice, in
turns: straight into the engine, and over HTTP (a plain socket client timing
the server-sent chunks). Both use the conversation id the server derives, so
both reuse the same cached prompt.

The headline figures pair each served request with the engine's own figures for
that very request, so machine noise hits both sides alike: ``ttft_added_ms`` is
the client's time to first token less the engine's (``RequestStats.ttft_ms``),
and ``decode_time_ratio`` the client's first-to-last-chunk time over the
engine's first-to-last-piece time. The direct runs give the same figures
without the server, for comparison. ``--clients N`` then adds N streaming
clients at once against N requests at once straight in (``serve_clients``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine.api.server.config import ServerConfig
from engine.api.server.engine_link import conversation_key
from engine.api.server.openai_schema import parse_chat
from engine.api.server.server import ApiServer
from engine.bench import serve_clients
from engine.protocol.messages import (
    DEVICES,
    Event,
    Generate,
    LoadModel,
    LoadOptions,
    ModelLoaded,
    ReplyFailed,
    ReplyFinished,
    TokenStreamed,
)
from engine.service.fanout import EngineHub

QUESTION = "Tell me a long story about a dragon who learns to cook, with many details."
TIMEOUT_S = 300


@dataclass(frozen=True)
class Timing:
    """One reply as seen by its client, and by the engine thread."""

    ttft_ms: float  # from sending the request to the first piece of text
    decode_ms: float  # from the first piece of text to the last
    engine_ttft_ms: float  # the engine's own: from taking the request to its first token
    engine_decode_ms: float  # first to last piece of text, as the engine thread emitted them
    pieces: int
    text: str


class TappedHub(EngineHub):
    """An ``EngineHub`` that notes, on the engine thread, when each request's text and stats leave the engine."""

    def __init__(self) -> None:
        super().__init__()
        self.emitted: dict[str, list[float]] = {}
        self.engine_ttft_ms: dict[str, float] = {}

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, TokenStreamed) and event.text:
            self.emitted.setdefault(event.request_id, []).append(time.perf_counter())
        elif isinstance(event, ReplyFinished):
            self.engine_ttft_ms[event.request_id] = event.stats.ttft_ms
        super()._dispatch(event)


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    serve_api = commands.add_parser("serve-api", help="time to first token and decode time through the API server")
    serve_api.add_argument("--device", default="auto", choices=DEVICES)
    serve_api.add_argument("--new-tokens", type=int, default=64)
    serve_api.add_argument("--rounds", type=int, default=5, help="direct and served requests, taking turns")
    serve_api.add_argument("--clients", type=int, default=0,
                           help="then this many streaming clients at once against as many requests straight in (0: skip)")
    return serve_api


def run(args: argparse.Namespace, show) -> dict[str, Any]:
    hub = TappedHub()
    hub.start()
    try:
        loaded = _load(hub, args.model, args.device)
        server = ApiServer(hub, ServerConfig(port=0))
        server.start()
        try:
            summary = _rounds(hub, server, loaded, args, show)
            if args.clients > 0:
                summary |= serve_clients.compare(hub, server.config.port, loaded, args.clients, args.new_tokens,
                                                 args.rounds, QUESTION)
            return summary
        finally:
            server.stop()
    finally:
        hub.stop()


def _load(hub: EngineHub, path: str, device: str) -> ModelLoaded:
    loaded = hub.load_and_wait(LoadModel("bench-load", path, LoadOptions(device=device)), TIMEOUT_S)
    if not isinstance(loaded, ModelLoaded):
        raise RuntimeError(loaded.message)
    return loaded


def _rounds(hub: TappedHub, server: ApiServer, loaded: ModelLoaded, args: argparse.Namespace, show) -> dict[str, Any]:
    body = serve_clients.chat_body(loaded, QUESTION, args.new_tokens)
    ask = parse_chat(body, loaded.name, loaded.context_length)
    direct_run = lambda: _direct(hub, Generate("", conversation_key(ask), ask.messages, ask.sampling, "stop"))
    served_run = lambda: _served(hub, server, body)
    direct_run(), served_run()  # warm-up: the first fills the conversation's cache
    direct, served = [], []
    for index in range(args.rounds):
        direct.append(direct_run())
        served.append(served_run())
        show({"round": index + 1, "direct_ttft_ms": round(direct[-1].ttft_ms, 2), "served_ttft_ms": round(served[-1].ttft_ms, 2),
              "served_engine_ttft_ms": round(served[-1].engine_ttft_ms, 2), "direct_decode_ms": round(direct[-1].decode_ms, 1),
              "served_decode_ms": round(served[-1].decode_ms, 1), "served_engine_decode_ms": round(served[-1].engine_decode_ms, 1)})
    return _summary(args, loaded, direct, served)


def _summary(args: argparse.Namespace, loaded: ModelLoaded, direct: list[Timing], served: list[Timing]) -> dict[str, Any]:
    median = lambda values: statistics.median(values)
    added = lambda runs: median(run.ttft_ms - run.engine_ttft_ms for run in runs)
    ratio = lambda runs: median(run.decode_ms / run.engine_decode_ms for run in runs if run.engine_decode_ms > 0)
    return {
        "model": args.model, "device": loaded.device, "precision": loaded.precision, "rounds": args.rounds,
        "new_tokens": args.new_tokens, "pieces": served[0].pieces,
        "engine_ttft_ms": round(median(run.engine_ttft_ms for run in served), 2),
        "served_ttft_ms": round(median(run.ttft_ms for run in served), 2),
        "ttft_added_ms": round(added(served), 2),
        "engine_decode_ms": round(median(run.engine_decode_ms for run in served), 1),
        "served_decode_ms": round(median(run.decode_ms for run in served), 1),
        "decode_time_ratio": round(ratio(served), 4),
        "direct_ttft_ms": round(median(run.ttft_ms for run in direct), 2), "direct_ttft_added_ms": round(added(direct), 2),
        "direct_decode_ms": round(median(run.decode_ms for run in direct), 1),
        "served_over_direct_decode": round(median(run.decode_ms for run in served) / median(run.decode_ms for run in direct), 3),
        "same_text": all(run.text == direct[0].text for run in direct + served),
    }


def _direct(hub: TappedHub, request: Generate) -> Timing:
    """Straight into the engine: the client's stamps are the engine thread's own (no asyncio, no HTTP)."""
    ended: queue.Queue = queue.Queue()
    request_id = uuid.uuid4().hex
    started = time.perf_counter()
    hub.submit(Generate(request_id, request.conversation_id, request.messages, request.sampling, "stop"),
               lambda event: ended.put(event) if isinstance(event, (ReplyFinished, ReplyFailed)) else None)
    event = ended.get(timeout=TIMEOUT_S)
    if isinstance(event, ReplyFailed):
        raise RuntimeError(event.message)
    stamps = hub.emitted.pop(request_id, [])
    return _timing(hub, request_id, started, stamps, event.text)


def _served(hub: TappedHub, server: ApiServer, body: dict) -> Timing:
    """Over HTTP with a plain client reading server-sent events line by line."""
    connection = http.client.HTTPConnection("127.0.0.1", server.config.port, timeout=TIMEOUT_S)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"the server answered {response.status}: {response.read().decode()[:300]}")
    stamps, text, request_id = [], "", ""
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        request_id, piece = chunk["id"], chunk["choices"][0]["delta"].get("content")
        if piece:
            stamps.append(time.perf_counter())
            text += piece
    connection.close()
    return _timing(hub, request_id, started, stamps, text)


def _timing(hub: TappedHub, request_id: str, started: float, stamps: list[float], text: str) -> Timing:
    emitted = hub.emitted.pop(request_id, stamps)
    if not stamps or not emitted:
        raise RuntimeError("the model replied with no text")
    engine_ttft_ms = hub.engine_ttft_ms.pop(request_id, 0.0)
    return Timing((stamps[0] - started) * 1000, (stamps[-1] - stamps[0]) * 1000, engine_ttft_ms,
                  (emitted[-1] - emitted[0]) * 1000, len(stamps), text)
