"""``FormatPlan``s for tests that build a ``FastLlama`` straight from a state dict."""

from __future__ import annotations

from typing import Any

import torch

from engine.models.format_plan import FormatPlan, ModelTraits, fast_formats, this_host


def fast_plan(config: Any, layers: str, device: torch.device, decode_copy: str | None = None) -> FormatPlan:
    """The fast path's plan for a model of ``config`` with its layers in ``layers`` on ``device`` (this CPU's
    features), ``format_plan``'s rules for the rest."""
    traits = ModelTraits(True, config.vocab_size, config.hidden_size)
    return fast_formats(device.type, layers, traits, this_host(), decode_copy)
