"""A Llama-family model's weights, built once from a state in the fast path's formats (engine thread).

Weights come from a Hugging Face state dict (tensors, or ``Int4Groups`` for a GGUF
file's 4-bit layers: ``engine.models.gguf_state``) and are repacked once into one
the formats of a ``FormatPlan`` (``engine.models.format_plan``, ``quant``) so that a
decode step makes few calls, since at this size each call's fixed cost adds up:
q/k/v become one matmul and gate/up another; each RMSNorm's weight goes to the
matmul after it (``Linear``'s ``input_scale``), the attention scale into the query
rows, and query/key rows are reordered so rotary positions are one complex multiply
in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import torch

from engine.forward.weights.pack_worker import PackWorker
from engine.forward.weights.quant import PLAIN_DTYPES, Linear, embedding
from engine.forward.weights.quant_int import INT4_PAIR, Int4Groups, Int4Pair, as_int4_pair
from engine.forward.weights.row_chunks import RowChunks

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

Weight = torch.Tensor | Int4Groups | Int4Pair | RowChunks  # a state's matmuls may come in 4-bit groups or
# (an output layer for the int8 kernel) as blocks decoded where packed: GGUF files

TABLE, HEAD = "model.embed_tokens.weight", "lm_head.weight"
ROPE_FACTORS = "model.rotary_emb.freq_factors"  # only GGUF files hold them (``gguf_direct``)


@dataclass
class LlamaLayer:
    qkv: Linear  # D -> (H + 2 Hkv) * hd, on the normalised input
    out: Linear  # H * hd -> D
    gate_up: Linear  # D -> 2 F, on the normalised input
    down: Linear  # F -> D
    head_norms: torch.Tensor | None = None  # [H + Hkv, hd]: Qwen3's per-head q/k RMSNorm weights (q's scaled)


class LlamaWeights:
    """The model's shape and its weights in one format: the output layer, the token table and the layers."""

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
        # each rotary pair's turn per position [hd/2], and the scale of its cos and sin
        self.inv_freq, self.rope_scale = _inverse_frequencies(config, device, state.get(ROPE_FACTORS))

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
               worker: PackWorker | None) -> LlamaLayer:
        """One layer's matmuls, given its norms' weights; the attention scale and the rotary order are folded in."""
        def weight(name: str) -> Weight:
            return _fp32(state[prefix + name], self.device)

        def optional(name: str) -> Weight | None:
            return weight(name) if prefix + name in state else None

        head_norms = self._head_norms(optional("self_attn.q_norm.weight"), optional("self_attn.k_norm.weight"))
        in_pairs = getattr(state, "rotary_pairs", False)  # a GGUF file's llama rows: pairs already (``gguf_direct``)

        def qkv_rows(kind: str) -> Weight | None:
            stacked = _stacked(state, [f"{prefix}self_attn.{p}_proj.{kind}" for p in "qkv"]) if in_pairs else None
            if stacked is not None:
                if head_norms is None:
                    stacked.scale_rows_(self.heads * self.head_dim, self.head_dim**-0.5)
                return stacked
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
        gate_up = _stacked(state, [f"{prefix}mlp.gate_proj.weight", f"{prefix}mlp.up_proj.weight"])
        if gate_up is None:
            gate_up = _cat_rows([weight("mlp.gate_proj.weight"), weight("mlp.up_proj.weight")])
        return LlamaLayer(
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


def _stacked(state: Mapping[str, Weight], names: list[str]) -> Int4Groups | None:
    """The tensors ``names``' rows one after another, decoded straight into one weight where the state can (a GGUF
    file's int4 groups, ``GGUFState.stacked``), so ``_cat_rows`` copies nothing; None elsewhere (or where a name is
    missing: a q/k/v bias)."""
    stacked = getattr(state, "stacked", None)
    if stacked is None or not all(name in state for name in names):
        return None
    return stacked(names)


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
