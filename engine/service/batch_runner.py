"""Continuous batching: runs the scheduler's steps over one block-wise KV store (engine thread).

A step is planned by ``engine/scheduler`` (which tokens of which sequences), then run
here: copies of shared blocks, one ``forward_batch`` over every running sequence, and
for each sequence whose chunk reached its last token, a sampled token said through its
own ``ReplyState`` (sampler, detokenizer, stop strings) and ``ReplyEvents``. So every
request gets its own ``PrefillDone``, ``TokenStreamed`` and ``ReplyFinished`` or
``ReplyFailed``, with the figures the single-stream path gives. A request with a
``Constraint`` samples among the tokens its mask allows; the masks of a step's
constrained requests are computed on a helper thread while the forward pass runs, so
constrained and free requests share the batch. ``BatchSampled`` goes
out after steps that changed the batch, at most ``1 / SAMPLE_INTERVAL_S`` times a second.

A decoding request may draft tokens (``engine/chat/speculative``; ``SamplingParams.speculative``)
before each step, from prompt lookup or, where the load has a draft model, from that model (``draft_model``;
each source asked once a step for all its requests): the scheduler feeds them after its last token, the step returns
each of those rows' logits, and the reply takes them one at a time as it takes any
token (``ReplyState.sample`` verifies each drafted one), so a stop string, the end of
the sequence or the token budget ends it exactly where it would end without the
draft; the drafted tokens it said count as computed, the rest are rolled back
(``Scheduler.keep_drafted``). A constrained request drafts only what its grammar
accepts from where it stands; the helper thread's mask covers its first row, and
each later row's mask is computed once the drafted token before it is said.
Requests asking for log-probabilities draft too, each drafted token's coming from
its own row of logits.
"""

from __future__ import annotations

import collections
import itertools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch

from engine.chat.generation import ReplyOutcome, ReplyState
from engine.chat.speculative.draft_source import DraftSource, DraftWant, LookupDrafts
from engine.chat.speculative.speculation import Speculation
from engine.chat.token_masks import ConstraintVocabulary
from engine.forward.paged_kv import BatchRow
from engine.host import garbage
from engine.host.memory import kv_pool_budget
from engine.models.loading import LoadedModel
from engine.protocol.channels import EventSink
from engine.protocol.messages import (
    BatchSampled,
    Constraint,
    FinishReason,
    KVPoolStats,
    MemoryStats,
    ReplyFailed,
    SamplingParams,
)
from engine.scheduler.block_pool import BLOCK_SIZE, BlockPool
from engine.scheduler.conversation_chains import ConversationChains
from engine.scheduler.scheduler import ScheduledChunk, Scheduler, Step
from engine.scheduler.step_pacer import StepPacer
from engine.service.draft_model import ModelDrafts, drafted_row_cost
from engine.service.reply_events import ReplyEvents

SAMPLE_INTERVAL_S = 0.1
THROUGHPUT_WINDOW_S = 3.0

MemoryReading = Callable[[int], MemoryStats]  # (this request's KV bytes) -> the memory figures
Masks = dict[str, torch.Tensor]  # request id -> the tokens its constraint allows next, bool [T]


@dataclass
class _Active:
    conversation_id: str
    events: ReplyEvents
    reply: ReplyState
    queued_at: float  # when it was handed to the scheduler
    speculation: Speculation | None  # its drafts, where it drafts
    prefill_ms: float = 0.0
    first_token_at: float = 0.0
    steps: int = 0  # steps that said tokens


def pool_blocks(budget_bytes: int, bytes_per_block: int, context_length: int, max_running: int,
                windows: tuple[int | None, ...] = (None,)) -> int:
    """As many blocks as the budget affords, up to every running sequence at the full context twice over
    (the second half keeps finished conversations' prefixes cached), a block of each KV group (``windows``) a
    block of context, a window group's at most its window and a block."""
    per_sequence = sum(sequence_blocks(context_length, window) for window in windows)
    return max(1, min(budget_bytes // bytes_per_block, 2 * max_running * per_sequence))


def sequence_blocks(positions: int, window: int | None) -> int:
    """Blocks a KV group of ``window`` holds for one sequence of ``positions``."""
    held = positions if window is None else min(positions, window + BLOCK_SIZE)
    return -(-held // BLOCK_SIZE)


class BatchRunner:
    """The loaded model's KV pool, its scheduler, and the replies in flight."""

    def __init__(self, loaded: LoadedModel, emit: EventSink, is_cancelled: Callable[[str], bool],
                 budget_bytes: int | None = None, step_tokens: int | None = None,
                 max_running: int | None = None) -> None:
        """``budget_bytes``: what the KV pool may take; by default ``kv_pool_budget`` of the model's device and its
        planned context (``LoadedModel.kv_budget_bytes``).
        ``step_tokens`` and ``max_running`` (``Scheduler``): by default what the backend names for its device
        (``BatchBackend.batch_step_tokens``, ``batch_max_running``)."""
        self._loaded = loaded
        self._backend = loaded.backend
        step_tokens = step_tokens or self._backend.batch_step_tokens
        max_running = max_running or self._backend.batch_max_running
        self._emit = emit
        self._is_cancelled = is_cancelled
        self.bytes_per_block = self._backend.new_pool(1, BLOCK_SIZE).bytes_per_block
        budget = kv_pool_budget(loaded.device, loaded.kv_budget_bytes) if budget_bytes is None else budget_bytes
        windows = self._backend.new_pool(1, BLOCK_SIZE).windows
        blocks = pool_blocks(budget, self.bytes_per_block, loaded.context_length, max_running, windows)
        self.kv = self._backend.new_pool(blocks, BLOCK_SIZE)
        self.scheduler = Scheduler(BlockPool(blocks, BLOCK_SIZE), step_tokens, max_running, pacer=StepPacer(),
                                   windows=windows)
        self.conversations = ConversationChains(self.scheduler.pool, blocks)
        self._active: dict[str, _Active] = {}
        self._sampled_tokens: collections.deque[tuple[float, int]] = collections.deque()
        self._last_sample = (0.0, None)
        self.constraints = ConstraintVocabulary(loaded.tokenizer, loaded.eos_ids)
        self.model_drafts = ModelDrafts(loaded, BLOCK_SIZE, max_running) if loaded.draft is not None else None
        self._lookup_drafts = LookupDrafts(drafted_row_cost(loaded))
        self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="hearth-masks")  # started on first use

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, request_id: str, conversation_id: str, prompt_ids: list[int], sampling: SamplingParams,
            events: ReplyEvents, constraint: Constraint | None = None) -> None:
        """The request joins the batch; ``ConstraintError`` (nothing joins) when its constraint cannot be used."""
        loaded = self._loaded
        matcher = self.constraints.matcher(constraint) if constraint is not None else None
        reply = ReplyState(loaded.tokenizer, sampling, loaded.eos_ids, loaded.context_length, self._backend.device,
                           prompt_ids, events.token, matcher)
        speculation = Speculation(request_id, self._draft_source()) if sampling.speculative else None
        self._active[request_id] = _Active(conversation_id, events, reply, time.perf_counter(), speculation)
        self.scheduler.add(request_id, prompt_ids)

    def _draft_source(self) -> DraftSource:
        """Where a new request's drafts come from: the draft model where the load has one, else prompt lookup.

        With a draft model, its drafts alone, never prompt lookup's first. Measured on the bench's edit task (the
        reply copies its prompt, lookup's best case; 2-core Xeon): lookup drafts were accepted at 0.55, the built-in
        model drafting for itself at 1.0. That pair pays for no draft (a draft step costs a whole step, so its
        drafting mostly pauses), but a draft model a tenth of its model's size costs about a third of a step per
        drafted token, and there the model's acceptance decides: lookup first would trade accepted tokens for
        rejected ones wherever the reply departs from its prompt. (A real pair could not be measured here.)"""
        return self.model_drafts if self.model_drafts is not None else self._lookup_drafts

    def forget_conversation(self, conversation_id: str) -> None:
        """The conversation was deleted: its cached blocks that no other conversation shares are freed."""
        if self.conversations.forget(conversation_id):
            self._report(force=True)  # the panel's pool figures change

    def abandon_all(self, message: str) -> None:
        """Every request in flight ends now with ``ReplyFailed(message)`` and its text so far; the runner is not
        stepped again (the engine shuts down, or a step failed unexpectedly)."""
        for active in self._active.values():
            active.events.broke_off(message)
        self._active.clear()

    def step(self, memory: MemoryReading) -> None:
        """One forward pass over every running sequence, and what it means for each request."""
        self._drop_cancelled(memory)
        self._propose_drafts()
        step = self.scheduler.schedule()
        for request_id, message in step.rejected:
            self._emit(ReplyFailed(request_id, message))
            self._drop(request_id)
        if step.chunks or step.copies:
            started = time.perf_counter()
            masks = self._start_masks(step)
            logits = self._run(step)
            allowed = masks.result() if masks is not None else {}
            if logits is not None:
                self._paced(step, (time.perf_counter() - started) * 1000)
                self.scheduler.complete(step)
                said = 0
                for chunk, rows in zip(step.chunks, logits.split([1 + c.drafted for c in step.chunks])):
                    if chunk.samples:
                        said += self._sampled_or_failed(chunk, rows, allowed.get(chunk.request_id), memory)
                    elif not self._active[chunk.request_id].first_token_at:  # a prompt read over several steps
                        self._active[chunk.request_id].events.reading(chunk.start + len(chunk.token_ids))
                self._sampled_tokens.append((time.perf_counter(), said))
        self._report(force=not self.has_work)  # the last step's state always goes out: the panel shows it idle

    def _paced(self, step: Step, ms: float) -> None:
        """The step's forward time, for the pacer, with its one-token rows and its prompt tokens (a step with drafts
        is left out: its extra rows are neither)."""
        if any(chunk.drafted for chunk in step.chunks):
            return
        prompts = [chunk for chunk in step.chunks if len(chunk.token_ids) > 1]
        tokens = sum(len(chunk.token_ids) for chunk in prompts)
        self.scheduler.pacer.observe(len(step.chunks) - len(prompts), tokens, ms)

    def request_bytes(self, request_id: str) -> int:
        seq = self.scheduler.get(request_id)
        return len(seq.held_blocks()) * self.bytes_per_block if seq else 0

    def total_bytes(self) -> int:
        """The KV blocks in use or cached, in bytes: the model's and its draft model's."""
        used, _, cached = self.scheduler.pool.counts()
        drafts = self.model_drafts.total_bytes() if self.model_drafts is not None else 0
        return (used + cached) * self.bytes_per_block + drafts

    def pool_stats(self) -> KVPoolStats:
        used, shared, cached = self.scheduler.pool.counts()
        return KVPoolStats(BLOCK_SIZE, self.scheduler.pool.num_blocks, used, shared, cached, self.bytes_per_block)

    # ------------------------------------------------------------ one step

    def _run(self, step: Step) -> torch.Tensor | None:
        """The step's forward pass, logits [B, V]; on a failure every request in it fails and ``None``."""
        try:
            for copy in step.copies:
                self.kv.copy_block(copy.source, copy.target, copy.tokens)
            rows = [BatchRow(c.token_ids, c.start, c.block_ids, c.group_tables, 1 + c.drafted) for c in step.chunks]
            return self._backend.forward_batch(rows, self.kv) if rows else torch.empty(0)
        except Exception as exc:  # out of memory, say: these replies fail, the others and the engine go on
            self.scheduler.complete(Step(()))  # lets go of the copy sources
            for chunk in step.chunks:
                self.scheduler.abort(chunk.request_id)
                self._drop(chunk.request_id).events.failed(exc)
            garbage.collect()
            return None

    def _start_masks(self, step: Step) -> Future[Masks] | None:
        """The masks of the step's constrained requests that sample, computing on the mask thread (which the
        forward pass leaves the GIL to); None when no such request is in the step."""
        sampling = [c.request_id for c in step.chunks if c.samples]
        constrained = [(r, self._active[r].reply.constraint) for r in sampling if self._active[r].reply.constraint]
        if not constrained:
            return None
        request_ids = [request_id for request_id, _ in constrained]
        matchers = [matcher for _, matcher in constrained]
        return self._mask_thread.submit(lambda: dict(zip(request_ids, self.constraints.allowed_tokens(matchers))))

    def _propose_drafts(self) -> None:
        """Each decoding request that drafts proposes its draft for the next step, at most what its reply and the
        context still take after the next token; each draft source is asked once, for all its requests."""
        wants: dict[DraftSource, list[DraftWant]] = {}
        for request_id, active in self._active.items():
            seq = self.scheduler.get(request_id)
            if active.speculation is None or not active.first_token_at or seq is None or seq.pending != 1:
                continue
            reply = active.reply
            room = min(reply.sampling.max_new_tokens - len(reply.generated), reply.context_length - len(seq.token_ids))
            want = active.speculation.want(seq.token_ids, room - 1)
            if want is not None:
                wants.setdefault(active.speculation.source, []).append(want)
        for source, asked in wants.items():
            for request_id, draft in source.drafts(asked).items():
                constraint = self._active[request_id].reply.constraint
                if constraint is not None and draft:
                    draft = draft[: constraint.valid_prefix(draft)]
                self.scheduler.propose(request_id, draft)

    def _sampled_or_failed(self, chunk: ScheduledChunk, logits: torch.Tensor, allowed: torch.Tensor | None,
                           memory: MemoryReading) -> int:
        """``_sampled``; a failure there (a sampler's bad input, say) ends this request alone (0 tokens said)."""
        try:
            return self._sampled(chunk, logits, allowed, memory)
        except Exception as exc:
            self.scheduler.finish(chunk.request_id)  # its keys and values are whole: only the sampling failed
            active = self._drop(chunk.request_id)
            if active is not None:
                active.events.failed(exc)
            return 0

    def _sampled(self, chunk: ScheduledChunk, logits: torch.Tensor, allowed: torch.Tensor | None,
                 memory: MemoryReading) -> int:
        """The tokens ``logits`` [1 + drafted, V] say, one row at a time: the first row's, then while each says what
        the draft had next, the next row's; how many were said."""
        request_id = chunk.request_id
        active = self._active[request_id]
        seq = self.scheduler.get(request_id)
        draft = chunk.token_ids[len(chunk.token_ids) - chunk.drafted :]
        kept: list[int] = []  # drafted tokens said and fed: their positions are computed
        for index, (row, drafted) in enumerate(zip(logits, [*draft, None])):
            if index:  # the drafted token before this row was said
                allowed = self._mask_after_draft(active)
            token = active.reply.sample(row, allowed, drafted)
            if not active.first_token_at:
                active.prefill_ms = (time.perf_counter() - active.queued_at) * 1000
                active.events.prefilled(seq.reused, active.prefill_ms)
                active.first_token_at = time.perf_counter()
            reason = active.reply.accept(token, seq.computed + len(kept), lambda: self._is_cancelled(request_id))
            if reason is not None or token != drafted:
                break
            kept.append(token)
        active.steps += 1
        if chunk.drafted:
            active.speculation.verified(chunk.drafted, len(kept) + (token == drafted))
            self.scheduler.keep_drafted(request_id, kept)
        if reason is None:
            self.scheduler.append(request_id, token)
        else:
            self._finish(request_id, reason, memory)
        return len(kept) + 1

    def _mask_after_draft(self, active: _Active) -> torch.Tensor | None:
        """The mask of a constrained reply's row after a drafted token it said (None: the reply is free)."""
        constraint = active.reply.constraint
        return None if constraint is None else self.constraints.allowed_tokens([constraint])[0]

    def _drop(self, request_id: str) -> _Active | None:
        """The request leaves the replies in flight (None: it had left), and its draft source lets go of it."""
        active = self._active.pop(request_id, None)
        if active is not None and active.speculation is not None:
            active.speculation.source.forget(request_id)
        return active

    def _drop_cancelled(self, memory: MemoryReading) -> None:
        """A cancelled request ends before the step, whatever it is at: waiting (it never enters a forward pass),
        between two prefill chunks (even with one prompt token left) or decoding."""
        for request_id in list(self._active):
            if self._is_cancelled(request_id) and self.scheduler.get(request_id) is not None:
                self._finish(request_id, "cancelled", memory)

    def _finish(self, request_id: str, reason: FinishReason, memory: MemoryReading) -> None:
        active = self._drop(request_id)
        seq = self.scheduler.get(request_id)
        reused = max(seq.reused, 0) if seq else 0
        held = self.request_bytes(request_id)
        self.scheduler.finish(request_id)
        if seq is not None:
            self.conversations.record(active.conversation_id, seq.token_ids[: seq.computed])
        if not active.first_token_at:  # cancelled before its first token
            active.prefill_ms = (time.perf_counter() - active.queued_at) * 1000
            active.events.prefilled(reused, active.prefill_ms)
            active.first_token_at = time.perf_counter()
        text = active.reply.close()
        decode_ms = (time.perf_counter() - active.first_token_at) * 1000
        speculation = active.speculation
        outcome = ReplyOutcome(text, reason, reused, active.prefill_ms, active.first_token_at, decode_ms,
                               len(active.reply.generated), speculation.drafted if speculation else 0,
                               speculation.accepted if speculation else 0, active.steps)
        active.events.finished(outcome, memory(held))

    def _report(self, force: bool) -> None:
        now = time.perf_counter()
        if now - self._last_sample[0] < SAMPLE_INTERVAL_S and not force:
            return
        state = (len(self.scheduler.running), len(self.scheduler.waiting), self.pool_stats())  # scans the pool
        if state == self._last_sample[1]:
            self._last_sample = (now, state)  # unchanged: the next scan waits its interval too
            return
        while self._sampled_tokens and self._sampled_tokens[0][0] < now - THROUGHPUT_WINDOW_S:
            self._sampled_tokens.popleft()
        span = now - self._sampled_tokens[0][0] if len(self._sampled_tokens) > 1 else 0.0
        after_first = itertools.islice(self._sampled_tokens, 1, None)  # the first sample's tokens came before the span
        rate = sum(count for _, count in after_first) / span if span > 0 else 0.0
        self._last_sample = (now, state)
        self._emit(BatchSampled(state[0], state[1], rate, state[2], now))
