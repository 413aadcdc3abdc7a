"""Forgetting a conversation uncaches the blocks only it used; shared and held blocks stay (no model needed)."""

from __future__ import annotations

from engine.scheduler.block_pool import BlockPool
from engine.scheduler.conversation_chains import ConversationChains
from engine.scheduler.scheduler import Scheduler

SYSTEM = list(range(1, 9))  # two full blocks of four


def _run_and_record(scheduler: Scheduler, chains: ConversationChains, conversation_id: str, tokens: list[int]) -> None:
    """One sequence prefilled in one step and finished, as the batch runner does (its reply left out)."""
    scheduler.add(conversation_id, tokens)
    step = scheduler.schedule()
    scheduler.complete(step)
    chains.record(conversation_id, scheduler.get(conversation_id).token_ids)
    scheduler.finish(conversation_id)


def _setup() -> tuple[Scheduler, ConversationChains]:
    scheduler = Scheduler(BlockPool(16, 4))
    chains = ConversationChains(scheduler.pool, limit=16)
    _run_and_record(scheduler, chains, "a", SYSTEM + [20, 21, 22, 23, 24, 25])
    _run_and_record(scheduler, chains, "b", SYSTEM + [30, 31])
    return scheduler, chains


def test_forgetting_frees_the_unshared_blocks_and_keeps_the_shared_prefix() -> None:
    scheduler, chains = _setup()
    pool = scheduler.pool
    cached_before = pool.counts()[2]

    freed = chains.forget("a")

    assert freed == 2 and pool.counts()[2] == cached_before - 2
    a_match = pool.match(SYSTEM + [20, 21, 22, 23, 24, 25])
    assert len(a_match.blocks) == 2 and a_match.partial_tokens == 0, "only the shared system prompt is left of a"
    b_match = pool.match(SYSTEM + [30, 31])
    assert len(b_match.blocks) == 2 and b_match.partial_tokens == 2, "b is whole"
    assert chains.forget("a") == 0


def test_blocks_a_running_sequence_holds_stay_cached() -> None:
    scheduler, chains = _setup()
    scheduler.add("a-copy", SYSTEM + [20, 21, 22, 23, 24, 25, 26])  # a forked chat, still running
    scheduler.complete(scheduler.schedule())

    freed = chains.forget("a")

    assert freed == 1, "a's full block is held by the fork; only a's partial last block goes"
    assert len(scheduler.pool.match(SYSTEM + [20, 21, 22, 23, 24]).blocks) == 3


def test_a_later_turn_and_the_last_block_of_the_turn_it_extends_go_too() -> None:
    scheduler, chains = _setup()
    second_turn = SYSTEM + [20, 21, 22, 23, 24, 25, 26, 27, 28]
    _run_and_record(scheduler, chains, "a", second_turn)
    cached_before = scheduler.pool.counts()[2]

    assert chains.forget("a") == 4, "20-23, 24-27, 28, and the first turn's own last block 24-25"
    assert scheduler.pool.counts()[2] == cached_before - 4
    assert len(scheduler.pool.match(second_turn).blocks) == 2
