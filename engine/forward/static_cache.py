"""A conversation's KV cache as preallocated buffers written in place (engine thread).

Keys and values of all layers live in one tensor that grows in chunks as the
conversation does, so memory follows the conversation's length rather than the
model's full context. Cropping to a prefix only moves ``length``: later writes
overwrite what lies beyond it.
"""

from __future__ import annotations

import torch

GROW_CHUNK = 256


class KVCache:
    """Positions ``[0, length)`` of every layer's keys and values."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self._shape = (layers, 2, kv_heads, 0, head_dim)
        self.buffer = torch.empty(self._shape, dtype=dtype, device=device)  # [L, 2, Hkv, capacity, D]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.buffer.shape[3]

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` positions, growing by whole chunks and keeping what is held."""
        if needed <= self.capacity:
            return
        capacity = -(-needed // GROW_CHUNK) * GROW_CHUNK
        layers, pair, kv_heads, _, head_dim = self._shape
        grown = torch.empty((layers, pair, kv_heads, capacity, head_dim), dtype=self.buffer.dtype, device=self.buffer.device)
        grown[:, :, :, : self.length] = self.buffer[:, :, :, : self.length]
        self.buffer = grown

    def write(self, layer: int, start: int, keys_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys_values`` [2, Hkv, S, D] at ``start`` in one copy; returns all keys and all values so far,
        [Hkv, start+S, D] each."""
        end = start + keys_values.shape[2]
        held = self.buffer[layer, :, :, :end]  # [2, Hkv, end, D]
        held[:, :, start:] = keys_values
        return held[0], held[1]

    def crop(self, length: int) -> None:
        self.length = max(0, min(length, self.length))

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()
