"""One reply's generation, whichever runner steps it (engine thread).

``ReplyState`` is one reply's sampler, detokenizer and stop strings: it says each
sampled token and tells when the reply stops (end-of-sequence, a stop string, a
complete constraint, the token budget, a full context or a cancel) and why. A
constrained reply samples among the tokens its mask allows (the runner computes the
masks, ``token_masks``) and its matcher advances with each token said.
``CachedSequence`` is one conversation's KV cache over a single-sequence backend,
which ``reuse_prefix`` crops to what a new prompt shares with it and ``feed``
extends. The runners in ``engine/service`` (``batch_runner``, ``sequence_runner``)
drive these a step at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from engine.chat.detokenize import IncrementalDetokenizer, StopStringFilter
from engine.chat.logprobs import token_logprob
from engine.chat.sampling import Sampler
from engine.chat.token_masks import ConstraintMatcher
from engine.forward.backend import Backend
from engine.protocol.messages import FinishReason, SamplingParams, TokenLogprob
from engine.scheduler.block_pool import common_prefix_length

OnText = Callable[[str, int, tuple[TokenLogprob, ...]], None]  # (new text, tokens so far, their logprobs if asked)


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
    drafted_tokens: int = 0  # proposed by speculative drafts (``engine/chat/speculative``)
    accepted_tokens: int = 0  # of those, said
    decode_steps: int = 0  # forward steps that said at least one token


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
    """Append tokens to the cache, ``backend.prefill_chunk`` at a time; logits after the last one, [V]."""
    assert token_ids, "feed() needs at least one token"
    size = backend.prefill_chunk
    for start in range(0, len(token_ids), size):
        chunk = list(token_ids[start : start + size])
        logits = backend.forward(chunk, seq.kv, len(seq.token_ids))
        seq.token_ids.extend(chunk)
    return logits


class ReplyState:
    """One reply's sampler, detokenizer and stop-string filter, its constraint's matcher (or None), and the tokens
    it has said so far.

    A runner (``engine/service``) keeps one per request.
    """

    def __init__(self, tokenizer: Any, sampling: SamplingParams, eos_ids: frozenset[int], context_length: int,
                 device: torch.device, prompt_ids: Sequence[int], on_text: OnText,
                 constraint: ConstraintMatcher | None = None) -> None:
        self.tokenizer = tokenizer
        self.constraint = constraint
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
        self._unshown_logprobs: list[TokenLogprob] = []  # of tokens whose text has not gone out yet

    def sample(self, logits: torch.Tensor, allowed: torch.Tensor | None = None, drafted: int | None = None) -> int:
        """The next token from ``logits`` [V] among the ``allowed`` ones (bool [T] over the tokenizer's tokens, a
        constraint's mask; None: any) (a host sync). ``drafted``: a speculative draft's token for this position,
        kept or replaced as ``Sampler.verify`` rules (the token has the distribution it would have without it)."""
        if allowed is not None:
            logits = logits.masked_fill(_refused(allowed, logits.numel()).to(logits.device), float("-inf"))  # [V]
        seen = self._seen()
        chosen = self.sampler(logits, seen) if drafted is None else self.sampler.verify(logits, seen, drafted)
        token = chosen.item()
        if self.sampling.logprobs is not None:
            self._unshown_logprobs.append(token_logprob(logits, token, self.sampling.logprobs, self.tokenizer))
        return token

    def accept(self, token: int, cached_positions: int, is_cancelled: Callable[[], bool]) -> FinishReason | None:
        """Say ``token`` (unless it ends the reply); why the reply stops here, or ``None`` to feed it and go on."""
        if token in self.eos_ids:
            self._unshown_logprobs.clear()  # the end of the reply is no token of its text
            return "eos"
        self.generated.append(token)
        if self.constraint is not None:
            self.constraint.accept(token)
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
        logprobs, self._unshown_logprobs = tuple(self._unshown_logprobs), []
        self.on_text(text, len(self.generated), logprobs)

    def _why_stop(self, cached_positions: int, is_cancelled: Callable[[], bool]) -> FinishReason | None:
        if self.stops.stopped:
            return "stop_string"
        if self.constraint is not None and self.constraint.complete:
            return "constraint"
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


def _refused(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [vocab_size]: the tokens ``allowed`` (bool [T]) does not allow, and any past its T."""
    refused = torch.ones(vocab_size, dtype=torch.bool)
    width = min(vocab_size, allowed.numel())
    refused[:width] = ~allowed[:width]
    return refused
