"""A model's rotary tables: each pair's turn per position and the factor of its cos and sin (engine thread).

One table serves every layer, except where the config gives each layer type its own rotary
parameters (Gemma 3: ``sliding_attention`` layers turn with ``rope_local_base_freq``, the
``full_attention`` ones with ``rope_theta`` and linear scaling). A table has a turn for every
(even, odd) pair of a head: past the rotary dimensions (Phi-3's ``partial_rotary_factor``) the
turn is zero and the factor one, so those pairs pass as they are and one rotary path serves.
LongRoPE (Phi-3.5/4) divides the frequencies by its short factors, or its long ones where the
context chosen at load is longer than the trained one, as llama.cpp chooses, and scales the
rotary pairs by its attention factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from engine.forward.family import head_dim_of, rotary_dim_of

ROPE_FACTORS = "model.rotary_emb.freq_factors"  # only GGUF files hold them (``gguf_direct``): Llama 3.1's
LONG_FACTORS = "model.rotary_emb.long_factors"  # a GGUF file's LongRoPE factors (``rope_factors_long``)
SHORT_FACTORS = "model.rotary_emb.short_factors"
FACTOR_NAMES = (ROPE_FACTORS, LONG_FACTORS, SHORT_FACTORS)


@dataclass(frozen=True)
class RotaryTable:
    inv_freq: torch.Tensor  # [hd/2]: each pair's turn per position, 0 past the rotary dimensions
    magnitude: torch.Tensor  # [hd/2]: each pair's cos and sin factor (the attention factor; 1 past the rotary ones)


def rotary_tables(config: Any, device: torch.device, factors: Mapping[str, torch.Tensor],
                  context_length: int | None) -> tuple[list[RotaryTable], tuple[int, ...]]:
    """The tables and, for each layer, the index of the one it turns with. ``factors``: the state's tensors named
    in ``FACTOR_NAMES``; ``context_length``: the context chosen at load (LongRoPE's choice of factors)."""
    rope, layers = config.rope_parameters, config.num_hidden_layers
    if not all(isinstance(value, dict) for value in rope.values()):
        return [_table(config, rope, None, device, factors, context_length)], (0,) * layers
    kinds = sorted(set(config.layer_types))
    tables = [_table(config, rope[kind], kind, device, factors, context_length) for kind in kinds]
    return tables, tuple(kinds.index(kind) for kind in config.layer_types)


def _table(config: Any, rope: Mapping[str, Any], layer_type: str | None, device: torch.device,
           factors: Mapping[str, torch.Tensor], context_length: int | None) -> RotaryTable:
    """One table as Hugging Face's rotary embedding computes it for ``rope`` (``transformers.modeling_rope_utils``,
    which imports none of the modelling code); ``factors[ROPE_FACTORS]`` [r/2]: each frequency's divisor, as a GGUF
    file of Llama 3.1 gives its rope scaling instead of naming it in the metadata."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotary, kind = rotary_dim_of(config), rope.get("rope_type", "default")
    if kind in ("default", "longrope"):
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, rotary, 2, dtype=torch.float) / rotary))  # [r/2]
        scale = 1.0
        if kind == "longrope":
            divisors, scale = _longrope(config, rope, factors, context_length)
            inv_freq = inv_freq / divisors
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, None, **({"layer_type": layer_type} if layer_type else {}))
    if ROPE_FACTORS in factors:
        inv_freq = inv_freq / factors[ROPE_FACTORS].to(torch.float32)
    pairs = head_dim_of(config) // 2
    magnitude = torch.ones(pairs)
    magnitude[: inv_freq.shape[0]] = float(scale)
    padded = torch.zeros(pairs)
    padded[: inv_freq.shape[0]] = inv_freq
    return RotaryTable(padded.to(device), magnitude.to(device))


def _longrope(config: Any, rope: Mapping[str, Any], factors: Mapping[str, torch.Tensor],
              context_length: int | None) -> tuple[torch.Tensor, float]:
    """LongRoPE's divisor of each frequency [r/2] (its long factors where the context is longer than the trained
    one) and its attention factor, given or as Hugging Face and llama.cpp's converter derive it."""
    original = rope["original_max_position_embeddings"]
    long = context_length is not None and context_length > original
    stored = factors.get(LONG_FACTORS if long else SHORT_FACTORS)
    divisors = stored.to(torch.float32) if stored is not None else torch.tensor(
        rope["long_factor" if long else "short_factor"], dtype=torch.float32)
    attention = rope.get("attention_factor")
    if attention is None:
        factor = rope.get("factor") or config.max_position_embeddings / original
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return divisors, float(attention)
