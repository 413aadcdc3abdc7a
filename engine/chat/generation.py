"""The decode loop: prefill what the cache lacks, then one token per step (engine thread).

``ReplyState`` is one reply's sampler, detokenizer and stop strings; ``DecodeLoop``
runs one reply to its end with it, and the batch runner keeps one per sequence.

Between two steps the loop asks whether the request was cancelled, so a Stop is
acknowledged within one decode step; it asks before the prefill too (a request
cancelled while queued runs no forward pass) and between two prefill chunks. It
stops on end-of-sequence, a stop string, the token budget or a full context, and
says which.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from engine.chat.detokenize import IncrementalDetokenizer, StopStringFilter
from engine.chat.sampling import Sampler
from engine.forward.backend import Backend
from engine.protocol.messages import FinishReason, SamplingParams
from engine.scheduler.block_pool import common_prefix_length

OnText = Callable[[str, int], None]  # (new text, tokens generated so far)
OnPrefill = Callable[[int, float], None]  # (tokens reused from the cache, prefill ms)


@dataclass
class CachedSequence:
    """A conversation's KV cache and the token ids it holds, position by position."""

    kv: Any
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ReplyOutcome:
    text: str
    finish_reason: FinishReason
    reused_tokens: int
    prefill_ms: float
    first_token_at: float
    decode_ms: float
    tokens_generated: int


def reuse_prefix(backend: Backend, seq: CachedSequence, prompt_ids: Sequence[int]) -> int:
    """Crop the cache to its longest prefix shared with the prompt; returns how many tokens stay.

    At least one prompt token is always left to prefill: its logits start the reply.
    """
    reused = min(common_prefix_length(seq.token_ids, prompt_ids), len(prompt_ids) - 1)
    crop_sequence(backend, seq, reused)
    return reused


def crop_sequence(backend: Backend, seq: CachedSequence, length: int) -> None:
    """Keep the first ``length`` positions of ``seq``: its cache and the token ids it holds."""
    seq.kv = backend.crop(seq.kv, length)
    del seq.token_ids[length:]


def feed(backend: Backend, seq: CachedSequence, token_ids: Sequence[int]) -> torch.Tensor:
    """Append tokens to the cache in chunks; logits after the last one, [V]."""
    logits = prefill(backend, seq, token_ids, lambda: False)
    assert logits is not None
    return logits


def prefill(backend: Backend, seq: CachedSequence, token_ids: Sequence[int],
            is_cancelled: Callable[[], bool]) -> torch.Tensor | None:
    """``feed``, asking before each further chunk whether the request was cancelled; ``None`` if it was (the
    chunks fed so far stay in the cache)."""
    assert token_ids, "feed() needs at least one token"
    logits = None
    size = backend.prefill_chunk
    for start in range(0, len(token_ids), size):
        if start and is_cancelled():
            return None
        chunk = list(token_ids[start : start + size])
        logits = backend.forward(chunk, seq.kv, len(seq.token_ids))
        seq.token_ids.extend(chunk)
    return logits


class ReplyState:
    """One reply's sampler, detokenizer and stop-string filter, and the tokens it has said so far.

    The decode loop keeps one; the batch runner (``engine/service/batch_runner.py``) one per sequence.
    """

    def __init__(self, tokenizer: Any, sampling: SamplingParams, eos_ids: frozenset[int], context_length: int,
                 device: torch.device, prompt_ids: Sequence[int], on_text: OnText) -> None:
        self.sampling = sampling
        self.eos_ids = eos_ids
        self.context_length = context_length
        self.device = device
        self.prompt_ids = prompt_ids
        self.on_text = on_text
        self.sampler = Sampler(sampling, device)
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringFilter(sampling.stop)
        self.generated: list[int] = []
        self.pieces: list[str] = []

    def sample(self, logits: torch.Tensor) -> int:
        """The next token from ``logits`` [V] (a host sync)."""
        return self.sampler(logits, self._seen()).item()

    def accept(self, token: int, cached_positions: int, is_cancelled: Callable[[], bool]) -> FinishReason | None:
        """Say ``token`` (unless it ends the reply); why the reply stops here, or ``None`` to feed it and go on."""
        if token in self.eos_ids:
            return "eos"
        self.generated.append(token)
        shown = self.stops.feed(self.detokenizer.push(token))
        if shown:
            self._say(shown)
        return self._why_stop(cached_positions, is_cancelled)

    def close(self) -> str:
        """The text held back for a possible stop string goes out; the whole reply's text."""
        tail = self.stops.flush()
        if tail:
            self._say(tail)
        return "".join(self.pieces)

    def _say(self, text: str) -> None:
        self.pieces.append(text)
        self.on_text(text, len(self.generated))

    def _why_stop(self, cached_positions: int, is_cancelled: Callable[[], bool]) -> FinishReason | None:
        if self.stops.stopped:
            return "stop_string"
        if len(self.generated) >= self.sampling.max_new_tokens:
            return "max_tokens"
        if cached_positions + 1 >= self.context_length:
            return "context_full"
        if is_cancelled():
            return "cancelled"
        return None

    def _seen(self) -> torch.Tensor:
        if self.sampling.repetition_penalty == 1.0:
            return torch.empty(0, dtype=torch.long, device=self.device)
        return torch.tensor([*self.prompt_ids, *self.generated], dtype=torch.long, device=self.device)  # [N]


@dataclass
class DecodeLoop:
    """One reply run to its end over one ``CachedSequence``."""

    backend: Backend
    tokenizer: Any
    sampling: SamplingParams
    eos_ids: frozenset[int]
    context_length: int
    is_cancelled: Callable[[], bool]
    on_prefill: OnPrefill
    on_text: OnText

    def run(self, seq: CachedSequence, prompt_ids: Sequence[int]) -> ReplyOutcome:
        if self.is_cancelled():  # cancelled while it waited in the queue: no forward pass for it
            return self._cancelled_before_reply(0, time.perf_counter())
        reused = reuse_prefix(self.backend, seq, prompt_ids)
        started = time.perf_counter()
        logits = prefill(self.backend, seq, prompt_ids[reused:], self.is_cancelled)
        if logits is None:
            return self._cancelled_before_reply(reused, started)
        reply = ReplyState(self.tokenizer, self.sampling, self.eos_ids, self.context_length, self.backend.device,
                           prompt_ids, self.on_text)
        token = reply.sample(logits)  # the first host sync
        prefill_ms = (time.perf_counter() - started) * 1000
        self.on_prefill(reused, prefill_ms)
        first_token_at = time.perf_counter()
        while (reason := reply.accept(token, len(seq.token_ids), self.is_cancelled)) is None:
            token = reply.sample(feed(self.backend, seq, [token]))
        text = reply.close()
        decode_ms = (time.perf_counter() - first_token_at) * 1000
        return ReplyOutcome(text, reason, reused, prefill_ms, first_token_at, decode_ms, len(reply.generated))

    def _cancelled_before_reply(self, reused: int, started: float) -> ReplyOutcome:
        """The reply ends, cancelled, before its first token: nothing is said."""
        prefill_ms = (time.perf_counter() - started) * 1000
        self.on_prefill(reused, prefill_ms)
        return ReplyOutcome("", "cancelled", reused, prefill_ms, time.perf_counter(), 0.0, 0)
