"""What the benchmark measures, callable from tests (engine thread, or the bench's main thread).

Every figure comes from the engine's own path: ``DecodeLoop`` over the loaded
model's backend, prompts planned by ``prompt.plan_prompt``. The baseline is plain
``model.generate()`` on a transformers model, timed through a streamer.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import torch

from engine.chat.generation import CachedSequence, DecodeLoop, crop_sequence, feed
from engine.chat.prompt import plan_prompt, reply_budget
from engine.models.loading import LoadedModel
from engine.protocol.messages import GREEDY, ChatMessage

TOPICS = (
    "how bread rises", "why the sky is blue", "how a bicycle stays upright", "what a compiler does",
    "how tides work", "why leaves change colour", "how vaccines train the body", "what makes music sound sad",
    "how bees find flowers", "why ice floats", "how a refrigerator cools", "what causes thunder",
    "how maps are drawn", "why cats purr", "how glass is made", "what a black hole is",
    "how coffee is roasted", "why we dream", "how a sailboat moves upwind", "what keeps planes in the air",
)


@dataclass(frozen=True)
class DecodeFigures:
    ttft_ms: float
    decode_tok_s: float
    text: str


def filler_prompt(tokenize: Any, count: int) -> list[int]:
    """``count`` token ids of ordinary English text."""
    text = " ".join(f"Here is a note about {topic}." for topic in TOPICS)
    ids = tokenize(text)
    while len(ids) < count:
        ids = ids + ids
    return ids[:count]


def measure_engine_decode(loaded: LoadedModel, prompt_ids: Sequence[int], new_tokens: int) -> DecodeFigures:
    """Greedy ``new_tokens`` tokens through the engine's decode loop, end-of-sequence ignored."""
    loop = DecodeLoop(
        loaded.backend, loaded.tokenizer, replace(GREEDY, max_new_tokens=new_tokens), frozenset(),
        loaded.context_length, is_cancelled=lambda: False, on_prefill=lambda *_: None, on_text=lambda *_: None,
    )
    started = time.perf_counter()
    outcome = loop.run(CachedSequence(loaded.backend.new_cache()), list(prompt_ids))
    steps = max(outcome.tokens_generated - 1, 1)
    rate = steps / (outcome.decode_ms / 1000) if outcome.decode_ms > 0 else 0.0
    return DecodeFigures((outcome.first_token_at - started) * 1000, rate, outcome.text)


def measure_prefill_ms(loaded: LoadedModel, prompt_ids: Sequence[int], repeats: int) -> list[float]:
    """Milliseconds to feed ``prompt_ids`` into an empty cache as the decode loop does, once per repeat."""
    device = torch.device(loaded.device)
    times = []
    for _ in range(repeats):
        seq = CachedSequence(loaded.backend.new_cache())
        _sync(device)
        started = time.perf_counter()
        feed(loaded.backend, seq, prompt_ids)
        _sync(device)
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure_cached_ttft_ms(loaded: LoadedModel, context_ids: Sequence[int], new_ids: Sequence[int], repeats: int) -> list[float]:
    """Time to the first token of a reply to ``new_ids`` after ``context_ids``, already cached, once per repeat.

    Each repeat crops the cache back to the context, as a reused conversation does.
    """
    seq = CachedSequence(loaded.backend.new_cache())
    feed(loaded.backend, seq, context_ids)
    loop = DecodeLoop(
        loaded.backend, loaded.tokenizer, replace(GREEDY, max_new_tokens=1), frozenset(), loaded.context_length,
        is_cancelled=lambda: False, on_prefill=lambda *_: None, on_text=lambda *_: None,
    )
    times = []
    for _ in range(repeats):
        crop_sequence(loaded.backend, seq, len(context_ids))
        started = time.perf_counter()
        outcome = loop.run(seq, [*context_ids, *new_ids])
        assert outcome.reused_tokens == len(context_ids), "the cached context was not reused"
        times.append((outcome.first_token_at - started) * 1000)
    return times


def cache_bytes_for(loaded: LoadedModel, prompt_ids: Sequence[int]) -> int:
    """Bytes of the KV cache that holds ``prompt_ids`` (a static cache holds its whole capacity)."""
    seq = CachedSequence(loaded.backend.new_cache())
    feed(loaded.backend, seq, prompt_ids)
    return loaded.backend.cache_bytes(seq.kv)


class _TokenClock:
    """A ``generate()`` streamer that only notes when each new token arrives."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True  # the first call carries the prompt

    def end(self) -> None:
        """Nothing to close: the times are read after ``generate()`` returns."""


@torch.inference_mode()
def measure_hf_generate(model: Any, tokenizer: Any, prompt_ids: Sequence[int], new_tokens: int) -> DecodeFigures:
    """Plain greedy ``model.generate()`` for exactly ``new_tokens`` tokens."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(prompt_ids)], device=device)  # [1, P]
    clock = _TokenClock()
    started = time.perf_counter()
    output = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, streamer=clock, pad_token_id=model.config.pad_token_id or 0,
    )
    span = clock.times[-1] - clock.times[0]
    rate = (len(clock.times) - 1) / span if span > 0 else 0.0
    text = tokenizer.decode(output[0, len(prompt_ids):].tolist(), skip_special_tokens=True)
    return DecodeFigures((clock.times[0] - started) * 1000, rate, text)


def copy_bandwidth(device: torch.device, size_bytes: int = 256 * 1024**2, repeats: int = 5) -> float:
    """Memory traffic of a large tensor copy (bytes read plus bytes written per second), best of ``repeats``."""
    source = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        target.copy_(source)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size_bytes / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start the GPU high-water mark afresh (after loading, which holds two copies of the weights for a while)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """GPU memory high-water mark on CUDA, else the process's peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class TurnReply:
    text: str
    prompt_tokens: int
    reused_tokens: int
    ttft_ms: float


def timed_reply(loaded: LoadedModel, seq: CachedSequence, history: Sequence[ChatMessage], max_new_tokens: int) -> TurnReply:
    """One greedy reply as the runtime makes it: plan the prompt, reuse the cache, decode."""
    started = time.perf_counter()
    sampling = replace(GREEDY, max_new_tokens=max_new_tokens)
    budget = reply_budget(max_new_tokens, loaded.context_length)
    plan = plan_prompt(history, loaded.render, loaded.tokenize, loaded.context_length, budget, "drop_oldest")
    loop = DecodeLoop(
        loaded.backend, loaded.tokenizer, sampling, loaded.eos_ids, loaded.context_length,
        is_cancelled=lambda: False, on_prefill=lambda *_: None, on_text=lambda *_: None,
    )
    outcome = loop.run(seq, plan.token_ids)
    return TurnReply(outcome.text, len(plan.token_ids), outcome.reused_tokens, (outcome.first_token_at - started) * 1000)


def user_message(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return (
        f"Thanks. Next I would like to understand {topic}. Please explain it in plain words for a curious "
        f"twelve-year-old, give one everyday example, and mention one common misunderstanding about {topic}."
    )


def reused_ttft_ms(
    loaded: LoadedModel, seq: CachedSequence, history: Sequence[ChatMessage], repeats: int
) -> list[float]:
    """Time to first token of the next reply, ``repeats`` times from the same cached prefix: each probe prefills
    what the cache lacks and takes one token, then the cache goes back to the prefix it shared."""
    times = []
    for _ in range(repeats):
        probe = timed_reply(loaded, seq, history, 1)
        crop_sequence(loaded.backend, seq, probe.reused_tokens)
        times.append(probe.ttft_ms)
    return times


def run_turns(loaded: LoadedModel, turns: int, max_new_tokens: int, repeats: int) -> Iterator[dict[str, Any]]:
    """Per turn: the reply with the conversation's cache reused, and again from a fresh cache.

    The reused time to first token is the median of the reply's own and ``repeats - 1`` probes before it.
    """
    timed_reply(loaded, CachedSequence(loaded.backend.new_cache()), [ChatMessage("user", "Hi!")], 4)  # warm-up
    history: list[ChatMessage] = []
    conversation = CachedSequence(loaded.backend.new_cache())
    for turn in range(1, turns + 1):
        history.append(ChatMessage("user", user_message(turn - 1)))
        probes = reused_ttft_ms(loaded, conversation, history, repeats - 1)
        reused = timed_reply(loaded, conversation, history, max_new_tokens)
        reused_ttft = statistics.median([*probes, reused.ttft_ms])
        fresh = timed_reply(loaded, CachedSequence(loaded.backend.new_cache()), history, max_new_tokens)
        history.append(ChatMessage("assistant", reused.text))
        yield {
            "turn": turn, "prompt_tokens": reused.prompt_tokens, "reused_tokens": reused.reused_tokens,
            "ttft_ms_reuse": round(reused_ttft, 2), "ttft_ms_fresh": round(fresh.ttft_ms, 2),
            "same_text": reused.text == fresh.text,
        }
