"""A tiny random gpt-oss model, and its GGUF file as llama.cpp's converter writes it (tests).

``tiny_gpt_oss``: openai/gpt-oss-20b's config (attention sinks, q/k/v/o biases, a sliding window of 128 on every
other layer, YaRN rope scaling, a router with a bias, experts with biases and the clamped SwiGLU) at a few small
layers of 8 experts, 2 active. ``write_gpt_oss_gguf`` writes its weights under llama.cpp's names
(``convert_hf_to_gguf``'s ``GptOssModel``): each layer's experts as 3-D tensors ``ffn_{gate,up,down}_exps`` [E, rows,
width] in MXFP4 (gguf-py's quantizer) and their biases as 2-D ones, the router ``ffn_gate_inp``, the sinks
``attn_sinks``, the MLP's input norm ``post_attention_norm``, the rest in F32 (or the attention's matrices in Q8_0,
as ggml-org's files hold them); the model's own weights become what the blocks stand for, so transformers' forward
is the reference for the file.
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
NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp",
}


def tiny_gpt_oss(seed: int = 0, layers: int = 4, window: int = 128, vocab: int = VOCAB) -> Any:
    """A random gpt-oss model in fp32, eval mode (see the module docstring); norm weights, biases and sinks random
    too, so that a reader that drops one shows. ``vocab``: the GGUF files' byte-level tokens, or another
    tokenizer's."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=window,
        max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=False, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 128},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif name.endswith("bias") or name.endswith("sinks"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "experts" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()


def write_gpt_oss_gguf(path: Path, model: Any, expert_type: Q = Q.MXFP4, attention_type: Q = Q.F32) -> Path:
    """``model``'s weights as a GGUF file (see the module docstring), its experts in ``expert_type`` (MXFP4, or
    F32), its attention's matrices in ``attention_type`` (F32 or Q8_0); ``model``'s own weights become what the
    file's blocks stand for."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    _metadata(writer, config)
    state = model.state_dict()

    def add(name: str, tensor: torch.Tensor) -> None:
        writer.add_tensor(name, np.ascontiguousarray(tensor.detach().float().numpy()))

    def add_attention(name: str, weight: torch.Tensor) -> None:
        """``weight`` [rows, width] in ``attention_type``; ``model``'s own becomes what the file holds."""
        if attention_type == Q.F32:
            add(name, weight)
            return
        blocks = quantize(np.ascontiguousarray(weight.detach().float().numpy()), attention_type)
        writer.add_tensor(name, blocks, raw_dtype=attention_type)
        with torch.no_grad():
            weight.copy_(torch.from_numpy(dequantize(blocks, attention_type)).reshape(weight.shape))

    def add_experts(name: str, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` [E, rows, width] in ``expert_type``; returns what the file holds, [E, rows, width]."""
        data = np.ascontiguousarray(weight.detach().float().numpy())
        if expert_type == Q.F32:
            writer.add_tensor(name, data)
            return weight
        blocks = quantize(data, expert_type)
        writer.add_tensor(name, blocks, raw_dtype=expert_type)
        return torch.from_numpy(dequantize(blocks, expert_type)).reshape(weight.shape)

    add("token_embd.weight", state["model.embed_tokens.weight"])
    add("output_norm.weight", state["model.norm.weight"])
    add("output.weight", state["lm_head.weight"])
    for index in range(config.num_hidden_layers):
        prefix, blk = f"model.layers.{index}.", f"blk.{index}."
        for local, short in NAMES.items():
            for kind in ("weight", "bias"):
                if prefix + f"{local}.{kind}" in state:
                    matrix = local.startswith("self_attn.") and kind == "weight"
                    (add_attention if matrix else add)(f"{blk}{short}.{kind}", state[prefix + f"{local}.{kind}"])
        add(blk + "attn_sinks.weight", state[prefix + "self_attn.sinks"])
        experts = prefix + "mlp.experts."
        gate_up = state[experts + "gate_up_proj"].transpose(1, 2)  # [E, 2F, D], gate and up rows interleaved
        gate = add_experts(blk + "ffn_gate_exps.weight", gate_up[:, 0::2])
        up = add_experts(blk + "ffn_up_exps.weight", gate_up[:, 1::2])
        down = add_experts(blk + "ffn_down_exps.weight", state[experts + "down_proj"].transpose(1, 2))
        gate_up_bias = state[experts + "gate_up_proj_bias"]  # [E, 2F]
        add(blk + "ffn_gate_exps.bias", gate_up_bias[:, 0::2])
        add(blk + "ffn_up_exps.bias", gate_up_bias[:, 1::2])
        add(blk + "ffn_down_exps.bias", state[experts + "down_proj_bias"])
        with torch.no_grad():  # the reference holds what the blocks stand for
            state[experts + "gate_up_proj"][:, :, 0::2] = gate.transpose(1, 2)
            state[experts + "gate_up_proj"][:, :, 1::2] = up.transpose(1, 2)
            state[experts + "down_proj"].copy_(down.transpose(1, 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    """The keys llama.cpp's converter writes for gpt-oss (``TextModel.set_gguf_parameters`` and its own)."""
    tokens = byte_tokens() + ["Ġt", END_OF_TURN]
    rope = config.rope_parameters
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_expert_count(config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_sliding_window(config.sliding_window)
    writer.add_expert_feed_forward_length(config.intermediate_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])
    writer.add_token_merges(["Ġ t"])
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_bos_token_id(len(tokens) - 1)


def save_mxfp4_folder(path: Path, model: Any) -> Path:
    """``model`` saved as openai/gpt-oss-20b's folder keeps it: each layer's experts as MXFP4
    ``mlp.experts.{gate_up,down}_proj_blocks`` [E, rows, width / 32, 16] (byte j of a block: weight 2j in its low
    nibble, 2j + 1 in its high one) and ``_scales`` [E, rows, width / 32] (e8m0, bias 127), rows the matmul's
    outputs (gate_up's gate and up rows interleaved), ``quantization_config`` naming ``mxfp4``; the rest as
    transformers saves it. ``model``'s own expert weights become what the blocks stand for."""
    from safetensors.torch import save_file

    state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    for name in [name for name in state if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        weight = state.pop(name).transpose(1, 2)  # [E, rows, width]: rows the outputs
        blocks = quantize(np.ascontiguousarray(weight.float().numpy()), Q.MXFP4)  # ggml's layout, [E, rows, W/32*17]
        exact = torch.from_numpy(dequantize(blocks, Q.MXFP4)).reshape(weight.shape)
        with torch.no_grad():
            model.state_dict()[name].copy_(exact.transpose(1, 2))
        grouped = torch.from_numpy(blocks).view(*weight.shape[:2], -1, 17)  # [E, rows, W/32, 17]
        codes = torch.cat([grouped[..., 1:] & 0x0F, grouped[..., 1:] >> 4], dim=-1)  # [E, rows, W/32, 32]: in order
        state[name + "_blocks"] = (codes[..., 0::2] | codes[..., 1::2] << 4).contiguous()  # [E, rows, W/32, 16]
        state[name + "_scales"] = grouped[..., 0].contiguous()  # [E, rows, W/32]
    model.config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    model.config.save_pretrained(path)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    del model.config.quantization_config
    return path
