"""The scheduler and block pool with a fake model: replies come out as if each request ran alone.

The fake model's next token is a function of every token its attention would read, read back
through the sequence's block table from a fake KV store, so a block given to two sequences, a
wrong copy on write or an evicted block in use changes the text.
"""

from __future__ import annotations

import pytest

from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import ScheduledChunk, Scheduler, Step

VOCAB = 97


def next_token(context: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 31 + len(context)) % VOCAB


def alone(prompt: list[int], new_tokens: int) -> list[int]:
    context, out = list(prompt), []
    for _ in range(new_tokens):
        out.append(next_token(context))
        context.append(out[-1])
    return out


class FakeRunner:
    """Runs each planned step over a fake KV store (block → the token at each position)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        size = scheduler.pool.block_size
        self.store = [[None] * size for _ in range(scheduler.pool.num_blocks)]
        self.budgets: dict[str, int] = {}
        self.replies: dict[str, list[int]] = {}
        self.rejected: dict[str, str] = {}
        self.steps: list[Step] = []

    def submit(self, request_id: str, prompt: list[int], new_tokens: int) -> None:
        self.scheduler.add(request_id, prompt)
        self.budgets[request_id], self.replies[request_id] = new_tokens, []

    def step(self) -> None:
        step = self.scheduler.schedule()
        self.steps.append(step)
        self.rejected.update(step.rejected)
        for copy in step.copies:
            self.store[copy.target][: copy.tokens] = self.store[copy.source][: copy.tokens]
        sampled = {}
        for chunk in step.chunks:
            token = self.feed(chunk)
            if token is not None:
                sampled[chunk.request_id] = token
        self.scheduler.complete(step)
        for request_id, token in sampled.items():
            self.replies[request_id].append(token)
            if len(self.replies[request_id]) >= self.budgets[request_id]:
                self.scheduler.finish(request_id)
            else:
                self.scheduler.append(request_id, token)

    def feed(self, chunk: ScheduledChunk) -> int | None:
        """Writes ``chunk``'s tokens into its blocks; the token it samples, if it samples, from what they hold."""
        size = self.scheduler.pool.block_size
        for offset, token in enumerate(chunk.token_ids):
            position = chunk.start + offset
            self.store[chunk.block_ids[position // size]][position % size] = token
        if not chunk.samples:
            return None
        end = chunk.start + len(chunk.token_ids)
        return next_token([self.store[chunk.block_ids[p // size]][p % size] for p in range(end)])

    def run(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.scheduler.has_work:
                return
            self.step()
        raise AssertionError("the scheduler never finished")


def prompt(length: int, seed: int) -> list[int]:
    return [(seed * 7 + i * 13) % VOCAB for i in range(length)]


def test_eight_requests_joining_at_different_steps_match_each_run_alone() -> None:
    runner = FakeRunner(Scheduler(BlockPool(200, 16), step_tokens=32, max_running=8))
    prompts = {f"r{i}": prompt(5 + 23 * i, i) for i in range(8)}
    for index, (request_id, ids) in enumerate(prompts.items()):
        runner.submit(request_id, ids, 12)
        for _ in range(index):  # later requests arrive while earlier ones stream
            runner.step()
    runner.run()
    assert max(len(step.chunks) for step in runner.steps) >= 4, "several sequences shared steps"
    for request_id, ids in prompts.items():
        assert runner.replies[request_id] == alone(ids, 12)
    assert runner.scheduler.pool.counts()[0] == 0, "every block went back"


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    runner = FakeRunner(Scheduler(BlockPool(400, 16), step_tokens=40, max_running=8))
    runner.submit("short", prompt(10, 1), 100)
    runner.step()
    runner.submit("long", prompt(2000, 2), 3)
    while "long" not in [c.request_id for s in runner.steps for c in s.chunks if c.samples]:
        runner.step()
        assert "short" in [c.request_id for c in runner.steps[-1].chunks] or not runner.scheduler.get("short")
    assert max(len(c.token_ids) for s in runner.steps for c in s.chunks) <= 40
    runner.run()
    assert runner.replies["long"] == alone(prompt(2000, 2), 3)
    assert runner.replies["short"] == alone(prompt(10, 1), 100)


def test_eight_conversations_with_one_system_prompt_hold_its_blocks_once() -> None:
    pool = BlockPool(300, 16)
    runner = FakeRunner(Scheduler(pool, step_tokens=1200, max_running=8))
    system = prompt(1000, 3)
    runner.submit("first", system + [1, 2, 3], 2)
    runner.step()
    for i in range(8):
        runner.submit(f"chat{i}", system + prompt(7 + i, 10 + i), 20)
    runner.step()
    runner.step()
    shared = runner.scheduler.get("chat0").blocks[: 1000 // 16]
    assert all(pool.blocks[b].ref_count == 8 for b in shared)
    assert all(runner.scheduler.get(f"chat{i}").blocks[: 1000 // 16] == shared for i in range(8))
    used, _, _ = pool.counts()
    assert used * 16 <= 1.2 * 1000 + 8 * 2 * 16, "the prefix is held once, plus a block or two per chat"
    runner.run()
    for i in range(8):
        assert runner.replies[f"chat{i}"] == alone(system + prompt(7 + i, 10 + i), 20)


def test_an_edit_reuses_everything_before_it_and_regenerating_all_but_one_token() -> None:
    runner = FakeRunner(Scheduler(BlockPool(100, 16)))
    original = prompt(100, 4)
    runner.submit("a", original, 5)
    runner.run()
    edited = original[:70] + [5, 5, 5]
    runner.submit("edit", edited, 5)
    runner.step()
    assert runner.scheduler.get("edit").reused == 70
    runner.run()
    assert runner.replies["edit"] == alone(edited, 5)
    runner.submit("again", original, 5)
    runner.step()
    assert runner.scheduler.get("again").reused == len(original) - 1
    runner.run()
    assert runner.replies["again"] == runner.replies["a"]


def test_eviction_takes_the_least_recently_used_cached_block_never_one_in_use() -> None:
    pool = BlockPool(4, 2)
    held = pool.allocate(2)
    pool.index(-1, [1, 2], held[0])
    old = pool.allocate(1)
    pool.index(-1, [7, 7], old[0])
    pool.release(old)
    newer = pool.allocate(1)
    pool.index(-1, [8, 8], newer[0])
    pool.release(newer)
    assert pool.allocate(3) is None, "two blocks are in use: only two can be had"
    first = pool.allocate(1)
    assert first == old and pool.match([7, 7]).blocks == () and pool.match([8, 8]).blocks == tuple(newer)
    assert pool.allocate(1) == newer and pool.allocate(1) is None
    assert pool.match([1, 2]).blocks == (held[0],) and pool.blocks[held[0]].ref_count == 1


def test_a_request_waits_for_blocks_and_completes_when_others_finish() -> None:
    runner = FakeRunner(Scheduler(BlockPool(8, 8), max_running=8))
    runner.submit("big1", prompt(40, 1), 10)
    runner.submit("big2", prompt(40, 2), 10)
    runner.step()
    assert runner.scheduler.get("big2") in runner.scheduler.waiting, "no room yet: it waits"
    runner.run()
    assert runner.replies["big2"] == alone(prompt(40, 2), 10)
    assert runner.replies["big1"] == alone(prompt(40, 1), 10)


def test_a_short_pool_preempts_and_recomputes_without_changing_any_reply() -> None:
    runner = FakeRunner(Scheduler(BlockPool(10, 4), max_running=4))
    for i in range(4):
        runner.submit(f"r{i}", prompt(6, i), 12)
    runner.run()
    assert any(step.preempted for step in runner.steps)
    for i in range(4):
        assert runner.replies[f"r{i}"] == alone(prompt(6, i), 12)


def test_cancelling_one_of_eight_leaves_the_others_unchanged() -> None:
    runner = FakeRunner(Scheduler(BlockPool(200, 16), max_running=8))
    for i in range(8):
        runner.submit(f"r{i}", prompt(30, 20 + i), 15)
    for _ in range(5):
        runner.step()
    runner.scheduler.finish("r3")
    runner.run()
    assert 0 < len(runner.replies["r3"]) < 15
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert runner.replies[f"r{i}"] == alone(prompt(30, 20 + i), 15)


def test_a_prompt_larger_than_the_pool_is_rejected_with_a_reason_and_others_run() -> None:
    runner = FakeRunner(Scheduler(BlockPool(4, 4)))
    runner.submit("huge", prompt(100, 1), 3)
    runner.submit("fits", prompt(5, 2), 3)
    runner.run()
    assert "needs 100 positions" in runner.rejected["huge"]
    assert runner.replies["fits"] == alone(prompt(5, 2), 3)


def test_an_aborted_sequence_leaves_nothing_it_wrote_in_the_index() -> None:
    scheduler = Scheduler(BlockPool(20, 4))
    runner = FakeRunner(scheduler)
    runner.submit("x", prompt(20, 1), 5)
    runner.step()
    scheduler.abort("x")
    assert scheduler.pool.match(prompt(20, 1)).blocks == ()
    assert scheduler.pool.counts() == (0, 0, 0)


def test_an_empty_pool_or_prompt_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0, 16)
    with pytest.raises(ValueError, match="at least one prompt token"):
        Scheduler(BlockPool(4, 4)).add("r", [])


def test_chats_arriving_together_with_one_system_prompt_compute_it_once() -> None:
    pool = BlockPool(300, 16)
    runner = FakeRunner(Scheduler(pool, step_tokens=64, max_running=8, idle_step_tokens=512))
    system = prompt(1000, 5)
    prompts = {f"chat{i}": system + prompt(9 + i, 30 + i) for i in range(8)}
    for request_id, ids in prompts.items():
        runner.submit(request_id, ids, 10)
    fed = 0
    while runner.scheduler.has_work:
        runner.step()
        fed += sum(len(c.token_ids) for c in runner.steps[-1].chunks)
        assert pool.used_blocks * 16 <= 1.2 * 1000 + 8 * 2 * 16
    assert fed < 1000 + 8 * (16 + 9 + 7 + 10), "the shared prefix was computed once"
    for request_id, ids in prompts.items():
        assert runner.replies[request_id] == alone(ids, 10)


def test_sequences_growing_side_by_side_keep_their_blocks_in_one_run() -> None:
    """The forward pass reads a run of blocks in place; scattered blocks it must gather first."""
    runner = FakeRunner(Scheduler(BlockPool(400, 16), step_tokens=64, max_running=8))
    for index in range(8):
        runner.submit(f"r{index}", prompt(40, index), 60)
    for _ in range(70):
        runner.step()
        for seq in runner.scheduler.running:
            assert seq.blocks == list(range(seq.blocks[0], seq.blocks[0] + len(seq.blocks))), seq.request_id
    runner.run()
    for index in range(8):
        assert runner.replies[f"r{index}"] == alone(prompt(40, index), 60)


def test_a_prompt_holds_blocks_for_what_is_written_not_for_all_of_it_at_once() -> None:
    """KV held stays at the positions written plus at most one partly filled block per sequence."""
    runner = FakeRunner(Scheduler(BlockPool(600, 16), step_tokens=40, max_running=8))
    runner.submit("streaming", prompt(20, 0), 80)
    runner.step()
    for index in range(1, 8):
        runner.submit(f"long{index}", prompt(300, index), 4)
    while runner.scheduler.has_work:
        runner.step()
        for seq in runner.scheduler.running:
            written_blocks = -(-seq.computed // 16)
            assert len(seq.blocks) <= written_blocks + 1, (seq.request_id, seq.computed, len(seq.blocks))
    for index in range(1, 8):
        assert runner.replies[f"long{index}"] == alone(prompt(300, index), 4)
    assert runner.replies["streaming"] == alone(prompt(20, 0), 80)


def test_prompts_admitted_together_never_starve_each_other_of_blocks() -> None:
    """Admission keeps the blocks running prompts still need free: a tight pool finishes every reply."""
    runner = FakeRunner(Scheduler(BlockPool(24, 16), step_tokens=32, max_running=4))
    prompts = {f"r{i}": prompt(90, i) for i in range(4)}
    for request_id, ids in prompts.items():
        runner.submit(request_id, ids, 20)
    runner.run()
    for request_id, ids in prompts.items():
        assert runner.replies[request_id] == alone(ids, 20)
