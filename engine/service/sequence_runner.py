"""One request at a time, one forward pass per step: the transformers fallback's runner (engine thread).

``HFBackend`` runs one sequence over one conversation's ``DynamicCache``, so its
requests queue first come, first served. The runner has the batch runner's shape
(``add``, ``step``, ``has_work``, ``forget_conversation``), so the engine loop drives
both alike and stays responsive between two steps. A step is one prefill chunk of
the current request's prompt or one decoded token. Each conversation keeps its cache
(``CacheStore``) between replies; a new prompt reuses the longest prefix it shares
with it. A request cancelled before its step ends there: one still queued runs no
forward pass, one mid-prefill runs no further chunk.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable

import torch

from engine.chat.cache_store import CacheStore
from engine.chat.generation import CachedSequence, ReplyOutcome, ReplyState, feed, reuse_prefix
from engine.chat.token_masks import ConstraintVocabulary
from engine.host import garbage
from engine.host.memory import KV_CACHE_BUDGET_BYTES
from engine.models.loading import LoadedModel
from engine.protocol.messages import Constraint, FinishReason, SamplingParams
from engine.service.batch_runner import MemoryReading
from engine.service.reply_events import ReplyEvents, is_out_of_memory


@dataclass
class _Request:
    request_id: str
    conversation_id: str
    prompt_ids: list[int]
    events: ReplyEvents
    reply: ReplyState
    seq: CachedSequence | None = None  # its conversation's cache, once it runs
    reused: int = 0
    began_at: float = 0.0  # when its prefill began
    prefill_ms: float = 0.0
    first_token_at: float = 0.0
    next_token: int | None = None  # said, to be fed on the next step


class SequenceRunner:
    """The queued requests, the one running, and the conversations' caches."""

    def __init__(self, loaded: LoadedModel, is_cancelled: Callable[[str], bool],
                 budget_bytes: int | None = None) -> None:
        """``budget_bytes``: what the conversations' caches may hold; by default ``KV_CACHE_BUDGET_BYTES``."""
        self._loaded = loaded
        self._backend = loaded.backend
        self._is_cancelled = is_cancelled
        budget = KV_CACHE_BUDGET_BYTES if budget_bytes is None else budget_bytes
        self.caches = CacheStore(self._backend.new_cache, self._backend.cache_bytes, budget)
        self._queue: collections.deque[_Request] = collections.deque()
        self._running: _Request | None = None
        self.constraints = ConstraintVocabulary(loaded.tokenizer, loaded.eos_ids)

    @property
    def has_work(self) -> bool:
        return self._running is not None or bool(self._queue)

    def add(self, request_id: str, conversation_id: str, prompt_ids: list[int], sampling: SamplingParams,
            events: ReplyEvents, constraint: Constraint | None = None) -> None:
        """The request queues; ``ConstraintError`` (nothing queues) when its constraint cannot be used."""
        loaded = self._loaded
        matcher = self.constraints.matcher(constraint) if constraint is not None else None
        reply = ReplyState(loaded.tokenizer, sampling, loaded.eos_ids, loaded.context_length, self._backend.device,
                           prompt_ids, events.token, matcher)
        self._queue.append(_Request(request_id, conversation_id, prompt_ids, events, reply))

    def forget_conversation(self, conversation_id: str) -> None:
        """The conversation was deleted: its cache goes (unless a reply is using it)."""
        self.caches.forget(conversation_id)

    def total_bytes(self) -> int:
        return self.caches.total_bytes()

    def abandon_all(self, message: str) -> None:
        """Every request in flight ends now with ``ReplyFailed(message)`` and its text so far; the runner is not
        stepped again."""
        running = [self._running] if self._running is not None else []
        for request in running + list(self._queue):
            request.events.broke_off(message)
        self._running = None
        self._queue.clear()

    def step(self, memory: MemoryReading) -> None:
        """One forward pass of the running request (starting the next queued one if none runs)."""
        self._drop_cancelled(memory)
        if self._running is None and self._queue:
            self._running = self._begin(self._queue.popleft())
        request = self._running
        if request is None:
            return
        try:
            self._advance(request, memory)
        except Exception as exc:  # out of memory, say: this reply fails, the next one and the engine go on
            self._fail(request, exc)

    def _drop_cancelled(self, memory: MemoryReading) -> None:
        """A cancelled request ends before the step: queued (no forward pass for it) or running."""
        for request in [r for r in self._queue if self._is_cancelled(r.request_id)]:
            self._queue.remove(request)
            self._finish(request, "cancelled", memory)
        if self._running is not None and self._is_cancelled(self._running.request_id):
            self._finish(self._running, "cancelled", memory)

    def _begin(self, request: _Request) -> _Request:
        request.seq = self.caches.checkout(request.conversation_id)
        request.reused = reuse_prefix(self._backend, request.seq, request.prompt_ids)
        request.began_at = time.perf_counter()
        return request

    def _advance(self, request: _Request, memory: MemoryReading) -> None:
        """One prefill chunk, or the token said last fed back; a token is sampled once the prompt is in."""
        seq = request.seq
        if request.next_token is None:
            fed = len(seq.token_ids)
            logits = feed(self._backend, seq, request.prompt_ids[fed : fed + self._backend.prefill_chunk])
            if len(seq.token_ids) < len(request.prompt_ids):
                return
        else:
            logits = feed(self._backend, seq, [request.next_token])
        constraint = request.reply.constraint
        allowed = self.constraints.allowed_tokens([constraint])[0] if constraint is not None else None
        token = request.reply.sample(logits, allowed)  # the step's host sync
        if not request.first_token_at:
            self._prefilled(request)
        reason = request.reply.accept(token, len(seq.token_ids), lambda: self._is_cancelled(request.request_id))
        if reason is None:
            request.next_token = token
        else:
            self._finish(request, reason, memory)

    def _prefilled(self, request: _Request) -> None:
        """The prompt is in (or, cancelled, never will be): ``PrefillDone`` goes out."""
        now = time.perf_counter()
        request.prefill_ms = (now - request.began_at) * 1000 if request.began_at else 0.0
        request.events.prefilled(request.reused, request.prefill_ms)
        request.first_token_at = time.perf_counter()

    def _finish(self, request: _Request, reason: FinishReason, memory: MemoryReading) -> None:
        if not request.first_token_at:  # cancelled before its first token: nothing is said
            self._prefilled(request)
        text = request.reply.close()
        decode_ms = (time.perf_counter() - request.first_token_at) * 1000
        outcome = ReplyOutcome(text, reason, request.reused, request.prefill_ms, request.first_token_at, decode_ms,
                               len(request.reply.generated))
        self._let_go(request)
        request.events.finished(outcome, memory(self.caches.bytes_of(request.conversation_id)))

    def _fail(self, request: _Request, exc: Exception) -> None:
        """The reply broke off: its working memory goes, what it said stays said.

        The conversation's cache is dropped too (it may hold a half-written step): the next reply prefills from
        scratch.
        """
        request.seq.kv = self._backend.new_cache()
        request.seq.token_ids.clear()
        self._let_go(request)
        garbage.collect()
        if is_out_of_memory(exc) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        request.events.failed(exc)

    def _let_go(self, request: _Request) -> None:
        """The request no longer runs; its conversation's cache is released (and over-budget caches evicted)."""
        if request is self._running:
            self._running = None
        if request.seq is not None:
            self.caches.release(request.conversation_id)
