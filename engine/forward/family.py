"""What sets a fast-path family apart from Llama, read from its config as data (any thread; imports no torch).

Llama, Mistral, Qwen2/3, Gemma 2/3 and Phi-3/4 share ``FastLlama``'s one forward pass; a
``Family`` holds the few values where they differ, each at Llama's value (no extra step)
unless the config says otherwise: Gemma's RMSNorm weights are ``1 + w`` and its token
embeddings are scaled by sqrt(hidden); its MLP gates with GELU's tanh approximation; its
attention scale is ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps attention scores
and logits; Phi-3's rotary turns only the first part of each head. Granite scales its
embeddings, its attention scores, each layer's attention and MLP outputs before they join the
residual stream, and its logits, each by a multiplier of its config. gpt-oss's experts gate with a
clamped SwiGLU (``Clamp``), its router takes the top k of its logits before their softmax, and its
attention holds a learned logit per head (a sink) that only the softmax's denominator sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GEMMA_TYPES = ("gemma2", "gemma3_text")
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
"""Model types whose transformers config ties the output layer to the token table unless it says otherwise."""
GRANITE_TYPE = "granite"
GPT_OSS = "gpt_oss"
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # config name -> the fast path's gate


@dataclass(frozen=True)
class Clamp:
    """gpt-oss's gate of its experts: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` where ``g`` is
    the gate clamped from above at ``limit``."""

    alpha: float
    limit: float


@dataclass(frozen=True)
class Family:
    norm_shift: float  # added to every RMSNorm weight: 1.0 where the model multiplies by (1 + w) (Gemma)
    embed_scale: float | None  # the token embeddings' factor (Gemma's sqrt(hidden)); None: none
    activation: str  # the MLP's gate: "silu" or "gelu_tanh"
    attention_scale: float  # the query's factor before its dot products with the keys
    attention_softcap: float | None  # scores become cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_softcap: float | None  # logits likewise (Gemma 2)
    rotary_dim: int  # each head's leading dimensions that turn (Phi-3's partial rotary); the rest pass as they are
    residual_scale: float | None = None  # the attention's and the MLP's outputs' factor (Granite's); None: none
    logit_scale: float | None = None  # the logits' factor (Granite's 1 / logits_scaling); None: none
    expert_clamp: Clamp | None = None  # gpt-oss's experts' gate; None: the MLP's ``activation``
    top_k_before_softmax: bool = False  # the router's softmax over its top k logits alone (gpt-oss)
    attention_sinks: bool = False  # each layer's ``self_attn.sinks`` [H] join each head's softmax (gpt-oss)


def ties_embeddings(config: Mapping[str, Any]) -> bool:
    """Whether a checked model's config ties the output layer to the token table. A GGUF file's says so as
    ``tied_embeddings`` (``gguf_check``: it has no ``output.weight``). A parsed config.json by its
    ``tie_word_embeddings`` (a multimodal config's own before its ``text_config``'s, as transformers reads them),
    else by the default of its model type's config (``TIED_BY_DEFAULT``): files saved by transformers 4 leave the
    flag out where it equals that default, as Gemma 3's do."""
    if "tied_embeddings" in config:
        return bool(config["tied_embeddings"])
    parts = [config, config.get("text_config") or {}]
    for part in parts:
        if "tie_word_embeddings" in part:
            return bool(part["tie_word_embeddings"])
    return any(part.get("model_type") in TIED_BY_DEFAULT for part in parts)


def activation_name(config: Any) -> str:
    """The MLP activation as the config names it (Gemma's ``hidden_activation``, else ``hidden_act``)."""
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "silu"


def head_dim_of(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_dim_of(config: Any) -> int:
    """Each head's rotated dimensions: the head, or its ``partial_rotary_factor`` (in ``rope_parameters`` or the
    config itself)."""
    rope = getattr(config, "rope_parameters", None) or {}
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None)) or 1.0
    return int(head_dim_of(config) * factor)


def family_of(config: Any) -> Family:
    """``config``'s family traits (a transformers config, or ``gguf_direct.hf_config``'s)."""
    if getattr(config, "model_type", None) == GRANITE_TYPE:
        return _granite(config)
    gemma = getattr(config, "model_type", None) in GEMMA_TYPES
    gpt_oss = getattr(config, "model_type", None) == GPT_OSS
    scalar = getattr(config, "query_pre_attn_scalar", None) if gemma else None
    return Family(
        norm_shift=1.0 if gemma else 0.0,
        embed_scale=config.hidden_size**0.5 if gemma else None,
        activation=ACTIVATIONS[activation_name(config)],
        attention_scale=(scalar or head_dim_of(config)) ** -0.5,
        attention_softcap=getattr(config, "attn_logit_softcapping", None) if gemma else None,
        final_softcap=getattr(config, "final_logit_softcapping", None) if gemma else None,
        rotary_dim=rotary_dim_of(config),
        expert_clamp=Clamp(config.swiglu_alpha, config.swiglu_limit) if gpt_oss else None,
        top_k_before_softmax=gpt_oss,
        attention_sinks=gpt_oss,
    )


def _granite(config: Any) -> Family:
    """Granite's multipliers (transformers' ``GraniteConfig`` names; 1.0, Llama's value, where absent)."""
    return Family(
        norm_shift=0.0,
        embed_scale=_factor(getattr(config, "embedding_multiplier", 1.0)),
        activation=ACTIVATIONS[activation_name(config)],
        attention_scale=getattr(config, "attention_multiplier", None) or head_dim_of(config) ** -0.5,
        attention_softcap=None,
        final_softcap=None,
        rotary_dim=rotary_dim_of(config),
        residual_scale=_factor(getattr(config, "residual_multiplier", 1.0)),
        logit_scale=_factor(1.0 / (getattr(config, "logits_scaling", None) or 1.0)),
    )


def _factor(value: float) -> float | None:
    """``value`` as a step's factor: None where it is 1 (the step is skipped)."""
    return None if value == 1.0 else float(value)
