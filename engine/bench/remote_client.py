"""``python -m engine.bench remote``: Hearth's remote client against a bare one, on the same server (main thread).

Each round streams the same greedy reply twice, taking turns: through Hearth's
remote runtime on its own engine thread (the path the app uses: engine thread,
reader thread, events handed over), and through a bare ``http.client`` loop on
the calling thread (the baseline). Both are timed alike on the calling thread:
time to the first text, and text pieces per second after it. The server's own
decode speed is shown when it reports one (llama.cpp's ``timings``). One bare
reply before the rounds warms the server up (its first prefill is not counted).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import statistics
import time
import urllib.parse
import uuid
from typing import Any, Callable

from engine.api.remote.openai_stream import CHAT_PATH, chat_request
from engine.api.remote.http_stream import normalize_base_url
from engine.api.remote.runtime import RemoteRuntime
from engine.protocol.messages import (
    ChatMessage,
    Generate,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service.worker import EngineThread

PROMPT = (ChatMessage("user", "Write a long story about a lighthouse keeper and a storm."),)
REPLY_TIMEOUT_S = 300.0

Timing = dict[str, float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the server's address, e.g. http://localhost:8080")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--model", required=True, help="the model's id on the server")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5, help="Hearth and bare client runs, taking turns")
    parser.add_argument("--json", action="store_true", help="JSON lines (else key=value lines)")


def run(args: argparse.Namespace, show: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    server = RemoteServer(normalize_base_url(args.url), args.api_key)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    hearth = _HearthClient(server, args.model)
    rounds: list[dict[str, float]] = []
    try:
        _bare_reply(server, args.model, sampling)  # warm-up: the server's first prefill of the prompt is not counted
        for number in range(1, args.rounds + 1):
            record = {"round": number, **_prefixed("hearth", hearth.reply(sampling))}
            record.update(_prefixed("bare", _bare_reply(server, args.model, sampling)))
            rounds.append(record)
            show(record)
    finally:
        hearth.close()
    return _summary(server.base_url, rounds)


def _prefixed(prefix: str, timing: Timing) -> dict[str, float]:
    return {f"{prefix}_{key}": value for key, value in timing.items()}


def _summary(base_url: str, rounds: list[dict[str, float]]) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(record[key] for record in rounds)

    summary: dict[str, Any] = {"server": base_url, "rounds": len(rounds)}
    for key in ("ttft_ms", "decode_pieces_s"):
        summary[f"hearth_{key}"] = round(median(f"hearth_{key}"), 2)
        summary[f"bare_{key}"] = round(median(f"bare_{key}"), 2)
    summary["ttft_ratio"] = round(summary["hearth_ttft_ms"] / summary["bare_ttft_ms"], 3)
    summary["decode_ratio"] = round(summary["hearth_decode_pieces_s"] / summary["bare_decode_pieces_s"], 3)
    reported = [record["hearth_server_decode_tok_s"] for record in rounds if "hearth_server_decode_tok_s" in record]
    if reported:
        summary["server_decode_tok_s"] = round(statistics.median(reported), 2)
    return summary


def _timing(started: float, piece_times: list[float]) -> Timing:
    if not piece_times:
        raise RuntimeError("the server sent no text")
    decode_s = piece_times[-1] - piece_times[0]
    return {
        "ttft_ms": (piece_times[0] - started) * 1000,
        "decode_pieces_s": (len(piece_times) - 1) / decode_s if decode_s > 0 else 0.0,
        "pieces": float(len(piece_times)),
    }


class _HearthClient:
    """The remote runtime on its engine thread, with the model chosen; events land on a queue here."""

    def __init__(self, server: RemoteServer, model: str) -> None:
        self._events: queue.Queue[object] = queue.Queue()
        self._thread = EngineThread(self._events.put, RemoteRuntime)
        self._thread.start()
        self._thread.submit(LoadModel(uuid.uuid4().hex, model, server=server))
        loaded = self._next((ModelLoaded, LoadFailed))
        if isinstance(loaded, LoadFailed):
            raise RuntimeError(loaded.message)

    def reply(self, sampling: SamplingParams) -> Timing:
        piece_times: list[float] = []
        started = time.perf_counter()
        self._thread.submit(Generate(uuid.uuid4().hex, "bench", PROMPT, sampling))
        while True:
            event = self._next((TokenStreamed, ReplyFinished, ReplyFailed))
            if isinstance(event, TokenStreamed):
                piece_times.append(time.perf_counter())
            elif isinstance(event, ReplyFailed):
                raise RuntimeError(event.message)
            else:
                timing = _timing(started, piece_times)
                remote = event.stats.remote
                if remote is not None and remote.decode_tok_s is not None:
                    timing["server_decode_tok_s"] = remote.decode_tok_s
                return timing

    def close(self) -> None:
        self._thread.stop(5)

    def _next(self, kinds: tuple[type, ...]) -> object:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            event = self._events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, kinds):
                return event


def _bare_reply(server: RemoteServer, model: str, sampling: SamplingParams) -> Timing:
    """The same request read by the simplest loop: one thread, each ``data:`` line parsed as it comes."""
    parts = urllib.parse.urlsplit(server.base_url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    headers = {"Content-Type": "application/json"}
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    body = json.dumps(chat_request(model, PROMPT, sampling))
    piece_times: list[float] = []
    started = time.perf_counter()
    connection = kind(parts.hostname, parts.port, timeout=REPLY_TIMEOUT_S)
    try:
        connection.request("POST", parts.path + CHAT_PATH, body=body, headers=headers)
        for raw in connection.getresponse():
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choices = json.loads(line[len("data:"):]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                piece_times.append(time.perf_counter())
    finally:
        connection.close()
    return _timing(started, piece_times)
