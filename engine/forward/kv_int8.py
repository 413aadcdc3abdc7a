"""The int8 KV cache's rows in torch ops: quantizing keys and values as they are written, widening them as they are
read (engine thread). The row layout is ``kv_layout``'s: ``head_dim`` int8 codes, then an fp16 scale per
``KV_GROUP`` values, held as bytes (uint8) in the block pool. Hearth's CPU kernels write and read the same layout
(``native.rotary``, ``native.decode_attention``); these serve where they do not run, and as the tests' reference.
"""

from __future__ import annotations

import torch

from engine.forward.kv_layout import KV_GROUP, kv_row_bytes


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., hd] (any float dtype) as int8 rows [..., hd + hd / 16] uint8: per group of ``KV_GROUP`` values
    the fp32 scale max|x| / 127 (1 for an all-zero group), codes round(x * (1 / scale)) to nearest even, and that
    scale stored rounded to fp16, as llama.cpp's q8_0."""
    head_dim = x.shape[-1]
    groups = x.float().unflatten(-1, (head_dim // KV_GROUP, KV_GROUP))  # [..., hd / 32, 32]
    largest = groups.abs().amax(dim=-1, keepdim=True)  # [..., hd / 32, 1]
    scales = torch.where(largest > 0, largest / 127.0, torch.ones_like(largest))
    codes = (groups * scales.reciprocal()).round_().to(torch.int8).flatten(-2)  # [..., hd]
    rows = torch.empty((*x.shape[:-1], kv_row_bytes("int8", head_dim)), dtype=torch.uint8, device=x.device)
    rows[..., :head_dim] = codes.view(torch.uint8)
    rows[..., head_dim:] = scales.squeeze(-1).to(torch.float16).view(torch.uint8)  # fp16 bytes, little-endian
    return rows


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 rows [..., hd + hd / 16] uint8 (``quantize_rows``) as values [..., hd] in ``dtype``: code × scale,
    in fp32."""
    head_dim = rows.shape[-1] * KV_GROUP // (KV_GROUP + 2)
    codes = rows[..., :head_dim].contiguous().view(torch.int8).float()  # [..., hd]
    scales = rows[..., head_dim:].contiguous().view(torch.float16).float()  # [..., hd / 32]
    values = codes.unflatten(-1, (-1, KV_GROUP)) * scales.unsqueeze(-1)  # [..., hd / 32, 32]
    return values.flatten(-2).to(dtype)
