"""Decode steps of several sequences over a block pool on a GPU, one fixed shape per batch-size bucket (engine thread).

A step of B sequences, one new token each, runs as the step of the smallest bucket
(``BUCKETS``) that holds B. The rows past B are padding: a dummy sequence at position
0 whose block table points only at the pool's scratch block (one block more than the
scheduler hands out), so they write and read there alone and the real rows' logits do
not depend on them. Token ids, positions, lengths and block tables are one static
device tensor, written by one copy before each run, so the bucket's step can be
captured as a CUDA graph (``GraphRunner.capture``) the first time it runs and replayed
after; if a capture fails, steps stay eager and the graph runner keeps the reason.

Attention is ``paged_attention``'s Triton kernel over the block tables; without Triton
(and on the CPU, where tests run these steps eagerly) it is the same attention in torch
ops over each row's gathered table. Steps with prefill chunks, more rows than the
largest bucket, or a table wider than ``table_width`` go through ``FastLlama.forward_batch``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from engine.forward.cuda_graphs import Captured, GraphRunner, replay
from engine.forward.llama_forward import FastLlama
from engine.forward.paged_attention import gathered_decode_attention, paged_decode_attention
from engine.forward.paged_kv import BatchRow, PagedKV
from engine.forward.weights import triton_gemv

BUCKETS = (1, 2, 4, 8, 16, 32)
FIELDS = 3  # rows of the input tensor before the block tables: token ids, positions, lengths

DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def bucket_for(rows: int) -> int | None:
    """The smallest bucket that holds ``rows`` sequences; ``None`` past the largest."""
    return next((bucket for bucket in BUCKETS if bucket >= rows), None)


def decode_attention_for(device: torch.device) -> DecodeAttention:
    """The Triton kernel on a GPU where Triton is installed, else its torch-ops twin."""
    return paged_decode_attention if device.type == "cuda" and triton_gemv.available() else gathered_decode_attention


class DevicePool(PagedKV):
    """A ``PagedKV`` with one more block, the scratch block padding rows use, and each bucket's step and graph."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, table_width: int) -> None:
        super().__init__(layers, kv_heads, head_dim, num_blocks + 1, block_size, dtype, device)
        self.scratch_block = num_blocks
        self.table_width = table_width  # blocks of the longest sequence a bucket step takes
        self.steps: dict[int, BucketStep] = {}
        self.graphs: dict[int, Captured] = {}  # bucket -> a capture bound to this pool's buffer


class BucketStep:
    """One token for each of ``bucket`` rows over ``pool``, with fixed shapes; logits [bucket, V] fp32."""

    def __init__(self, model: FastLlama, pool: DevicePool, bucket: int, attention: DecodeAttention) -> None:
        self.model, self.pool, self.attention = model, pool, attention
        padding = torch.full((FIELDS + pool.table_width, bucket), pool.scratch_block, dtype=torch.long)
        padding[:FIELDS] = torch.tensor([[0], [0], [1]])  # token 0 at position 0, one position long
        self._padding = padding  # [F + W, bucket] on the host: every row the scratch sequence
        self.inputs = padding.to(model.device)  # [F + W, bucket], written in place before each run
        self._turns = model.rotations(0, pool.table_width * pool.block_size)  # [C, 1, hd/2] complex

    def set_input(self, rows: Sequence[BatchRow]) -> None:
        """Write ``rows`` (one token each) over the padding, in one copy to the device."""
        host = self._padding.clone()
        count = len(rows)
        starts = torch.tensor([row.start for row in rows], dtype=torch.long)  # [B]
        host[0, :count] = torch.tensor([row.token_ids[0] for row in rows], dtype=torch.long)
        host[1, :count] = starts
        host[2, :count] = starts + 1
        for index, row in enumerate(rows):
            host[FIELDS : FIELDS + len(row.block_ids), index] = torch.tensor(row.block_ids, dtype=torch.long)
        self.inputs.copy_(host)

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        model, size = self.model, self.pool.block_size
        tokens, positions, lengths = self.inputs[0], self.inputs[1], self.inputs[2]  # [Bk] each
        tables = self.inputs[FIELDS:].t()  # [Bk, W]
        blocks = tables.gather(1, (positions // size).unsqueeze(1)).squeeze(1)  # [Bk]: each new token's block
        slots = blocks * size + positions % size  # [Bk]: where its keys and values go
        turns = self._turns.index_select(0, positions)  # [Bk, 1, hd/2]
        x = model.embed(tokens)  # [Bk, D]
        for index, layer in enumerate(model.layers):
            h = model.normalise(x)
            q, new_keys_values = model.project(layer, h, turns)  # [Bk, H, hd], [2, Hkv, Bk, hd]
            self.pool.write(index, slots, new_keys_values)
            attended = self.attention(q, self.pool.buffer[index], tables, lengths, size)  # [Bk, H, hd]
            x = x + layer.out(attended.reshape(h.shape[0], -1))
            x = x + layer.mlp(model.normalise(x))
        return model.lm_head(model.normalise(x)).float()  # [Bk, V]


def fits_a_bucket(rows: Sequence[BatchRow], pool: PagedKV) -> bool:
    """Whether a bucket step can run ``rows``: one token each, few enough, tables no wider than the pool's width."""
    return (isinstance(pool, DevicePool) and bucket_for(len(rows)) is not None
            and all(len(row.token_ids) == 1 and len(row.block_ids) <= pool.table_width for row in rows))


def run_bucket(model: FastLlama, runner: GraphRunner, attention: DecodeAttention, rows: Sequence[BatchRow],
               pool: DevicePool) -> torch.Tensor:
    """``rows`` (``fits_a_bucket``) through their bucket's step: replayed if captured, else eager, then captured.
    Logits of each row, [B, V] fp32."""
    bucket = bucket_for(len(rows))
    assert bucket is not None
    step = pool.steps.get(bucket)
    if step is None:
        step = pool.steps[bucket] = BucketStep(model, pool, bucket, attention)
    step.set_input(rows)
    captured = pool.graphs.get(bucket) if runner.use_graphs else None
    if captured is not None:
        return replay(captured)[: len(rows)]
    logits = step()
    if runner.use_graphs:
        captured = runner.capture(step, bucket)
        if captured is not None:
            pool.graphs[bucket] = captured
    return logits[: len(rows)]
