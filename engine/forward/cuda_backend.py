"""The fast path on a GPU: eager prefill chunks, graph-captured decode steps over a block pool (engine thread).

``CudaLlama`` is ``FastLlama`` with prompt-chunk attention on SDPA's fused kernels
(flash attention for a fresh prompt, the memory-efficient kernel with a causal
mask for a chunk after cached positions). ``CudaLlamaBackend`` is what the batch
runner drives (``BatchBackend``): a step whose rows are one token each — a single
reply's included, as a batch of one — runs as its batch-size bucket's fixed-shape
step over a ``DevicePool`` (``cuda_batch``: attention by the Triton kernel straight
over the block tables, a CUDA graph per bucket); a step with prefill chunks runs
eagerly through ``FastLlama.forward_batch``. A sequence holds up to ``capacity``
positions: the model's context, capped so the bucket steps' block tables fit the
cache budget and half the free GPU memory.

``open_gpu_backend`` checks at load time that a captured step gives the eager
step's logits; if capture fails or differs, decoding stays eager and the load
notice says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.nn.functional as F

from engine.forward.attention import attend
from engine.forward.backend import BatchBackend
from engine.forward.cuda_batch import BUCKETS, DevicePool, decode_attention_for, fits_a_bucket, run_bucket
from engine.forward.cuda_graphs import GraphRunner
from engine.forward.llama_forward import FastLlama
from engine.forward.paged_attention import paged_decode_attention
from engine.forward.paged_kv import BatchRow, PagedKV
from engine.forward.weights import triton_gemv
from engine.host.memory import KV_CACHE_BUDGET_BYTES

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

PROBE_TOKENS = (0, 1, 2)
MIN_CAPACITY = 256
"""Positions a sequence may always hold (where the context is as long), whatever the free memory; capacities are
multiples of it."""


class CudaLlama(FastLlama):
    """``FastLlama`` whose prompt chunks attend on SDPA's fused GPU kernels."""

    def attend_chunk(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
        """``q`` [S, H, hd] (scaled) over ``keys``/``values`` [Hkv, T, hd]; ``mask`` [S, T] added to the scores.
        Returns [S, H, hd]; soft-capped scores (Gemma 2) and sinks in torch ops over the whole chunk at once
        (``attention.attend``: the CPU's blocks would wait for the mask)."""
        if self.family.attention_softcap is not None or sinks is not None:
            return attend(q, keys, values, mask, self._softcap, sinks)
        groups = q.shape[1] // keys.shape[0]
        keys = keys.repeat_interleave(groups, dim=0)  # [H, T, hd]: fused kernels want one kv head per query head
        values = values.repeat_interleave(groups, dim=0)
        fresh = q.shape[0] == keys.shape[1]  # no cached positions: plain causal attention (flash)
        attended = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
            attn_mask=None if fresh else mask, is_causal=fresh, scale=1.0,
        )  # [1, H, S, hd]
        return attended[0].transpose(0, 1)


class CudaLlamaBackend(BatchBackend):
    """A ``FastLlama`` on a GPU (or, graphs off, eagerly on the CPU for tests) as the batch runner drives it."""

    batch_max_running = BUCKETS[-1]  # every decode step fits a captured bucket
    batch_step_tokens = 256
    """Tokens per batched step while sequences decode (``Scheduler``): a GPU runs a step of 32 rows in about the
    time of one (its weights' reads set the time), so a prompt joins in chunks this long; the CPU's 40 would
    stretch it over many steps."""

    def __init__(self, model: FastLlama, capacity: int, use_graphs: bool = True) -> None:
        self.model = model
        self.device: torch.device = model.device
        self.capacity = capacity
        self.runner = GraphRunner(self.device, use_graphs)
        self.decode_attention = decode_attention_for(self.device)

    def new_pool(self, num_blocks: int, block_size: int) -> DevicePool:
        """``num_blocks`` for the scheduler (and a scratch block); bucket steps take tables up to ``capacity``."""
        model = self.model
        return DevicePool(len(model.layers), model.kv_heads, model.head_dim, num_blocks, block_size, model.dtype,
                          self.device, -(-self.capacity // block_size))

    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        """Each row's tokens appended to its blocks of ``kv``; logits of each row's last ``logit_rows`` tokens, row
        after row, [sum of logit_rows, V] fp32 (a row with a draft has several tokens: the step runs eagerly)."""
        if fits_a_bucket(rows, kv) and self.model.family.attention_softcap is None:  # the kernel does not cap
            return run_bucket(self.model, self.runner, self.decode_attention, rows, kv)
        return self.model.forward_batch(rows, kv)

    def check_graphs(self) -> None:
        """Capture a single sequence's decode step (bucket 1) on a small pool after a two-token prompt, and compare
        its replay with the eager step; turn graphs off if unequal."""
        if not self.runner.use_graphs:
            return
        pool = self.new_pool(1, MIN_CAPACITY)
        self.forward_batch([BatchRow(PROBE_TOKENS[:2], 0, [0])], pool)  # a prompt chunk: eager
        step = [BatchRow(PROBE_TOKENS[2:], 2, [0])]
        eager = self.forward_batch(step, pool)  # runs eagerly, then is captured
        replayed = self.forward_batch(step, pool) if self.runner.use_graphs else eager
        if not torch.allclose(eager, replayed, rtol=1e-2, atol=1e-2 * float(eager.abs().max())):
            self.runner.disable("the captured step's logits differ from the eager step's")

    @property
    def capacity_reason(self) -> str:
        """Why a sequence's context is ``capacity`` where that is shorter than the one asked, in words."""
        return f"limited to {self.capacity} tokens so its cache fits in GPU memory"

    def notices(self, fmt: str, context_length: int) -> tuple[str, ...]:
        """What the user should know about how this model runs here."""
        found = []
        if self.capacity < context_length:
            found.append(f"The context is {self.capacity_reason}.")
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
    """Positions per sequence: the context, capped by the cache budget and half the free memory."""
    per_position = 2 * len(model.layers) * model.kv_heads * model.head_dim * model.dtype.itemsize
    affordable = min(KV_CACHE_BUDGET_BYTES, free_bytes // 2) // per_position
    return max(min(context_length, affordable // MIN_CAPACITY * MIN_CAPACITY), min(context_length, MIN_CAPACITY))


def open_gpu_backend(config: Any, state: Any, formats: FormatPlan, device: torch.device,
                     context_length: int) -> CudaLlamaBackend:
    """Weights packed in ``formats`` on ``device``, a backend sized to free memory, its graphs checked."""
    model = CudaLlama(config, state, formats, device, context_length)
    free_bytes = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else KV_CACHE_BUDGET_BYTES * 2
    backend = CudaLlamaBackend(model, cache_capacity(model, context_length, free_bytes))
    backend.check_graphs()
    return backend
