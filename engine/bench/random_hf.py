"""Hugging Face folders of real model shapes with random weights, for load benchmarks (main thread of a benchmark).

``random-hf:SHAPE:DTYPE`` names one, e.g. ``random-hf:smollm2-1.7b:bf16``: a folder
with config.json, the built-in model's tokenizer (SmolLM2's 49 152-token BPE, saved
from its GGUF file) and one ``model.safetensors`` in ``DTYPE`` (bf16, fp16 or fp32),
written once into Hearth's cache folder (``random-hf/``, never committed) and reused.
Shapes are ``random_gguf``'s Llama and Qwen2 ones, with their real vocabulary's rows in
the embedding and output (``vocab_size``), past the tokenizer's ids as in many real
checkpoints whose tables are padded.
The file is written tensor by tensor (the header first, from the shapes), so writing
it holds one tensor at a time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from engine.bench.random_gguf import SHAPES, WEIGHT_STD, Shape, parse_spec, written_once
from engine.host import paths

PREFIX = "random-hf:"
FORMAT_VERSION = 2  # 2: the real vocabulary's rows (1: the tokenizer's 49 152)
DTYPES = {"bf16": (torch.bfloat16, "BF16"), "fp16": (torch.float16, "F16"), "fp32": (torch.float32, "F32")}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
HF_SHAPES = tuple(name for name, shape in SHAPES.items() if shape.arch in ARCHITECTURES)
TensorShapes = dict[str, tuple[int, ...]]


class RandomHfError(ValueError):
    """A ``random-hf:`` name that does not say a known shape and dtype; the message lists them."""


def is_random_hf(model: str) -> bool:
    return model.startswith(PREFIX)


def parse(model: str) -> tuple[str, str]:
    """``random-hf:SHAPE:DTYPE`` as (shape, dtype), checked."""
    return parse_spec(model, PREFIX, "DTYPE", DTYPES, RandomHfError, HF_SHAPES)


def random_hf_path(model: str) -> Path:
    shape, dtype = parse(model)
    return paths.models_dir() / "random-hf" / f"{shape}-{dtype}-v{FORMAT_VERSION}"


def ensure_random_hf(model: str, tokenizer_source: Path) -> Path:
    """The folder ``model`` names, written first if it is not there yet."""
    return written_once(random_hf_path(model), lambda staging: write_random_hf(staging, *parse(model), tokenizer_source))


def write_random_hf(folder: Path, shape_name: str, dtype_name: str, tokenizer_source: Path, seed: int = 0) -> None:
    """config.json, the tokenizer of the GGUF file ``tokenizer_source``, and the random weights."""
    from engine.models.gguf_direct import load_tokenizer

    folder.mkdir(parents=True)
    tokenizer = load_tokenizer(tokenizer_source)
    tokenizer.save_pretrained(str(folder))
    shape = SHAPES[shape_name]
    vocab = max(shape.vocab, len(tokenizer))
    _write_config(folder, shape, vocab, tokenizer)
    write_safetensors(folder / "model.safetensors", tensor_shapes(shape, vocab), dtype_name, seed)


def tensor_shapes(shape: Shape, vocab: int) -> TensorShapes:
    """Every tensor of the checkpoint under Hugging Face's names, in the order transformers saves them."""
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shapes: TensorShapes = {"model.embed_tokens.weight": (vocab, shape.hidden)}
    for i in range(shape.layers):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (shape.hidden,),
            layer + "self_attn.q_proj.weight": (q_rows, shape.hidden),
            layer + "self_attn.k_proj.weight": (kv_rows, shape.hidden),
            layer + "self_attn.v_proj.weight": (kv_rows, shape.hidden),
            layer + "self_attn.o_proj.weight": (shape.hidden, q_rows),
            layer + "post_attention_layernorm.weight": (shape.hidden,),
            layer + "mlp.gate_proj.weight": (shape.ffn, shape.hidden),
            layer + "mlp.up_proj.weight": (shape.ffn, shape.hidden),
            layer + "mlp.down_proj.weight": (shape.hidden, shape.ffn),
        }
        if shape.qkv_bias:
            shapes |= {layer + f"self_attn.{p}_proj.bias": (rows,) for p, rows in zip("qkv", (q_rows, kv_rows, kv_rows))}
    shapes["model.norm.weight"] = (shape.hidden,)
    if not shape.tied:
        shapes["lm_head.weight"] = (vocab, shape.hidden)
    return shapes


def write_safetensors(path: Path, shapes: TensorShapes, dtype_name: str, seed: int) -> None:
    """A safetensors file of random tensors (norm weights ones), written one tensor at a time."""
    dtype, code = DTYPES[dtype_name]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = dtype.itemsize * math.prod(shape)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
    generator = torch.Generator().manual_seed(seed)
    with path.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape in shapes.items():
            out.write(_random_tensor(name, shape, dtype, generator).view(torch.uint8).numpy().data)


def _random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)  # [hidden]
    return (torch.randn(shape, generator=generator) * WEIGHT_STD).to(dtype).contiguous()  # [rows, cols] or [rows]


def _write_config(folder: Path, shape: Shape, vocab: int, tokenizer: object) -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        shape.arch, hidden_size=shape.hidden, intermediate_size=shape.ffn, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        vocab_size=vocab, max_position_embeddings=shape.context, tie_word_embeddings=shape.tied,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta}, rms_norm_eps=1e-5,
        bos_token_id=getattr(tokenizer, "bos_token_id", None), eos_token_id=getattr(tokenizer, "eos_token_id", None),
        architectures=[ARCHITECTURES[shape.arch]], attention_bias=shape.qkv_bias,
    )
    config.save_pretrained(str(folder))
