"""The int4 kernels' group scales (``int4_scales``): what they keep of a weight's scales and zero points, in how many
bytes."""

from __future__ import annotations

import pytest
import torch

from engine.forward.native import int4_scales
from engine.forward.native.int4_scales import LARGEST_CODE, SCALE_RUN


def _run_largest(values: torch.Tensor) -> torch.Tensor:
    """values [G, N] -> each value's run's largest magnitude (runs of SCALE_RUN groups down a row), [G, N]."""
    groups = values.shape[0]
    runs = torch.zeros(-(-groups // SCALE_RUN) * SCALE_RUN, values.shape[1])
    runs[:groups] = values.abs()
    largest = runs.view(-1, SCALE_RUN, values.shape[1]).amax(1, keepdim=True).expand(-1, SCALE_RUN, -1)
    return largest.reshape(-1, values.shape[1])[:groups]


@pytest.mark.parametrize("groups", [1, 5, 8, 67])  # a run of fewer groups last, or whole runs
def test_each_scale_and_zero_comes_back_within_half_a_code_of_its_runs_largest(groups):
    torch.manual_seed(groups)
    scales_and_zeros = torch.randn(groups, 128, 2) * torch.logspace(-4, 0, 128)[:, None]  # rows of any magnitude
    laid_out = int4_scales.block_scales(scales_and_zeros)
    assert laid_out.shape == (2, int4_scales.block_bytes(groups))
    back = int4_scales.scales_and_zeros_of(laid_out, groups)
    for part in range(2):
        error = (back[..., part] - scales_and_zeros[..., part]).abs()
        assert (error <= _run_largest(scales_and_zeros[..., part]) * 0.51 / LARGEST_CODE).all()


def test_a_q4_k_files_scales_keep_their_codes_doubled_under_a_bf16_factor():
    """llama.cpp's Q4_K: d times 6-bit codes whose largest is 63 in each run of 8 sub-blocks (256 weights)."""
    torch.manual_seed(0)
    d = torch.rand(1, 64) * 1e-3  # one factor a row and run
    codes = torch.randint(0, 64, (8, 64)).float()
    codes[3] = 63
    scales_and_zeros = torch.stack([d * codes, torch.randn(8, 64) * 1e-2], dim=-1)  # [8, 64, 2]
    back = int4_scales.scales_and_zeros_of(int4_scales.block_scales(scales_and_zeros), 8)[..., 0]
    factor = (d / 2).bfloat16().float()
    assert torch.equal(back, factor * (2 * codes))  # exactly the codes, each scale off by the factor's rounding
    assert ((back - scales_and_zeros[..., 0]).abs() <= scales_and_zeros[..., 0] * 2 ** -8).all()


def test_a_weight_takes_4_625_bits_and_an_all_zero_run_stays_zero():
    groups = 4096 // 32
    assert int4_scales.block_bytes(groups) * 8 / (64 * 4096) + 4 == 4.625
    scales_and_zeros = torch.zeros(groups, 64, 2)
    scales_and_zeros[8:] = LARGEST_CODE / 512  # a factor bf16 holds exactly
    back = int4_scales.scales_and_zeros_of(int4_scales.block_scales(scales_and_zeros), groups)
    assert torch.equal(back[:8], torch.zeros(8, 64, 2)) and torch.equal(back[8:], scales_and_zeros[8:])
