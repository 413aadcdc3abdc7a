"""The fast path on the CPU as the batch runner drives it (engine thread).

``FastLlamaBackend`` runs a ``FastLlama`` over a ``PagedKV``: every reply, alone or
beside others, is a step of ``forward_batch``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.forward.backend import BatchBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.paged_kv import BatchRow, PagedKV
from engine.scheduler.scheduler import DEFAULT_MAX_RUNNING, DEFAULT_STEP_TOKENS


class FastLlamaBackend(BatchBackend):
    """A ``FastLlama`` on the CPU, with the scheduler's CPU-sized step budget."""

    batch_step_tokens = DEFAULT_STEP_TOKENS
    batch_max_running = DEFAULT_MAX_RUNNING

    def __init__(self, model: FastLlama) -> None:
        self.model = model
        self.device: torch.device = model.device

    def new_pool(self, num_blocks: int, block_size: int) -> PagedKV:
        model = self.model
        groups = model.kv_groups
        return PagedKV(groups.page_layers, model.kv_heads, model.head_dim, num_blocks, block_size, model.kv_dtype,
                       self.device, groups.windows)

    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        return self.model.forward_batch(rows, kv)
