"""The KV cache's row layouts and the bytes a key or value row takes in each (any thread; no torch).

Of the KV caches a load may ask for (``messages.KV_CACHES``), "auto" and "bf16" keep the CPU fast path's bf16
cache; "int8" keeps each head's key and value row as llama.cpp's q8_0 cache does: one int8 code a value and an fp16
scale per ``KV_GROUP`` values (scale = max|x| / 127, codes rounded to nearest), about half bf16's bytes. A row of ``head_dim`` values is then ``head_dim`` bytes of codes followed by ``head_dim / KV_GROUP`` fp16 scales, scale
``g`` covering codes ``g * KV_GROUP …``: the scales beside the codes of the same row, so a row is read in one place.
Only the CPU fast path holds an int8 cache (``format_plan.choose_formats`` refuses it elsewhere).
"""

from __future__ import annotations

KV_GROUP = 32  # values a scale covers
KV_VALUE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + 2.0 / KV_GROUP}
"""Bytes a cached value takes in each KV cache dtype, its share of the scales included (exact in binary)."""


def kv_row_bytes(kv_cache: str, head_dim: int) -> int:
    """Bytes of one head's key (or value) row of ``head_dim`` values in the ``kv_cache`` dtype."""
    return int(head_dim * KV_VALUE_BYTES[kv_cache])


def int8_kv_refusal(head_dim: int) -> str | None:
    """Why a model whose heads are ``head_dim`` wide cannot keep an int8 cache, or None where it can."""
    if head_dim % KV_GROUP:
        return f"the int8 KV cache takes heads of a multiple of {KV_GROUP} values, and this model's have {head_dim}"
    return None
