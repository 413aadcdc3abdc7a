"""One sequence through a fast backend's batched step, a batch of one as the batch runner runs a lone reply (tests)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.forward.paged_kv import BatchRow

BLOCK_SIZE = 16


class OneSequence:
    """A sequence alone in its own pool of ``capacity`` positions, in consecutive blocks (a run of them for each
    KV group of the model)."""

    def __init__(self, backend: Any, capacity: int = 1024, block_size: int = BLOCK_SIZE) -> None:
        self.backend = backend
        self.block_size = block_size
        self.capacity_blocks = -(-capacity // block_size)
        self.groups = len(backend.new_pool(1, block_size).windows)
        self.kv = backend.new_pool(self.capacity_blocks * self.groups, block_size)
        self.length = 0

    def feed(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``token_ids`` after what the sequence holds; logits of the last one, [V] fp32."""
        end = self.length + len(token_ids)
        used = -(-end // self.block_size)
        tables = [list(range(g * self.capacity_blocks, g * self.capacity_blocks + used)) for g in range(self.groups)]
        row = BatchRow(list(token_ids), self.length, tables[0], tuple(tables[1:]))
        logits = self.backend.forward_batch([row], self.kv)
        self.length = end
        return logits[0]  # [V]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions; later ones are written over."""
        self.length = min(length, self.length)


def prompt_logits(backend: Any, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits after ``token_ids`` fed into an empty pool, [V] fp32."""
    return OneSequence(backend, len(token_ids)).feed(token_ids)


def greedy_tokens(backend: Any, prompt: Sequence[int], count: int, sequence: OneSequence | None = None) -> list[int]:
    """``count`` greedy tokens after ``prompt`` (fed after what ``sequence`` holds, if given), one step each."""
    sequence = sequence or OneSequence(backend, len(prompt) + count)
    tokens = [int(sequence.feed(prompt).argmax())]
    while len(tokens) < count:
        tokens.append(int(sequence.feed(tokens[-1:]).argmax()))
    return tokens


def serve_greedy(backend: Any, requests: dict[str, tuple[list[int], int, int]], blocks: int,
                 block_size: int) -> tuple[dict[str, list[int]], int]:
    """Greedy replies of ``requests`` (id -> prompt, new tokens, the step it joins at) batched by the scheduler over
    a pool of ``blocks`` of ``block_size``; and the most window-group blocks any sequence had let go of at once."""
    from engine.scheduler.block_pool import BlockPool
    from engine.scheduler.scheduler import RELEASED, Scheduler

    kv = backend.new_pool(blocks, block_size)
    scheduler = Scheduler(BlockPool(blocks, block_size), step_tokens=8, max_running=4, idle_step_tokens=16,
                          windows=kv.windows)
    replies: dict[str, list[int]] = {request_id: [] for request_id in requests}
    released, index = 0, 0
    while scheduler.has_work or index <= max(join for _, _, join in requests.values()):
        for request_id, (prompt, _, join) in requests.items():
            if join == index:
                scheduler.add(request_id, prompt)
        step = scheduler.schedule()
        for copy in step.copies:
            kv.copy_block(copy.source, copy.target, copy.tokens)
        rows = [BatchRow(c.token_ids, c.start, c.block_ids, c.group_tables) for c in step.chunks]
        logits = backend.forward_batch(rows, kv) if rows else None
        scheduler.complete(step)
        released = max([released] + [sum(table.count(RELEASED) for table in s.tables) for s in scheduler.running])
        for row, chunk in enumerate(step.chunks):
            if chunk.samples:
                replies[chunk.request_id].append(int(logits[row].argmax()))
                if len(replies[chunk.request_id]) == requests[chunk.request_id][1]:
                    scheduler.finish(chunk.request_id)
                else:
                    scheduler.append(chunk.request_id, replies[chunk.request_id][-1])
        index += 1
    assert scheduler.pool.counts()[0] == 0, "every block went back"
    return replies, released
