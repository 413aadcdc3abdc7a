"""The server's figures: ``GET /metrics`` in Prometheus text, and one record per request for the app.

Updated and read on the server's loop only (``EngineLink`` feeds it), so it needs no
lock. Names follow Prometheus' conventions (``_total`` counters, seconds, bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.protocol.messages import BatchSampled, MemorySampled

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RequestState = Literal["waiting", "reading", "running", "done", "cancelled", "failed"]


@dataclass(frozen=True)
class ServerRequestInfo:
    """One API request as the app's performance panel lists it (text and numbers only). While a long prompt is read
    over several steps (``PromptProgress``) its state is "reading", ``read_tokens`` of its ``prompt_tokens`` in."""

    request_id: str
    client: str  # the peer's address and its User-Agent, e.g. "127.0.0.1 · OpenAI/Python 3.51.0"
    endpoint: str
    state: RequestState
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    tok_s: float = 0.0
    read_tokens: int = 0


@dataclass
class ServerMetrics:
    """Counters and gauges since the server started."""

    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    kv_bytes: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0

    def first_token(self, seconds: float) -> None:
        self.ttft_sum_s += seconds
        self.ttft_count += 1
        for index, bound in enumerate(TTFT_BUCKETS_S):
            if seconds <= bound:
                self.ttft_counts[index] += 1

    def finished(self, outcome: str, info: ServerRequestInfo) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.prompt_tokens += info.prompt_tokens
        self.cached_tokens += info.cached_tokens
        self.generation_tokens += info.completion_tokens

    def sampled(self, event: MemorySampled | BatchSampled) -> None:
        if isinstance(event, MemorySampled):
            self.kv_bytes = event.memory.kv_bytes_total
        else:
            pool = event.pool
            self.kv_blocks_used, self.kv_blocks_total = pool.blocks_used, pool.blocks_total
            self.kv_bytes = (pool.blocks_used + pool.blocks_cached) * pool.bytes_per_block  # as MemorySampled counts

    def render(self) -> str:
        lines: list[str] = []
        gauges_and_counters = (
            ("hearth_requests_running", "gauge", "Requests the engine is answering now.", self.running),
            ("hearth_requests_waiting", "gauge", "Requests queued for the engine.", self.waiting),
            ("hearth_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", self.prompt_tokens),
            ("hearth_prompt_tokens_cached_total", "counter", "Prompt tokens taken from the KV cache.", self.cached_tokens),
            ("hearth_generation_tokens_total", "counter", "Tokens generated for finished requests.", self.generation_tokens),
        )
        for name, kind, help_text, value in gauges_and_counters:
            _metric(lines, name, kind, help_text, value)
        _header(lines, "hearth_requests_total", "counter", "Finished requests by how they ended.")
        lines += [f'hearth_requests_total{{outcome="{name}"}} {count}' for name, count in sorted(self.outcomes.items())]
        self._render_ttft(lines)
        _metric(lines, "hearth_kv_cache_bytes", "gauge", "Bytes of KV cache held: blocks in use and cached prefixes.", self.kv_bytes)
        usage = self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
        _metric(lines, "hearth_kv_cache_usage_ratio", "gauge", "Share of the KV block pool in use (0 without one).", usage)
        return "\n".join(lines) + "\n"

    def _render_ttft(self, lines: list[str]) -> None:
        name = "hearth_time_to_first_token_seconds"
        _header(lines, name, "histogram", "From the request's arrival to its first token, queueing included.")
        lines += [f'{name}_bucket{{le="{bound}"}} {count}' for bound, count in zip(TTFT_BUCKETS_S, self.ttft_counts)]
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.ttft_count}')
        lines += [f"{name}_sum {self.ttft_sum_s:.6f}", f"{name}_count {self.ttft_count}"]


def _header(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


def _metric(lines: list[str], name: str, kind: str, help_text: str, value: float) -> None:
    _header(lines, name, kind, help_text)
    lines.append(f"{name} {value}")
