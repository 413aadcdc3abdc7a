"""The fast path on a GPU: eager prefill, graph-captured decode step, static KV caches (engine thread).

``CudaLlama`` is ``FastLlama`` with prefill attention on SDPA's fused kernels
(flash attention for a fresh prompt, the memory-efficient kernel with a causal
mask for a chunk after cached positions). ``CudaLlamaBackend`` is the decode
loop's ``Backend``: several tokens go through the eager forward pass, one token
through ``DecodeStep`` via ``GraphRunner``. Each conversation's cache is a
``StaticKVCache`` of ``capacity`` positions: the model's context, capped so one
cache fits the cache store's budget and half the free GPU memory.

Batched (``new_pool``, ``forward_batch``, as the batch runner drives them): a step
whose rows are one token each runs as its batch-size bucket's fixed-shape step over
a ``DevicePool`` (``cuda_batch``: attention by the Triton kernel straight over the
block tables, a CUDA graph per bucket); a step with prefill chunks runs eagerly
through ``FastLlama.forward_batch``, whose chunks attend with SDPA over gathered keys.

``open_gpu_backend`` checks at load time that a captured step gives the eager
step's logits; if capture fails or differs, decoding stays eager and the load
notice says so. ``HEARTH_CUDA_GRAPHS=0`` turns graphs off.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.nn.functional as F

from engine.forward.cuda_batch import BUCKETS, DevicePool, decode_attention_for, fits_a_bucket, run_bucket
from engine.forward.cuda_graphs import GraphRunner
from engine.forward.cuda_step import FIRST_SPAN, DecodeStep, StaticKVCache
from engine.forward.fast_llama import FastLlama
from engine.forward.paged_attention import paged_decode_attention
from engine.forward.paged_kv import BatchRow, PagedKV
from engine.forward.weights import triton_gemv
from engine.host.memory import KV_CACHE_BUDGET_BYTES

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

PROBE_TOKENS = (0, 1, 2)
GRAPHS_ENV = "HEARTH_CUDA_GRAPHS"


class CudaLlama(FastLlama):
    """``FastLlama`` whose multi-token attention runs on SDPA's fused GPU kernels."""

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``q`` [S, H, hd] (scaled) over ``keys``/``values`` [Hkv, T, hd]; ``mask`` [S, T] added to the scores, or None for one
        query. Returns [S, H, hd]."""
        if mask is None:
            return super()._attend(q, keys, values, mask)
        groups = q.shape[1] // keys.shape[0]
        keys = keys.repeat_interleave(groups, dim=0)  # [H, T, hd]: fused kernels want one kv head per query head
        values = values.repeat_interleave(groups, dim=0)
        fresh = q.shape[0] == keys.shape[1]  # no cached positions: plain causal attention (flash)
        attended = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
            attn_mask=None if fresh else mask, is_causal=fresh, scale=1.0,
        )  # [1, H, S, hd]
        return attended[0].transpose(0, 1)


class CudaLlamaBackend:
    """The decode loop's ``Backend`` for a ``FastLlama`` on a GPU (or, graphs off, eagerly on the CPU for tests)."""

    prefill_chunk = 4096
    """A long prompt in few calls keeps the GEMMs large; fused attention needs no [S, T] score matrix."""
    batch_max_running = BUCKETS[-1]  # the batch runner's limit: every decode step fits a captured bucket
    batch_step_tokens = 256
    """Tokens per batched step while sequences decode (``Scheduler``): a GPU runs a step of 32 rows in about the
    time of one (its weights' reads set the time), so a prompt joins in chunks this long; the CPU's 40 would
    stretch it over many steps."""

    def __init__(self, model: FastLlama, capacity: int, use_graphs: bool = True) -> None:
        self.model = model
        self.device = model.device
        self.capacity = capacity
        self.runner = GraphRunner(DecodeStep(model, capacity), use_graphs)
        self.decode_attention = decode_attention_for(self.device)

    def new_cache(self, capacity: int | None = None) -> StaticKVCache:
        model = self.model
        return StaticKVCache(len(model.layers), model.kv_heads, model.head_dim, model.dtype, self.device,
                             capacity or self.capacity)

    def forward(self, token_ids: Sequence[int], cache: StaticKVCache, start: int) -> torch.Tensor:
        """Append ``token_ids`` at ``start``; logits of the last one, [V] fp32."""
        if len(token_ids) != 1:
            ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [S]
            return self.model.forward(ids, cache, start)
        cache.reserve(start + 1)
        logits = self.runner.run(cache, token_ids[0], start)
        cache.length = start + 1
        return logits

    def new_pool(self, num_blocks: int, block_size: int) -> DevicePool:
        """``num_blocks`` for the scheduler (and a scratch block); bucket steps take tables up to ``capacity``."""
        model = self.model
        return DevicePool(len(model.layers), model.kv_heads, model.head_dim, num_blocks, block_size, model.dtype,
                          self.device, -(-self.capacity // block_size))

    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        """Each row's tokens appended to its blocks of ``kv``; logits of each row's last token, [B, V] fp32."""
        if fits_a_bucket(rows, kv):
            return run_bucket(self.model, self.runner, self.decode_attention, rows, kv)
        return self.model.forward_batch(rows, kv)

    def crop(self, cache: StaticKVCache, length: int) -> StaticKVCache:
        cache.crop(length)  # the write position moves; the buffer and its graphs stay
        return cache

    def cache_bytes(self, cache: StaticKVCache) -> int:
        return cache.nbytes

    def check_graphs(self) -> None:
        """Capture a step on a small cache, and a batched step on a small pool, and compare their replays with the
        eager steps; turn graphs off if unequal."""
        if not self.runner.use_graphs:
            return
        cache = self.new_cache(min(FIRST_SPAN, self.capacity))
        self.forward(list(PROBE_TOKENS[:2]), cache, 0)
        self._compare_replay(lambda: self.forward([PROBE_TOKENS[2]], cache, 2), "step")  # eager, then captured
        pool, rows = self.new_pool(1, FIRST_SPAN), [BatchRow(PROBE_TOKENS[:1], 0, [0])]
        self._compare_replay(lambda: self.forward_batch(rows, pool), "batched step")

    def _compare_replay(self, run: Callable[[], torch.Tensor], name: str) -> None:
        """``run`` twice: eagerly (capturing), then replayed; graphs off if the logits differ."""
        if not self.runner.use_graphs:
            return
        eager = run()
        replayed = run() if self.runner.use_graphs else eager
        if not torch.allclose(eager, replayed, rtol=1e-2, atol=1e-2 * float(eager.abs().max())):
            self.runner.disable(f"the captured {name}'s logits differ from the eager {name}'s")

    def notices(self, fmt: str, context_length: int) -> tuple[str, ...]:
        """What the user should know about how this model runs here."""
        found = []
        if self.capacity < context_length:
            found.append(f"The context is limited to {self.capacity} tokens so its cache fits in GPU memory.")
        if self.runner.disabled_reason:
            found.append(f"CUDA graphs are off, so replies are slower ({self.runner.disabled_reason}).")
        if self.device.type == "cuda" and self.decode_attention is not paged_decode_attention:
            found.append("Triton is missing, so batched decoding gathers every sequence's keys (slower).")
        if fmt == "int8" and not triton_gemv.available():
            found.append("Triton is missing, so int8 weights are dequantized for every token (slower than bf16).")
        if fmt == "int4":
            found.append("4-bit weights use PyTorch's int4 kernel (groups of up to 128), not bitsandbytes NF4.")
        return tuple(found)


def cache_capacity(model: FastLlama, context_length: int, free_bytes: int) -> int:
    """Positions per conversation cache: the context, capped by the cache budget and half the free memory."""
    per_position = 2 * len(model.layers) * model.kv_heads * model.head_dim * model.dtype.itemsize
    affordable = min(KV_CACHE_BUDGET_BYTES, free_bytes // 2) // per_position
    return max(min(context_length, affordable // FIRST_SPAN * FIRST_SPAN), min(context_length, FIRST_SPAN))


def open_gpu_backend(config: Any, state: Any, formats: FormatPlan, device: torch.device,
                     context_length: int) -> CudaLlamaBackend:
    """Weights packed in ``formats`` on ``device``, a backend sized to free memory, its graphs checked."""
    model = CudaLlama(config, state, formats, device)
    free_bytes = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else KV_CACHE_BUDGET_BYTES * 2
    use_graphs = os.environ.get(GRAPHS_ENV, "1") != "0"
    backend = CudaLlamaBackend(model, cache_capacity(model, context_length, free_bytes), use_graphs)
    backend.check_graphs()
    return backend
