"""Rotary positions and the KV cache write of a step's new rows, in one call (engine thread).

PyTorch's path is a complex multiply over the queries and keys, then a strided copy of
the keys and values into the cache, several ops a layer whose dispatch a decode step
pays in every layer. The kernel does both in one pass of the row, rounding the keys and
values to the cache's bf16 (to nearest even, as PyTorch rounds), or quantizing them to an int8
pool's rows (``kv_layout``: codes and an fp16 scale per 32, as ``kv_int8.quantize_rows``),
before the attention kernel reads the cache in place.
"""

from __future__ import annotations

import torch

from engine.forward.native.build import LANES, address, library
from engine.forward.native.decode_attention import holds_pool
from engine.forward.paged_kv import INT8_ROWS


def covers(qkv: torch.Tensor, layer_kv: torch.Tensor) -> bool:
    """Whether the kernel writes ``qkv``'s keys and values into ``layer_kv``: a bf16 pool, or an int8 one where the
    variant has ``rotate_and_store_q8``."""
    return (library() is not None and qkv.dtype == torch.float32 and holds_pool(layer_kv.dtype, qkv.shape[-1])
            and qkv.device.type == "cpu" and qkv.shape[-1] % LANES == 0)


def rotate_and_store(qkv: torch.Tensor, turns: torch.Tensor, layer_kv: torch.Tensor, slots: torch.Tensor,
                     heads: int) -> None:
    """``qkv`` [S, H + 2Hkv, hd] (contiguous): its queries rotated by ``turns`` [S, 1, hd/2] (complex) in place, its
    keys rotated into ``layer_kv`` [2, Hkv, P, hd] bf16 (or [2, Hkv, P, row bytes] int8 rows) at ``slots`` [S]
    (int64 positions of the pool) and its values stored there."""
    rows, _, head_dim = qkv.shape
    _, kv_heads, positions, _ = layer_kv.shape
    pairs = torch.view_as_real(turns.contiguous())  # [S, 1, hd/2, 2]: cos, sin
    function = library().rotate_and_store_q8 if layer_kv.dtype == INT8_ROWS else library().rotate_and_store
    function(address(qkv), address(pairs), rows, heads, kv_heads, head_dim, address(layer_kv), positions,
             address(slots))
