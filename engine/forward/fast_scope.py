"""Which models the fast path runs, decided from their config alone (any thread; imports no torch).

``llama_forward`` runs these; ``loading`` asks with transformers' config object, and
``memory_estimate`` with the parsed config.json (``config_view``), so that the estimate
counts the formats the load will hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from engine.forward.family import ACTIVATIONS, GEMMA_TYPES, GPT_OSS, GRANITE_TYPE, activation_name

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe", GRANITE_TYPE, GPT_OSS,
                 *GEMMA_TYPES)
ROPE_TYPES = ("default", "llama3", "linear", "longrope", "yarn")


def unsupported_reason(config: Any) -> str | None:
    """Why the fast path cannot run this model, or ``None`` when it can."""
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', '?')!r}"
    if activation_name(config) not in ACTIVATIONS:
        return f"activation {activation_name(config)!r}"
    rope = getattr(config, "rope_parameters", None) or {}
    for kind in _rope_types(rope):
        if kind not in ROPE_TYPES:
            return f"rope scaling {kind!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    return None


def _rope_types(rope: Mapping[str, Any]) -> list[str]:
    """The rope types of a config's ``rope_parameters``: one, or one per layer type (Gemma 3)."""
    if rope and all(isinstance(value, Mapping) for value in rope.values()):
        return [part.get("rope_type", "default") for part in rope.values()]
    return [rope.get("rope_type", "default")]


def config_view(config: Mapping[str, Any]) -> SimpleNamespace:
    """A parsed config.json as ``unsupported_reason`` reads transformers' config: older files name their rope
    scaling ``rope_scaling`` (its kind under ``type``), which transformers turns into ``rope_parameters``."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope and all(isinstance(value, Mapping) for value in rope.values()):  # one per layer type (Gemma 3)
        return SimpleNamespace(**{**config, "rope_parameters": rope})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    return SimpleNamespace(**{**config, "rope_parameters": {**rope, "rope_type": kind}})
