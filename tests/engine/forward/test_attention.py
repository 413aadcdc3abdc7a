"""A prompt chunk's attention in blocks of rows, each over the keys it sees, equals the whole chunk's in one call."""

from __future__ import annotations

import pytest
import torch

from engine.forward import attention

CPU = torch.device("cpu")


@pytest.mark.parametrize("start, length, first, window", [
    (0, 150, 0, None),  # a fresh prompt: causal, the last block short
    (200, 130, 0, None),  # a chunk after 200 held positions
    (300, 140, 260, None),  # keys held from position 260 on (a window group's blocks let go before it)
    (0, 200, 0, 48),  # a sliding window narrower than a block's span
    (500, 128, 380, 100),
])
@pytest.mark.parametrize("softcap, with_sinks", [(None, False), (30.0, False), (None, True)])
def test_blocks_of_rows_attend_as_the_whole_chunk(start: int, length: int, first: int, window: int | None,
                                                   softcap: float | None, with_sinks: bool):
    generator = torch.Generator().manual_seed(start + length)
    keys_held = start + length - first
    q = torch.randn(length, 4, 16, generator=generator)  # [S, H, hd]
    keys, values = (torch.randn(2, keys_held, 16, generator=generator) for _ in range(2))  # [Hkv, T, hd]
    sinks = torch.randn(4, generator=generator) if with_sinks else None
    mask = attention.causal_mask(start, length, torch.float32, CPU, first, window)  # [S, T]
    whole = attention.attend(q, keys, values, mask, softcap, sinks)
    torch.testing.assert_close(attention.attend_in_blocks(q, keys, values, mask, softcap, sinks), whole)


def test_each_block_meets_only_the_keys_its_rows_see(monkeypatch: pytest.MonkeyPatch):
    """A 256-row fresh prompt under a 32-key window: each block of 64 rows reads at most 64 + 31 keys."""
    spans: list[int] = []
    whole_call = attention.attend

    def counting(q, keys, values, mask, softcap=None, sinks=None):
        spans.append(keys.shape[1])
        return whole_call(q, keys, values, mask, softcap, sinks)

    monkeypatch.setattr(attention, "attend", counting)
    q, keys, values = torch.randn(256, 2, 8), torch.randn(1, 256, 8), torch.randn(1, 256, 8)
    attention.attend_in_blocks(q, keys, values, attention.causal_mask(0, 256, torch.float32, CPU, window=32))
    assert spans == [64, 95, 95, 95]
