"""Rotary positions and the KV cache write of a step's new rows, in one call (engine thread).

PyTorch's path is a complex multiply over the queries and keys, then a strided copy of
the keys and values into the cache, several ops a layer whose dispatch a decode step
pays in every layer. The kernel does both in one pass of the row, before the attention
kernel reads the cache in place.
"""

from __future__ import annotations

import torch

from engine.forward.native.build import LANES, address, kv_cache_dtype, library


def covers(qkv: torch.Tensor, layer_kv: torch.Tensor) -> bool:
    return (library() is not None and qkv.dtype == torch.float32 and layer_kv.dtype == kv_cache_dtype()
            and qkv.device.type == "cpu" and qkv.shape[-1] % LANES == 0)


def rotate_and_store(qkv: torch.Tensor, turns: torch.Tensor, layer_kv: torch.Tensor, slots: torch.Tensor,
                     heads: int) -> None:
    """``qkv`` [S, H + 2Hkv, hd] (contiguous): its queries rotated by ``turns`` [S, 1, hd/2] (complex) in place, its
    keys rotated into ``layer_kv`` [2, Hkv, P, hd] at ``slots`` [S] (int64 positions of the pool) and its values
    copied there."""
    rows, _, head_dim = qkv.shape
    _, kv_heads, positions, _ = layer_kv.shape
    pairs = torch.view_as_real(turns.contiguous())  # [S, 1, hd/2, 2]: cos, sin
    library().rotate_and_store(address(qkv), address(pairs), rows, heads, kv_heads, head_dim, address(layer_kv),
                               positions, address(slots))
