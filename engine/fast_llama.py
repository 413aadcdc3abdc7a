"""A compact forward pass for Llama-family models, run as a ``Backend`` (engine thread).

Covers Llama, Mistral (without a sliding window) and Qwen2: RMSNorm, rotary
positions (including Llama 3 and linear scaling), grouped-query attention, a SiLU
gated MLP and optional q/k/v biases. Weights come from a Hugging Face state dict
and are repacked into one weight format (``quant``): q/k/v become one matmul, gate
and up another, so a decode step makes few calls. The KV cache is a ``KVCache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.quant import Embedding, Linear
from engine.static_cache import KVCache

ARCHITECTURES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "llama3", "linear")
ROPE_TABLE_CHUNK = 4096


def unsupported_reason(config: Any) -> str | None:
    """Why the fast path cannot run this model, or ``None`` when it can."""
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', '?')!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in ROPE_TYPES:
        return f"rope scaling {rope.get('rope_type')!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    return None


@dataclass
class _Layer:
    input_norm: torch.Tensor  # [D]
    qkv: Linear  # D -> (H + 2 Hkv) * hd
    out: Linear  # H * hd -> D
    post_norm: torch.Tensor  # [D]
    gate_up: Linear  # D -> 2 F
    down: Linear  # F -> D


class FastLlama:
    """The model's weights in one format, and its forward pass over a ``KVCache``."""

    def __init__(self, config: Any, state: Mapping[str, torch.Tensor], fmt: str, device: torch.device) -> None:
        self.config = config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.device = device
        self.layers = [self._layer(state, f"model.layers.{i}.", fmt) for i in range(config.num_hidden_layers)]
        self.dtype = self.layers[0].qkv.compute_dtype
        table, head = _embedding_and_head(config, state)
        self.embed = Embedding(table.to(device), fmt, self.dtype)
        self.lm_head = Linear(head.to(device), None, fmt)
        self.final_norm = state["model.norm.weight"].to(device, self.dtype)
        self._rotary = _rotary_module(config, device)
        self._cos = self._sin = torch.empty(0, self.head_dim, device=device)

    def _layer(self, state: Mapping[str, torch.Tensor], prefix: str, fmt: str) -> _Layer:
        def weight(name: str) -> torch.Tensor:
            return state[prefix + name].to(self.device)

        def bias(name: str) -> torch.Tensor | None:
            found = state.get(prefix + name)
            return found.to(self.device) if found is not None else None

        qkv_names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
        qkv_biases = [bias(f"{n}.bias") for n in qkv_names]
        qkv_bias = torch.cat(qkv_biases) if all(b is not None for b in qkv_biases) else None
        qkv = Linear(torch.cat([weight(f"{n}.weight") for n in qkv_names]), qkv_bias, fmt)
        gate_up = torch.cat([weight("mlp.gate_proj.weight"), weight("mlp.up_proj.weight")])
        return _Layer(
            input_norm=weight("input_layernorm.weight").to(qkv.compute_dtype),
            qkv=qkv,
            out=Linear(weight("self_attn.o_proj.weight"), bias("self_attn.o_proj.bias"), fmt),
            post_norm=weight("post_attention_layernorm.weight").to(qkv.compute_dtype),
            gate_up=Linear(gate_up, None, fmt),
            down=Linear(weight("mlp.down_proj.weight"), None, fmt),
        )

    @property
    def weight_bytes(self) -> int:
        per_layer = sum(l.qkv.nbytes + l.out.nbytes + l.gate_up.nbytes + l.down.nbytes for l in self.layers)
        return per_layer + self.embed.nbytes + self.lm_head.nbytes

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """``token_ids`` [S] at positions ``start``…; logits of the last one, [V] fp32."""
        length = token_ids.shape[0]
        cache.reserve(start + length)
        cos, sin = self._rope(start, start + length)  # [S, hd] each
        mask = _causal_mask(start, length, self.device)  # [S, start+S] or None
        x = self.embed(token_ids)  # [S, D]
        for index, layer in enumerate(self.layers):
            x = x + self._attention(layer, index, _rms_norm(x, layer.input_norm, self.eps), cache, start, cos, sin, mask)
            gate, up = layer.gate_up(_rms_norm(x, layer.post_norm, self.eps)).chunk(2, dim=-1)  # [S, F] each
            x = x + layer.down(F.silu(gate) * up)
        cache.length = start + length
        last = _rms_norm(x[-1:], self.final_norm, self.eps)  # [1, D]
        return self.lm_head(last)[0].float()  # [V]

    def _attention(self, layer: _Layer, index: int, h: torch.Tensor, cache: KVCache, start: int,
                   cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        length, hd, heads = h.shape[0], self.head_dim, self.heads
        qkv = layer.qkv(h).view(length, heads + 2 * self.kv_heads, hd).transpose(0, 1)  # [H + 2Hkv, S, hd]
        qk = _rotate(qkv[: heads + self.kv_heads], cos, sin)  # queries and keys rotated together
        keys, values = cache.write(index, start, qk[heads:], qkv[heads + self.kv_heads :])  # [Hkv, T, hd] each
        attended = self._attend(qk[:heads], keys, values, mask)  # [H, S, hd]
        return layer.out(attended.transpose(0, 1).reshape(length, heads * hd))  # [S, D]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention over the cache (``_attend``); ``cuda_backend`` overrides it with fused GPU kernels."""
        return _attend(q, keys, values, mask)

    def rope_tables(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary cos and sin of positions ``0 … end-1``, [end, hd] each (for steps that index them on the device)."""
        return self._rope(0, end)

    def _rope(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if end > self._cos.shape[0]:
            size = -(-end // ROPE_TABLE_CHUNK) * ROPE_TABLE_CHUNK
            positions = torch.arange(size, device=self.device).unsqueeze(0)  # [1, P]
            probe = torch.empty(1, dtype=torch.float32, device=self.device)
            cos, sin = self._rotary(probe, positions)  # [1, P, hd] each
            self._cos, self._sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        return self._cos[start:end], self._sin[start:end]


def _embedding_and_head(config: Any, state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The token table and the output layer; with tied embeddings a checkpoint may hold either name once."""
    table, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
    if getattr(config, "tie_word_embeddings", False):
        table = head = table if table is not None else head
    if table is None or head is None:
        raise ValueError("The checkpoint lacks its token embeddings or its output layer (lm_head).")
    return table, head


def _rotary_module(config: Any, device: torch.device) -> torch.nn.Module:
    """Hugging Face's rotary embedding for ``config``: it knows each scaling scheme's frequencies."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config).to(device)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` [S, D]; PyTorch's fused kernel (a hand-written mean costs several slow copies per call)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions in Hugging Face's half-split layout; ``x`` [H, S, hd], ``cos``/``sin`` [S, hd]."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``q`` [H, S, hd] over ``keys``/``values`` [Hkv, T, hd]; query head ``h`` uses kv head ``h // (H / Hkv)``."""
    heads, length, hd = q.shape
    kv_heads = keys.shape[0]
    if mask is not None:
        return F.scaled_dot_product_attention(q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                                              attn_mask=mask, enable_gqa=True)[0]
    # One query: three small matmuls beat the fused kernel's setup cost.
    grouped = q.view(kv_heads, heads // kv_heads, hd)  # [Hkv, G, hd]
    scores = (grouped @ keys.transpose(1, 2)) * hd**-0.5  # [Hkv, G, T]
    return (scores.softmax(dim=-1) @ values).view(heads, 1, hd)  # [H, 1, hd]


def _causal_mask(start: int, length: int, device: torch.device) -> torch.Tensor | None:
    """Query ``i`` (at position ``start + i``) sees keys ``0 … start + i``; ``None`` for a single query."""
    if length == 1:
        return None
    keys = torch.arange(start + length, device=device)  # [T]
    queries = torch.arange(start, start + length, device=device)  # [S]
    return keys.unsqueeze(0) <= queries.unsqueeze(1)  # [S, T]


class FastLlamaBackend:
    """The decode loop's ``Backend`` over a ``FastLlama``."""

    def __init__(self, model: FastLlama) -> None:
        self.model = model
        self.device = model.device

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def forward(self, token_ids: Sequence[int], cache: KVCache, start: int) -> torch.Tensor:
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [S]
        return self.model.forward(ids, cache, start)

    def crop(self, cache: KVCache, length: int) -> KVCache:
        cache.crop(length)
        return cache

    def cache_bytes(self, cache: KVCache) -> int:
        return cache.nbytes
