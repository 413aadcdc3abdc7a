"""A sampled token's log-probability and its likeliest rivals, as ``TokenLogprob`` (engine thread).

Computed from the logits the sampler saw after a constraint's mask and before
temperature, top-k, top-p and min-p, so at temperature 1 the chosen token's figure is
``log_softmax(logits)[token]``. Tokens a constraint refused (``-inf``) never appear among
the rivals. Only a request that asked for log-probabilities pays for this.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.protocol.messages import TokenChoice, TokenLogprob


def token_logprob(logits: torch.Tensor, token: int, top: int, tokenizer: Any) -> TokenLogprob:
    """``logits`` [V] (masked) → the chosen ``token``'s ``TokenLogprob`` with up to ``top`` rivals, best first."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
    best = torch.topk(logprobs, top) if top > 0 else None
    rivals = [] if best is None else zip(best.indices.tolist(), best.values.tolist())
    chosen = _choice(tokenizer, token, logprobs[token].item())
    return TokenLogprob(chosen, tuple(_choice(tokenizer, i, lp) for i, lp in rivals if not math.isinf(lp)))


def _choice(tokenizer: Any, token: int, logprob: float) -> TokenChoice:
    text = tokenizer.decode([token])
    return TokenChoice(text, tuple(text.encode("utf-8")), max(logprob, -9999.0))
