"""``python -m engine.bench serve-api``: what streaming through the API server adds to the engine's own figures.

Main thread. One engine thread (an ``EngineHub``) with the model, and Hearth's API
server on a free loopback port sharing it. Each round asks the same greedy
question twice, in turns: straight into the engine (a hub listener timing the
``TokenStreamed`` events as they arrive) and over HTTP (a plain socket client
timing the server-sent chunks). Both use the conversation id the server derives,
so both reuse the same cached prompt. The summary gives the medians and what the
server adds: milliseconds to the first token, and the ratio of decode times.
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

from engine.api.config import ServerConfig
from engine.api.engine_link import conversation_key
from engine.api.openai_schema import parse_chat
from engine.api.server import ApiServer
from engine.protocol.messages import Generate, LoadModel, LoadOptions, ModelLoaded, ReplyFailed, ReplyFinished, TokenStreamed
from engine.service.fanout import EngineHub

QUESTION = "Tell me a long story about a dragon who learns to cook, with many details."
TIMEOUT_S = 300


@dataclass(frozen=True)
class Timing:
    ttft_ms: float  # from sending the request to the first piece of text
    decode_ms: float  # from the first piece of text to the last
    pieces: int
    text: str


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    serve_api = commands.add_parser("serve-api", help="time to first token and decode time through the API server")
    serve_api.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    serve_api.add_argument("--new-tokens", type=int, default=64)
    serve_api.add_argument("--rounds", type=int, default=5, help="direct and served requests, taking turns")
    return serve_api


def run(args: argparse.Namespace, show) -> dict[str, Any]:
    hub = EngineHub()
    hub.start()
    try:
        loaded = _load(hub, args.model, args.device)
        server = ApiServer(hub, ServerConfig(port=0))
        server.start()
        try:
            return _rounds(hub, server, loaded, args, show)
        finally:
            server.stop()
    finally:
        hub.stop()


def _load(hub: EngineHub, path: str, device: str) -> ModelLoaded:
    loaded = hub.load_and_wait(LoadModel("bench-load", path, LoadOptions(device=device)), TIMEOUT_S)
    if not isinstance(loaded, ModelLoaded):
        raise RuntimeError(loaded.message)
    return loaded


def _rounds(hub: EngineHub, server: ApiServer, loaded: ModelLoaded, args: argparse.Namespace, show) -> dict[str, Any]:
    body = {"model": loaded.name, "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": args.new_tokens, "temperature": 0, "stream": True}
    ask = parse_chat(body, loaded.name, loaded.context_length)
    direct_run = lambda: _direct(hub, Generate("", conversation_key(ask), ask.messages, ask.sampling, "stop"))
    served_run = lambda: _served(server, body)
    direct_run(), served_run()  # warm-up: the first fills the conversation's cache
    direct, served = [], []
    for index in range(args.rounds):
        direct.append(direct_run())
        served.append(served_run())
        show({"round": index + 1, "direct_ttft_ms": round(direct[-1].ttft_ms, 2), "served_ttft_ms": round(served[-1].ttft_ms, 2),
              "direct_decode_ms": round(direct[-1].decode_ms, 1), "served_decode_ms": round(served[-1].decode_ms, 1)})
    return _summary(args, loaded, direct, served)


def _summary(args: argparse.Namespace, loaded: ModelLoaded, direct: list[Timing], served: list[Timing]) -> dict[str, Any]:
    median = lambda runs, key: statistics.median(getattr(run, key) for run in runs)
    direct_decode, served_decode = median(direct, "decode_ms"), median(served, "decode_ms")
    return {
        "model": args.model, "device": loaded.device, "precision": loaded.precision, "rounds": args.rounds,
        "new_tokens": args.new_tokens, "pieces": served[0].pieces,
        "direct_ttft_ms": round(median(direct, "ttft_ms"), 2), "served_ttft_ms": round(median(served, "ttft_ms"), 2),
        "ttft_added_ms": round(statistics.median(s.ttft_ms - d.ttft_ms for d, s in zip(direct, served)), 2),
        "direct_decode_ms": round(direct_decode, 1), "served_decode_ms": round(served_decode, 1),
        "decode_time_ratio": round(served_decode / direct_decode, 3) if direct_decode else None,
        "same_text": all(run.text == direct[0].text for run in direct + served),
    }


def _direct(hub: EngineHub, request: Generate) -> Timing:
    """The engine's own figures: events timed as the engine thread hands them over (no asyncio, no HTTP)."""
    arrivals: queue.Queue = queue.Queue()
    stamped = lambda event: arrivals.put((time.perf_counter(), event))
    request_id = uuid.uuid4().hex
    started = time.perf_counter()
    hub.submit(Generate(request_id, request.conversation_id, request.messages, request.sampling, "stop"), stamped)
    stamps, text = [], ""
    while True:
        at, event = arrivals.get(timeout=TIMEOUT_S)
        if isinstance(event, TokenStreamed) and event.text:
            stamps.append(at)
            text += event.text
        elif isinstance(event, ReplyFailed):
            raise RuntimeError(event.message)
        elif isinstance(event, ReplyFinished):
            return _timing(started, stamps, text)


def _served(server: ApiServer, body: dict) -> Timing:
    """Over HTTP with a plain client reading server-sent events line by line."""
    connection = http.client.HTTPConnection("127.0.0.1", server.config.port, timeout=TIMEOUT_S)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"the server answered {response.status}: {response.read().decode()[:300]}")
    stamps, text = [], ""
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        piece = json.loads(line[6:])["choices"][0]["delta"].get("content")
        if piece:
            stamps.append(time.perf_counter())
            text += piece
    connection.close()
    return _timing(started, stamps, text)


def _timing(started: float, stamps: list[float], text: str) -> Timing:
    if not stamps:
        raise RuntimeError("the model replied with no text")
    return Timing((stamps[0] - started) * 1000, (stamps[-1] - stamps[0]) * 1000, len(stamps), text)
