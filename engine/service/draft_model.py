"""Drafts from a small model with the target's tokenizer, batched across the requests that draft (engine thread).

``ModelDrafts`` is the draft model's ``DraftSource`` (``engine/chat/speculative``). It
owns the draft model's own KV block pool and scheduler, small beside the target's
(``draft_pairing.draft_pool_blocks``: the blocks its load notice counts), in which each drafting request has a
sequence that follows the target's. Asked for drafts, it first brings each sequence
to the target's tokens: where everything it computed is still a prefix of them (the
draft was accepted whole, or just short of it) the new tokens are fed after it;
otherwise (a drafted token was rejected) the sequence ends and starts again, and its
prefix comes back from the pool's prefix cache (a partly shared block is copied), so
only the positions past the first rejected token are computed again. Then it decodes
greedily, one batched step of the draft model for every request still drafting, until
each has its count. Greedy drafts are deterministic, so the target's verification
(``Sampler.verify``: accept the drafted token with its target probability, else draw
from the rest) keeps the target's distribution exactly.

A request that stops drafting (its drafting pauses) ends its sequence here: its blocks
stay cached, and when it drafts again only the tokens since then are computed.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.chat.speculative.draft_length import ROW_COST
from engine.chat.speculative.draft_source import DraftWant
from engine.forward.paged_kv import BatchRow
from engine.models.draft_pairing import draft_pool_blocks
from engine.models.loading import LoadedModel
from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import IDLE_STEP_TOKENS, Scheduler, Step


class ModelDrafts:
    """The draft model of ``target`` (``LoadedModel.draft``), its pool and its sequences, one per drafting request."""

    def __init__(self, target: LoadedModel, block_size: int, max_running: int) -> None:
        draft = target.draft
        assert draft is not None, "the target has no draft model"
        self._backend = draft.backend
        one = self._backend.new_pool(1, block_size)
        self.context_length = min(target.context_length, draft.context_length)
        blocks = draft_pool_blocks(self.context_length, block_size, len(one.windows))
        self.bytes_per_block = one.bytes_per_block
        self.kv = self._backend.new_pool(blocks, block_size)
        self.scheduler = Scheduler(BlockPool(blocks, block_size), IDLE_STEP_TOKENS, max_running, windows=one.windows)
        self._vocab = len(target.tokenizer)  # a draft model's padded logits past the tokenizer's ids are never drafted
        self.row_cost = drafted_row_cost(target) + _decode_bytes(draft) / _decode_bytes(target)
        """A drafted token's row in the target's step, and a step of the draft model: a decode step's time is its
        weight reads', so one costs about the draft's decode bytes over the target's (the built-in model drafting for
        itself never pays, and soon pauses)."""

    def drafts(self, wants: Sequence[DraftWant]) -> dict[str, list[int]]:
        """Each want's greedy draft, the draft model stepped for all of them together."""
        counts = {want.request_id: min(want.count, self.context_length - len(want.tokens)) for want in wants}
        counts = {request_id: count for request_id, count in counts.items() if count > 0}  # none past its context
        wants = [want for want in wants if want.request_id in counts]
        self._end_others(counts)
        for want in wants:
            self._follow(want.request_id, want.tokens)
        said: dict[str, list[int]] = {request_id: [] for request_id in counts}
        while any(len(said[r]) < counts[r] for r in counts):
            step = self.scheduler.schedule()
            if not step.chunks:
                break  # the rest wait for room in the draft pool: no draft for them this step
            greedy = self._run(step)[:, : self._vocab].argmax(dim=-1).tolist()  # [chunks], one host sync
            self.scheduler.complete(step)
            for chunk, token in zip(step.chunks, greedy):
                request_id = chunk.request_id
                if chunk.samples and len(said[request_id]) < counts[request_id]:
                    said[request_id].append(token)
                    if len(said[request_id]) < counts[request_id]:
                        self.scheduler.append(request_id, token)
        return said

    def forget(self, request_id: str) -> None:
        """The request ended or stopped drafting: its sequence ends, its blocks stay cached for a while."""
        if self.scheduler.get(request_id) is not None:
            self.scheduler.finish(request_id)

    def total_bytes(self) -> int:
        """The draft pool's blocks in use or cached, in bytes."""
        used, _, cached = self.scheduler.pool.counts()
        return (used + cached) * self.bytes_per_block

    def _end_others(self, drafting: dict[str, int]) -> None:
        """Sequences of requests not drafting this step end (their blocks stay cached): none is computed for nothing."""
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            if seq.request_id not in drafting:
                self.scheduler.finish(seq.request_id)

    def _follow(self, request_id: str, tokens: Sequence[int]) -> None:
        """The request's sequence goes on with ``tokens``: after what it computed where that is their prefix, else
        started again from the cached prefix."""
        if not self.scheduler.follow(request_id, list(tokens)):
            self.forget(request_id)
            self.scheduler.add(request_id, list(tokens))

    def _run(self, step: Step) -> torch.Tensor:
        """The draft model's forward pass over the step: each chunk's last logits, [chunks, V]."""
        for copy in step.copies:
            self.kv.copy_block(copy.source, copy.target, copy.tokens)
        rows = [BatchRow(c.token_ids, c.start, c.block_ids, c.group_tables) for c in step.chunks]
        return self._backend.forward_batch(rows, self.kv)


def drafted_row_cost(target: LoadedModel) -> float:
    """A drafted token's row in ``target``'s step, in decode steps: ``ROW_COST``, and for a mixture of experts the
    experts a row routed apart adds (gpt-oss-20b's four of 32 a layer: about 0.6 of a one-row step)."""
    return ROW_COST + getattr(target.model, "routed_row_bytes", 0) / _decode_bytes(target)


def _decode_bytes(loaded: LoadedModel) -> int:
    """The weight bytes a decode step of ``loaded`` reads (all its weights where the model does not say)."""
    return getattr(loaded.model, "decode_bytes", loaded.weight_bytes)
