"""Chooses the next token from the logits (engine thread).

The order follows transformers' logits processors, so greedy decoding matches
``model.generate()``: repetition penalty, temperature, top-k, top-p, min-p, then a
draw from a seeded generator. Everything stays on the model's device; the caller
takes ``.item()`` only when the token must be shown.

``verify`` judges a speculative draft's token (``engine/chat/speculative``) against these
same probabilities. A prompt-lookup draft proposes one token with certainty (its
distribution q is a point mass), so rejection sampling accepts the token t with
probability min(1, p(t) / q(t)) = p(t), and on rejection draws from the residual
max(0, p − q), normalised: p without t. Either way the token has the distribution
p, as a plain draw would; greedy decoding simply takes the argmax, so a draft is
kept exactly when it is what decoding without it would have said.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.protocol.messages import SamplingParams


class Sampler:
    """Stateful only through its random generator: the same seed gives the same draws."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.params = params
        self._generator: torch.Generator | None = None
        if not params.greedy:
            self._generator = torch.Generator(device=device)
            if params.seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor, seen_ids: torch.Tensor) -> torch.Tensor:
        """``logits`` [V] fp32, ``seen_ids`` [N] int64 (prompt and reply so far) → token id, a 0-d tensor."""
        logits = self._penalize_repeats(logits, seen_ids)
        if self.params.greedy:
            return _argmax(logits)
        return torch.multinomial(self._probabilities(logits), 1, generator=self._generator)[0]

    def verify(self, logits: torch.Tensor, seen_ids: torch.Tensor, drafted: int) -> torch.Tensor:
        """The token to say at a position a draft proposed ``drafted`` for: ``drafted`` itself when accepted, else
        a draw from the rest (the module's rejection rule), a 0-d tensor distributed as ``__call__``'s would be."""
        logits = self._penalize_repeats(logits, seen_ids)
        if self.params.greedy:
            return _argmax(logits)
        probs = self._probabilities(logits)  # [V]
        accept_below = probs[drafted]
        if torch.rand((), generator=self._generator, device=probs.device) < accept_below:
            return torch.tensor(drafted, device=probs.device)
        rest = probs.clone()
        rest[drafted] = 0.0
        if not bool(rest.sum() > 0):  # p(drafted) was 1 (or rounded to it): nothing else can be drawn
            return torch.tensor(drafted, device=probs.device)
        return torch.multinomial(rest, 1, generator=self._generator)[0]  # renormalised by multinomial

    def _probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution a sampled token is drawn from: temperature, top-k, top-p, min-p, softmax, [V]."""
        logits = logits / self.params.temperature
        logits = _keep_top_k(logits, self.params.top_k)
        logits = _keep_top_p(logits, self.params.top_p)
        logits = _keep_min_p(logits, self.params.min_p)
        return torch.softmax(logits, dim=-1)  # [V]

    def _penalize_repeats(self, logits: torch.Tensor, seen_ids: torch.Tensor) -> torch.Tensor:
        penalty = self.params.repetition_penalty
        if penalty == 1.0 or seen_ids.numel() == 0:
            return logits
        seen_logits = logits.gather(0, seen_ids)  # [N]
        seen_logits = torch.where(seen_logits < 0, seen_logits * penalty, seen_logits / penalty)
        return logits.scatter(0, seen_ids, seen_logits)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """The first largest logit's index (a NaN counts as largest, as in ``torch.argmax``), a 0-d tensor. On the CPU
    through NumPy, which is much faster over a vocabulary's logits than PyTorch's, for each reply each step."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return torch.argmax(logits)
    return torch.as_tensor(np.argmax(logits.numpy()))


def _keep_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    if top_k <= 0 or top_k >= logits.numel():
        return logits
    kth_best = torch.topk(logits, top_k).values[-1]
    return logits.masked_fill(logits < kth_best, float("-inf"))


def _keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=False)  # [V], ascending
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - top_p)
    drop_sorted[-1] = False  # always keep the most likely token
    drop = drop_sorted.scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _keep_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.max() * min_p
    return logits.masked_fill(probs < threshold, float("-inf"))
