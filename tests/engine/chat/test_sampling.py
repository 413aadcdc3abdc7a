"""Greedy decoding picks what ``torch.argmax`` would, whatever path the logits take (``engine.chat.sampling``)."""

from __future__ import annotations

import pytest
import torch

from engine.chat.sampling import Sampler
from engine.protocol.messages import SamplingParams


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_takes_the_first_of_the_largest_logits_as_torch_argmax_does(dtype):
    greedy = Sampler(SamplingParams(temperature=0), torch.device("cpu"))
    none_seen = torch.empty(0, dtype=torch.long)
    torch.manual_seed(0)
    logits = torch.randn(49_152).to(dtype)
    assert greedy(logits, none_seen).item() == torch.argmax(logits).item()
    logits[100] = logits[40_000] = logits.max() + 1  # a tie: the first one, as transformers' generate picks
    assert greedy(logits, none_seen).item() == 100
    rows = torch.randn(4, 1000)  # a batched step's logits, one request's row
    assert greedy(rows[2], none_seen).item() == torch.argmax(rows[2]).item()
