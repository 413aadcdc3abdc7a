"""One reply's events, as both runners (``batch_runner``, ``sequence_runner``) send them (engine thread).

``ReplyEvents`` turns a reply's progress (a long prompt being read, prefill done, each
piece of text, the end or a failure) into ``PromptProgress``, ``PrefillDone``,
``TokenStreamed``, ``ReplyFinished`` and ``ReplyFailed`` with the same figures whichever
path produced the reply.
"""

from __future__ import annotations

import time
import torch

from engine.chat.generation import ReplyOutcome
from engine.chat.prompt import PromptPlan
from engine.protocol.channels import EventSink
from engine.protocol.messages import (
    PROMPT_PROGRESS_INTERVAL_S,
    MemoryStats,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    TokenLogprob,
    TokenStreamed,
)

OUT_OF_MEMORY_MESSAGE = (
    "The model ran out of memory while replying. The partial reply is kept, and the next "
    "message will work; a shorter context or a smaller precision leaves more room."
)


def is_out_of_memory(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text or "can't allocate memory" in text


def failure_message(exc: Exception) -> str:
    return OUT_OF_MEMORY_MESSAGE if is_out_of_memory(exc) else f"The reply failed: {type(exc).__name__}: {exc}"


class ReplyEvents:
    """The events of one request; ``started`` is when it arrived (``perf_counter``)."""

    def __init__(self, emit: EventSink, request_id: str, plan: PromptPlan, tokenize_ms: float, context_length: int,
                 started: float) -> None:
        self._emit = emit
        self.request_id = request_id
        self._plan = plan
        self._tokenize_ms = tokenize_ms
        self._context_length = context_length
        self.started = started
        self._first_at = 0.0
        self._progress_at = started  # when the last PromptProgress went out (or the request arrived)
        self.text = ""

    @property
    def prompt_ids(self) -> list[int]:
        return self._plan.token_ids

    def reading(self, computed_tokens: int) -> None:
        """``computed_tokens`` of the prompt are in the KV cache and more are to come: a ``PromptProgress`` goes out
        once ``PROMPT_PROGRESS_INTERVAL_S`` has passed since the last (a prompt read within it says nothing)."""
        now = time.perf_counter()
        if now - self._progress_at >= PROMPT_PROGRESS_INTERVAL_S:
            self._progress_at = now
            self._emit(PromptProgress(self.request_id, computed_tokens, len(self._plan.token_ids)))

    def prefilled(self, reused: int, prefill_ms: float) -> None:
        self._first_at = time.perf_counter()
        self._emit(PrefillDone(
            self.request_id, self._tokenize_ms, len(self._plan.token_ids), reused, prefill_ms,
            self._context_length, self._plan.dropped_turns,
        ))

    def token(self, text: str, count: int, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        now = time.perf_counter()
        self.text += text
        elapsed = now - self._first_at
        rate = (count - 1) / elapsed if elapsed > 0 else 0.0
        self._emit(TokenStreamed(self.request_id, text, count, rate, now, logprobs))

    def finished(self, outcome: ReplyOutcome, memory: MemoryStats) -> None:
        decode_steps = max(outcome.tokens_generated - 1, 0)
        stats = RequestStats(
            tokenize_ms=self._tokenize_ms,
            prompt_tokens=len(self._plan.token_ids),
            reused_tokens=outcome.reused_tokens,
            prefill_ms=outcome.prefill_ms,
            ttft_ms=(outcome.first_token_at - self.started) * 1000,
            decode_ms=outcome.decode_ms,
            decode_tok_s=decode_steps / (outcome.decode_ms / 1000) if outcome.decode_ms > 0 else 0.0,
            tokens_generated=outcome.tokens_generated,
            finish_reason=outcome.finish_reason,
            context_length=self._context_length,
            dropped_turns=self._plan.dropped_turns,
            memory=memory,
            started_at=self.started,
            finished_at=time.perf_counter(),
            drafted_tokens=outcome.drafted_tokens,
            accepted_tokens=outcome.accepted_tokens,
            decode_steps=outcome.decode_steps,
        )
        self._emit(ReplyFinished(self.request_id, outcome.text, stats))

    def failed(self, exc: Exception) -> None:
        self.broke_off(failure_message(exc))

    def broke_off(self, message: str) -> None:
        """The reply ends here, for ``message``; what it said so far is kept."""
        self._emit(ReplyFailed(self.request_id, message, self.text))

