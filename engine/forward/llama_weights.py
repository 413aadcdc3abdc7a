"""A Llama-family model's weights, built once from a state in the fast path's formats (engine thread).

Weights come from a Hugging Face state dict (tensors, or ``Int4Groups`` for a GGUF
file's 4-bit layers and ``Int8Groups`` for its Q8_0 ones: ``engine.models.gguf_direct``)
and are repacked once into the formats of a ``FormatPlan`` (``engine.models.format_plan``, ``quant``) so that a
decode step makes few calls, since at this size each call's fixed cost adds up:
q/k/v become one matmul and gate/up another; each RMSNorm's weight goes to the
matmul after it (``Linear``'s ``input_scale``), the attention scale into the query
rows, and query/key rows are reordered so rotary positions are one complex multiply
in place. A family's differences (``family.Family``) enter as data: Gemma's ``1 + w``
norms and its norms after attention and MLP, fused q/k/v and gate/up rows (Phi-3), a
rotary table per layer type (``rotary_tables``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import torch

from engine.forward.family import family_of, head_dim_of
from engine.forward.rotary_tables import FACTOR_NAMES, rotary_tables
from engine.forward.experts import ROUTERS, MixtureOfExperts, mixture_of_experts
from engine.forward.mlp import GatedMlp
from engine.forward.native import int8_matmul as native_int8
from engine.forward.weights.pack_worker import PackWorker
from engine.forward.weights.packed_sizes import OUTPUT_ROWS
from engine.forward.weights.quant import PLAIN_DTYPES, Linear, OutputRows, embedding
from engine.forward.weights.mxfp4 import Mxfp4Rows
from engine.forward.weights.int8_groups import Int8Groups
from engine.forward.weights.quant_int import INT4_PAIR, Int4Groups, Int4Pair, as_int4_pair
from engine.forward.weights.row_chunks import RowChunks

if TYPE_CHECKING:
    from engine.models.format_plan import FormatPlan

Weight = torch.Tensor | Int4Groups | Int4Pair | Int8Groups | RowChunks | Mxfp4Rows
"""A state's matmul: GGUF files' may come in 4-bit groups or Q8_0's int8 groups, (an output layer for the int8
kernel) as blocks decoded where packed, or (gpt-oss's experts) in MXFP4."""
GROUPED = (Int4Groups, Int8Groups)  # a file's groups, which reorder, concatenate and scale as they are

TABLE, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@dataclass
class LlamaLayer:
    qkv: Linear  # D -> (H + 2 Hkv) * hd, on the normalised input
    out: Linear  # H * hd -> D
    mlp: GatedMlp | MixtureOfExperts  # D -> D, on the normalised input (a mixture: where the layer has a router)
    head_norms: torch.Tensor | None = None  # [H + Hkv, hd]: Qwen3's per-head q/k RMSNorm weights (q's scaled)
    attention_norm: torch.Tensor | None = None  # [D]: Gemma's RMSNorm weight of the attention's output
    mlp_norm: torch.Tensor | None = None  # [D]: Gemma's RMSNorm weight of the MLP's output
    rotary: int = 0  # the index of the rotary table this layer turns with (``rotary_tables``)
    sinks: torch.Tensor | None = None  # [H] fp32: gpt-oss's per-head logit that joins each softmax's denominator


class LlamaWeights:
    """The model's shape and its weights in one format: the output layer, the token table and the layers."""

    def __init__(self, config: Any, state: Mapping[str, torch.Tensor], formats: FormatPlan,
                 device: torch.device, context_length: int | None = None) -> None:
        """The weights of ``state`` in ``formats`` (``format_plan.choose_formats``) on ``device``;
        ``context_length``: the context chosen at load (LongRoPE's choice of factors)."""
        self.config = config
        self.family = family_of(config)
        # a GGUF file's Gemma norms hold 1 + w already (llama.cpp's converter adds it)
        self._norm_shift = 0.0 if getattr(state, "shifted_norms", False) else self.family.norm_shift
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.eps = config.rms_norm_eps
        self.device = device
        self.formats = formats
        self.dtype = PLAIN_DTYPES[formats.compute]
        with PackWorker() as worker:  # FBGEMM's packing beside the reads (``pack_worker``)
            self._build(config, state, formats, worker if device.type == "cpu" else None)
        factors = {name: state[name] for name in FACTOR_NAMES if name in state}
        self.rotary, layer_tables = rotary_tables(config, device, factors, context_length)
        for layer, table in zip(self.layers, layer_tables):
            layer.rotary = table

    def _build(self, config: Any, state: Mapping[str, Weight], formats: FormatPlan, worker: PackWorker | None) -> None:
        """The output layer, the token table and the layers, in that order: the first two's full-size temporaries
        are freed before the layers are held. ``worker`` packs fp16 weights beside the reads."""
        final_norm = self._norm(state["model.norm.weight"])
        head_name, table_name = _head_and_table_names(config, state)
        head = self._output_weight(state[head_name], formats.output_layer)
        if formats.output_layer == INT4_PAIR:
            head = as_int4_pair(head)  # made once where the table is the same weights
        self.lm_head = Linear(head, None, formats.output_layer, final_norm, worker=worker)
        shared = table_name == head_name
        tied = head if shared else None
        del head  # an untied output layer's temporaries go before the table's come
        if formats.token_table == OUTPUT_ROWS:
            self.embed = self._output_rows(shared)
        else:
            self.embed = self._token_table(state, table_name, PLAIN_DTYPES.get(formats.token_table), tied)
        del tied
        self.layers = [
            self._layer(state, f"model.layers.{i}.", formats, worker) for i in range(config.num_hidden_layers)
        ]

    def _output_weight(self, weight: Weight, output_format: str) -> Weight:
        """The output layer's weight on its way into ``output_format``: for the CPU's int8 kernel a checkpoint's
        16-bit rows as ``RowChunks``, widened to fp32 a chunk at a time as they are packed (a 128k x 4096 layer
        is 2.1 GB in fp32), else ``_fp32``'s."""
        if (output_format == "int8" and self.device.type == "cpu" and isinstance(weight, torch.Tensor)
                and weight.dtype in (torch.bfloat16, torch.float16) and native_int8.covers(*weight.shape)):
            rows, width = weight.shape
            return RowChunks(rows, width, lambda start, end: weight[start:end].float())
        return _fp32(weight, self.device)

    def _output_rows(self, tied: bool) -> OutputRows:
        """The token table as the int8 output layer's rows, which the plan chose for a table tied to it."""
        if not tied or self.lm_head.int8 is None:
            raise RuntimeError("the format plan looks the token table up in the output layer, but the model does "
                               "not tie them or its output layer is not on Hearth's int8 kernel")
        return OutputRows(self.lm_head.int8, self.dtype)

    def _token_table(self, state: Mapping[str, Weight], name: str, storage: torch.dtype | None,
                     tied: Weight | None) -> Any:
        """The token table ``name`` in ``storage`` (``quant.embedding``; None: two planes of 4-bit groups), or on
        the CPU as the file keeps it where the state can hand its rows so (``kept_rows``: a GGUF file's quantized
        table, ``gguf_blocks.BlockTable``), decoded exactly when looked up, in a fraction of fp16's bytes. ``tied``:
        the output layer's weight where it is the same tensor, which is not read again (unless it came in chunks)."""
        if self.device.type == "cpu" and hasattr(state, "kept_rows"):
            kept = state.kept_rows(name, self.dtype)
            if kept is not None:
                return kept
        if tied is None or isinstance(tied, RowChunks):  # chunks are not a table: read it again
            tied = _fp32(state[name], self.device)
        return embedding(tied, storage, self.dtype)

    def _layer(self, state: Mapping[str, torch.Tensor], prefix: str, formats: FormatPlan,
               worker: PackWorker | None) -> LlamaLayer:
        """One layer's matmuls, given its norms' weights; the attention scale and the rotary order are folded in."""
        def weight(name: str) -> Weight:
            return _fp32(state[prefix + name], self.device)

        def optional(name: str) -> Weight | None:
            return weight(name) if prefix + name in state else None

        def norm(name: str) -> torch.Tensor | None:
            return self._norm(state[prefix + name]) if prefix + name in state else None

        head_norms = self._head_norms(norm("self_attn.q_norm.weight"), norm("self_attn.k_norm.weight"))
        in_pairs = getattr(state, "rotary_pairs", False)  # a GGUF file's llama rows: pairs already (``gguf_direct``)
        rotary = self.family.rotary_dim

        def qkv_rows(kind: str) -> Weight | None:
            stacked = _stacked(state, [f"{prefix}self_attn.{p}_proj.{kind}" for p in "qkv"]) if in_pairs else None
            if stacked is not None:
                if head_norms is None:
                    stacked.scale_rows_(self.heads * self.head_dim, self.family.attention_scale)
                return stacked
            fused = optional(f"self_attn.qkv_proj.{kind}")  # Phi-3's
            if fused is not None:
                q, k, v = _split_rows(fused, [self.heads * self.head_dim] + [self.kv_heads * self.head_dim] * 2)
            else:
                q, k, v = (optional(f"self_attn.{p}_proj.{kind}") for p in "qkv")
            if q is None or k is None or v is None:
                return None
            q = q if head_norms is not None else _scaled(q, self.family.attention_scale)  # else the norm takes it
            if not in_pairs:
                q, k = _pair_rows(q, self.heads, rotary), _pair_rows(k, self.kv_heads, rotary)
            return _cat_rows([q, k, v])

        def linear(rows: Weight, bias: Weight | None, norm_weight: torch.Tensor | None = None,
                   expert: bool = False) -> Linear:
            if expert:  # one copy, in the experts' format
                return Linear(rows, bias, formats.experts, norm_weight, worker=worker)
            return Linear(rows, bias, formats.layers, norm_weight, formats.decode_copy, worker)

        def gated_rows(gate_up: Weight, down: Weight, expert: bool = False, gate_up_bias: torch.Tensor | None = None,
                       down_bias: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None) -> GatedMlp:
            return GatedMlp(linear(gate_up, gate_up_bias, norm_weight, expert), linear(down, down_bias, expert=expert),
                            self.family.expert_clamp or self.family.activation)

        def stacked_rows(names: list[str]) -> Weight:  # gate's and up's rows, stacked where the state can
            stacked = _stacked(state, [prefix + name for name in names])
            return stacked if stacked is not None else _cat_rows([weight(name) for name in names])

        # Gemma normalises the attention's and the MLP's outputs too; its MLP input norm is pre_feedforward's
        post_norms = prefix + "pre_feedforward_layernorm.weight" in state
        mlp_input = "pre_feedforward_layernorm.weight" if post_norms else "post_attention_layernorm.weight"
        qkv = linear(qkv_rows("weight"), qkv_rows("bias"), norm("input_layernorm.weight"))
        if any(prefix + router in state for router in ROUTERS):
            mlp: GatedMlp | MixtureOfExperts = mixture_of_experts(
                self.config, self.family, weight, lambda name: prefix + name in state, stacked_rows, gated_rows)
        else:
            gate_up = optional("mlp.gate_up_proj.weight")  # Phi-3's, gate rows first
            if gate_up is None:
                gate_up = stacked_rows(["mlp.gate_proj.weight", "mlp.up_proj.weight"])
            mlp = gated_rows(gate_up, weight("mlp.down_proj.weight"), norm_weight=norm(mlp_input))
        return LlamaLayer(
            qkv=qkv,
            out=linear(weight("self_attn.o_proj.weight"), optional("self_attn.o_proj.bias")),
            mlp=mlp,
            head_norms=head_norms.to(qkv.compute_dtype) if head_norms is not None else None,
            attention_norm=norm("post_attention_layernorm.weight") if post_norms else None,
            mlp_norm=norm("post_feedforward_layernorm.weight") if post_norms else None,
            sinks=optional("self_attn.sinks"),
        )

    def _norm(self, weight: torch.Tensor) -> torch.Tensor:
        """An RMSNorm's weight as the factor it multiplies by, in fp32 on the device: ``1 + w`` for Gemma."""
        weight = weight.to(self.device, torch.float32)
        return weight + self._norm_shift if self._norm_shift else weight

    def _head_norms(self, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> torch.Tensor | None:
        """Qwen3's and Gemma 3's q/k norm weights [hd] each, in the rotary pair order, one row per head; q's times
        the attention scale. None for models without them."""
        if q_norm is None or k_norm is None:
            return None
        rotary = self.family.rotary_dim
        q_norm, k_norm = _pair_rows(q_norm, 1, rotary), _pair_rows(k_norm, 1, rotary)  # [hd] each
        rows = [q_norm * self.family.attention_scale] * self.heads + [k_norm] * self.kv_heads
        return torch.stack(rows)  # [H + Hkv, hd]

    @property
    def weight_bytes(self) -> int:
        mlps = sum(layer.mlp.nbytes for layer in self.layers)
        return sum(linear.nbytes for linear in self._linears()) + mlps + self.embed.nbytes

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step of one row reads (each layer's one-row copy and its row's experts, the
        output layer); it sets the speed."""
        mlps = sum(layer.mlp.one_row_nbytes for layer in self.layers)
        return sum(linear.one_row_nbytes for linear in self._linears()) + mlps

    @property
    def routed_row_bytes(self) -> int:
        """Weight bytes one more row of a step may add to its reads: its own experts' in each mixture-of-experts
        layer (0 for a dense model, whose every row shares the step's one read of the weights)."""
        return sum(getattr(layer.mlp, "routed_row_nbytes", 0) for layer in self.layers)

    def _linears(self) -> list[Linear]:
        """The attention's matmuls and the output layer (the MLPs count their own)."""
        return [l for layer in self.layers for l in (layer.qkv, layer.out)] + [self.lm_head]


def _head_and_table_names(config: Any, state: Mapping[str, Weight]) -> tuple[str, str]:
    """The names in ``state`` of the output layer's weight and of the token table. Where the config ties them, one
    tensor for both: the table, as transformers ties the output layer to it (a checkpoint may hold a copy under
    ``lm_head``), else the output layer where the checkpoint holds that alone."""
    if getattr(config, "tie_word_embeddings", False):
        shared = TABLE if TABLE in state else HEAD
        if shared in state:
            return shared, shared
    elif HEAD in state and TABLE in state:
        return HEAD, TABLE
    raise ValueError("The checkpoint lacks its token embeddings or its output layer (lm_head).")


def _fp32(weight: Weight, device: torch.device) -> Weight:
    """A tensor in fp32 on ``device``; ``Int4Groups`` and ``Int4Pair`` stay in their groups, ``RowChunks`` (the CPU's)
    and ``Mxfp4Rows`` in their blocks, bytes (an MXFP4 checkpoint's blocks and scales) as they are."""
    if isinstance(weight, RowChunks) or (isinstance(weight, torch.Tensor) and weight.dtype == torch.uint8):
        return weight
    if isinstance(weight, (Int4Groups, Int4Pair, Int8Groups, Mxfp4Rows)):
        return weight.to(device)
    return weight.to(device, torch.float32)


def _scaled(weight: Weight, factor: float) -> Weight:
    return weight.scaled(factor) if isinstance(weight, GROUPED) else weight * factor


def _stacked(state: Mapping[str, Weight], names: list[str]) -> Int4Groups | Mxfp4Rows | None:
    """The tensors ``names``' rows one after another, decoded straight into one weight where the state can (a GGUF
    file's int4 groups or MXFP4 blocks, ``GGUFState.stacked``), so ``_cat_rows`` copies nothing; None elsewhere (or
    where a name is missing: a q/k/v bias)."""
    stacked = getattr(state, "stacked", None)
    if stacked is None or not all(name in state for name in names):
        return None
    return stacked(names)


def _cat_rows(parts: list[Weight]) -> Weight:
    """The parts' rows one after another: 4-bit or int8 groups if all are, else fp32 (a Q4_K_M file's 4-bit q and
    k beside its 6-bit v: each exact, and a 4-bit decode copy is quantized from the whole); MXFP4 blocks if all
    are."""
    for kind in (*GROUPED, Mxfp4Rows):
        if all(isinstance(part, kind) for part in parts):
            return kind.cat(parts)
    return torch.cat([part.dequantize() if isinstance(part, GROUPED) else part for part in parts])


def _split_rows(weight: Weight, sizes: list[int]) -> list[Weight]:
    """``weight``'s rows in consecutive parts of ``sizes`` rows (a fused q/k/v weight as q, k and v)."""
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    if isinstance(weight, GROUPED):
        return [weight.rows(torch.arange(start, end)) for start, end in zip(bounds, bounds[1:])]
    return list(weight.split(sizes))


def _pair_rows(rows: Weight, heads: int, rotary_dim: int) -> Weight:
    """Each head's first ``rotary_dim`` rows from Hugging Face's half-split rotary order to (even, odd) pairs: 0,
    r/2, 1, r/2 + 1, …; the rows past them (Phi-3's partial rotary), which do not turn, stay where they are.

    Queries and keys are reordered alike, so their dot products, and the attention, stay the same.
    """
    head_dim = rows.shape[0] // heads
    turning = torch.arange(rotary_dim).view(2, rotary_dim // 2).t().reshape(-1)  # [r]
    order = torch.cat([turning, torch.arange(rotary_dim, head_dim)])  # [hd]
    every_head = (torch.arange(heads).unsqueeze(1) * head_dim + order).flatten()  # [H * hd]
    return rows.rows(every_head) if isinstance(rows, GROUPED) else rows[every_head.to(rows.device)]
