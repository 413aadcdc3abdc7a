"""The group scales of Hearth's int4 kernels (``kernels_common.h``): made from a weight's scales and zero points at
load, and read back (engine thread).

A group of 32 weights of one row is ``(q - 8) * scale + zero`` for its codes q in 0…15. A block of 64 rows keeps each
group's scale and zero point as two int8 codes, c and z, under a pair of bf16 factors (d, e) that a row's run of
``SCALE_RUN`` groups shares: ``scale = d * c``, ``zero = e * z``. That is 4.625 bits a weight where a bf16 pair a
group took 5: 7.5 % fewer bytes for a decode step, which reads every weight once. Each
factor is its run's largest magnitude over ``LARGEST_CODE`` (126), so llama.cpp's Q4_K, whose largest sub-block scale
has the 6-bit code 63, keeps its scales' codes doubled. The zero point, the middle of a group's range, is coded
rather than the weight of code 0: a code's error then moves a group's weights by ``(q - 8)`` times it, half as far.
On the built-in model's Q4_1 weights the codes' rounding is 4.3 % of the file's own (bf16 pairs: 2.4 %); added in
quadrature, 0.1 %.

A block's bytes: for each run, its factors [64, 2] bf16, then each of its groups' codes [64, 2] int8 (the last run
may hold fewer groups); blocks one after another.
"""

from __future__ import annotations

import torch

from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS

SCALE_RUN = 8  # groups whose codes share a row's factors
LARGEST_CODE = 126  # the code of a run's largest magnitude
FACTOR_BYTES = CPU_INT4_PACK_ROWS * 2 * 2  # a run's factors: 64 rows' bf16 pairs
CODE_BYTES = CPU_INT4_PACK_ROWS * 2  # a group's codes: 64 rows' int8 pairs


def block_bytes(groups: int) -> int:
    """The bytes of one block's scales, ``groups`` groups a row."""
    return -(-groups // SCALE_RUN) * FACTOR_BYTES + groups * CODE_BYTES


def block_scales(scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """``scales_and_zeros`` [G, N, 2] (fp32 or bf16; ``w = (q - 8) * scale + zero``, N a multiple of 64) as the
    kernels' scales [N / 64, ``block_bytes(G)``] uint8."""
    groups, rows, _ = scales_and_zeros.shape
    runs, blocks = -(-groups // SCALE_RUN), rows // CPU_INT4_PACK_ROWS
    values = torch.zeros(runs * SCALE_RUN, rows, 2)  # [G', N, 2], groups past G zero
    values[:groups] = scales_and_zeros
    values = values.view(runs, SCALE_RUN, blocks, CPU_INT4_PACK_ROWS, 2).permute(2, 0, 1, 3, 4)  # [B, S, RUN, 64, 2]
    factors = (values.abs().amax(dim=2) / LARGEST_CODE).to(torch.bfloat16)  # [B, S, 64, 2]
    divisors = factors.float().unsqueeze(2)  # [B, S, 1, 64, 2]
    codes = values.div(divisors.where(divisors > 0, 1)).round_().clamp_(-127, 127).to(torch.int8)  # [B, S, RUN, 64, 2]
    laid_out = torch.empty(blocks, runs, FACTOR_BYTES + SCALE_RUN * CODE_BYTES, dtype=torch.uint8)
    laid_out[..., :FACTOR_BYTES] = factors.reshape(blocks, runs, -1).view(torch.uint8)
    laid_out[..., FACTOR_BYTES:] = codes.reshape(blocks, runs, -1).view(torch.uint8)
    return laid_out.view(blocks, -1)[:, :block_bytes(groups)].contiguous()


def scales_and_zeros_of(laid_out: torch.Tensor, groups: int) -> torch.Tensor:
    """The kernels' scales [n / 64, ``block_bytes(groups)``] back as [G, n, 2] fp32 (scale, zero), the values the
    kernels multiply by."""
    blocks, runs = laid_out.shape[0], -(-groups // SCALE_RUN)
    padded = torch.zeros(blocks, runs * (FACTOR_BYTES + SCALE_RUN * CODE_BYTES), dtype=torch.uint8)
    padded[:, :laid_out.shape[1]] = laid_out
    padded = padded.view(blocks, runs, -1)
    factors = padded[..., :FACTOR_BYTES].contiguous().view(torch.bfloat16).float()  # [B, S, 128]
    codes = padded[..., FACTOR_BYTES:].contiguous().view(torch.int8).float()  # [B, S, RUN * 128]
    values = codes.view(blocks, runs, SCALE_RUN, CPU_INT4_PACK_ROWS, 2) * factors.view(
        blocks, runs, 1, CPU_INT4_PACK_ROWS, 2)  # [B, S, RUN, 64, 2]
    return values.permute(1, 2, 0, 3, 4).reshape(runs * SCALE_RUN, blocks * CPU_INT4_PACK_ROWS, 2)[:groups]
