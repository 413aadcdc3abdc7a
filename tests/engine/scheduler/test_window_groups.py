"""KV groups with sliding windows, with a fake model: replies come out as if each request ran alone, while a window
group holds only its window's blocks.

The fake model's next token is a function of what each group's attention reads back through that group's table
from a fake KV store: every position for a full group, the last ``window`` for a window group. A block let go too
early, an evicted shadow or a wrong copy changes the text.
"""

from __future__ import annotations

from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import RELEASED, ScheduledChunk, Scheduler
from tests.engine.scheduler.test_scheduler import FakeRunner, next_token, prompt

SIZE = 4


def seen(context: list[int], window: int | None) -> list[int]:
    return context if window is None else context[-window:]


def alone(prompt_ids: list[int], new_tokens: int, windows: tuple[int | None, ...]) -> list[int]:
    context, out = list(prompt_ids), []
    for _ in range(new_tokens):
        out.append(sum(next_token(seen(context, window)) for window in windows) % 97)
        context.append(out[-1])
    return out


class GroupsRunner(FakeRunner):
    """``FakeRunner`` over every table of a chunk: each group's keys are written and read through its own."""

    def feed(self, chunk: ScheduledChunk) -> int | None:
        tables = (chunk.block_ids, *chunk.group_tables)
        end = chunk.start + len(chunk.token_ids)
        for table in tables:
            for offset, token in enumerate(chunk.token_ids):
                self._write(table, chunk.start + offset, token)
        if not chunk.samples:
            return None
        return sum(next_token([self._read(table, p) for p in range(end - len(seen(range(end), window)), end)])
                   for table, window in zip(tables, self.scheduler.windows)) % 97

    def _write(self, table, position: int, token: int) -> None:
        block = table[position // SIZE]
        assert block != RELEASED, f"position {position} written into a released block"
        self.store[block][position % SIZE] = token

    def _read(self, table, position: int) -> int:
        block = table[position // SIZE]
        assert block != RELEASED, f"position {position} read from a released block"
        return self.store[block][position % SIZE]


def test_requests_joining_at_different_steps_match_each_run_alone_with_window_groups() -> None:
    windows = (None, 8, 8)
    runner = GroupsRunner(Scheduler(BlockPool(300, SIZE), step_tokens=12, max_running=4, idle_step_tokens=20,
                                    windows=windows))
    prompts = {f"r{i}": prompt(3 + 17 * i, i) for i in range(5)}
    for index, (request_id, ids) in enumerate(prompts.items()):
        runner.submit(request_id, ids, 15)
        for _ in range(index):
            runner.step()
    runner.run()
    assert max(len(step.chunks) for step in runner.steps) >= 3, "several sequences shared steps"
    for request_id, ids in prompts.items():
        assert runner.replies[request_id] == alone(ids, 15, windows)
    assert runner.scheduler.pool.counts()[0] == 0, "every block went back"


def test_a_window_group_lets_go_of_blocks_before_its_window_as_the_sequence_grows() -> None:
    scheduler = Scheduler(BlockPool(100, SIZE), idle_step_tokens=8, windows=(None, 6))
    runner = GroupsRunner(scheduler)
    runner.submit("r", prompt(40, 1), 20)
    for _ in range(12):
        runner.step()
    seq = scheduler.get("r")
    full, window = seq.tables
    assert RELEASED not in full and len(full) == -(-len(seq.token_ids) // SIZE)
    live = [block for block in window if block != RELEASED]
    assert len(live) <= -(-6 // SIZE) + 1, "the window's blocks and the one it starts inside"
    assert window[: len(window) - len(live)] == [RELEASED] * (len(window) - len(live))
    assert scheduler.pool.used_blocks == len(full) + len(live)


def test_every_layer_windowed_runs_a_conversation_longer_than_the_pool() -> None:
    windows = (8,)
    runner = GroupsRunner(Scheduler(BlockPool(12, SIZE), step_tokens=8, max_running=2, idle_step_tokens=8,
                                    windows=windows))
    runner.submit("long", prompt(30, 2), 60)  # 90 positions, the pool holds 48
    runner.run()
    assert not runner.rejected
    assert runner.replies["long"] == alone(prompt(30, 2), 60, windows)


def test_a_later_turn_reuses_the_prefix_whose_window_is_still_cached() -> None:
    windows = (None, 8)
    scheduler = Scheduler(BlockPool(100, SIZE), idle_step_tokens=8, windows=windows)
    runner = GroupsRunner(scheduler)
    first = prompt(40, 3)
    runner.submit("turn1", first, 3)
    runner.run()
    second = first + runner.replies["turn1"] + prompt(9, 4)
    runner.submit("turn2", second, 6)
    runner.step()
    assert scheduler.get("turn2").reused == 42, "the first turn's written tokens: its blocks and partial block"
    runner.run()
    assert runner.replies["turn2"] == alone(second, 6, windows)


def test_a_prefix_whose_last_window_was_evicted_is_reused_up_to_where_its_window_is_cached() -> None:
    windows = (None, 8)
    scheduler = Scheduler(BlockPool(100, SIZE), idle_step_tokens=8, windows=windows)
    runner = GroupsRunner(scheduler)
    first = prompt(40, 5)
    runner.submit("turn1", first, 1)
    runner.run()
    match = scheduler.pool.match(first)
    scheduler.pool.forget([scheduler.pool.shadow(match.blocks[-1], 1)])  # the window's last block is gone
    second = first + prompt(7, 6)
    runner.submit("turn2", second, 6)
    runner.step()
    assert scheduler.get("turn2").reused == 36, "up to the block before the lost one"
    runner.run()
    assert runner.replies["turn2"] == alone(second, 6, windows)


def test_replies_on_a_tight_pool_preempt_and_recompute_as_if_alone_with_window_groups() -> None:
    windows = (None, 8)
    runner = GroupsRunner(Scheduler(BlockPool(40, SIZE), step_tokens=8, max_running=4, idle_step_tokens=8,
                                    windows=windows))
    prompts = {f"r{i}": prompt(10 + 3 * i, 20 + i) for i in range(4)}
    for request_id, ids in prompts.items():
        runner.submit(request_id, ids, 25)
    runner.run()
    assert any(step.preempted for step in runner.steps), "the pool ran short"
    for request_id, ids in prompts.items():
        assert runner.replies[request_id] == alone(ids, 25, windows)
    assert runner.scheduler.pool.counts()[0] == 0
