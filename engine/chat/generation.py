"""The decode loop: prefill what the cache lacks, then one token per step (engine thread).

Between two steps the loop asks whether the request was cancelled, so a Stop is
acknowledged within one decode step. It stops on end-of-sequence, a stop string,
the token budget or a full context, and says which.
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
    logits = None
    size = backend.prefill_chunk
    for start in range(0, len(token_ids), size):
        chunk = list(token_ids[start : start + size])
        logits = backend.forward(chunk, seq.kv, len(seq.token_ids))
        seq.token_ids.extend(chunk)
    assert logits is not None, "feed() needs at least one token"
    return logits


@dataclass
class DecodeLoop:
    """One reply: owns the sampler, detokenizer and stop-string filter for it."""

    backend: Backend
    tokenizer: Any
    sampling: SamplingParams
    eos_ids: frozenset[int]
    context_length: int
    is_cancelled: Callable[[], bool]
    on_prefill: OnPrefill
    on_text: OnText

    def run(self, seq: CachedSequence, prompt_ids: Sequence[int]) -> ReplyOutcome:
        reused = reuse_prefix(self.backend, seq, prompt_ids)
        started = time.perf_counter()
        logits = feed(self.backend, seq, prompt_ids[reused:])
        sampler = Sampler(self.sampling, self.backend.device)
        first_token = sampler(logits, self._seen(prompt_ids, ())).item()  # the first host sync
        prefill_ms = (time.perf_counter() - started) * 1000
        self.on_prefill(reused, prefill_ms)
        return self._decode(seq, prompt_ids, sampler, first_token, reused, prefill_ms)

    def _decode(
        self, seq: CachedSequence, prompt_ids: Sequence[int], sampler: Sampler, token: int, reused: int, prefill_ms: float
    ) -> ReplyOutcome:
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringFilter(self.sampling.stop)
        generated: list[int] = []
        pieces: list[str] = []
        first_token_at = time.perf_counter()
        reason: FinishReason | None = None
        while reason is None:
            if token in self.eos_ids:
                reason = "eos"
                break
            generated.append(token)
            shown = stops.feed(detokenizer.push(token))
            if shown:
                pieces.append(shown)
                self.on_text(shown, len(generated))
            reason = self._why_stop(stops, generated, seq)
            if reason is None:
                logits = feed(self.backend, seq, [token])
                token = sampler(logits, self._seen(prompt_ids, generated)).item()
        tail = stops.flush()
        if tail:
            pieces.append(tail)
            self.on_text(tail, len(generated))
        decode_ms = (time.perf_counter() - first_token_at) * 1000
        return ReplyOutcome("".join(pieces), reason, reused, prefill_ms, first_token_at, decode_ms, len(generated))

    def _why_stop(self, stops: StopStringFilter, generated: list[int], seq: CachedSequence) -> FinishReason | None:
        if stops.stopped:
            return "stop_string"
        if len(generated) >= self.sampling.max_new_tokens:
            return "max_tokens"
        if len(seq.token_ids) + 1 >= self.context_length:
            return "context_full"
        if self.is_cancelled():
            return "cancelled"
        return None

    def _seen(self, prompt_ids: Sequence[int], generated: Sequence[int]) -> torch.Tensor:
        if self.sampling.repetition_penalty == 1.0:
            return torch.empty(0, dtype=torch.long, device=self.backend.device)
        return torch.tensor([*prompt_ids, *generated], dtype=torch.long, device=self.backend.device)  # [N]
