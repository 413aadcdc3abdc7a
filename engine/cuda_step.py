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
import torch.nn.functional as F

from engine.fast_llama import FastLlama
from engine.static_cache import KVCache

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
        self._cos, self._sin = model.rope_tables(capacity)  # [C, hd] each
        half = model.head_dim // 2
        eye = torch.eye(model.head_dim, dtype=model.dtype, device=self.device)
        self._half_turn = torch.cat((-eye[:, half:], eye[:, :half]), dim=1)  # [hd, hd]: x @ it = rotate_half(x)
        self._key_positions = torch.arange(capacity, device=self.device)  # [C]

    def set_input(self, token: int, position: int) -> None:
        """Write the inputs in place (no host sync), so a captured graph sees them."""
        self.token.fill_(token)
        self.position.fill_(position)

    @torch.inference_mode()
    def __call__(self, buffer: torch.Tensor, span: int) -> torch.Tensor:
        """Run over ``buffer`` [L, 2, Hkv, C, hd], attending to its first ``span`` positions."""
        model = self.model
        rope = self._rope_matrix()  # [hd, hd]
        mask = self._mask(span)  # [1, 1, span]
        x = model.embed(self.token)  # [1, D]
        for index, layer in enumerate(model.layers):
            x = x + self._attention(layer, x, buffer[index], rope, mask, span)
            gate, up = layer.gate_up(self._norm(x, layer.post_norm)).chunk(2, dim=-1)  # [1, F] each
            x = x + layer.down(F.silu(gate) * up)
        return model.lm_head(self._norm(x, model.final_norm))[0].float()  # [V]

    def _attention(self, layer: Any, x: torch.Tensor, cache: torch.Tensor, rope: torch.Tensor,
                   mask: torch.Tensor, span: int) -> torch.Tensor:
        """``x`` [1, D]; ``cache`` [2, Hkv, C, hd] gets this position's keys and values."""
        heads, kv_heads, hd = self.model.heads, self.model.kv_heads, self.model.head_dim
        qkv = layer.qkv(self._norm(x, layer.input_norm)).view(heads + 2 * kv_heads, hd)  # [H + 2Hkv, hd]
        qk = qkv[: heads + kv_heads] @ rope  # [H + Hkv, hd], rotated to the position
        keys, values = cache[0], cache[1]  # [Hkv, C, hd] each
        keys.index_copy_(1, self.position, qk[heads:].unsqueeze(1))
        values.index_copy_(1, self.position, qkv[heads + kv_heads :].unsqueeze(1))
        grouped = qk[:heads].view(kv_heads, heads // kv_heads, hd)  # [Hkv, G, hd]
        scores = torch.baddbmm(mask, grouped, keys[:, :span].transpose(1, 2), alpha=hd**-0.5)  # [Hkv, G, span]
        attended = scores.softmax(dim=-1) @ values[:, :span]  # [Hkv, G, hd]
        return layer.out(attended.view(1, heads * hd))  # [1, D]

    def _rope_matrix(self) -> torch.Tensor:
        """Rotary positions as one matrix: ``x @ R = x * cos + rotate_half(x) * sin`` at this position."""
        cos = self._cos.index_select(0, self.position)  # [1, hd]
        sin = self._sin.index_select(0, self.position)  # [1, hd]
        return torch.diag_embed(cos)[0] + self._half_turn * sin  # [hd, hd]

    def _mask(self, span: int) -> torch.Tensor:
        """0 for cache positions up to this one, -inf beyond: [1, 1, span] in the model's dtype."""
        beyond = self._key_positions[:span] > self.position  # [span]
        zeros = torch.zeros(1, 1, span, dtype=self.model.dtype, device=self.device)
        return zeros.masked_fill(beyond, float("-inf"))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.model.eps)
