"""The draft model's sequences follow their targets': after a draft accepted whole, in part or not at all, and beside
other requests, a draft is what a fresh draft model would propose for the same tokens (the tiny model drafting for
itself)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.chat.speculative.draft_source import DraftWant
from engine.models.draft_pairing import with_draft
from engine.models.memory_estimate import gib_text
from engine.scheduler.block_pool import BLOCK_SIZE
from engine.chat.speculative.draft_length import ROW_COST
from engine.service.draft_model import ModelDrafts, drafted_row_cost

BLOCK = 16


@pytest.fixture
def paired(tiny_loaded):
    return replace(tiny_loaded, draft=tiny_loaded)


@pytest.fixture
def prompt(tiny_loaded) -> list[int]:
    return tiny_loaded.tokenize("The quick brown fox jumps over the lazy dog. Paris is the capital")


def _fresh(paired, tokens: list[int], count: int) -> list[int]:
    return ModelDrafts(paired, BLOCK, 4).drafts([DraftWant("a", tokens, count)])["a"]


def _other(token: int) -> int:
    return token + 1 if token < 100 else token - 1


@pytest.mark.parametrize("accepted", [0, 2, 5, 6])
def test_after_a_draft_the_next_one_is_what_a_fresh_draft_model_proposes(paired, prompt, accepted: int):
    drafts = ModelDrafts(paired, BLOCK, 4)
    first = drafts.drafts([DraftWant("a", prompt, 6)])["a"]
    assert len(first) == 6 and first == _fresh(paired, prompt, 6)
    said = _other(first[accepted]) if accepted < len(first) else first[0]  # in place of a rejected one, or one more
    target = [*prompt, *first[:accepted], said]  # the target kept ``accepted`` drafted tokens, then said its own
    assert drafts.drafts([DraftWant("a", target, 5)])["a"] == _fresh(paired, target, 5)


def test_requests_drafted_together_get_what_each_gets_alone_and_an_ended_one_lets_go_of_its_blocks(paired, prompt):
    other = prompt[:9]
    drafts = ModelDrafts(paired, BLOCK, 4)
    together = drafts.drafts([DraftWant("a", prompt, 4), DraftWant("b", other, 7)])
    assert together == {"a": _fresh(paired, prompt, 4), "b": _fresh(paired, other, 7)}
    drafts.forget("a")
    drafts.drafts([DraftWant("b", [*other, *together["b"][:3], _other(together["b"][3])], 2)])
    assert [seq.request_id for seq in drafts.scheduler.running] == ["b"]
    assert drafts.drafts([DraftWant("b", other, 1)])["b"] == together["b"][:1]  # b went back: its prefix is cached
    assert drafts.drafts([]) == {} and drafts.scheduler.pool.counts()[0] == 0  # none drafting: no block held


def test_the_load_notice_counts_the_positions_and_bytes_the_draft_pool_allocates(tiny_loaded):
    target = replace(tiny_loaded, context_length=1000)  # not a whole number of blocks: the pool rounds up
    notice = with_draft(target, tiny_loaded).notices[-1]
    pool = ModelDrafts(replace(target, draft=tiny_loaded), BLOCK_SIZE, 4).kv
    allocated = pool.buffer.numel() * pool.buffer.element_size()
    assert allocated == pool.num_blocks * pool.bytes_per_block
    assert f"at most {gib_text(allocated)} of KV cache ({pool.num_blocks * BLOCK_SIZE:,} positions)" in notice


def test_a_dense_models_drafted_row_costs_the_rows_arithmetic_alone(tiny_loaded):
    """Its rows share the step's one read of the weights (a mixture's rows add their experts': test_experts)."""
    assert drafted_row_cost(tiny_loaded) == ROW_COST
