"""Decode attention straight over a ``PagedKV``'s block tables, as a Triton kernel (engine thread).

Each row of a decode step is one query token of its own sequence. The kernel runs one
program per (row, kv head, split): it loads the kv head's G query heads once, walks its
share of the row's positions in tiles, finds each position's slot through the block
table (``table[p // block_size] * block_size + p % block_size``) and reads keys and
values from the pool where they lie: no gather, no copy. Scores and the running
softmax (maximum, sum, weighted values) are kept in fp32. Splitting a row's positions
over several programs (flash-decoding) keeps the GPU busy when rows × kv heads are
few; each split writes its normalised output and log-sum-exp, and a softmax over the
splits' log-sum-exps weighs them into the result (torch ops, a few per layer).

Shapes never depend on the rows' lengths (they are read from a tensor inside the
kernel), so a step that calls it can be captured in a CUDA graph. Rows with several
tokens (prefill chunks) do not come here: they use SDPA over gathered keys
(``CudaLlama.attend_chunk``). ``gathered_decode_attention`` is the same attention in torch
ops with fixed shapes, for where Triton is missing and for the CPU in tests.
"""

from __future__ import annotations

from functools import lru_cache

import torch

TILE = 64  # positions per loop iteration of a program
MAX_SPLITS = 16
PROGRAMS_WANTED = 256  # about two per streaming multiprocessor on a large GPU: a guess, not a measurement
MIN_DOT = 16  # ``tl.dot``'s smallest side on a GPU: the G query heads are padded up to it


@lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(q_ptr, kv_ptr, tables_ptr, lengths_ptr, out_ptr, lse_ptr, splits,
                     q_row_stride, q_head_stride, kv_pair_stride, kv_head_stride, kv_position_stride,
                     table_row_stride, table_column_stride, length_stride,
                     GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr):
        row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        length = tl.load(lengths_ptr + row * length_stride)
        share = tl.cdiv(tl.cdiv(length, splits), TILE) * TILE  # positions per split, whole tiles
        begin = split * share
        end = tl.minimum(begin + share, length)
        groups, dims = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)  # [BG], [BD]
        group_ok, dim_ok = groups < GROUPS, dims < HEAD_DIM
        heads = kv_head * GROUPS + groups  # [BG]: the query heads that share this kv head
        q_ptrs = q_ptr + row * q_row_stride + heads[:, None] * q_head_stride + dims[None, :]
        q = tl.load(q_ptrs, mask=group_ok[:, None] & dim_ok[None, :], other=0.0)  # [BG, BD], already scaled
        best = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)  # running maximum per query head
        total = tl.zeros((BLOCK_G,), dtype=tl.float32)  # running sum of exp(score - best)
        acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)  # running weighted values
        for first in range(begin, end, TILE):
            positions = first + tl.arange(0, TILE)  # [T]
            position_ok = positions < end
            blocks = tl.load(tables_ptr + row * table_row_stride + (positions // BLOCK_SIZE) * table_column_stride,
                             mask=position_ok, other=0)  # [T]
            slots = blocks.to(tl.int64) * BLOCK_SIZE + positions % BLOCK_SIZE  # [T]
            key_ptrs = kv_ptr + kv_head * kv_head_stride + slots[:, None] * kv_position_stride + dims[None, :]
            load_ok = position_ok[:, None] & dim_ok[None, :]
            keys = tl.load(key_ptrs, mask=load_ok, other=0.0)  # [T, BD]
            values = tl.load(key_ptrs + kv_pair_stride, mask=load_ok, other=0.0)  # [T, BD]
            scores = tl.dot(q, tl.trans(keys), input_precision="ieee")  # [BG, T] fp32
            scores = tl.where(position_ok[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            kept = tl.exp(best - new_best)  # [BG]: how much of the old sums still counts
            weights = tl.exp(scores - new_best[:, None])  # [BG, T]
            total = total * kept + tl.sum(weights, axis=1)
            acc = acc * kept[:, None] + tl.dot(weights.to(values.dtype), values, input_precision="ieee")
            best = new_best
        filled = total > 0  # false for a split past the row's end
        out = acc / tl.where(filled, total, 1.0)[:, None]  # [BG, BD]
        lse = tl.where(filled, best + tl.log(tl.where(filled, total, 1.0)), float("-inf"))  # [BG]
        where = (row * GROUPS * tl.num_programs(1) + heads) * splits + split  # [BG] in [B, H, S]
        tl.store(out_ptr + where[:, None] * HEAD_DIM + dims[None, :], out, mask=group_ok[:, None] & dim_ok[None, :])
        tl.store(lse_ptr + where, lse, mask=group_ok)

    return paged_decode


def split_count(rows: int, kv_heads: int) -> int:
    """Splits per (row, kv head), so that rows × kv heads × splits comes near ``PROGRAMS_WANTED``."""
    return max(1, min(MAX_SPLITS, PROGRAMS_WANTED // (rows * kv_heads)))


def paged_decode_attention(q: torch.Tensor, layer_kv: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor,
                           block_size: int, splits: int | None = None, tile: int = TILE) -> torch.Tensor:
    """``q`` [B, H, hd] (already scaled, last stride 1) over one layer of the pool ``layer_kv`` [2, Hkv, P, hd]
    (contiguous): row ``b`` attends to positions ``0 … lengths[b]-1`` of the blocks ``tables[b]`` [B, W].
    Query head ``h`` uses kv head ``h // (H / Hkv)``. Returns [B, H, hd] in ``q``'s dtype."""
    rows, heads, head_dim = q.shape
    kv_heads = layer_kv.shape[1]
    groups = heads // kv_heads
    splits = splits or split_count(rows, kv_heads)
    partial = torch.empty(rows, heads, splits, head_dim, dtype=torch.float32, device=q.device)  # [B, H, S, hd]
    lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)  # [B, H, S]
    _kernel()[(rows, kv_heads, splits)](
        q, layer_kv, tables, lengths, partial, lse, splits,
        q.stride(0), q.stride(1), layer_kv.stride(0), layer_kv.stride(1), layer_kv.stride(2),
        tables.stride(0), tables.stride(1), lengths.stride(0),
        GROUPS=groups, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_G=max(MIN_DOT, _power_of_two(groups)), BLOCK_D=_power_of_two(head_dim), TILE=tile,
    )
    weights = lse.softmax(dim=-1).unsqueeze(-1)  # [B, H, S, 1]: an empty split's is 0
    return (partial * weights).sum(dim=2).to(q.dtype)  # [B, H, hd]


def gathered_decode_attention(q: torch.Tensor, layer_kv: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor,
                              block_size: int) -> torch.Tensor:
    """``paged_decode_attention`` in torch ops: each row's whole table gathered (fixed shapes), positions from
    its length on masked. Returns [B, H, hd]."""
    rows, heads, head_dim = q.shape
    kv_heads = layer_kv.shape[1]
    offsets = torch.arange(block_size, device=q.device)  # [bs]
    slots = (tables.unsqueeze(-1) * block_size + offsets).flatten(1)  # [B, W * bs]
    pair = layer_kv[:, :, slots].transpose(1, 2)  # [2, B, Hkv, T, hd]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, head_dim)  # [B, Hkv, G, hd]
    scores = grouped @ pair[0].transpose(-1, -2)  # [B, Hkv, G, T]
    beyond = torch.arange(slots.shape[1], device=q.device) >= lengths.unsqueeze(1)  # [B, T]
    scores = scores.masked_fill(beyond[:, None, None, :], float("-inf"))
    values = pair[1].masked_fill(beyond[:, None, :, None], 0.0)  # never-written positions may hold NaN: 0 * NaN
    return (scores.softmax(dim=-1) @ values).reshape(rows, heads, head_dim)  # [B, H, hd]


def _power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()
