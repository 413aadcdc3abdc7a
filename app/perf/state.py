"""What the performance panel knows, built only from the engine's events.

``PerfState.apply(event)`` folds one event into plain fields in O(1) time; it has
no Qt and does no drawing, so it is cheap to call for every streamed token and
easy to test. It runs on the GUI thread (the events arrive there from the
engine client). The few derived figures (prefill tokens/s, session throughput,
context in use) are simple arithmetic on figures the engine sent.

While a reply streams, its figures come from its own events, so they agree with
each other: time to first token from the request (``track``, on the engine's
``perf_counter`` clock, which the engine thread in this process shares) to its
first ``TokenStreamed``; decode speed over the last ``RATE_WINDOW_S`` of its
tokens; the throughput of all replies is the sum of those rates whenever every
running reply is one of this window's (else the engine's own figure, e.g. with API
requests in the batch); the KV bytes of the chat are its tokens' blocks in the
pool. ``ReplyFinished`` then replaces them with the engine's final figures.

Several replies may stream at once, one per conversation. Each in-flight reply has
its own ``ReplyPerf``; ``track`` says which conversation a request answers, and
``focus`` which conversation is on screen: ``reply`` is that conversation's latest
reply (with no focus, the latest reply of all), and only its tokens feed the decode
chart. ``batch`` is the engine's last ``BatchSampled``: the whole batch and its KV pool.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field

from app.perf.series import RollingSeries
from engine.protocol.messages import (
    BatchSampled,
    Event,
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    PrefillDone,
    PromptProgress,
    RemoteFigures,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)

DECODE_WINDOW_S = 120.0
MEMORY_WINDOW_S = 300.0
CHART_POINTS = 400  # about one point per pixel of a docked chart; closer samples merge
RATE_WINDOW_S = 3.0  # as the batch runner's own throughput window


@dataclass
class ModelInfo:
    """The loaded model as the engine described it."""

    name: str
    device: str
    precision: str
    context_length: int
    server: str = ""  # the remote server's address, "" for a model in this process
    kv_cache: str = ""  # "bf16", "int8", …; "" for a remote model
    draft_model: str = ""  # the model drafting for this one, "" for none


@dataclass
class ReplyPerf:
    """Figures of the reply in progress, or of the last one once it finished."""

    request_id: str
    waiting: bool = False
    """True from the request until the engine begins it (it may wait for room in the batch)."""
    reading: tuple[int, int] | None = None
    """(tokens read, prompt tokens) while the engine reads a long prompt, before ``PrefillDone``."""
    tokenize_ms: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_ms: float = 0.0
    context_length: int = 0
    dropped_turns: tuple[int, ...] = ()
    tokens_generated: int = 0
    decode_tok_s: float | None = None
    ttft_ms: float | None = None
    decode_ms: float | None = None
    finish_reason: str | None = None
    failure: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    remote: RemoteFigures | None = None
    requested_at: float | None = None
    """``perf_counter`` when the request was sent (None when not tracked)."""
    kv_bytes: int | None = None
    """The KV cache this reply's conversation holds, once the engine said so."""
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0
    """Speculative drafts' tokens proposed and said, and the steps that said tokens, once the reply finished."""
    recent: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    """(timestamp, tokens generated) of the tokens of the last ``RATE_WINDOW_S``."""

    @property
    def recent_tok_s(self) -> float | None:
        """Tokens per second over the last ``RATE_WINDOW_S`` (None before two tokens)."""
        if len(self.recent) < 2:
            return None
        (first_at, first_count), (last_at, last_count) = self.recent[0], self.recent[-1]
        return (last_count - first_count) / (last_at - first_at) if last_at > first_at else None

    def add_token(self, timestamp: float, tokens_generated: int) -> None:
        if self.ttft_ms is None and self.requested_at is not None:
            self.ttft_ms = max(0.0, (timestamp - self.requested_at) * 1000)
        self.tokens_generated = tokens_generated
        self.token_times.append(timestamp)
        self.recent.append((timestamp, tokens_generated))
        while self.recent[0][0] < timestamp - RATE_WINDOW_S:
            self.recent.popleft()

    @property
    def new_tokens(self) -> int:
        """Prompt tokens that had to be prefilled (not found in the cache)."""
        return self.prompt_tokens - self.reused_tokens

    @property
    def prefill_tok_s(self) -> float | None:
        if self.prefill_ms <= 0 or self.new_tokens <= 0:
            return None
        return self.new_tokens / (self.prefill_ms / 1000)

    @property
    def context_in_use(self) -> int:
        return self.prompt_tokens + self.tokens_generated

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def take_stats(self, stats: RequestStats) -> None:
        """Overwrite with the engine's final, authoritative figures."""
        self.waiting = False
        self.tokenize_ms = stats.tokenize_ms
        self.prompt_tokens = stats.prompt_tokens
        self.reused_tokens = stats.reused_tokens
        self.prefill_ms = stats.prefill_ms
        self.context_length = stats.context_length
        self.dropped_turns = stats.dropped_turns
        self.tokens_generated = stats.tokens_generated
        self.decode_tok_s = stats.decode_tok_s
        self.ttft_ms = stats.ttft_ms
        self.decode_ms = stats.decode_ms
        self.finish_reason = stats.finish_reason
        self.started_at = stats.started_at
        self.finished_at = stats.finished_at
        self.remote = stats.remote
        self.kv_bytes = None if stats.remote else stats.memory.kv_bytes_conversation
        self.drafted_tokens = stats.drafted_tokens
        self.accepted_tokens = stats.accepted_tokens
        self.decode_steps = stats.decode_steps


@dataclass
class SessionPerf:
    """Totals over the replies finished since the model was loaded."""

    replies: int = 0
    tokens_generated: int = 0
    decode_ms: float = 0.0

    @property
    def throughput_tok_s(self) -> float | None:
        if self.decode_ms <= 0:
            return None
        return self.tokens_generated / (self.decode_ms / 1000)

    def add(self, stats: RequestStats) -> None:
        self.replies += 1
        self.tokens_generated += stats.tokens_generated
        self.decode_ms += stats.decode_ms


class PerfState:
    """Everything the panel shows; ``apply`` returns whether the event changed it."""

    def __init__(self) -> None:
        self.model: ModelInfo | None = None
        self.session = SessionPerf()
        self.memory: MemoryStats | None = None
        self.batch: BatchSampled | None = None
        self.now: float | None = None
        self.focus: str | None = None
        """The conversation on screen (None: follow the latest reply, whichever conversation it answers)."""
        self._live: dict[str, ReplyPerf] = {}
        """The replies in flight, by request id."""
        self._latest: dict[str, ReplyPerf] = {}
        """The latest reply of each conversation, by conversation id ("" for requests never tracked)."""
        self._conversation_of: dict[str, str] = {}
        """The conversation of each tracked request in flight."""
        self._latest_key: str | None = None
        self.decode_speed = RollingSeries(DECODE_WINDOW_S, DECODE_WINDOW_S / CHART_POINTS)
        self.batch_throughput = RollingSeries(DECODE_WINDOW_S, DECODE_WINDOW_S / CHART_POINTS)
        self.device_used = RollingSeries(MEMORY_WINDOW_S, MEMORY_WINDOW_S / CHART_POINTS)
        self.process_rss = RollingSeries(MEMORY_WINDOW_S, MEMORY_WINDOW_S / CHART_POINTS)

    def apply(self, event: Event) -> bool:
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return False
        handler(self, event)
        return True

    @property
    def reply(self) -> ReplyPerf | None:
        """The reply whose figures are shown: the latest of the conversation on screen."""
        key = self._latest_key if self.focus is None else self.focus
        return self._latest.get(key) if key is not None else None

    @property
    def context_length(self) -> int | None:
        reply = self.reply
        if reply is not None and reply.context_length > 0:
            return reply.context_length
        return self.model.context_length if self.model is not None else None

    def track(self, request_id: str, conversation_id: str) -> bool:
        """``request_id`` answers ``conversation_id`` (told before its first event); True if that one is shown."""
        self._conversation_of[request_id] = conversation_id
        self._begin(ReplyPerf(request_id=request_id, waiting=True, requested_at=time.perf_counter()))
        return self.is_shown(request_id)

    @property
    def throughput_tok_s(self) -> float | None:
        """Tokens per second of all replies: from their tokens while this window streams every one of them."""
        if self.batch is None:
            return None
        if self.batch.running == 0:
            return 0.0  # the engine's figure then is of its last window, when replies still ran
        streaming = [reply for reply in self._live.values() if reply.tokens_generated > 0]
        rates = [reply.recent_tok_s for reply in streaming]
        if self.batch.running == len(streaming) > 0 and None not in rates:
            return sum(rate for rate in rates if rate is not None)
        return self.batch.throughput_tok_s

    @property
    def reply_decode_tok_s(self) -> float | None:
        """The shown reply's decode speed: over its last tokens while it streams, the engine's figure after."""
        reply = self.reply
        if reply is None:
            return None
        return reply.decode_tok_s if reply.done else reply.recent_tok_s or reply.decode_tok_s

    @property
    def kv_total_bytes(self) -> int | None:
        """KV cache of all kept chats: the pool's blocks in use and cached when batching, else the engine's figure."""
        if self.batch is not None:
            pool = self.batch.pool
            return (pool.blocks_used + pool.blocks_cached) * pool.bytes_per_block
        return self.memory.kv_bytes_total if self.memory is not None else None

    @property
    def reply_kv_bytes(self) -> int | None:
        """KV cache the shown reply's conversation holds: the engine's figure, or its tokens' blocks while it runs."""
        reply = self.reply
        if reply is None:
            return None
        if reply.kv_bytes is not None or self.batch is None:
            return reply.kv_bytes
        pool = self.batch.pool
        return math.ceil(reply.context_in_use / pool.block_size) * pool.bytes_per_block

    def show_conversation(self, conversation_id: str) -> None:
        if conversation_id != self.focus:
            self.focus = conversation_id
            self.decode_speed.break_line()

    def is_shown(self, request_id: str) -> bool:
        """Whether ``request_id`` is the reply whose figures are shown."""
        reply = self.reply
        return reply is not None and reply.request_id == request_id

    def _begin(self, reply: ReplyPerf) -> None:
        key = self._conversation_of.get(reply.request_id, "")
        self._live[reply.request_id] = reply
        self._latest[key] = reply
        self._latest_key = key

    def _end(self, request_id: str) -> ReplyPerf:
        """Take ``request_id`` out of the replies in flight (one that was never begun is begun, to hold its end)."""
        if request_id not in self._live:
            self._begin(ReplyPerf(request_id=request_id))
        self._conversation_of.pop(request_id, None)
        return self._live.pop(request_id)

    def _model_loaded(self, event: ModelLoaded) -> None:
        self.model = ModelInfo(event.name, event.device, event.precision, event.context_length, event.server,
                               event.kv_cache, event.draft_model)
        self.memory = None if event.server else event.memory  # a remote model's memory is the server's: unknown here
        self.batch = None
        self._live.clear()
        self._latest.clear()
        self._conversation_of.clear()
        self._latest_key = None
        self.session = SessionPerf()

    def _prompt_progress(self, event: PromptProgress) -> None:
        reply = self._live.get(event.request_id)
        if reply is not None:
            reply.reading = (event.computed_tokens, event.prompt_tokens)

    def _prefill_done(self, event: PrefillDone) -> None:
        asked = self._live.get(event.request_id)
        self._begin(
            ReplyPerf(
                request_id=event.request_id,
                requested_at=asked.requested_at if asked is not None else None,
                tokenize_ms=event.tokenize_ms,
                prompt_tokens=event.prompt_tokens,
                reused_tokens=event.reused_tokens,
                prefill_ms=event.prefill_ms,
                context_length=event.context_length,
                dropped_turns=event.dropped_turns,
            )
        )
        if self.is_shown(event.request_id):
            self.decode_speed.break_line()

    def _token_streamed(self, event: TokenStreamed) -> None:
        reply = self._live.get(event.request_id)
        if reply is None:
            return
        reply.decode_tok_s = event.decode_tok_s
        reply.add_token(event.timestamp, event.tokens_generated)
        rate = reply.recent_tok_s
        if reply is self.reply and rate is not None:
            self.decode_speed.add(event.timestamp, rate)
        self._advance_clock(event.timestamp)

    def _reply_finished(self, event: ReplyFinished) -> None:
        self._end(event.request_id).take_stats(event.stats)
        self.session.add(event.stats)
        if event.stats.remote is None:
            self.memory = event.stats.memory
        self._advance_clock(event.stats.finished_at)

    def _reply_failed(self, event: ReplyFailed) -> None:
        if event.request_id in self._live:
            reply = self._end(event.request_id)
            reply.waiting = False
            reply.finish_reason = "error"
            reply.failure = event.message

    def _memory_sampled(self, event: MemorySampled) -> None:
        self.memory = event.memory
        self.device_used.add(event.timestamp, event.memory.device_used_bytes)
        self.process_rss.add(event.timestamp, event.memory.process_rss_bytes)
        self._advance_clock(event.timestamp)

    def _batch_sampled(self, event: BatchSampled) -> None:
        self.batch = event
        self.batch_throughput.add(event.timestamp, self.throughput_tok_s or 0.0)
        self._advance_clock(event.timestamp)

    def _advance_clock(self, timestamp: float) -> None:
        if self.now is None or timestamp > self.now:
            self.now = timestamp


_HANDLERS = {
    ModelLoaded: PerfState._model_loaded,
    PromptProgress: PerfState._prompt_progress,
    PrefillDone: PerfState._prefill_done,
    TokenStreamed: PerfState._token_streamed,
    ReplyFinished: PerfState._reply_finished,
    ReplyFailed: PerfState._reply_failed,
    MemorySampled: PerfState._memory_sampled,
    BatchSampled: PerfState._batch_sampled,
}
