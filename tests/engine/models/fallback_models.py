"""Random models of architectures the fast path does not run (StableLM, Starcoder2), for the quantized fallback's
tests: a safetensors folder as transformers saves it, and a GGUF file as llama.cpp's converter lays it out.

The GGUF file names its tensors by gguf-py's map, keeps vectors (norms, biases) in F32 and quantizes every matrix
with gguf-py's own quantizer (``layer_type``; the token table in Q8_0), so transformers' GGUF loader reads it
back as fp32 of exactly the file's blocks: the reference the fallback's logits are compared with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import torch
from gguf.constants import GGMLQuantizationType as Q

from engine.models.random_models import byte_tokenizer
from tests.engine.models.random_gguf import END_OF_TURN, _write_tokenizer, byte_tokens

GGUF_VOCAB = len(byte_tokens()) + 2  # byte-level tokens, one merge, an end of turn (``random_gguf``)
FOLDER_VOCAB = len(byte_tokenizer())


def tiny_config(architecture: str, vocab: int, hidden: int = 256, layers: int = 2, ffn: int = 512) -> Any:
    """A small config of ``architecture`` ("stablelm", its own output layer, or "starcoder2", its output layer tied to
    the token table), with widths the int4 groups take."""
    from transformers import StableLmConfig, Starcoder2Config

    shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    if architecture == "stablelm":
        return StableLmConfig(**shape, bos_token_id=0, eos_token_id=2)
    return Starcoder2Config(**shape, bos_token_id=0, eos_token_id=2, tie_word_embeddings=True)


def random_model(config: Any, seed: int = 0) -> Any:
    """transformers' model of ``config`` in fp32, its weights spread like a trained model's (std 0.05)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.dim() == 2:
                tensor.normal_(0.0, 0.05)
    return model


def write_folder(folder: Path, model: Any) -> Path:
    """``model`` saved as a safetensors folder with the byte-level tokenizer (its vocabulary is ``FOLDER_VOCAB``)."""
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def write_gguf(path: Path, model: Any, architecture: str, layer_type: Q = Q.Q4_0) -> Path:
    """``model`` (vocabulary ``GGUF_VOCAB``) as llama.cpp's converter lays it out, its matrices in ``layer_type``."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in (("context_length", config.max_position_embeddings), ("embedding_length", config.hidden_size),
                       ("block_count", config.num_hidden_layers), ("feed_forward_length", config.intermediate_size),
                       ("attention.head_count", config.num_attention_heads),
                       ("attention.head_count_kv", config.num_key_value_heads)):
        writer.add_uint32(f"{architecture}.{key}", value)
    epsilon = getattr(config, "layer_norm_eps", None) or config.norm_epsilon
    writer.add_float32(f"{architecture}.attention.layer_norm_epsilon", epsilon)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if layer_type == Q.Q4_0 else gguf.LlamaFileType.MOSTLY_Q8_0)
    _write_tokenizer(writer, byte_tokens() + ["Ġt", END_OF_TURN])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[architecture.upper()], config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if data.ndim == 2:
            kind = Q.Q8_0 if gguf_name == "token_embd.weight" else layer_type
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_of_gguf(path: Path) -> Any:
    """transformers' own fp32 model of a GGUF file (it dequantizes every tensor)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

