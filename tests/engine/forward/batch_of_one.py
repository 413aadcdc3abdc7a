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
