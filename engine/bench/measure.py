"""What the benchmark measures, callable from tests (engine thread, or the bench's main thread).

Every figure of Hearth's comes from the path a user's reply takes: the batch runner
over the loaded model's block pool (``runner_replies``), a single reply as a batch of
one, prompts planned by ``prompt.plan_prompt``. The baseline is plain
``model.generate()`` on a transformers model, timed through a streamer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from engine.bench.runner_replies import Reply, ReplyDriver
from engine.chat.prompt import plan_prompt, reply_budget
from engine.host.memory import peak_rss_bytes
from engine.models.loading import LoadedModel
from engine.protocol.messages import ChatMessage

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
    kv_bytes: int = 0  # the KV blocks the reply held at its end (Hearth's replies; generate() keeps its own)


def filler_prompt(tokenize: Any, count: int) -> list[int]:
    """``count`` token ids of ordinary English text."""
    text = " ".join(f"Here is a note about {topic}." for topic in TOPICS)
    ids = tokenize(text)
    while len(ids) < count:
        ids = ids + ids
    return ids[:count]


def measure_engine_decode(loaded: LoadedModel, prompt_ids: Sequence[int], new_tokens: int) -> DecodeFigures:
    """Greedy ``new_tokens`` tokens as one reply through the batch runner, end-of-sequence ignored."""
    driver = ReplyDriver(loaded, len(prompt_ids) + new_tokens, stop_at_eos=False)
    reply = driver.reply(prompt_ids, new_tokens)
    return DecodeFigures(reply.stats.ttft_ms, reply.stats.decode_tok_s, reply.text,
                         reply.stats.memory.kv_bytes_conversation)


def measure_prefill_ms(loaded: LoadedModel, prompt_ids: Sequence[int], repeats: int) -> list[float]:
    """Milliseconds from a reply's arrival to its first token sampled, for ``prompt_ids`` on an empty pool, once
    per repeat."""
    times = []
    for _ in range(repeats):
        reply = ReplyDriver(loaded, len(prompt_ids) + 1).reply(prompt_ids, 1)
        times.append(reply.stats.prefill_ms)
    return times


def measure_cached_ttft_ms(loaded: LoadedModel, context_ids: Sequence[int], new_ids: Sequence[int], repeats: int) -> list[float]:
    """Time to the first token of a reply to ``new_ids`` after ``context_ids``, which an earlier reply of the same
    conversation left cached, once per repeat (each on a fresh pool holding only the context)."""
    times = []
    for _ in range(repeats):
        driver = ReplyDriver(loaded, len(context_ids) + len(new_ids) + 1)
        driver.reply(context_ids, 1, "chat")
        reply = driver.reply([*context_ids, *new_ids], 1, "chat")
        assert reply.stats.reused_tokens == len(context_ids), "the cached context was not reused"
        times.append(reply.stats.ttft_ms)
    return times


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
    return peak_rss_bytes()


@dataclass(frozen=True)
class TurnReply:
    text: str
    prompt_tokens: int
    reused_tokens: int
    ttft_ms: float


def timed_reply(loaded: LoadedModel, driver: ReplyDriver, history: Sequence[ChatMessage], max_new_tokens: int) -> TurnReply:
    """One greedy reply as the runtime makes it: plan the prompt, reuse what ``driver``'s pool holds, decode."""
    started = time.perf_counter()
    budget = reply_budget(max_new_tokens, loaded.context_length)
    plan = plan_prompt(history, loaded.render, loaded.tokenize, loaded.context_length, budget, "drop_oldest")
    reply: Reply = driver.reply(plan.token_ids, max_new_tokens, "turns")
    first_token_at = reply.stats.started_at + reply.stats.ttft_ms / 1000
    return TurnReply(reply.text, len(plan.token_ids), reply.stats.reused_tokens, (first_token_at - started) * 1000)


def user_message(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return (
        f"Thanks. Next I would like to understand {topic}. Please explain it in plain words for a curious "
        f"twelve-year-old, give one everyday example, and mention one common misunderstanding about {topic}."
    )


def run_turns(loaded: LoadedModel, turns: int, max_new_tokens: int, repeats: int) -> Iterator[dict[str, Any]]:
    """Per turn: the reply with the conversation's blocks reused, and again on a fresh pool.

    The conversation runs in ``repeats`` copies, each its own runner given the same history; the reused time to
    first token is the median of the copies' replies, and the history goes on with the first copy's reply.
    """
    positions = loaded.context_length
    timed_reply(loaded, ReplyDriver(loaded, positions), [ChatMessage("user", "Hi!")], 4)  # warm-up
    history: list[ChatMessage] = []
    copies = [ReplyDriver(loaded, positions) for _ in range(max(repeats, 1))]
    for turn in range(1, turns + 1):
        history.append(ChatMessage("user", user_message(turn - 1)))
        replies = [timed_reply(loaded, copy, history, max_new_tokens) for copy in copies]
        reused = replies[0]
        fresh = timed_reply(loaded, ReplyDriver(loaded, positions), history, max_new_tokens)
        history.append(ChatMessage("assistant", reused.text))
        yield {
            "turn": turn, "prompt_tokens": reused.prompt_tokens, "reused_tokens": reused.reused_tokens,
            "ttft_ms_reuse": round(statistics.median(reply.ttft_ms for reply in replies), 2),
            "ttft_ms_fresh": round(fresh.ttft_ms, 2), "same_text": reused.text == fresh.text, "path": "batch",
        }
