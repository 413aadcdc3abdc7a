"""A compact forward pass for Llama-family models, run as a ``Backend`` (engine thread).

Covers Llama, Mistral (without a sliding window), Qwen2 and Qwen3: RMSNorm, rotary
positions (including Llama 3 and linear scaling), grouped-query attention, a SiLU
gated MLP, optional q/k/v biases and Qwen3's RMSNorm of each query and key head. Weights come from a Hugging Face state dict
(tensors, or ``Int4Groups`` for a GGUF file's 4-bit layers: ``engine.models.gguf_state``)
and are repacked once into the formats of a ``FormatPlan`` (``quant``, ``format_plan``) so that a decode step makes
few calls, since at this size each call's fixed cost adds up: q/k/v become one
matmul and gate/up another; each RMSNorm's weight goes to the matmul after it
(``Linear``'s ``input_scale``), the attention scale into the query rows, and
query/key rows are reordered so rotary positions are one complex multiply in place.
The KV cache is a ``KVCache`` for one sequence, or a ``PagedKV`` for a batch of
sequences (``forward_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.forward.backend import PREFILL_CHUNK
from engine.forward.native import activation_codes
from engine.forward.native import decode_attention as native_attention
from engine.forward.native import norm as native_norm
from engine.forward.native import rotary as native_rotary
from engine.forward.native.decode_attention import ChunkRuns, DecodeRuns
from engine.forward.paged_kv import BatchRow, PagedKV, StepLayout
from engine.forward.static_cache import KVCache
from engine.forward.weights.pack_worker import PackWorker
from engine.forward.weights.quant import PLAIN_DTYPES, Linear, embedding
from engine.forward.weights.quant_int import INT4_PAIR, Int4Groups, Int4Pair, as_int4_pair
from engine.forward.weights.row_chunks import RowChunks

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

Weight = torch.Tensor | Int4Groups | Int4Pair | RowChunks  # a state's matmuls may come in 4-bit groups or
# (an output layer for the int8 kernel) as blocks decoded where packed: GGUF files

ROPE_TABLE_CHUNK = 4096


@dataclass
class _Layer:
    qkv: Linear  # D -> (H + 2 Hkv) * hd, on the normalised input
    out: Linear  # H * hd -> D
    gate_up: Linear  # D -> 2 F, on the normalised input
    down: Linear  # F -> D
    head_norms: torch.Tensor | None = None  # [H + Hkv, hd]: Qwen3's per-head q/k RMSNorm weights (q's scaled)


class FastLlama:
    """The model's weights in one format, and its forward pass over a ``KVCache``."""

    def __init__(self, config: Any, state: Mapping[str, torch.Tensor], formats: FormatPlan,
                 device: torch.device) -> None:
        """The weights of ``state`` in ``formats`` (``format_plan.choose_formats``) on ``device``."""
        self.config = config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.device = device
        self.formats = formats
        self.dtype = PLAIN_DTYPES[formats.compute]
        with PackWorker() as worker:  # FBGEMM's packing beside the reads (``pack_worker``)
            self._build(config, state, formats, worker if device.type == "cpu" else None)
        self._eps = torch.full((1, 1), self.eps, dtype=self.dtype, device=device)
        self._inv_freq, self._rope_scale = _inverse_frequencies(config, device, state.get(ROPE_FACTORS))
        self._turns = torch.empty(0, 1, self.head_dim // 2, dtype=torch.complex64, device=device)
        self._attention_kernels = device.type == "cpu" and native_attention.covers(self.heads, self.kv_heads,
                                                                                   self.head_dim)
        self._mask_dtype = PLAIN_DTYPES[formats.prompt_attention]  # bf16 where 4-bit prompts multiply on AMX's tiles
        self._chunk_tiles = self._mask_dtype == torch.bfloat16 and native_attention.tiles_cover(self.head_dim)

    def _build(self, config: Any, state: Mapping[str, Weight], formats: FormatPlan, worker: PackWorker | None) -> None:
        """The output layer, the token table and the layers, in that order: the first two's full-size temporaries
        are freed before the layers are held. ``worker`` packs fp16 weights beside the reads."""
        final_norm = _fp32(state["model.norm.weight"], self.device)
        head_name, table_name = _tied_name(config, state, HEAD, TABLE), _tied_name(config, state, TABLE, HEAD)
        head = _fp32(state[head_name], self.device)
        if formats.output_layer == INT4_PAIR:
            head = as_int4_pair(head)  # made once where the table is the same weights
        self.lm_head = Linear(head, None, formats.output_layer, final_norm, worker=worker)
        tied = head if table_name == head_name else None
        del head  # an untied output layer's temporaries go before the table's come
        self.embed = self._token_table(state, table_name, PLAIN_DTYPES.get(formats.token_table), tied)
        del tied
        self.layers = [
            self._layer(state, f"model.layers.{i}.", formats, worker) for i in range(config.num_hidden_layers)
        ]

    def _token_table(self, state: Mapping[str, Weight], name: str, storage: torch.dtype | None,
                     tied: Weight | None) -> Any:
        """The token table ``name`` in ``storage`` (``quant.embedding``; None: two planes of 4-bit groups), or on
        the CPU as the file keeps it where the state can hand its rows so (``kept_rows``: a GGUF file's quantized
        table, ``gguf_blocks.BlockTable``), decoded exactly when looked up, in a fraction of fp16's bytes. ``tied``:
        the output layer's weight where it is the same tensor, which is not read again."""
        if self.device.type == "cpu" and hasattr(state, "kept_rows"):
            kept = state.kept_rows(name, self.dtype)
            if kept is not None:
                return kept
        return embedding(tied if tied is not None else _fp32(state[name], self.device), storage, self.dtype)

    def _layer(self, state: Mapping[str, torch.Tensor], prefix: str, formats: FormatPlan,
               worker: PackWorker | None) -> _Layer:
        """One layer's matmuls, given its norms' weights; the attention scale and the rotary order are folded in."""
        def weight(name: str) -> Weight:
            return _fp32(state[prefix + name], self.device)

        def optional(name: str) -> Weight | None:
            return weight(name) if prefix + name in state else None

        head_norms = self._head_norms(optional("self_attn.q_norm.weight"), optional("self_attn.k_norm.weight"))
        in_pairs = getattr(state, "rotary_pairs", False)  # a GGUF file's llama rows: pairs already (``gguf_direct``)

        def qkv_rows(kind: str) -> Weight | None:
            q, k, v = (optional(f"self_attn.{p}_proj.{kind}") for p in "qkv")
            if q is None or k is None or v is None:
                return None
            q = q if head_norms is not None else _scaled(q, self.head_dim**-0.5)  # else the norm takes the scale
            if not in_pairs:
                q, k = _pair_rows(q, self.heads), _pair_rows(k, self.kv_heads)
            return _cat_rows([q, k, v])

        def linear(rows: Weight, bias: Weight | None, norm: str | None = None) -> Linear:
            return Linear(rows, bias, formats.layers, weight(norm) if norm else None, formats.decode_copy, worker)

        qkv = linear(qkv_rows("weight"), qkv_rows("bias"), "input_layernorm.weight")
        gate_up = _cat_rows([weight("mlp.gate_proj.weight"), weight("mlp.up_proj.weight")])
        return _Layer(
            qkv=qkv,
            out=linear(weight("self_attn.o_proj.weight"), optional("self_attn.o_proj.bias")),
            gate_up=linear(gate_up, None, "post_attention_layernorm.weight"),
            down=linear(weight("mlp.down_proj.weight"), None),
            head_norms=head_norms.to(qkv.compute_dtype) if head_norms is not None else None,
        )

    def _head_norms(self, q_norm: Weight | None, k_norm: Weight | None) -> torch.Tensor | None:
        """Qwen3's q/k norm weights [hd] each, in the rotary pair order, one row per head; q's times the
        attention scale. None for models without them."""
        if q_norm is None or k_norm is None:
            return None
        q_norm, k_norm = _pair_rows(q_norm, 1), _pair_rows(k_norm, 1)  # [hd] each
        rows = [q_norm * self.head_dim**-0.5] * self.heads + [k_norm] * self.kv_heads
        return torch.stack(rows)  # [H + Hkv, hd]

    @property
    def weight_bytes(self) -> int:
        return sum(linear.nbytes for linear in self._linears()) + self.embed.nbytes

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads (each layer's one-row copy, the output layer); it sets the speed."""
        return sum(linear.one_row_nbytes for linear in self._linears())

    def _linears(self) -> list[Linear]:
        return [l for layer in self.layers for l in (layer.qkv, layer.out, layer.gate_up, layer.down)] + [self.lm_head]

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """``token_ids`` [S] at positions ``start``…; logits of the last one, [V] fp32."""
        length = token_ids.shape[0]
        cache.reserve(start + length)
        turns = self.rotations(start, start + length)  # [S, 1, hd/2] complex
        kernel = self._cache_kernel(start, length)
        mask = None if kernel is not None else _causal_mask(start, length, self._mask_dtype, self.device)  # [S, start+S]
        slots = _slots(slice(start, start + length))  # [S]: where the rows' keys and values go
        x = self.embed(token_ids)  # [S, D]
        for index, layer in enumerate(self.layers):
            x += self._attention(layer, index, self.normalise(x), cache, start, slots, turns, mask, kernel)
            x += layer.down(swiglu(layer.gate_up(self.normalise(x))))
        cache.length = start + length
        return self.lm_head(self.normalise(x[-1:]))[0].float()  # [V]

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [S, D] over its root mean square; the norm's own weight goes to the next matmul."""
        if native_norm.covers(x):
            return native_norm.rms_norm(x, self.eps)
        if x.shape[0] == 1 and x.dtype == torch.float32:
            # One row: its mean square as one tiny matmul costs a fifth of the general kernel's several ops.
            return x * torch.addmm(self._eps, x, x.t(), alpha=1 / x.shape[1]).rsqrt_()  # [1, D] * [1, 1]
        return F.rms_norm(x, (x.shape[1],), eps=self.eps)

    def _kernel_takes(self, length: int) -> bool:
        """Whether ``length`` new tokens of one sequence attend in the CPU kernels (else SDPA, or two bmm a row):
        any number on AMX's tiles (``KERNEL_CHUNK_ROWS``)."""
        return self._attention_kernels and (length <= KERNEL_CHUNK_ROWS or self._chunk_tiles)

    def _cache_kernel(self, start: int, length: int) -> DecodeRuns | ChunkRuns | None:
        """The CPU kernel for ``length`` new tokens at ``start`` of a ``KVCache`` (one run of positions), or None
        where it does not take them."""
        if not self._kernel_takes(length):
            return None
        held = (slice(0, start + length),)
        return DecodeRuns.of([0], [held]) if length == 1 else ChunkRuns.of(0, length, start, held, self._chunk_tiles)

    def _attention(self, layer: _Layer, index: int, h: torch.Tensor, cache: KVCache, start: int, slots: torch.Tensor,
                   turns: torch.Tensor, mask: torch.Tensor | None,
                   kernel: DecodeRuns | ChunkRuns | None) -> torch.Tensor:
        qkv, layer_kv = self._qkv(layer, h), cache.buffer[index]  # [S, H + 2Hkv, hd], [2, Hkv, P, hd]
        if kernel is not None and native_rotary.covers(qkv, layer_kv):
            native_rotary.rotate_and_store(qkv, turns, layer_kv, slots, self.heads)
            q = qkv[:, : self.heads]  # [S, H, hd]
        else:
            q, new_keys_values = self._rotated(qkv, turns)  # [S, H, hd], [2, Hkv, S, hd]
            keys, values = cache.write(index, start, new_keys_values)  # [Hkv, T, hd] each
        if kernel is not None:
            q, attended = q.contiguous(), torch.empty(q.shape, dtype=q.dtype)  # [S, H, hd]
            kernel.attend(q, attended, layer_kv)
        else:
            attended = self._attend(q, keys, values, mask)  # [S, H, hd]
        return layer.out(attended.reshape(h.shape[0], self.heads * self.head_dim))  # [S, D]

    def _project(self, layer: _Layer, h: torch.Tensor, turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries [S, H, hd] and the new keys and values [2, Hkv, S, hd] of ``h`` [S, D]."""
        return self._rotated(self._qkv(layer, h), turns)

    def _qkv(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
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
        round activations to 8 bits (``activation_codes``). Logits of each row's last token, [B, V]."""
        layout = kv.layout(rows)
        ids = torch.tensor([t for row in rows for t in row.token_ids], dtype=torch.long, device=self.device)  # [R]
        self.rotations(0, max(span.start + span.length for span in layout.spans))
        turns = self._turns[layout.positions]  # [R, 1, hd/2]
        kernels = self._kernel_attention(layout)
        masks = [None if self._kernel_takes(span.length) else _causal_mask(span.start, span.length, self._mask_dtype,
                                                                           self.device) for span in layout.spans]
        runs = [kv.layer_runs(span.runs) if span.length == 1 and kernels is None else None for span in layout.spans]
        slots = _slots(layout.write)  # [R]: where the rows' keys and values go in the pool
        x = self.embed(ids)  # [R, D]
        with activation_codes.for_step(len(rows)):
            for index, layer in enumerate(self.layers):
                x += self._paged_attention(layer, index, self.normalise(x), kv, layout, slots, turns, masks, runs,
                                           kernels)
                x += layer.down(swiglu(layer.gate_up(self.normalise(x))))
            return self.lm_head(self.normalise(x[layout.last_rows])).float()  # [B, V]

    def _kernel_attention(self, layout: StepLayout) -> list[DecodeRuns | ChunkRuns] | None:
        """The step's attention in the CPU kernels (``native.decode_attention``): its decode rows at once, and each
        prompt chunk of up to ``KERNEL_CHUNK_ROWS`` rows; None where the kernels are not here."""
        if not self._attention_kernels:
            return None
        decoding = [span for span in layout.spans if span.length == 1]
        kernels: list[DecodeRuns | ChunkRuns] = [
            ChunkRuns.of(span.rows.start, span.length, span.start, span.runs, self._chunk_tiles)
            for span in layout.spans if span.length > 1 and self._kernel_takes(span.length)
        ]
        if decoding:
            kernels.append(DecodeRuns.of([span.rows.start for span in decoding], [span.runs for span in decoding]))
        return kernels

    def _paged_attention(self, layer: _Layer, index: int, h: torch.Tensor, kv: PagedKV, layout: StepLayout,
                         slots: torch.Tensor, turns: torch.Tensor, masks: list[torch.Tensor | None],
                         runs: list[list[tuple[tuple[torch.Tensor, torch.Tensor], ...]] | None],
                         kernels: list[DecodeRuns | ChunkRuns] | None) -> torch.Tensor:
        """``runs``: each decode row's keys and values by layer and run (``PagedKV.layer_runs``), None for a prompt
        chunk and for every row where ``kernels`` run the attention; ``masks``: a prompt chunk's causal mask for
        SDPA, None where a kernel (or a decode row's two bmm) takes it."""
        qkv, layer_kv = self._qkv(layer, h), kv.buffer[index]  # [R, H + 2Hkv, hd], [2, Hkv, P, hd]
        if native_rotary.covers(qkv, layer_kv):
            native_rotary.rotate_and_store(qkv, turns, layer_kv, slots, self.heads)
            q = qkv[:, : self.heads]  # [R, H, hd]
        else:
            q, new_keys_values = self._rotated(qkv, turns)  # [R, H, hd], [2, Hkv, R, hd]
            kv.write(index, layout.write, new_keys_values)
        attended = torch.empty_like(q)  # [R, H, hd]: each sequence's rows written in place
        if kernels is not None:
            q = q.contiguous()  # a view of the step's q, k, v projections
            for kernel in kernels:
                kernel.attend(q, attended, kv.buffer[index])
        else:
            self._attend_decode_rows(q, attended, layout, [run[index] if run is not None else None for run in runs])
        for span, mask in zip(layout.spans, masks):
            if mask is not None:
                attended[span.rows] = self._attend(q[span.rows], *kv.read(index, span.runs), mask)
        rows, heads, hd = q.shape
        return layer.out(attended.view(rows, heads * hd))  # [R, D]

    def _attend_decode_rows(self, q: torch.Tensor, attended: torch.Tensor, layout: StepLayout,
                            runs: list[tuple[tuple[torch.Tensor, torch.Tensor], ...] | None]) -> None:
        """Each decode row's attention over its runs of this layer (None: a prompt chunk's span), into ``attended``.
        Two bmm a row over views made once per step: a batch of 8 makes 240 such calls a step, and at this size
        each op's dispatch costs about what its arithmetic does (``native.decode_attention`` makes them one)."""
        rows, _, hd = q.shape
        queries, out = q.view(rows, self.kv_heads, -1, hd), attended.view(rows, self.kv_heads, -1, hd)  # [R, Hkv, G, hd]
        if rows == len(layout.spans):  # decode rows alone: every row's view at once
            queries, out = queries.unbind(0), out.unbind(0)
        for span, run in zip(layout.spans, runs):
            if run is not None:
                attend_runs(queries[span.rows.start], run, out[span.rows.start])

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention over the cache (``attend``); ``cuda_backend`` overrides it with fused GPU kernels."""
        return attend(q, keys, values, mask)

    def rotations(self, start: int, end: int) -> torch.Tensor:
        """Unit complex numbers that turn each (even, odd) pair of a head at positions ``start``…``end``."""
        if end > self._turns.shape[0]:
            size = -(-end // ROPE_TABLE_CHUNK) * ROPE_TABLE_CHUNK
            angles = torch.arange(size, device=self.device).float().unsqueeze(1) * self._inv_freq  # [P, hd/2]
            cos, sin = angles.cos() * self._rope_scale, angles.sin() * self._rope_scale
            self._turns = torch.complex(cos, sin).unsqueeze(1)  # [P, 1, hd/2]
        return self._turns[start:end]


KERNEL_CHUNK_ROWS = 128
"""Prompt chunks of up to this many rows attend in the CPU kernel (``ChunkRuns``), each row over the positions up to
its own: the chunks a step takes beside decoding rows. 2 000 positions deep (built-in model's heads): 16 rows 0.66 ms a
layer against SDPA's 1.05, 64 rows 2.3 against 4.3, 128 rows 3 000 deep 8.0 against 12.6; a whole prompt's chunks of
512 stay on SDPA's blocked matmuls. On AMX's tiles (``ChunkRuns.on_tiles``) the kernel takes chunks of any size: 512
rows 1 000 deep 5.5 ms a layer against bf16 SDPA's 8.0 (3 584 deep 15.0 against 20.4), and it reads the pool in place
where SDPA needs the prefix gathered; 64 rows 1 000 deep 0.65 against the fp32 kernel's 1.46."""
TABLE, HEAD = "model.embed_tokens.weight", "lm_head.weight"
ROPE_FACTORS = "model.rotary_emb.freq_factors"  # only GGUF files hold them (``gguf_direct``)


def _slots(where: slice | torch.Tensor) -> torch.Tensor:
    """A step's new positions as int64 [R]: a run of them, or the positions themselves."""
    if isinstance(where, slice):
        return torch.arange(where.start, where.stop)
    return where.to(torch.int64)


def _tied_name(config: Any, state: Mapping[str, Weight], name: str, tied_name: str) -> str:
    """``name``, or with tied embeddings ``tied_name`` where the checkpoint holds the table under that one."""
    if name in state:
        return name
    if getattr(config, "tie_word_embeddings", False) and tied_name in state:
        return tied_name
    raise ValueError("The checkpoint lacks its token embeddings or its output layer (lm_head).")


def _inverse_frequencies(config: Any, device: torch.device, factors: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """Each rotary pair's turn per position [hd/2] and the scale of its cos and sin, as Hugging Face's rotary
    embedding computes them for ``config``'s scaling scheme (``transformers.modeling_rope_utils``, which imports
    none of the modelling code).

    ``factors`` [hd/2]: each frequency's divisor, as a GGUF file of Llama 3.1 gives its rope scaling
    (``rope_freqs.weight``) instead of naming it in the metadata.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = config.rope_parameters
    if rope["rope_type"] == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq, scale = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config)
    if factors is not None:
        inv_freq = inv_freq / factors.to(torch.float32)  # [hd/2]
    return inv_freq.to(device), float(scale)


def _fp32(weight: Weight, device: torch.device) -> Weight:
    """A tensor in fp32 on ``device``; ``Int4Groups`` and ``Int4Pair`` stay in their groups, ``RowChunks`` (the CPU's)
    in their blocks."""
    if isinstance(weight, RowChunks):
        return weight
    return weight.to(device) if isinstance(weight, (Int4Groups, Int4Pair)) else weight.to(device, torch.float32)


def _scaled(weight: Weight, factor: float) -> Weight:
    return weight.scaled(factor) if isinstance(weight, Int4Groups) else weight * factor


def _cat_rows(parts: list[Weight]) -> Weight:
    """The parts' rows one after another: 4-bit groups if all are, else fp32 (a Q4_K_M file's 4-bit q and k
    beside its 6-bit v: each exact, and a 4-bit decode copy is quantized from the whole)."""
    if all(isinstance(part, Int4Groups) for part in parts):
        return Int4Groups.cat(parts)
    return torch.cat([part.dequantize() if isinstance(part, Int4Groups) else part for part in parts])


def _pair_rows(rows: Weight, heads: int) -> Weight:
    """Each head's rows from Hugging Face's half-split rotary order to (even, odd) pairs: 0, hd/2, 1, hd/2 + 1, …

    Queries and keys are reordered alike, so their dot products, and the attention, stay the same.
    """
    head_dim = rows.shape[0] // heads
    order = torch.arange(head_dim).view(2, head_dim // 2).t().reshape(-1)  # [hd]
    every_head = (torch.arange(heads).unsqueeze(1) * head_dim + order).flatten()  # [H * hd]
    return rows.rows(every_head) if isinstance(rows, Int4Groups) else rows[every_head.to(rows.device)]


def rotate_pairs_(x: torch.Tensor, turns: torch.Tensor) -> None:
    """Rotary positions in place: ``x`` [S, N, hd] as hd/2 complex numbers, each times its ``turns`` [S, 1, hd/2]."""
    if x.dtype == torch.float32:
        torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(turns)
        return
    turned = torch.view_as_complex(x.float().unflatten(-1, (-1, 2))) * turns  # [S, N, hd/2]
    x.copy_(torch.view_as_real(turned).flatten(-2))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up from ``gate_up`` [S, 2F]: [S, F], in Hearth's CPU kernel or in place in its gate half."""
    if native_norm.swiglu_covers(gate_up):
        return native_norm.swiglu(gate_up)
    width = gate_up.shape[1] // 2
    gate = F.silu(gate_up[:, :width], inplace=True)  # [S, F]
    return gate.mul_(gate_up[:, width:])


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``q`` [S, H, hd] (already scaled) over ``keys``/``values`` [Hkv, T, hd]; query head ``h`` uses kv head
    ``h // (H / Hkv)``. Returns [S, H, hd]. A prompt chunk's attention (SDPA, under ``mask``) runs in the mask's
    dtype (``FormatPlan.prompt_attention``)."""
    if mask is not None:
        dtype = mask.dtype
        attended = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0).to(dtype), keys.unsqueeze(0).to(dtype),
                                                  values.unsqueeze(0).to(dtype), attn_mask=mask, scale=1.0,
                                                  enable_gqa=True)
        return attended[0].transpose(0, 1).to(q.dtype)
    _, heads, hd = q.shape
    grouped = q.view(keys.shape[0], -1, hd)  # [Hkv, G, hd]
    return attend_grouped(grouped, keys.transpose(1, 2), values, torch.empty_like(grouped)).view(1, heads, hd)


def attend_grouped(queries: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One query's heads grouped by kv head, ``queries`` [Hkv, G, hd] (scaled), over ``keys_t`` [Hkv, hd, T] and
    ``values`` [Hkv, T, hd], into ``out`` [Hkv, G, hd]: two batched matmuls (called directly: ``@`` adds a dispatch
    layer) beat the fused kernel's setup."""
    scores = torch.bmm(queries, keys_t)  # [Hkv, G, T]
    return torch.bmm(scores.softmax(dim=-1), values, out=out)


def attend_runs(queries: torch.Tensor, runs: tuple[tuple[torch.Tensor, torch.Tensor], ...], out: torch.Tensor) -> torch.Tensor:
    """``attend_grouped`` over keys and values that lie in several runs of the pool, ``runs`` of ([Hkv, hd, n],
    [Hkv, n, hd]) (a prefix another sequence holds, then this one's own blocks): every run's scores side by side,
    one softmax, each run's weighted values summed into ``out``; read in place, where gathering them copied a
    shared prefix's keys per sequence, layer and step (8 chats under one 1 000-token prompt: 1.7x a step)."""
    if len(runs) == 1:
        return attend_grouped(queries, *runs[0], out)
    scores = torch.cat([torch.bmm(queries, keys_t) for keys_t, _ in runs], dim=2)  # [Hkv, G, T]
    weights = scores.softmax(dim=-1)
    start = 0
    for index, (_, values) in enumerate(runs):
        part = weights.narrow(2, start, values.shape[1])  # [Hkv, G, n]
        if index == 0:
            torch.bmm(part, values, out=out)
        else:
            out.baddbmm_(part, values)
        start += values.shape[1]
    return out


def _causal_mask(start: int, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """Query ``i`` (at position ``start + i``) sees keys ``0 … start + i``: 0 there, -inf beyond, added to the scores
    (SDPA turns a boolean mask into this on every call); ``None`` for a single query."""
    if length == 1:
        return None
    keys = torch.arange(start + length, device=device)  # [T]
    queries = torch.arange(start, start + length, device=device)  # [S]
    hidden = keys.unsqueeze(0) > queries.unsqueeze(1)  # [S, T]
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, float("-inf"))


class FastLlamaBackend:
    """The decode loop's ``Backend`` over a ``FastLlama``."""

    prefill_chunk = PREFILL_CHUNK

    def __init__(self, model: FastLlama) -> None:
        self.model = model
        self.device = model.device

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def forward(self, token_ids: Sequence[int], cache: KVCache, start: int) -> torch.Tensor:
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [S]
        return self.model.forward(ids, cache, start)

    def new_pool(self, num_blocks: int, block_size: int) -> PagedKV:
        model = self.model
        return PagedKV(len(model.layers), model.kv_heads, model.head_dim, num_blocks, block_size, model.dtype, self.device)

    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        """Each row's tokens appended to its blocks of ``kv``; logits of each row's last token, [B, V] fp32."""
        return self.model.forward_batch(rows, kv)

    def crop(self, cache: KVCache, length: int) -> KVCache:
        cache.crop(length)
        return cache

    def cache_bytes(self, cache: KVCache) -> int:
        return cache.nbytes
