"""Llama-architecture models with random weights, for benchmarks and tests (engine thread).

Decode speed depends on shapes, not on weight values, so ``random:NAME`` gives a
model of a known size without downloading it. The tokenizer is a byte-level one
with a ChatML template: any text encodes, and ids past its 259 entries decode to
nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from engine.chat.chat_template import ChatTemplate
from engine.models.format_plan import ModelTraits, choose_formats
from engine.models.loading import DTYPES, LoadedModel, LoadPlan, fast_path_applies, resolve_device, wrap_model

PREFIX = "random:"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, max_position_embeddings=1024, tie_word_embeddings=True,
        initializer_range=0.3,  # large enough that greedy replies vary from token to token
    ),
    "smollm2-135m": dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
        rope_theta=100000.0,
    ),
    "llama3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False,
        rope_theta=500000.0,
    ),
}
CPU_BUILD_LIMIT_BYTES = 8 * 1024**3  # building happens in fp32 before any repacking


class RandomModelError(ValueError):
    """The random model cannot be built as asked; the message says why and what works."""


def is_random(path: str) -> bool:
    return path.startswith(PREFIX)


def llama_config(name: str) -> Any:
    from transformers import LlamaConfig

    if name not in PRESETS:
        raise RandomModelError(f"Unknown random model {name!r}; choose one of {', '.join(PRESETS)}.")
    return LlamaConfig(**PRESETS[name], bos_token_id=0, eos_token_id=2, pad_token_id=0)


def byte_tokenizer() -> Any:
    """A byte-level tokenizer: ids 0-2 are the special tokens, then one id per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def build_hf_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """The transformers model for preset ``name`` with seeded random weights."""
    from transformers import AutoModelForCausalLM

    config = llama_config(name)
    _check_size(name, config, device, dtype)
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def load_random(path: str, device_name: str, requested_precision: str, context_length: int | None = None) -> LoadedModel:
    """``random:NAME`` loaded the way ``loading`` loads a folder: same precision choice and backend."""
    started = time.perf_counter()
    name = path[len(PREFIX):]
    device = resolve_device(device_name)
    config = llama_config(name)
    traits = ModelTraits(fast_path_applies(config, device), config.vocab_size, config.hidden_size)
    formats = choose_formats(device.type, requested_precision, traits)
    if not formats.fast_path and formats.quantized_layers:
        raise RandomModelError(
            f"Random models cannot be built in {formats.precision} on {device.type}; use an unquantized precision "
            "(int8 and int4 work on a GPU, where the fast path quantizes them)."
        )
    model = build_hf_model(name, device, torch.float32 if device.type == "cpu" else DTYPES[formats.compute])
    tokenizer = byte_tokenizer()
    plan = LoadPlan(
        Path(path), path, device, formats.precision, context_length or model.config.max_position_embeddings,
        ChatTemplate(tokenizer.chat_template, "the random model's tokenizer"), formats=formats,
    )
    return wrap_model(model, tokenizer, plan, started)


def _check_size(name: str, config: Any, device: torch.device, dtype: torch.dtype) -> None:
    params = config.num_hidden_layers * (
        config.hidden_size * config.head_dim * (config.num_attention_heads * 2 + config.num_key_value_heads * 2)
        + 3 * config.hidden_size * config.intermediate_size
    ) + config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    needed = params * torch.finfo(dtype).bits // 8
    if device.type == "cpu" and needed > CPU_BUILD_LIMIT_BYTES:
        raise RandomModelError(
            f"random:{name} needs {needed / 1024**3:.0f} GB to build in {dtype} on the CPU, more than this "
            "benchmark allows; run it with --device cuda, or pick random:smollm2-135m."
        )
