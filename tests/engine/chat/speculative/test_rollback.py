"""A draft's rejected tokens leave no trace: the next step's logits, the blocks held and the prefix cache are those
of a sequence that never drafted them (the tiny model, through the scheduler and the batch backend)."""

from __future__ import annotations

import pytest
import torch

from engine.forward.paged_kv import BatchRow
from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import Scheduler

BLOCK = 16
PROMPT_TOKENS = 14  # the draft's positions run from block 0 into block 1


class Stepper:
    """One sequence through a scheduler and the tiny model's backend."""

    def __init__(self, loaded, prompt: list[int]) -> None:
        self.scheduler = Scheduler(BlockPool(8, BLOCK))
        self.backend = loaded.backend
        self.kv = self.backend.new_pool(8, BLOCK)
        self.scheduler.add("a", prompt)

    def step(self) -> torch.Tensor:
        """The step's logits, [1 + drafted, V]."""
        step = self.scheduler.schedule()
        rows = [BatchRow(c.token_ids, c.start, c.block_ids, c.group_tables, 1 + c.drafted) for c in step.chunks]
        logits = self.backend.forward_batch(rows, self.kv)
        self.scheduler.complete(step)
        return logits

    def said(self, token: int) -> int:
        self.scheduler.append("a", token)
        return token

    @property
    def seq(self):
        return self.scheduler.get("a")


@pytest.fixture
def prompt(tiny_loaded) -> list[int]:
    return tiny_loaded.tokenize("The quick brown fox jumps over the lazy dog. Paris")[:PROMPT_TOKENS]


def test_after_a_rejected_draft_the_next_step_sees_what_it_would_have_seen_without_it(tiny_loaded, prompt):
    plain = Stepper(tiny_loaded, prompt)
    plain.said(int(plain.step()[0].argmax()))
    second = plain.said(int(plain.step()[0].argmax()))
    third = plain.said(int(plain.step()[0].argmax()))
    expected = plain.step()[0]
    wrong = [(third + 1) % expected.numel(), 5, 6]

    drafted = Stepper(tiny_loaded, prompt)
    drafted.said(int(drafted.step()[0].argmax()))
    drafted.scheduler.propose("a", [second, *wrong])
    rows = drafted.step()
    assert rows.shape[0] == 5  # the last token and each drafted one's logits
    assert int(rows[0].argmax()) == second and int(rows[1].argmax()) == third  # the second kept, the first wrong
    drafted.scheduler.keep_drafted("a", [second])
    assert drafted.seq.computed == PROMPT_TOKENS + 2
    drafted.said(third)
    torch.testing.assert_close(drafted.step()[0], expected, rtol=0, atol=1e-4)
    assert drafted.seq.blocks == plain.seq.blocks[: len(drafted.seq.blocks)]
    assert drafted.scheduler.pool.free_blocks == plain.scheduler.pool.free_blocks


def test_rolled_back_blocks_return_to_the_pool_and_the_cache_never_holds_rejected_tokens(tiny_loaded, prompt):
    stepper = Stepper(tiny_loaded, prompt)
    first = stepper.said(int(stepper.step()[0].argmax()))
    free_before = stepper.scheduler.pool.free_blocks
    stepper.scheduler.propose("a", [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23])  # into block 1
    stepper.step()
    stepper.scheduler.keep_drafted("a", [])
    assert len(stepper.seq.blocks) == 1 and stepper.scheduler.pool.free_blocks == free_before
    stepper.said(40)
    stepper.step()
    stepper.scheduler.finish("a")
    pool = stepper.scheduler.pool
    cached = pool.match([*prompt, first, 40, 99])
    assert len(cached.blocks) * BLOCK + cached.partial_tokens == PROMPT_TOKENS + 2
    rejected = pool.match([*prompt, 7, 8, 9])
    assert len(rejected.blocks) * BLOCK + rejected.partial_tokens == PROMPT_TOKENS
