"""Which models the fast path runs, decided from their config alone (any thread; imports no torch).

``llama_forward`` runs these; ``loading`` asks with transformers' config object, and
``memory_estimate`` with the parsed config.json (``config_view``), so that the estimate
counts the formats the load will hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
ROPE_TYPES = ("default", "llama3", "linear")


def unsupported_reason(config: Any) -> str | None:
    """Why the fast path cannot run this model, or ``None`` when it can."""
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', '?')!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in ROPE_TYPES:
        return f"rope scaling {rope.get('rope_type')!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    return None


def config_view(config: Mapping[str, Any]) -> SimpleNamespace:
    """A parsed config.json as ``unsupported_reason`` reads transformers' config: older files name their rope
    scaling ``rope_scaling`` (its kind under ``type``), which transformers turns into ``rope_parameters``."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    return SimpleNamespace(**{**config, "rope_parameters": {**rope, "rope_type": kind}})
