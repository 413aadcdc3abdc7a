"""Tiny random Qwen2-MoE and Qwen3-MoE models, and their GGUF files as llama.cpp's converter writes them (tests).

The configs are the real models' own kinds (Qwen/Qwen1.5-MoE-A2.7B: a shared expert with a sigmoid gate, no
renormalised top-k; Qwen/Qwen3-30B-A3B: q/k norms, renormalised top-k), at a few small layers of 8 experts, two
active, one layer a dense MLP (``mlp_only_layers``, ``decoder_sparse_step``). ``write_moe_gguf`` writes a model's
weights under llama.cpp's names (``convert_hf_to_gguf``'s ``Qwen2MoeModel``): each layer's experts stacked into
3-D tensors ``ffn_{gate,up,down}_exps`` [E, rows, width], the router ``ffn_gate_inp`` in F32, the shared expert's
``ffn_*_shexp`` and its gate ``ffn_gate_inp_shexp``; matrices in F32 or quantized by gguf-py, the model's own
weights then replaced by what the blocks stand for (the dequantized reference).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from tests.engine.models.random_gguf import END_OF_TURN, byte_tokens

VOCAB = 258  # the byte-level tokens, "Ġt" and the end of turn (``random_gguf``)
ARCHITECTURES = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
UNQUANTIZED = ("ffn_gate_inp", "ffn_gate_inp_shexp", "token_embd", "output")  # llama-quantize keeps routers apart


def tiny_moe(model_type: str, seed: int = 0, layers: int = 3) -> Any:
    """A random ``model_type`` ("qwen2_moe" or "qwen3_moe") model in fp32, eval mode; norm weights and q/k/v biases
    random too, so that a repacking that drops them shows."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                  num_experts_per_tok=2, initializer_range=0.2, tie_word_embeddings=False, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    if model_type == "qwen3_moe":
        config = Qwen3MoeConfig(**common, head_dim=16, norm_topk_prob=True, mlp_only_layers=[1])
        model = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen2MoeConfig(**common, shared_expert_intermediate_size=64, norm_topk_prob=False,
                                decoder_sparse_step=2, use_sliding_window=False)
        model = Qwen2MoeForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif name.endswith("proj.bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


def write_moe_gguf(path: Path, model: Any, quant_type: Q = Q.F32) -> Path:
    """``model``'s weights as a GGUF file (see the module docstring), its matrices in ``quant_type`` (F32, or a type
    gguf-py quantizes: Q4_0, Q4_1, Q8_0); ``model``'s own weights become what the file's blocks stand for."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), ARCHITECTURES[config.model_type])
    _metadata(writer, config)
    state = model.state_dict()

    def add(name: str, tensor: torch.Tensor, source: str, part: slice | None = None) -> None:
        data = tensor.detach().float().numpy()
        if quant_type == Q.F32 or data.ndim == 1 or name.split(".")[-2] in UNQUANTIZED:
            writer.add_tensor(name, np.ascontiguousarray(data))
            return
        blocks = quantize(data, quant_type)
        writer.add_tensor(name, blocks, raw_dtype=quant_type)
        with torch.no_grad():  # the reference holds what the blocks stand for
            target = state[source] if part is None else state[source][:, part]
            target.copy_(torch.from_numpy(dequantize(blocks, quant_type)).reshape(target.shape))

    add("token_embd.weight", state["model.embed_tokens.weight"], "model.embed_tokens.weight")
    add("output_norm.weight", state["model.norm.weight"], "model.norm.weight")
    add("output.weight", state["lm_head.weight"], "lm_head.weight")
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}."
        for name in [n for n in state if n.startswith(prefix)]:
            local, kind = name[len(prefix):].rsplit(".", 1) if "experts" not in name else (name[len(prefix):], "")
            if local == "mlp.experts.gate_up_proj":
                width = state[name].shape[1] // 2
                add(f"blk.{index}.ffn_gate_exps.weight", state[name][:, :width], name, slice(0, width))
                add(f"blk.{index}.ffn_up_exps.weight", state[name][:, width:], name, slice(width, 2 * width))
            elif local == "mlp.experts.down_proj":
                add(f"blk.{index}.ffn_down_exps.weight", state[name], name)
            else:
                add(f"blk.{index}.{NAMES[local]}.{kind}", state[name], name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    tokens = byte_tokens() + ["Ġt", END_OF_TURN]
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(512)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if getattr(config, "shared_expert_intermediate_size", None):
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])
    writer.add_token_merges(["Ġ t"])
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_bos_token_id(len(tokens) - 1)
