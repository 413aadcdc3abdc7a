"""``serve-api --clients N``: N streaming clients at once through the API server, against N requests at once
straight into the engine (main thread, client threads of its own).

Each round sends N different greedy questions both ways, in turns: submitted
together to the engine thread (``EngineHub.submit``, as ``engine.bench serve``'s
requests enter the batch runner), and as N HTTP clients in threads of their own,
each reading its server-sent events line by line. Every round uses new questions,
so neither side reuses the other's cached prompts. A side's throughput is the
tokens all of its requests generated over the time from sending the first to the
last one finishing; ``served_over_direct`` is the served figure over the direct one.
"""

from __future__ import annotations

import http.client
import json
import queue
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine.api.server.engine_link import conversation_key
from engine.api.server.openai_schema import parse_chat
from engine.protocol.messages import Generate, ModelLoaded, ReplyFailed, ReplyFinished
from engine.service.fanout import EngineHub

TIMEOUT_S = 300


@dataclass(frozen=True)
class Throughput:
    tokens: int
    seconds: float
    completed: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def chat_body(loaded: ModelLoaded, question: str, new_tokens: int) -> dict[str, Any]:
    return {"model": loaded.name, "messages": [{"role": "user", "content": question}],
            "max_tokens": new_tokens, "temperature": 0, "stream": True}


def direct(hub: EngineHub, loaded: ModelLoaded, bodies: list[dict[str, Any]]) -> Throughput:
    """Every request submitted to the engine thread at once; done when each has finished."""
    ended: queue.Queue = queue.Queue()
    started = time.perf_counter()
    for body in bodies:
        ask = parse_chat(body, loaded.name, loaded.context_length)
        request = Generate(uuid.uuid4().hex, conversation_key(ask), ask.messages, ask.sampling, "stop")
        hub.submit(request, lambda event: ended.put((time.perf_counter(), event))
                   if isinstance(event, (ReplyFinished, ReplyFailed)) else None)
    results = [ended.get(timeout=TIMEOUT_S) for _ in bodies]
    finished = [event for _, event in results if isinstance(event, ReplyFinished)]
    last = max(at for at, _ in results)
    return Throughput(sum(event.stats.tokens_generated for event in finished), last - started, len(finished))


def served(port: int, bodies: list[dict[str, Any]]) -> Throughput:
    """One HTTP client thread per request, all started together; tokens are the chunks' content pieces."""
    results: list[tuple[float, int] | None] = [None] * len(bodies)
    threads = [threading.Thread(target=_stream, args=(port, body, results, index)) for index, body in enumerate(bodies)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    done = [result for result in results if result is not None]
    last = max((at for at, _ in done), default=started)
    return Throughput(sum(tokens for _, tokens in done), last - started, len(done))


def _stream(port: int, body: dict[str, Any], results: list[tuple[float, int] | None], index: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    connection.request("POST", "/v1/chat/completions", json.dumps(body | {"stream_options": {"include_usage": True}}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    tokens = 0
    for line in response:
        if line.startswith(b"data: {"):
            usage = json.loads(line[6:]).get("usage")
            tokens = usage["completion_tokens"] if usage else tokens
    connection.close()
    if response.status == 200 and tokens:
        results[index] = (time.perf_counter(), tokens)


def compare(hub: EngineHub, port: int, loaded: ModelLoaded, clients: int, new_tokens: int, rounds: int,
            question: str) -> dict[str, Any]:
    """Direct and served rounds in turns (after one warm-up of each); medians of their throughputs."""
    ask = lambda tag: [chat_body(loaded, f"{tag}, request {index + 1}: {question}", new_tokens) for index in range(clients)]
    direct(hub, loaded, ask("Warm-up direct")), served(port, ask("Warm-up served"))
    direct_runs, served_runs = [], []
    for index in range(rounds):
        direct_runs.append(direct(hub, loaded, ask(f"Round {index + 1} direct")))
        served_runs.append(served(port, ask(f"Round {index + 1} served")))
    direct_tok_s = statistics.median(run.tok_s for run in direct_runs)
    served_tok_s = statistics.median(run.tok_s for run in served_runs)
    return {
        "clients": clients, "new_tokens": new_tokens, "rounds": rounds,
        "direct_aggregate_tok_s": round(direct_tok_s, 1), "served_aggregate_tok_s": round(served_tok_s, 1),
        "served_over_direct": round(served_tok_s / direct_tok_s, 3) if direct_tok_s else 0.0,
        "served_completed": min(run.completed for run in served_runs),
        "served_ratios": [round(s.tok_s / d.tok_s, 3) if d.tok_s else 0.0 for d, s in zip(direct_runs, served_runs)],
    }
