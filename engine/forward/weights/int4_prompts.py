"""Prompt chunks over the CPU's packed 4-bit weights: dequantized, then one fp32 GEMM (engine thread).

A model that only fits in 4 bits (an 8B GGUF on a 16 GB machine) runs its prompts on
the same weights as its decode steps. PyTorch's int4 kernel is made for a few rows:
at a 512-token chunk it multiplies at about half of MKL's fp32 rate. So a call of
``PROMPT_ROWS`` rows or more dequantizes the weights a block of rows at a time into
one fp32 scratch buffer (the same groups, ``(q - 8) * scale + zero``) and multiplies
each block with MKL's sgemm: 1.5-2.4x faster at 512 rows (an 8B model's matrices,
2 threads), and with fp32 activations instead of the kernel's
bf16. The scratch (``SCRATCH_WEIGHTS``) is one buffer for every layer, since only the
engine thread runs them, one at a time.
"""

from __future__ import annotations

import torch

from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS as BLOCK_ROWS  # the kernel layout's row blocks

PROMPT_ROWS = 128
"""Rows from which dequantizing pays: at 128 it is 1.1-1.4x the kernel's speed on an 8B model's matrices, at 96
level or slower."""
SCRATCH_WEIGHTS = 2**22
"""Weights dequantized at a time, 16 MiB of fp32: 5-15 % faster than 64 MiB in two runs (an 8B model's shapes at
512 rows; 1 M was faster on the smallest and slower on the others)."""


class _Scratch:
    """A reused fp32 buffer, grown to the largest block asked for."""

    def __init__(self) -> None:
        self._buffer = torch.empty(0)

    def take(self, size: int) -> torch.Tensor:
        if self._buffer.numel() < size:
            self._buffer = torch.empty(size)
        return self._buffer[:size]


_SCRATCH = _Scratch()


def dequantizes(rows: int) -> bool:
    """Whether a weight of ``rows`` rows takes this path: whole blocks of the kernel's layout only."""
    return rows % BLOCK_ROWS == 0


def dequantized_matmul(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                       group: int) -> torch.Tensor:
    """``x`` [M, K] fp32 times the weight [N, K] that ``packed`` [N, K / 2] uint8 (the CPU kernel's layout) and
    ``scales_and_zeros`` [K / group, N, 2] bf16 hold, ``w = (q - 8) * scale + zero``; [M, N] fp32."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(x.shape[0], rows)  # [M, N]
    step = max(BLOCK_ROWS, SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        weights_t = _dequantized(packed[start:end], scales_and_zeros[:, start:end], group)  # [n / 64, K, 64]
        product = torch.matmul(x, weights_t)  # [n / 64, M, 64]: each block's 64 columns of the result
        out[:, start:end].view(x.shape[0], -1, BLOCK_ROWS).copy_(product.transpose(0, 1))
    return out


def _dequantized(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The rows of ``packed`` [n, K / 2] as fp32 in the scratch, each block of 64 transposed, [n / 64, K, 64]."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    blocks, groups = rows // BLOCK_ROWS, width // group
    codes = packed.view(blocks, groups, group, BLOCK_ROWS // 2)  # byte (k, j): row j's code low, row j + 32's high
    weights = _SCRATCH.take(rows * width).view(blocks, groups, group, BLOCK_ROWS)
    weights[..., : BLOCK_ROWS // 2].copy_(codes & 15)
    weights[..., BLOCK_ROWS // 2 :].copy_(codes >> 4)
    scales = scales_and_zeros[..., 0].float()  # [G, n]
    offsets = scales_and_zeros[..., 1].float() - 8 * scales  # (q - 8) * scale + zero = q * scale + offset
    weights.mul_(_per_block(scales, blocks)).add_(_per_block(offsets, blocks))
    return weights.view(blocks, width, BLOCK_ROWS)


def _per_block(values: torch.Tensor, blocks: int) -> torch.Tensor:
    """[G, n] group values as [n / 64, G, 1, 64], to scale a block's [G, group, 64] weights."""
    groups = values.shape[0]
    return values.t().reshape(blocks, BLOCK_ROWS, groups).transpose(1, 2).unsqueeze(2)
