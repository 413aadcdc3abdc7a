"""A GGUF file opened as it is, without a converted copy: its config, tokenizer and tensors (engine thread).

For the architectures the fast path covers (``DIRECT_ARCHITECTURES``) the Hugging Face
config is built from the file's metadata, the tokenizer by transformers from the metadata
alone (it reads no tensor), and ``GGUFState`` hands ``FastLlama`` the tensors under Hugging
Face's names, each read from the file and decoded when it is asked for
(``engine.forward.weights.gguf_blocks``): a load holds the packed weights and one layer's
tensors on their way there, never the whole file decoded. A tensor that is decoded into a form
of its own is mapped from the page cache (``tensor_reads.mapped_bytes``) for as long as its
decoding takes, not copied first: mapping pages is several times faster than copying them, and
once the mapping goes the file's pages no longer count in the process's resident memory beside
their packed form. A tensor whose bytes are kept (a quantized token table) is read into a buffer
of its own.

llama.cpp's converter reorders the query and key rows of llama-architecture models
(Llama, Mistral, Granite) for its rotary layout, rows 2i and 2i + 1 of each head a pair: the order
``FastLlama`` turns Hugging Face's into. So ``GGUFState`` hands them over as the file
keeps them and says so (``rotary_pairs``), where putting them back in Hugging Face's
order, as transformers does, and then into pairs again copied every query and key
weight twice. Other architectures (Qwen, Gemma, Phi-3) keep Hugging Face's order.

The converter also adds 1 to every Gemma norm weight (Gemma's RMSNorm multiplies by
``1 + w``): ``GGUFState`` says so too (``shifted_norms``). Tensor names differ by family:
Gemma's ``ffn_norm`` is the MLP's input norm after its ``post_attention_norm``, Phi-3's
``attn_qkv`` and ``ffn_up`` (2F rows, gate first) are fused as in its Hugging Face files.
gpt-oss's ``post_attention_norm`` is its MLP's input norm, its router ``ffn_gate_inp`` has a
bias, its experts' biases are 2-D tensors [E, rows] beside their 3-D weights, its experts'
MXFP4 blocks are handed over as they are (``weights.mxfp4``), and its config (YaRN, a window
on every other layer, the clamped SwiGLU) is as its Hugging Face config states it, since the
converter writes only the window and the rope scaling's factor and trained context.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.forward.llama_weights import Weight
from engine.forward.rotary_tables import LONG_FACTORS, ROPE_FACTORS, SHORT_FACTORS
from engine.forward.native import gguf_layout
from engine.forward.weights.gguf_blocks import (
    FOUR_BIT_TYPES, BlockTable, dense, int4_groups, requantized_groups, requantized_pair, stacked_groups,
)
from engine.forward.weights.gguf_codes import row_width
from engine.forward.weights.mxfp4 import Mxfp4Rows
from engine.forward.weights.int8_groups import Int8Groups
from engine.forward.weights.quant_int import INT4_PAIR, Int4Groups
from engine.forward.weights.row_chunks import RowChunks
from engine.host.allocator import return_freed_memory
from engine.models.gguf_check import (
    DIRECT_ARCHITECTURES, PLAIN_TYPES, GGUFContents, GGUFTensorInfo, window_fields,
)
from engine.models.tensor_reads import LazyTensors, mapped_bytes, read_exactly

PERMUTED_ARCHITECTURES = ("llama", "granite")  # llama.cpp's ``GraniteModel`` is its ``LlamaModel``'s
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")  # their norms hold 1 + w (``shifted_norms``)
GEMMA_ATTENTION_SCALE_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models' blocks: llama.cpp's sign of
# their attention scale, hidden / heads rather than the head size (the files do not state it)
GRANITE_MULTIPLIERS = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
                       "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}
GEMMA_LOCAL_ROPE_BASE = 10000.0
TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": ROPE_FACTORS,  # Llama 3.1's rope scaling, as a divisor per frequency
    "rope_factors_long.weight": LONG_FACTORS,  # Phi-3.5/4's LongRoPE
    "rope_factors_short.weight": SHORT_FACTORS,
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router [E, D]
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
GEMMA_LAYER_NAMES = LAYER_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
FAMILY_LAYER_NAMES = {
    "gemma2": GEMMA_LAYER_NAMES, "gemma3": GEMMA_LAYER_NAMES,
    "phi3": LAYER_NAMES | {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gpt-oss": LAYER_NAMES | {"post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router",
                              "attn_sinks": "self_attn.sinks"},
}
BARE_NAMES = ("self_attn.sinks",)  # Hugging Face's names without the GGUF tensor's ``.weight``
EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
"""A mixture's experts, one 3-D tensor [E, rows, width] each (and gpt-oss's biases, 2-D [E, rows]), which
``GGUFState`` hands over expert by expert under Hugging Face's names (``mlp.experts.N.gate_proj.weight``): each
expert's rows lie one after another in the file."""
ROUTER_NAMES = ("mlp.gate.weight", "mlp.shared_expert_gate.weight", "mlp.router.weight")
GPT_OSS_CONFIG = {"hidden_act": "silu", "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "beta_fast": 32.0,
                  "beta_slow": 1.0, "truncate": False}
"""openai/gpt-oss-20b's config.json, which the file omits. YaRN's ramp between its correction dimensions is not
rounded to whole dimensions (``truncate``), as transformers and openai's own code compute it; llama.cpp rounds them
outward, so its logits differ a little from both."""
NORMALISED_TOP_K = {"qwen2moe": False, "qwen3moe": True}  # llama.cpp's defaults, where a file does not say
TABLE_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
END_TOKEN_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
Progress = Callable[[int, int], None]


def hf_name(gguf_name: str, architecture: str) -> str | None:
    """The Hugging Face name of a GGUF tensor of ``architecture``: ``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``."""
    if gguf_name in TOP_LEVEL_NAMES:
        return TOP_LEVEL_NAMES[gguf_name]
    names = FAMILY_LAYER_NAMES.get(architecture, LAYER_NAMES)
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
        name = names[parts[2]]
        return f"model.layers.{parts[1]}.{name}" + ("" if name in BARE_NAMES else f".{parts[3]}")
    return None


def placed(info: GGUFTensorInfo, architecture: str) -> Iterator[tuple[str, GGUFTensorInfo]]:
    """The Hugging Face names and tensors ``info`` stands for: itself under ``hf_name``, or an expert tensor's
    experts, each a matrix of its own (``EXPERT_NAMES``); none for a tensor Hearth does not place."""
    parts = info.name.split(".")
    stacked_dims = 3 if parts[-1] == "weight" else 2  # weights [E, rows, width], biases [E, rows]
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in EXPERT_NAMES and len(info.dims) == stacked_dims:
        experts, each = info.dims[-1], info.n_bytes // info.dims[-1]
        for index in range(experts):
            yield (f"model.layers.{parts[1]}.mlp.experts.{index}.{EXPERT_NAMES[parts[2]]}.{parts[3]}",
                   replace(info, n_elements=info.n_elements // experts, n_bytes=each,
                           offset=info.offset + index * each, dims=info.dims[:-1]))
        return
    name = hf_name(info.name, architecture)
    if name is not None:
        yield name, info


def direct_reason(contents: GGUFContents) -> str | None:
    """Why this file cannot be opened directly (then transformers converts it), or None when it can."""
    architecture = contents.metadata.get("general.architecture")
    if architecture not in DIRECT_ARCHITECTURES:
        return f"architecture {architecture!r}"
    unknown = [t.name for t in contents.tensors if next(placed(t, architecture), None) is None]
    return f"tensors Hearth does not place ({', '.join(unknown[:3])})" if unknown else None


def hf_config(contents: GGUFContents) -> Any:
    """The Hugging Face config ``FastLlama`` needs, from the file's metadata.

    A plain ``PreTrainedConfig`` with the architecture's ``model_type``: the architecture's own config class
    imports transformers' modelling code on its way (a large part of a small model's load time and memory), and
    the fast path reads none of its other defaults (its activation, SiLU, is named here).
    """
    from transformers.configuration_utils import PreTrainedConfig

    meta, architecture = contents.metadata, contents.metadata["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{architecture}.{name}", default)

    heads, hidden = key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length") or hidden // heads
    names = {tensor.name for tensor in contents.tensors}
    config = PreTrainedConfig(
        num_hidden_layers=key("block_count"), hidden_size=hidden, intermediate_size=key("feed_forward_length"),
        num_attention_heads=heads, num_key_value_heads=key("attention.head_count_kv") or heads,
        head_dim=head_dim, hidden_act="silu",
        rms_norm_eps=key("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=key("context_length", 2048),
        vocab_size=contents.array_lengths.get("tokenizer.ggml.tokens") or key("vocab_size"),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        attention_bias=any(tensor.name.endswith("attn_q.bias") for tensor in contents.tensors),
        **window_fields(meta, architecture, key("block_count")), **_experts(architecture, key),
    )
    config.model_type = DIRECT_ARCHITECTURES[architecture]
    # set after construction, which checks LongRoPE's factors: ``GGUFState`` hands them over as tensors
    config.rope_parameters = _rope_parameters(key, head_dim, "rope_factors_long.weight" in names)
    if architecture in GEMMA_ARCHITECTURES:
        _gemma_config(config, architecture, key)
    if architecture == "granite":
        _granite_config(config, key)
    if architecture == "gpt-oss":
        _gpt_oss_config(config)
    return config


def _granite_config(config: Any, key: Callable[..., Any]) -> None:
    """Granite's multipliers under transformers' names, from the keys llama.cpp's converter writes (each only
    where the model has it)."""
    for name, gguf_key in GRANITE_MULTIPLIERS.items():
        if key(gguf_key) is not None:
            setattr(config, name, float(key(gguf_key)))


def _experts(architecture: str, key: Callable[..., Any]) -> dict[str, Any]:
    """A mixture of experts' config fields (none for a dense model). Which layers are mixtures the file's tensors
    say (a router, ``ffn_gate_inp``), so the config names no sparse step."""
    if key("expert_count") is None:
        return {}
    return {
        "num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "shared_expert_intermediate_size": key("expert_shared_feed_forward_length", 0),
        "norm_topk_prob": bool(key("expert_weights_norm", NORMALISED_TOP_K.get(architecture, False))),
    }


def _rope_parameters(key: Callable[..., Any], head_dim: int, long_rope: bool) -> dict[str, Any]:
    """The rope parameters of the metadata; ``long_rope``: the file holds LongRoPE's factors (Phi-3.5/4), whose
    rotary part of each head is ``rope.dimension_count``."""
    theta = float(key("rope.freq_base", 10000.0))
    rotary = {"partial_rotary_factor": key("rope.dimension_count") / head_dim} if key("rope.dimension_count") else {}
    if long_rope:
        return {"rope_type": "longrope", "rope_theta": theta, **rotary,
                "original_max_position_embeddings": key("rope.scaling.original_context_length"),
                "attention_factor": key("rope.scaling.attn_factor")}
    scaling = key("rope.scaling.type")
    if scaling in (None, "none"):
        return {"rope_type": "default", "rope_theta": theta, **rotary}
    trained = key("rope.scaling.original_context_length")
    return {"rope_type": scaling, "rope_theta": theta, "factor": float(key("rope.scaling.factor", 1.0)), **rotary,
            **({"original_max_position_embeddings": trained} if trained else {})}


def _gemma_config(config: Any, architecture: str, key: Callable[..., Any]) -> None:
    """Gemma's traits on ``config``, from the metadata where it states them and else as llama.cpp sets them: its
    activation, attention scale, soft caps and (Gemma 3) the sliding layers' rope base."""
    config.hidden_act = config.hidden_activation = "gelu_pytorch_tanh"
    scale = key("attention.scale")
    if scale:
        config.query_pre_attn_scalar = scale**-2
    elif config.num_hidden_layers == GEMMA_ATTENTION_SCALE_LAYERS[architecture]:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
    else:
        config.query_pre_attn_scalar = config.head_dim
    config.attn_logit_softcapping = key("attn_logit_softcapping")
    config.final_logit_softcapping = key("final_logit_softcapping")
    if architecture == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(key("rope.freq_base_swa", GEMMA_LOCAL_ROPE_BASE))}
        config.rope_parameters = {"full_attention": config.rope_parameters, "sliding_attention": local}


def _gpt_oss_config(config: Any) -> None:
    """gpt-oss's traits on ``config`` (``GPT_OSS_CONFIG``): the clamped SwiGLU's constants and YaRN's bounds."""
    config.hidden_act = GPT_OSS_CONFIG["hidden_act"]
    config.swiglu_alpha, config.swiglu_limit = GPT_OSS_CONFIG["swiglu_alpha"], GPT_OSS_CONFIG["swiglu_limit"]
    config.num_local_experts = config.num_experts
    if config.rope_parameters.get("rope_type") == "yarn":
        config.rope_parameters.update({name: GPT_OSS_CONFIG[name] for name in ("beta_fast", "beta_slow", "truncate")})


def _kept_mxfp4(info: GGUFTensorInfo) -> bool:
    """Whether the tensor is a matrix of MXFP4 blocks, which ``GGUFState`` hands over as they are."""
    return info.quant_type == GGMLQuantizationType.MXFP4 and len(info.dims) == 2


def end_token_ids(contents: GGUFContents) -> frozenset[int]:
    """The ids that end a reply: end of sequence, of turn, of message (whichever the file names)."""
    return frozenset(contents.metadata[k] for k in END_TOKEN_KEYS if isinstance(contents.metadata.get(k), int))


def load_tokenizer(path: Path) -> Any:
    """transformers' tokenizer from the file's metadata (the vocabulary, merges and special tokens).

    The fast tokenizer class is named directly: ``AutoTokenizer`` would first build the whole
    config through ``gguf.GGUFReader``, which takes seconds for a 50 k-token vocabulary.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)


class GGUFState(LazyTensors):
    """The file's tensors under Hugging Face's names, each decoded when asked for.

    ``groups``: 4-bit layer weights come as ``Int4Groups`` (exact, for a format that packs
    4-bit groups), with ``cpu_layout`` already in the CPU kernel's layout. ``all_groups``:
    every matrix does, whatever its type (4-bit alone, with a 4-bit head:
    ``format_plan``), other types quantized a few thousand rows at a time; with
    ``table_format`` ``INT4_PAIR`` the token table and output layer come as an ``Int4Pair`` instead (two
    planes, about 8 bits), with ``"int8"`` a quantized type's as ``RowChunks`` (decoded a chunk of rows at a time
    where the int8 kernel packs them): the CPU's head beside quantized layers. ``int8_groups``: Q8_0 layer weights
    come as ``Int8Groups``, their blocks as they are, for the CPU's int8 kernel. Every other tensor comes as
    fp32. ``report`` counts tensors decoded. ``rotary_pairs``: the query and key rows come in
    rotary pair order (the module docstring), not Hugging Face's.
    """

    def __init__(self, path: Path, contents: GGUFContents, groups: bool, report: Progress,
                 all_groups: bool = False, table_format: str | None = None, cpu_layout: bool = False,
                 int8_groups: bool = False) -> None:
        self._path, self._start = path, contents.data_start
        architecture = contents.metadata["general.architecture"]
        self._tensors = dict(pair for tensor in contents.tensors for pair in placed(tensor, architecture))
        self.rotary_pairs = architecture in PERMUTED_ARCHITECTURES
        self.shifted_norms = architecture in GEMMA_ARCHITECTURES
        self._groups, self._all_groups, self._report, self._done = groups, all_groups, report, set()
        self._table_format, self._cpu_layout, self._int8_groups = table_format, cpu_layout, int8_groups

    def __getitem__(self, name: str) -> Weight:
        info = self._tensors[name]
        return_freed_memory()  # the previous tensor's temporaries, before this one's
        if _kept_mxfp4(info):  # gpt-oss's experts, kept as they are (``weights.mxfp4``)
            weight = self._mxfp4_rows([info])
        elif self._in_row_chunks(name, info):
            weight = self._row_chunks(info)
        else:
            weight = self._decoded(name, info, self._blocks(info))
        self._counted(name)
        return weight

    def stacked(self, names: Sequence[str]) -> Int4Groups | Mxfp4Rows | None:
        """The matrices ``names``' rows one after another (a layer's q, k and v, or gate and up) as one
        ``Int4Groups``, each decoded straight into its rows (``stacked_groups``), or MXFP4 blocks read straight into
        their rows of one ``Mxfp4Rows``: no concatenating copy. None where any of them would not come so
        (``__getitem__``) or its type is not read in C; then each is asked for alone."""
        infos = [self._tensors[name] for name in names]
        one_width = len({info.dims[0] for info in infos}) == 1
        if one_width and all(_kept_mxfp4(info) for info in infos):
            stacked = self._mxfp4_rows(infos)
        elif one_width and all(self._stacks(name, info) for name, info in zip(names, infos)):
            stacked = stacked_groups([(info.quant_type, info.dims[1], info.dims[0]) for info in infos],
                                     lambda index: self._blocks(infos[index]), self._cpu_layout)
        else:
            return None
        for name in names:
            self._counted(name)
        return stacked

    def _mxfp4_rows(self, infos: Sequence[GGUFTensorInfo]) -> Mxfp4Rows:
        """MXFP4 tensors' blocks read one after another into one buffer of their own, [rows, bytes per row]."""
        blocks = np.empty(sum(info.n_bytes for info in infos), dtype=np.uint8)
        start = 0
        for info in infos:
            read_exactly(self._path, memoryview(blocks[start : start + info.n_bytes]), self._start + info.offset)
            start += info.n_bytes
        return Mxfp4Rows(torch.from_numpy(blocks.reshape(sum(info.dims[1] for info in infos), -1)), handed_over=True)

    def _stacks(self, name: str, info: GGUFTensorInfo) -> bool:
        """Whether ``__getitem__`` would hand ``name`` as ``Int4Groups`` that C decodes (``stacked``)."""
        wanted = self._all_groups or (self._groups and info.quant_type in FOUR_BIT_TYPES)
        return (len(info.dims) == 2 and name not in TABLE_NAMES and wanted and info.quant_type in gguf_layout.TYPES
                and gguf_layout.available())

    def kept_rows(self, name: str, dtype: torch.dtype) -> BlockTable | None:
        """The token table ``name`` as its blocks (``BlockTable``, read into a buffer of its own, which it keeps),
        for a quantized type; None for F16, BF16 and F32, which ``FastLlama`` keeps in a dtype of its own."""
        info = self._tensors[name]
        if info.quant_type in PLAIN_TYPES:
            return None
        table = BlockTable(self._blocks(info, own_buffer=True), info.quant_type, dtype)
        self._counted(name)
        return table

    def _counted(self, name: str) -> None:
        self._done.add(name)
        self._report(len(self._done), len(self._tensors))

    def _in_row_chunks(self, name: str, info: GGUFTensorInfo) -> bool:
        """Whether ``name`` comes as ``RowChunks`` (the CPU's int8 output layer, or its tied table)."""
        return self._table_format == "int8" and name in TABLE_NAMES and info.quant_type not in PLAIN_TYPES

    def _row_chunks(self, info: GGUFTensorInfo) -> RowChunks:
        """The tensor's rows decoded where they are packed, from blocks in a buffer of their own: the next read
        does not overwrite them first."""
        blocks = self._blocks(info, own_buffer=True)
        return RowChunks(blocks.shape[0], row_width(blocks, info.quant_type),
                         lambda start, end: dense(blocks[start:end], info.quant_type))

    def _decoded(self, name: str, info: GGUFTensorInfo, blocks: np.ndarray) -> Weight:
        if name.endswith(ROUTER_NAMES):  # a mixture's routing stays in fp32, whatever the layers' format
            return dense(blocks, info.quant_type).reshape(info.shape)
        if len(info.dims) == 2 and self._all_groups:
            if name in TABLE_NAMES and self._table_format == INT4_PAIR:
                return requantized_pair(blocks, info.quant_type, self._cpu_layout)
            return requantized_groups(blocks, info.quant_type, self._cpu_layout)
        if len(info.dims) == 2 and self._groups and info.quant_type in FOUR_BIT_TYPES and name not in TABLE_NAMES:
            return int4_groups(blocks, info.quant_type, self._cpu_layout)
        if len(info.dims) == 2 and self._int8_groups and info.quant_type == GGMLQuantizationType.Q8_0 \
                and name not in TABLE_NAMES:
            return Int8Groups.from_q8_0(blocks)
        return dense(blocks, info.quant_type).reshape(info.shape)

    def _blocks(self, info: GGUFTensorInfo, own_buffer: bool = False) -> np.ndarray:
        """The tensor's bytes, one row of the weight per row: [rows, bytes per row] uint8; mapped from the file
        (``mapped_bytes``: read-only, for a decoder that copies what it returns), or with ``own_buffer`` read into a
        buffer of their own, for a caller that keeps them."""
        if own_buffer:
            return read_blocks(self._path, self._start, info)
        return _rows(mapped_bytes(self._path, self._start + info.offset, info.n_bytes), info)


def read_blocks(path: Path, data_start: int, info: GGUFTensorInfo) -> np.ndarray:
    """``info``'s bytes from ``path`` (whose tensor data begins at ``data_start``), one row of the weight per row:
    [rows, bytes per row] uint8, read into a buffer of their own."""
    raw = np.empty(info.n_bytes, dtype=np.uint8)
    read_exactly(path, memoryview(raw), data_start + info.offset)
    return _rows(raw, info)


def _rows(raw: np.ndarray, info: GGUFTensorInfo) -> np.ndarray:
    """A tensor's bytes [n_bytes] as one row of the weight per row: [rows, bytes per row]."""
    block_size, type_size = GGML_QUANT_SIZES[info.quant_type]
    return raw.reshape(-1, info.dims[0] // block_size * type_size)
