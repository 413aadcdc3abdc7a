"""The pacer sizes a step's prompt tokens from what steps cost, and the scheduler gives a joining prompt that many."""

from __future__ import annotations

from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.step_pacer import MIN_PROMPT_TOKENS, StepPacer


def test_nothing_is_paced_before_both_costs_are_known():
    pacer = StepPacer(ratio=3.0)
    assert pacer.prompt_tokens(7) is None
    pacer.observe(7, 0, 20.0)  # a decode-only step of 7 rows
    assert pacer.prompt_tokens(7) is None
    pacer.observe(7, 10, 40.0)  # 10 prompt tokens added 20 ms
    assert pacer.prompt_tokens(7) == 20  # (3 - 1) * 20 ms at 2 ms a token
    assert pacer.prompt_tokens(3) is None  # no decode-only step of 3 rows seen


def test_dearer_tokens_make_smaller_chunks_but_a_prompt_always_moves_on():
    pacer = StepPacer(ratio=3.0)
    pacer.observe(7, 0, 20.0)
    sizes = []
    for cost_ms in (2.0, 3.0, 4.0, 6.0):  # a token's cost grows with the positions it attends to
        for _ in range(20):
            pacer.observe(7, 10, 20.0 + 10 * cost_ms)
        sizes.append(pacer.prompt_tokens(7))
    assert sizes == [20, 13, 10, MIN_PROMPT_TOKENS]  # 40 ms over each cost, at least the floor
    for _ in range(20):
        pacer.observe(7, 10, 20.0 + 10 * 500.0)
    assert pacer.prompt_tokens(7) == MIN_PROMPT_TOKENS


def test_one_slow_step_moves_neither_estimate_but_a_lasting_slowdown_shrinks_the_chunks():
    """A decode-only step the machine slowed leaves the median of the latest ones; so does one slowed step beside
    decoding rows, while dearer prompt tokens in most of the latest steps price the next chunk."""
    pacer = StepPacer(ratio=3.0)
    for ms in (20.0, 20.0, 60.0):
        pacer.observe(7, 0, ms)
    pacer.observe(7, 10, 40.0)  # 2 ms a token beside the median's 20 ms
    assert pacer.prompt_tokens(7) == 20
    pacer.observe(7, 10, 60.0)  # 4 ms a token once
    pacer.observe(7, 10, 40.0)
    assert pacer.prompt_tokens(7) == 20
    for _ in range(2):
        pacer.observe(7, 10, 60.0)  # now 3 of the latest 5
    assert pacer.prompt_tokens(7) == 10


def test_a_prompts_own_steps_stand_in_doubled_until_a_step_beside_decoding_rows_is_seen():
    pacer = StepPacer(ratio=3.0)
    pacer.observe(0, 512, 512.0)  # a prompt alone: 1 ms a token in big chunks
    pacer.observe(4, 0, 10.0)
    assert pacer.prompt_tokens(4) == 10  # (3 - 1) * 10 ms at twice 1 ms a token
    pacer.observe(4, 10, 25.0)  # beside 4 decoding rows: 1.5 ms a token
    assert pacer.prompt_tokens(4) == 13


def test_the_scheduler_gives_a_joining_prompt_what_the_pacer_allows():
    pacer = StepPacer(ratio=3.0)
    scheduler = Scheduler(BlockPool(400, 16), step_tokens=40, max_running=8, pacer=pacer)
    scheduler.add("streaming", list(range(10)))
    scheduler.complete(scheduler.schedule())  # its prompt, in one chunk
    scheduler.append("streaming", 5)
    pacer.observe(1, 0, 10.0)
    pacer.observe(1, 10, 15.0)  # half a ms a prompt token: (3 - 1) * 10 / 0.5 = 40 tokens
    scheduler.add("joining", list(range(1000)))
    chunks = {chunk.request_id: chunk for chunk in scheduler.schedule().chunks}
    assert len(chunks["streaming"].token_ids) == 1 and len(chunks["joining"].token_ids) == 40  # not 40 - 1
