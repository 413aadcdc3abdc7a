"""The fixed-shape decode step and the static KV cache it writes into (engine thread).

A CUDA graph replays kernels on the very tensors it was captured with, so the
decode step is written with shapes and addresses that never change: the token and
its position are one-element tensors written before each run, the new keys and
values go to that position with ``index_copy_``, and attention spans a fixed
number of cache positions (``span``) with a mask hiding those past the position.
The same code runs eagerly on the CPU, which is how tests check it against
``FastLlama.forward``.

``StaticKVCache`` is allocated once, at its full capacity, on its first use;
cropping for reuse only moves ``length``. Spans are powers of two from
``FIRST_SPAN`` up to the capacity, so a short chat does not read the whole buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.forward.fast_llama import FastLlama, swiglu
from engine.forward.static_cache import KVCache

FIRST_SPAN = 256


class CacheFullError(ValueError):
    """The conversation needs more positions than its static cache holds."""


class StaticKVCache(KVCache):
    """A ``KVCache`` whose buffer has a fixed capacity and address (zero-filled, so masked slots stay finite)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int) -> None:
        super().__init__(layers, kv_heads, head_dim, dtype, device)
        self._full_shape = (layers, 2, kv_heads, capacity, head_dim)
        self.graphs: dict[int, Any] = {}  # span -> a capture bound to this buffer (``cuda_graphs``)

    @property
    def capacity(self) -> int:
        return self._full_shape[3]

    @property
    def allocated(self) -> bool:
        return self.buffer.shape[3] == self.capacity

    def reserve(self, needed: int) -> None:
        """Allocate the whole buffer on first use; refuse to go past the capacity."""
        if needed > self.capacity:
            raise CacheFullError(
                f"The conversation needs {needed} positions, but its GPU cache holds {self.capacity}; "
                "a shorter context or a new conversation is needed."
            )
        if not self.allocated:
            self.buffer = torch.zeros(self._full_shape, dtype=self.buffer.dtype, device=self.buffer.device)


def spans(capacity: int) -> list[int]:
    """The attention spans a cache of ``capacity`` positions uses: doubling from ``FIRST_SPAN``, then the capacity."""
    found = []
    span = FIRST_SPAN
    while span < capacity:
        found.append(span)
        span *= 2
    return found + [capacity]


def span_for(needed: int, capacity: int) -> int:
    """The smallest span that covers positions ``0 … needed-1``."""
    return next(span for span in spans(capacity) if span >= needed)


class DecodeStep:
    """One token at a device-held position through a ``FastLlama``, with fixed shapes; logits [V] fp32."""

    def __init__(self, model: FastLlama, capacity: int) -> None:
        self.model = model
        self.device = model.device
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)  # [1], written before each run
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)  # [1]
        self._turns = model.rotations(0, capacity)  # [C, 1, hd/2] complex
        self._key_positions = torch.arange(capacity, device=self.device)  # [C]

    def set_input(self, token: int, position: int) -> None:
        """Write the inputs in place (no host sync), so a captured graph sees them."""
        self.token.fill_(token)
        self.position.fill_(position)

    @torch.inference_mode()
    def __call__(self, buffer: torch.Tensor, span: int) -> torch.Tensor:
        """Run over ``buffer`` [L, 2, Hkv, C, hd], attending to its first ``span`` positions."""
        model = self.model
        turns = self._turns.index_select(0, self.position)  # [1, 1, hd/2]
        mask = self._mask(span)  # [1, 1, span]
        x = model.embed(self.token)  # [1, D]
        for index, layer in enumerate(model.layers):
            x = x + self._attention(layer, model.normalise(x), buffer[index], turns, mask, span)
            x = x + layer.down(swiglu(layer.gate_up(model.normalise(x))))
        return model.lm_head(model.normalise(x))[0].float()  # [V]

    def _attention(self, layer: Any, h: torch.Tensor, cache: torch.Tensor, turns: torch.Tensor,
                   mask: torch.Tensor, span: int) -> torch.Tensor:
        """``h`` [1, D] normalised; ``cache`` [2, Hkv, C, hd] gets this position's keys and values."""
        heads, kv_heads, hd = self.model.heads, self.model.kv_heads, self.model.head_dim
        q, new_keys_values = self.model._project(layer, h, turns)  # [1, H, hd] normed and turned, [2, Hkv, 1, hd]
        by_head = cache.view(2 * kv_heads, -1, hd)  # [2Hkv, C, hd]: keys' heads, then values'
        by_head.index_copy_(1, self.position, new_keys_values.reshape(2 * kv_heads, 1, hd))
        keys, values = cache[0, :, :span], cache[1, :, :span]  # [Hkv, span, hd] each
        grouped = q[0].view(kv_heads, heads // kv_heads, hd)  # [Hkv, G, hd], already scaled
        scores = torch.baddbmm(mask, grouped, keys.transpose(1, 2))  # [Hkv, G, span]
        attended = scores.softmax(dim=-1) @ values  # [Hkv, G, hd]
        return layer.out(attended.view(1, heads * hd))  # [1, D]

    def _mask(self, span: int) -> torch.Tensor:
        """0 for cache positions up to this one, -inf beyond: [1, 1, span] in the model's dtype."""
        beyond = self._key_positions[:span] > self.position  # [span]
        zeros = torch.zeros(1, 1, span, dtype=self.model.dtype, device=self.device)
        return zeros.masked_fill(beyond, float("-inf"))
