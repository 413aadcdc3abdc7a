"""A drafted token is verified so that what is said has the model's distribution, drafted or not."""

from __future__ import annotations

import pytest
import torch

from engine.chat.sampling import Sampler
from engine.protocol.messages import SamplingParams

DRAWS = 20_000
CHI_SQUARE_LIMIT = 30.0
"""Above the 99.99th percentile of chi-square with up to 5 degrees of freedom (25.7 at 5): a correct sampler's seeded
draws stay below it; one that keeps the draft too often (or never) lands in the thousands."""
NONE_SEEN = torch.empty(0, dtype=torch.long)


def _counts(sampler: Sampler, logits: torch.Tensor, drafted: int | None) -> torch.Tensor:
    picks = [int(sampler(logits, NONE_SEEN) if drafted is None else sampler.verify(logits, NONE_SEEN, drafted))
             for _ in range(DRAWS)]
    return torch.bincount(torch.tensor(picks), minlength=logits.numel()).double()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * DRAWS
    seen = expected > 0
    assert counts[~seen].sum() == 0, "a token of probability 0 was said"
    return float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())


@pytest.mark.parametrize("drafted", [0, 2, 4])
def test_verified_tokens_follow_the_target_distribution_whatever_was_drafted(drafted: int):
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = torch.softmax(logits / params.temperature, dim=-1)
    counts = _counts(Sampler(params, torch.device("cpu")), logits, drafted)
    assert _chi_square(counts, probs) < CHI_SQUARE_LIMIT


def test_a_draft_outside_top_k_is_never_kept_and_the_rest_keep_their_shares():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=11)
    logits = torch.tensor([1.5, 1.0, 0.2, 0.1, -0.5])
    probs = torch.zeros(5)
    probs[:3] = torch.softmax(logits[:3], dim=-1)
    counts = _counts(Sampler(params, torch.device("cpu")), logits, drafted=4)
    assert counts[4] == 0
    assert _chi_square(counts, probs) < CHI_SQUARE_LIMIT


def test_a_sampler_that_kept_every_draft_would_fail_the_check():
    """The check above can fail: keeping the draft always puts every draw on it."""
    probs = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]) / 0.8, dim=-1)
    always_drafted = torch.zeros(6, dtype=torch.float64)
    always_drafted[2] = DRAWS
    assert _chi_square(always_drafted, probs) > CHI_SQUARE_LIMIT


def test_greedy_keeps_a_draft_exactly_when_it_is_the_argmax():
    greedy = Sampler(SamplingParams(temperature=0), torch.device("cpu"))
    logits = torch.tensor([0.1, 3.0, 2.9])
    assert greedy.verify(logits, NONE_SEEN, drafted=1).item() == 1
    assert greedy.verify(logits, NONE_SEEN, drafted=2).item() == 1
