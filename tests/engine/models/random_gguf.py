"""Small GGUF files of random weights, written the way llama.cpp writes them (for tests).

Blocks come from the benchmarks' writer (``engine.bench.random_blocks``: random codes, scales for a
sane weight spread); the query and key rows of a llama file are in llama.cpp's rotary order, as its converter
leaves them. The tokenizer is byte-level BPE over the 256 byte symbols and one end-of-turn token.
``write_converted_gguf`` writes a transformers model's own weights (Gemma 2/3, Phi-3) as llama.cpp's converter
does, in F32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from engine.bench.random_blocks import random_blocks
from engine.bench.random_gguf import WEIGHT_STD

END_OF_TURN = "<|end|>"


@dataclass(frozen=True)
class Shape:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 512
    extra_vocab: int = 0  # token ids past the byte-level ones (a real-sized table)
    context: int = 512  # the trained context the file states

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_random_gguf(path: Path, architecture: str = "llama", layer_type: Q = Q.Q4_K, shape: Shape = Shape(),
                      six_bit_down: bool = True, seed: int = 0, untied: bool = False,
                      rope_factors: np.ndarray | None = None, file_type: gguf.LlamaFileType | None = None) -> Path:
    """A random model of ``architecture`` (llama, qwen2, qwen3) with its layers in ``layer_type``.

    ``six_bit_down``: the MLP's down matrices in Q6_K, and the first layer's v, as a Q4_K_M file keeps some (its
    q/k/v then mix two types). ``untied``: an output
    layer of its own, in Q6_K (as a Q4_K_M file has it), the token table then in ``layer_type``.
    ``rope_factors``: a ``rope_freqs.weight`` tensor, as llama.cpp writes Llama 3.1's rope scaling. ``file_type``:
    the file type the metadata states (none unless given).
    """
    rng = np.random.default_rng(seed)
    tokens = byte_tokens() + [f"<extra{i}>" for i in range(shape.extra_vocab)] + ["Ġt", END_OF_TURN]
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_metadata(writer, shape, tokens)
    if file_type is not None:
        writer.add_file_type(file_type)

    def matrix(name: str, rows: int, width: int, quant_type: Q = layer_type) -> None:
        writer.add_tensor(name, random_blocks(quant_type, rows, width, WEIGHT_STD, rng), raw_dtype=quant_type)

    def vector(name: str, size: int, around: float = 1.0) -> None:
        writer.add_tensor(name, (around + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), shape.hidden, layer_type if untied else Q.Q8_0)
    if untied:
        matrix("output.weight", len(tokens), shape.hidden, Q.Q6_K)
    vector("output_norm.weight", shape.hidden)
    if rope_factors is not None:
        writer.add_tensor("rope_freqs.weight", rope_factors.astype(np.float32))
    for i in range(shape.layers):
        _write_layer(f"blk.{i}.", architecture, shape, matrix, vector, six_bit_down, six_bit_v=six_bit_down and i == 0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_metadata(writer: gguf.GGUFWriter, shape: Shape, tokens: list[str]) -> None:
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    _write_tokenizer(writer, tokens)


def _write_tokenizer(writer: gguf.GGUFWriter, tokens: list[str]) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # the last one a control token
    writer.add_token_merges(["Ġ t"])
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_bos_token_id(len(tokens) - 1)


def write_hollow_gguf(path: Path, shape: Shape, layer_type: Q = Q.Q4_K) -> Path:
    """A file of ``shape`` whose tensor data is a hole (a sparse file: its headers in a few hundred kilobytes,
    whatever its size), for what reads only headers (inspection, estimates); never load it. The layers in
    ``layer_type``, the MLP's down matrices and an untied output layer in Q6_K, as a Q4_K_M file has them."""
    tokens = byte_tokens() + [f"<extra{i}>" for i in range(shape.extra_vocab)] + ["Ġt", END_OF_TURN]
    writer = gguf.GGUFWriter(str(path), "llama")
    _write_metadata(writer, shape, tokens)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    data_bytes = 0

    def matrix(name: str, rows: int, width: int, quant_type: Q = layer_type) -> None:
        nonlocal data_bytes
        block, block_bytes = gguf.GGML_QUANT_SIZES[quant_type]
        row_bytes = width // block * block_bytes
        writer.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes, raw_dtype=quant_type)
        data_bytes += -(-rows * row_bytes // writer.data_alignment) * writer.data_alignment

    def vector(name: str, size: int, around: float = 1.0) -> None:
        nonlocal data_bytes
        writer.add_tensor_info(name, (size,), np.dtype(np.float32), size * 4)
        data_bytes += -(-size * 4 // writer.data_alignment) * writer.data_alignment

    matrix("token_embd.weight", len(tokens), shape.hidden)
    matrix("output.weight", len(tokens), shape.hidden, Q.Q6_K)
    vector("output_norm.weight", shape.hidden)
    for i in range(shape.layers):
        _write_layer(f"blk.{i}.", "llama", shape, matrix, vector, six_bit_down=True, six_bit_v=False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    headers = path.stat().st_size
    start = -(-headers // writer.data_alignment) * writer.data_alignment
    with path.open("r+b") as file:
        file.truncate(start + data_bytes)
    return path


def _write_layer(prefix: str, architecture: str, shape: Shape, matrix, vector, six_bit_down: bool,
                 six_bit_v: bool) -> None:
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    vector(prefix + "attn_norm.weight", shape.hidden)
    vector(prefix + "ffn_norm.weight", shape.hidden)
    matrix(prefix + "attn_q.weight", q_rows, shape.hidden)
    matrix(prefix + "attn_k.weight", kv_rows, shape.hidden)
    matrix(prefix + "attn_v.weight", kv_rows, shape.hidden, *([Q.Q6_K] if six_bit_v else []))
    matrix(prefix + "attn_output.weight", shape.hidden, q_rows)
    matrix(prefix + "ffn_gate.weight", shape.ffn, shape.hidden)
    matrix(prefix + "ffn_up.weight", shape.ffn, shape.hidden)
    matrix(prefix + "ffn_down.weight", shape.hidden, shape.ffn, Q.Q6_K if six_bit_down else Q.Q4_K)
    if architecture == "qwen2":
        for name, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)):
            vector(f"{prefix}{name}.bias", rows, around=0.0)
    if architecture == "qwen3":
        vector(prefix + "attn_q_norm.weight", shape.head_dim)
        vector(prefix + "attn_k_norm.weight", shape.head_dim)


CONVERTED_ARCHITECTURES = {"Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3",
                           "GraniteForCausalLM": "granite"}
GRANITE_KEYS = {"embedding_multiplier": gguf.Keys.LLM.EMBEDDING_SCALE, "residual_multiplier": gguf.Keys.LLM.RESIDUAL_SCALE,
                "attention_multiplier": gguf.Keys.Attention.SCALE, "logits_scaling": gguf.Keys.LLM.LOGIT_SCALE}


def write_converted_gguf(path: Path, model) -> Path:
    """``model`` (a transformers ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``Phi3ForCausalLM`` or
    ``GraniteForCausalLM`` whose vocabulary is this module's byte-level one) as llama.cpp's converter
    (``Gemma2Model``, ``Gemma3Model``, ``Phi3MiniModel``, ``GraniteModel``) writes it, every tensor in F32: gguf-py's
    tensor names (Phi-3's fused ``attn_qkv`` and ``ffn_up``), Gemma's norm weights plus one, Granite's query and key
    rows paired for llama.cpp's rotary as ``LlamaModel`` permutes them, no tied output layer, the metadata keys the
    converter sets (llama.cpp assumes Gemma's sliding pattern and local rope base), Phi-3's LongRoPE factors as
    tensors."""
    config, architecture = model.config, CONVERTED_ARCHITECTURES[type(model).__name__]
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_converted_metadata(writer, config, architecture)
    _write_tokenizer(writer, byte_tokens() + ["Ġt", END_OF_TURN])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[architecture.upper()], config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if architecture.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1  # Gemma's RMSNorm multiplies by (1 + w)
        if architecture == "granite" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if name.endswith("q_proj.weight") else config.num_key_value_heads
            tensor = _paired_rotary_rows(tensor, heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.float().numpy())
    rope = config.rope_parameters
    if rope.get("rope_type") == "longrope":
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_converted_metadata(writer: gguf.GGUFWriter, config, architecture: str) -> None:
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if architecture.startswith("gemma"):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
        if config.attn_logit_softcapping is not None:
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        if config.final_logit_softcapping is not None:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if architecture == "gemma3":
        full = config.rope_parameters["full_attention"]
        writer.add_rope_freq_base(full["rope_theta"])
        if full.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full["factor"])
    if architecture == "phi3":
        _write_phi3_rope(writer, config)
    if architecture == "granite":
        writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
        for name, key in GRANITE_KEYS.items():
            writer.add_float32(key.format(arch=architecture), getattr(config, name))


def _paired_rotary_rows(weight, heads: int):
    """A query or key weight [heads * hd, D] with each head's rows in llama.cpp's rotary order (rows i and
    hd/2 + i become rows 2i and 2i + 1), as ``LlamaModel.permute`` writes them."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _write_phi3_rope(writer: gguf.GGUFWriter, config) -> None:
    """``Phi3MiniModel``'s rope keys: the rotary part of a head, the trained context and LongRoPE's attention
    factor."""
    import math

    rope, head_dim = config.rope_parameters, config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_sliding_window(config.sliding_window or 0)
    original = rope.get("original_max_position_embeddings", config.max_position_embeddings)
    writer.add_rope_scaling_orig_ctx_len(original)
    if rope.get("rope_type") == "longrope":
        scale = config.max_position_embeddings / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
