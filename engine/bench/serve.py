"""``python -m engine.bench serve``: many requests at once through the batch runner (main thread, as the engine's).

Each concurrency level starts that many greedy requests together (end-of-sequence
ignored) on a fresh KV pool and runs the engine's own ``BatchRunner`` until all
finish. ``--shared-prefix N`` starts every prompt with the same N tokens; ``--join``
lets 7 streams run, then a request with ``--join-tokens`` prompt tokens arrives, and
reports its time to first token against its time alone and the running streams'
inter-token times while it is prefilled. ``--constrained-half`` decodes every other
request under ``BENCH_SCHEMA`` (a JSON schema long enough to fill ``--new-tokens``), so
constrained and free requests share the batch as they do behind the API server.

``aggregate_decode_tok_s`` counts every token after each request's first over the whole
run, prefills of later requests included; ``steady_decode_tok_s`` counts the stretch in
which all of them were decoding, which is what llama.cpp's batched figure measures.

llama.cpp's batched decode on the same file, when the peer is set up, is added to
each level's line by the command (``engine.bench.cli``), from its own process.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from engine.bench.measure import filler_prompt
from engine.chat.prompt import PromptPlan
from engine.host.memory import read_memory
from engine.models.loading import LoadedModel
from engine.protocol.messages import Constraint, ReplyFinished, SamplingParams, TokenStreamed
from engine.scheduler.scheduler import DEFAULT_STEP_TOKENS
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents

JOIN_STREAMS = 7
JOIN_WARM_STEPS = 8  # steps the streams run before the request joins, for their inter-token times alone
BENCH_SCHEMA = {  # at least 64 notes: the grammar stays open for any --new-tokens the bench uses
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
    "required": ["notes"],
}


@dataclass
class _Timeline:
    """Every event, with when it arrived."""

    finished: dict[str, ReplyFinished] = field(default_factory=dict)
    token_times: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def __call__(self, event: Any) -> None:
        if isinstance(event, TokenStreamed):
            self.token_times.setdefault(event.request_id, []).append((event.timestamp, event.tokens_generated))
        elif isinstance(event, ReplyFinished):
            self.finished[event.request_id] = event

    def generated_by(self, request_id: str, moment: float) -> int:
        """Tokens ``request_id`` had generated at ``moment``."""
        return max((count for at, count in self.token_times.get(request_id, []) if at <= moment), default=0)

    def steady_tok_s(self) -> float:
        """Tokens per second across requests while every one of them was decoding: from the last first token
        to the first finish (as llama.cpp's batched figure counts decode steps alone); 0 when that never held."""
        starts = [times[0][0] for times in self.token_times.values() if times]
        ends = [reply.stats.finished_at for reply in self.finished.values()]
        begin, end = max(starts, default=0.0), min(ends, default=0.0)
        if end <= begin:
            return 0.0
        tokens = sum(self.generated_by(r, end) - self.generated_by(r, begin) for r in self.token_times)
        return tokens / (end - begin)

    def gaps_ms(self, request_id: str, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """Milliseconds per token between successive pieces of text of one request."""
        times = self.token_times.get(request_id, [])
        return [(t2 - t1) * 1000 / (n2 - n1) for (t1, n1), (t2, n2) in zip(times, times[1:])
                if n2 > n1 and since <= t1 and t2 <= until]


class _Bench:
    """One fresh runner over the loaded model, requests added and stepped to the end."""

    def __init__(self, loaded: LoadedModel, new_tokens: int, step_tokens: int = DEFAULT_STEP_TOKENS) -> None:
        self.loaded = replace(loaded, eos_ids=frozenset())
        self.sampling = SamplingParams(temperature=0, max_new_tokens=new_tokens)
        self.timeline = _Timeline()
        self.cancelled: set[str] = set()
        self.runner = BatchRunner(self.loaded, self.timeline, self.cancelled.__contains__, step_tokens=step_tokens)
        self.peak = (0, 0)  # (bytes of blocks in use, ideal bytes) when most blocks were in use

    def add(self, request_id: str, prompt_ids: list[int], new_tokens: int | None = None,
            constraint: Constraint | None = None) -> None:
        sampling = self.sampling if new_tokens is None else replace(self.sampling, max_new_tokens=new_tokens)
        events = ReplyEvents(self.timeline, request_id, PromptPlan(prompt_ids, ()), 0.0,
                             self.loaded.context_length, time.perf_counter())
        self.runner.add(request_id, request_id, prompt_ids, sampling, events, constraint)

    def step(self) -> None:
        self.runner.step(lambda held: read_memory(self.loaded.device, 0, held, 0))
        used = self.runner.scheduler.pool.used_blocks * self.runner.bytes_per_block
        if used > self.peak[0]:
            per_token = self.runner.bytes_per_block // self.runner.scheduler.pool.block_size
            self.peak = (used, self.runner.scheduler.held_tokens() * per_token)

    def run_until(self, done: Callable[[], bool]) -> None:
        while self.runner.has_work and not done():
            self.step()


def prompts_for(loaded: LoadedModel, count: int, prompt_tokens: int, shared_prefix: int) -> list[list[int]]:
    """``count`` prompts of ``prompt_tokens`` tokens that differ after their first ``shared_prefix``."""
    filler = filler_prompt(loaded.tokenize, prompt_tokens * 2 + shared_prefix)
    prompts = []
    for index in range(count):
        own = loaded.tokenize(f" Request {index}: ") + filler[shared_prefix + index :]
        prompts.append((filler[:shared_prefix] + own)[: max(prompt_tokens, shared_prefix + 4)])
    return prompts


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def run_level(loaded: LoadedModel, concurrency: int, prompt_tokens: int, new_tokens: int, shared_prefix: int,
              constrained_half: bool = False) -> dict[str, Any]:
    """One concurrency level; with ``constrained_half`` every odd request decodes under ``BENCH_SCHEMA``."""
    bench = _Bench(loaded, new_tokens)
    schema = Constraint("json_schema", json.dumps(BENCH_SCHEMA))
    for index, prompt in enumerate(prompts_for(loaded, concurrency, prompt_tokens, shared_prefix)):
        bench.add(f"r{index}", prompt, constraint=schema if constrained_half and index % 2 else None)
    bench.run_until(lambda: False)
    stats = [reply.stats for reply in bench.timeline.finished.values()]
    span = max(s.finished_at for s in stats) - min(s.started_at + s.ttft_ms / 1000 for s in stats)
    gaps = [gap for request_id in bench.timeline.finished for gap in bench.timeline.gaps_ms(request_id)]
    ttfts = [s.ttft_ms for s in stats]
    return {
        "concurrency": concurrency, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "shared_prefix": shared_prefix,
        "constrained": concurrency // 2 if constrained_half else 0,
        "aggregate_decode_tok_s": round(sum(s.tokens_generated - 1 for s in stats) / span, 1),
        "steady_decode_tok_s": round(bench.timeline.steady_tok_s(), 1),
        "per_request_decode_tok_s": round(statistics.median(s.decode_tok_s for s in stats), 1),
        "ttft_ms_p50": round(_percentile(ttfts, 0.5), 1), "ttft_ms_p99": round(_percentile(ttfts, 0.99), 1),
        "itl_ms_p50": round(_percentile(gaps, 0.5), 2), "itl_ms_p99": round(_percentile(gaps, 0.99), 2),
        "kv_bytes": bench.peak[0], "kv_bytes_ideal": bench.peak[1],
        "kv_block_bytes": bench.runner.bytes_per_block,
    }


def run_join(loaded: LoadedModel, prompt_tokens: int, join_tokens: int, step_tokens: int = DEFAULT_STEP_TOKENS) -> dict[str, Any]:
    """Its time to first token alone, then joining ``JOIN_STREAMS`` streams, and theirs meanwhile."""
    joiner = prompts_for(loaded, 1, join_tokens, 0)[0]
    alone = _Bench(loaded, 1)
    alone.add("joiner", joiner)
    alone.run_until(lambda: False)
    idle_ttft = alone.timeline.finished["joiner"].stats.ttft_ms
    bench = _Bench(loaded, 100_000, step_tokens)
    streams = [f"s{i}" for i in range(JOIN_STREAMS)]
    for request_id, prompt in zip(streams, prompts_for(loaded, JOIN_STREAMS, prompt_tokens, 0)):
        bench.add(request_id, prompt)
    bench.run_until(lambda: all(len(bench.timeline.token_times.get(s, ())) > JOIN_WARM_STEPS for s in streams))
    joined_at = time.perf_counter()
    bench.add("joiner", joiner, new_tokens=1)
    bench.run_until(lambda: "joiner" in bench.timeline.finished)
    first_token_at = time.perf_counter()
    bench.cancelled.update(streams)
    bench.run_until(lambda: False)
    before = [g for s in streams for g in bench.timeline.gaps_ms(s, until=joined_at)]
    during = [g for s in streams for g in bench.timeline.gaps_ms(s, since=joined_at, until=first_token_at)]
    ttft = bench.timeline.finished["joiner"].stats.ttft_ms
    median = _percentile(before, 0.5)
    return {
        "join": True, "running_streams": JOIN_STREAMS, "step_tokens": step_tokens, "join_prompt_tokens": len(joiner),
        "join_ttft_ms": round(ttft, 1), "join_idle_ttft_ms": round(idle_ttft, 1),
        "join_ttft_ratio": round(ttft / idle_ttft, 2),
        "running_itl_ms_p50": round(median, 2), "running_itl_ms_p99_while_joining": round(_percentile(during, 0.99), 2),
        "itl_p99_over_p50": round(_percentile(during, 0.99) / median, 2) if median else None,
    }
