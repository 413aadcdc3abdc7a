"""The fast path's forward pass for Llama-family models over a block pool (engine thread).

Covers Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, Phi-3/4, Granite, Qwen2-MoE and Qwen3-MoE: RMSNorm,
rotary positions (including Llama 3, linear and LongRoPE scaling, partial rotary, a table per
layer type), grouped-query attention, a SiLU or GELU gated MLP or a mixture of
experts (``mlp``, ``experts``: the layer's), optional q/k/v biases and
RMSNorm of each query and key head, and the steps only some families take, each skipped
where absent (``family.Family``): Gemma's embedding scale, its norms of the attention's and
the MLP's outputs, Gemma 2's soft-capped attention scores and logits, Granite's multipliers; over weights built by
``llama_weights``. Every reply goes through ``forward_batch``: a step
of one or more sequences' new tokens, their keys and values kept in a ``PagedKV``.
Layers with a sliding window (``windows.layer_windows``) attend over their window
alone and keep their keys in their own KV groups (``windows.KVGroups``): each group's
part of the step (``GroupStep``) is laid out once, and every layer of it uses that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.forward.attention import attend_in_blocks, attend_runs, causal_mask
from engine.forward.llama_weights import LlamaLayer, LlamaWeights
from engine.forward.native import activation_codes
from engine.forward.native import decode_attention as native_attention
from engine.forward.native import norm as native_norm
from engine.forward.native import rotary as native_rotary
from engine.forward.native.decode_attention import ChunkRuns, DecodeRuns
from engine.forward.kv_layout import int8_kv_refusal
from engine.forward.paged_kv import INT8_ROWS, BatchRow, GroupLayout, PagedKV
from engine.forward.weights.quant import PLAIN_DTYPES
from engine.forward.windows import KVGroups, layer_windows

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

ROPE_TABLE_CHUNK = 4096
KERNEL_CHUNK_ROWS = 128
"""Prompt chunks of up to this many rows attend in the CPU kernel (``ChunkRuns``), each row over the positions up to
its own: the chunks a step takes beside decoding rows, where the kernel is faster than SDPA. A whole prompt's chunks of
512 rows stay on SDPA's blocked matmuls, which pay at that size. On AMX's tiles (``ChunkRuns.on_tiles``) the kernel
takes chunks of any size: it is faster there than bf16 SDPA and than the fp32 kernel, and reads the pool in place
where SDPA needs the prefix gathered."""

DecodeRowRuns = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # a decode row's keys_t and values, run by run


@dataclass(frozen=True)
class GroupStep:
    """One KV group's part of a step, made once for all its layers. ``runs``: each decode row's keys and values by
    page layer and run (``PagedKV.layer_runs``), None for a prompt chunk and for every row where ``kernels`` run the
    attention; ``masks``: a prompt chunk's causal (and window) mask for SDPA, None where a kernel (or a decode
    row's two bmm) takes it."""

    layout: GroupLayout
    slots: torch.Tensor  # [R]: where the rows' keys and values go in the pool
    masks: list[torch.Tensor | None]
    runs: list[list[DecodeRowRuns] | None]
    kernels: list[DecodeRuns | ChunkRuns] | None


class FastLlama(LlamaWeights):
    """The model's weights (``LlamaWeights``) and its forward pass over a ``PagedKV``."""

    def __init__(self, config: Any, state: Mapping[str, torch.Tensor], formats: FormatPlan,
                 device: torch.device, context_length: int | None = None) -> None:
        super().__init__(config, state, formats, device, context_length)
        self._eps = torch.full((1, 1), self.eps, dtype=self.dtype, device=device)
        self._turns = [torch.empty(0, 1, self.head_dim // 2, dtype=torch.complex64, device=device)] * len(self.rotary)
        self.kv_dtype = pool_dtype(formats.kv_cache, self.head_dim)  # the block pool's (bf16 on the CPU)
        self._softcap = self.family.attention_softcap  # the kernels do not cap scores: torch ops
        self._attention_kernels = (device.type == "cpu" and self._softcap is None
                                   and native_attention.covers(self.heads, self.kv_heads, self.head_dim, self.kv_dtype))
        self._chunk_kernels = self._attention_kernels and not self.family.attention_sinks  # decode rows take sinks
        self._mask_dtype = PLAIN_DTYPES[formats.prompt_attention]  # bf16 where 4-bit prompts multiply on AMX's tiles
        self._chunk_tiles = (self._mask_dtype == torch.bfloat16 and self.kv_dtype == torch.bfloat16
                             and native_attention.tiles_cover(self.head_dim))  # an int8 pool: the fp32 kernel
        self.kv_groups = KVGroups.of(layer_windows(config))
        self._places = tuple(self.kv_groups.place(index) for index in range(len(self.layers)))  # (group, page layer)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [S, D] over its root mean square; the norm's own weight goes to the next matmul."""
        if native_norm.covers(x):
            return native_norm.rms_norm(x, self.eps)
        if x.shape[0] == 1 and x.dtype == torch.float32:
            # One row: its mean square as one tiny matmul costs less than the general kernel's several ops.
            return x * torch.addmm(self._eps, x, x.t(), alpha=1 / x.shape[1]).rsqrt_()  # [1, D] * [1, 1]
        return F.rms_norm(x, (x.shape[1],), eps=self.eps)

    def _kernel_takes(self, length: int) -> bool:
        """Whether ``length`` new tokens of one sequence attend in the CPU kernels (else SDPA, or two bmm a row):
        a decode row; a prompt chunk where the model has no sinks, any number on AMX's tiles
        (``KERNEL_CHUNK_ROWS``)."""
        if length == 1:
            return self._attention_kernels
        return self._chunk_kernels and (length <= KERNEL_CHUNK_ROWS or self._chunk_tiles)

    def project(self, layer: LlamaLayer, h: torch.Tensor, turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries [S, H, hd] and the new keys and values [2, Hkv, S, hd] of ``h`` [S, D]."""
        return self._rotated(self._qkv(layer, h), turns)

    def _qkv(self, layer: LlamaLayer, h: torch.Tensor) -> torch.Tensor:
        """The queries, keys and values of ``h`` [S, D], head norms applied: [S, H + 2Hkv, hd]."""
        length, heads, kv_heads = h.shape[0], self.heads, self.kv_heads
        qkv = layer.qkv(h).view(length, heads + 2 * kv_heads, self.head_dim)  # [S, H + 2Hkv, hd]
        if layer.head_norms is not None:
            queries_keys = qkv[:, : heads + kv_heads]  # [S, H + Hkv, hd]
            queries_keys.copy_(F.rms_norm(queries_keys, (self.head_dim,), eps=self.eps).mul_(layer.head_norms))
        return qkv

    def _rotated(self, qkv: torch.Tensor, turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``qkv`` [S, H + 2Hkv, hd] as rotated queries [S, H, hd] and keys with values [2, Hkv, S, hd]."""
        heads, kv_heads = self.heads, self.kv_heads
        rotate_pairs_(qkv[:, : heads + kv_heads], turns)  # queries and keys rotated together
        return qkv[:, :heads], qkv[:, heads:].transpose(0, 1).unflatten(0, (2, kv_heads))

    @torch.inference_mode()
    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        """Several sequences' new tokens in one pass: every ``Linear`` sees all R rows at once (one read of the
        weights serves them all); attention is per sequence over its blocks. With several sequences the CPU kernels
        round activations to 8 bits (``activation_codes``). Logits of each row's last ``logit_rows`` tokens, row after
        row, [sum of logit_rows, V] ([B, V] when each row asks for its last token's alone)."""
        layout = kv.layout(rows)
        ids = torch.tensor([t for row in rows for t in row.token_ids], dtype=torch.long, device=self.device)  # [R]
        tables = self.rotations(0, max(span.start + span.length for span in layout.spans))
        turns = [table[layout.positions] for table in tables]  # each [R, 1, hd/2]
        steps = [self._group_step(group, window, kv) for group, window in zip(layout.groups, self.kv_groups.windows)]
        x = self.embed_tokens(ids)  # [R, D]
        with activation_codes.for_step(len(rows)):
            for index, layer in enumerate(self.layers):
                group, page_layer = self._places[index]
                x += self._paged_attention(layer, page_layer, self.normalise(x), kv, turns[layer.rotary], steps[group])
                x += self.mlp(layer, self.normalise(x))
        with activation_codes.for_output_layer():
            return self.logits(x[layout.last_rows])  # [sum of logit_rows, V]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` [R] in the token table, [R, D], times Gemma's embedding scale."""
        x = self.embed(ids)  # [R, D]
        return x if self.family.embed_scale is None else x.mul_(self.family.embed_scale)

    def mlp(self, layer: LlamaLayer, h: torch.Tensor) -> torch.Tensor:
        """The MLP's output for the normalised ``h`` [R, D] (Gemma's normalised again, Granite's scaled), [R, D]."""
        out = layer.mlp(h)  # [R, D]
        return self._residual(out if layer.mlp_norm is None else self.normalise(out).mul_(layer.mlp_norm))

    def attention_out(self, layer: LlamaLayer, attended: torch.Tensor) -> torch.Tensor:
        """The attention's output projection of ``attended`` [R, H * hd] (Gemma's normalised, Granite's scaled),
        [R, D]."""
        out = layer.out(attended)  # [R, D]
        return self._residual(out if layer.attention_norm is None else self.normalise(out).mul_(layer.attention_norm))

    def _residual(self, out: torch.Tensor) -> torch.Tensor:
        """A layer's attention or MLP output ``out`` [R, D] as it joins the residual stream (Granite's scaled)."""
        scale = self.family.residual_scale
        return out if scale is None else out.mul_(scale)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The output layer's fp32 logits of ``x`` [B, D], [B, V] (Gemma 2's soft-capped, Granite's scaled)."""
        logits = self.lm_head(self.normalise(x)).float()  # [B, V]
        if self.family.logit_scale is not None:
            logits.mul_(self.family.logit_scale)
        cap = self.family.final_softcap
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def _group_step(self, layout: GroupLayout, window: int | None, kv: PagedKV) -> GroupStep:
        """What every layer of one KV group (``window``: its layers' window) reuses in a step."""
        kernels = self._kernel_attention(layout, window)
        masks = [None if self._kernel_takes(span.length) else causal_mask(span.start, span.length, self._mask_dtype,
                                                                           self.device, span.first, window)
                 for span in layout.spans]
        runs = [kv.layer_runs(span.runs) if span.length == 1 and kernels is None else None for span in layout.spans]
        return GroupStep(layout, _slots(layout.write), masks, runs, kernels)

    def _kernel_attention(self, layout: GroupLayout, window: int | None) -> list[DecodeRuns | ChunkRuns] | None:
        """The step's attention in the CPU kernels (``native.decode_attention``): its decode rows at once, and each
        prompt chunk of up to ``KERNEL_CHUNK_ROWS`` rows; None where the kernels are not here."""
        if not self._attention_kernels:
            return None
        decoding = [span for span in layout.spans if span.length == 1]
        kernels: list[DecodeRuns | ChunkRuns] = [
            ChunkRuns.of(span.rows.start, span.length, span.start - span.first, span.runs, self._chunk_tiles, window)
            for span in layout.spans if span.length > 1 and self._kernel_takes(span.length)
        ]
        if decoding:
            kernels.append(DecodeRuns.of([span.rows.start for span in decoding], [span.runs for span in decoding]))
        return kernels

    def _paged_attention(self, layer: LlamaLayer, index: int, h: torch.Tensor, kv: PagedKV, turns: torch.Tensor,
                         step: GroupStep) -> torch.Tensor:
        """The attention of ``layer``, held at page layer ``index`` of its KV group (``step``)."""
        qkv, layer_kv = self._qkv(layer, h), kv.buffer[index]  # [R, H + 2Hkv, hd], [2, Hkv, P, hd]
        layout = step.layout
        if native_rotary.covers(qkv, layer_kv):
            native_rotary.rotate_and_store(qkv, turns, layer_kv, step.slots, self.heads)
            q = qkv[:, : self.heads]  # [R, H, hd]
        else:
            q, new_keys_values = self._rotated(qkv, turns)  # [R, H, hd], [2, Hkv, R, hd]
            kv.write(index, layout.write, new_keys_values)
        attended = torch.empty_like(q)  # [R, H, hd]: each sequence's rows written in place
        if step.kernels is not None:
            q = q.contiguous()  # a view of the step's q, k, v projections
            for kernel in step.kernels:
                kernel.attend(q, attended, layer_kv, layer.sinks)
        else:
            runs = [run[index] if run is not None else None for run in step.runs]
            self._attend_decode_rows(q, attended, layout, runs, layer.sinks)
        for span, mask in zip(layout.spans, step.masks):
            if mask is not None:
                attended[span.rows] = self.attend_chunk(q[span.rows], *kv.read(index, span.runs), mask, layer.sinks)
        rows, heads, hd = q.shape
        return self.attention_out(layer, attended.view(rows, heads * hd))  # [R, D]

    def _attend_decode_rows(self, q: torch.Tensor, attended: torch.Tensor, layout: GroupLayout,
                            runs: list[DecodeRowRuns | None], sinks: torch.Tensor | None) -> None:
        """Each decode row's attention over its runs of this layer (None: a prompt chunk's span), into ``attended``.
        Two bmm a row over views made once per step: a batch of 8 makes 240 such calls a step, and at this size
        each op's dispatch costs about what its arithmetic does (``native.decode_attention`` makes them one)."""
        rows, _, hd = q.shape
        queries, out = q.view(rows, self.kv_heads, -1, hd), attended.view(rows, self.kv_heads, -1, hd)  # [R, Hkv, G, hd]
        if rows == len(layout.spans):  # decode rows alone: every row's view at once
            queries, out = queries.unbind(0), out.unbind(0)
        for span, run in zip(layout.spans, runs):
            if run is not None:
                attend_runs(queries[span.rows.start], run, out[span.rows.start], self._softcap, sinks)

    def attend_chunk(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
        """A prompt chunk's attention, ``q`` [S, H, hd] over its sequence's ``keys``/``values`` [Hkv, T, hd] under
        ``mask`` [S, T] (``attention.attend_in_blocks``; ``sinks`` [H]: gpt-oss's); ``cuda_backend`` overrides it
        with fused GPU kernels."""
        return attend_in_blocks(q, keys, values, mask, self._softcap, sinks)

    def rotations(self, start: int, end: int) -> list[torch.Tensor]:
        """For each rotary table (``LlamaLayer.rotary``), the complex numbers that turn each (even, odd) pair of a
        head at positions ``start``…``end``: [end - start, 1, hd/2] each."""
        if end > self._turns[0].shape[0]:
            size = -(-end // ROPE_TABLE_CHUNK) * ROPE_TABLE_CHUNK
            positions = torch.arange(size, device=self.device).float().unsqueeze(1)  # [P, 1]
            self._turns = [_turns(positions * table.inv_freq, table.magnitude) for table in self.rotary]
        return [turns[start:end] for turns in self._turns]


def _turns(angles: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """``magnitude`` [hd/2] times the unit complex numbers of ``angles`` [P, hd/2]: [P, 1, hd/2]."""
    return torch.complex(angles.cos() * magnitude, angles.sin() * magnitude).unsqueeze(1)


def pool_dtype(kv_cache: str, head_dim: int) -> torch.dtype:
    """The block pool's dtype for a plan's ``kv_cache``: int8 rows (``INT8_ROWS``; refused, ValueError, for heads
    whose width ``kv_layout`` cannot group), else a plain dtype."""
    if kv_cache != "int8":
        return PLAIN_DTYPES[kv_cache]
    refusal = int8_kv_refusal(head_dim)
    if refusal:
        raise ValueError(f"{refusal[0].upper()}{refusal[1:]}: load it with the bf16 KV cache.")
    return INT8_ROWS


def _slots(where: slice | torch.Tensor) -> torch.Tensor:
    """A step's new positions as int64 [R]: a run of them, or the positions themselves."""
    if isinstance(where, slice):
        return torch.arange(where.start, where.stop)
    return where.to(torch.int64)


def rotate_pairs_(x: torch.Tensor, turns: torch.Tensor) -> None:
    """Rotary positions in place: ``x`` [S, N, hd] as hd/2 complex numbers, each times its ``turns`` [S, 1, hd/2]."""
    if x.dtype == torch.float32:
        torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(turns)
        return
    turned = torch.view_as_complex(x.float().unflatten(-1, (-1, 2))) * turns  # [S, N, hd/2]
    x.copy_(torch.view_as_real(turned).flatten(-2))

