"""Prompt chunks over the CPU's packed 4-bit weights, as one int8 or fp32 GEMM (engine thread).

A model that only fits in 4 bits (an 8B GGUF on a 16 GB machine) runs its prompts on
the same weights as its decode steps. PyTorch's int4 kernel is made for a few rows:
at a 512-token chunk it multiplies at about half of MKL's fp32 rate. So a call of
``PROMPT_ROWS`` rows or more multiplies in the fastest GEMM the CPU has (where it has
AMX's tiles or the avx512 variant of Hearth's kernels runs, Hearth's int4 kernel multiplies them instead,
``native.int4_matmul``):

* int8, where the CPU has VNNI (``cpu_features.has_int8_dot``):

  - weights: a block of rows at a time is unpacked into int8 in one reused buffer,
    ``(q - 8) * scale`` of each group of 32 over one scale per row (the largest group's),
    rounded; the zero points are exact, one small fp32 matmul of the groups' sums of
    the activations.
  - activations: each row as ``scale * (high + low / LOW_STEPS)``, two int8 codes a value
    (about 15 bits), both multiplied in the same GEMM. A single int8 code per value
    (llama.cpp rounds its activations so, per block of 32) changed too many of the
    built-in model's teacher-forced top-1 tokens.

  It is faster than the fp32 path on large models' matrices. A product's relative error
  is about 0.6 % (the weights' rounding to int8 rows).
* fp32 otherwise: the weights dequantized a block of rows at a time into an fp32
  scratch and multiplied with MKL's sgemm: exact, and faster than an int8 GEMM where
  the CPU has no VNNI.

The scratch buffers are shared by every layer, since only the engine thread runs them,
one at a time.
"""

from __future__ import annotations

from typing import Callable

import torch

from engine.forward.weights.cpu_int4_layout import laid_out_here
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS as BLOCK_ROWS  # the kernel layout's row blocks
from engine.forward.native.scratch import Scratch
from engine.host.cpu_features import has_int8_dot

PROMPT_ROWS = 128
"""Rows from which the int8 and fp32 GEMMs pay: from about here on large models' matrices they are faster than the
int4 kernel, below it they are not."""
SCRATCH_WEIGHTS = 2**24
"""Weights multiplied at a time: 16 MiB of int8."""
FP32_SCRATCH_WEIGHTS = 2**22
"""Weights dequantized at a time for the fp32 GEMM, 16 MiB: on large models' shapes the GEMM runs faster
in blocks of this size than of larger ones."""
UNPACKED_WEIGHTS = 2**22
"""Weights unpacked at a time, 8 MiB of int16 codes: unpacking is fastest at about this size, slower both at much
smaller and at much larger blocks."""
FIXED_BITS = 8  # a group's scale over its row's, in int16 fixed point: (q - 8) * factor, at most 127 * 2**8, fits
LOW_STEPS = 254  # an activation's second code counts in steps of 1/254 of its first's

_CODES, _WEIGHTS, _FP32_WEIGHTS = Scratch(torch.int16), Scratch(torch.int8), Scratch(torch.float32)


def covers(rows: int) -> bool:
    """Whether a weight of ``rows`` rows takes this path: whole blocks of the kernel's layout only, where the kernel
    takes Hearth's layout (``cpu_int4_layout``)."""
    return laid_out_here(rows)


ScalesOfRows = Callable[[int, int], torch.Tensor]  # (start, end) -> those rows' scales and zeros [K / group, n, 2]


def takes(rows: int) -> bool:
    """Whether a call of ``rows`` rows takes this module's GEMM."""
    return rows >= PROMPT_ROWS


def prompt_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``x`` [M, K] fp32 times the weight [N, K] that ``packed`` [N, K / 2] uint8 (the CPU kernel's layout) and
    the scales and zeros hold, ``w = (q - 8) * scale + zero``; [M, N] fp32. ``scales_of_rows``: a block of rows'
    scales and zeros, wherever they are kept (``native.int4_matmul`` keeps them in blocks of its own)."""
    multiply = int8_matmul if has_int8_dot() else fp32_matmul
    return multiply(x, packed, scales_of_rows, group)


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``prompt_matmul`` in int8 (the module docstring)."""
    rows, width, length = packed.shape[0], packed.shape[1] * 2, x.shape[0]
    codes, x_scales = _activation_codes(x)  # [2M, K] int8, [M, 1]
    group_sums = x.view(length, -1, group).sum(-1)  # [M, G]: each group's zero point times its sum, exactly
    out = torch.empty(length, rows)  # [M, N]
    step = max(BLOCK_ROWS, SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        scales_and_zeros = scales_of_rows(start, end)  # [G, n, 2]
        weights, w_scales = _int8_weights(packed[start:end], scales_and_zeros, group)  # [K, n], [n]
        sums = torch._int_mm(codes, weights)  # [2M, n] int32: the high codes' products, then the low codes'
        block = out[:, start:end].copy_(sums[length:]).div_(LOW_STEPS).add_(sums[:length])
        block.mul_(w_scales).mul_(x_scales).addmm_(group_sums, scales_and_zeros[..., 1].float())
    return out


def _activation_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] as int8 codes [2M, K] (the high codes' rows, then the low ones') and row scales [M, 1]:
    ``x ≈ scale * (high + low / LOW_STEPS)``."""
    length = x.shape[0]
    scales = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_min_(1e-30).div_(127)  # [M, 1]
    scaled = x / scales  # [M, K] in [-127, 127]
    high = scaled.round()
    codes = torch.empty(2 * length, x.shape[1], dtype=torch.int8)
    codes[:length].copy_(high)
    codes[length:].copy_(scaled.sub_(high).mul_(LOW_STEPS).round_())  # in [-127, 127]
    return codes, scales


def _int8_weights(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``packed`` [n, K / 2] as int8 [K, n] in the scratch, ``(q - 8) * scale / row scale`` rounded,
    and the row scales [n] fp32 (its largest group's scale times 8 / 127); unpacked ``UNPACKED_WEIGHTS`` at a
    time."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    scales = scales_and_zeros[..., 0].float()  # [G, n]
    row_scales = scales.abs().amax(0).clamp_min_(1e-30).mul_(8 / 127)  # [n]: |q - 8| <= 8
    factors = torch.round(scales * ((1 << FIXED_BITS) / row_scales))  # [G, n]
    offsets = (1 << (FIXED_BITS - 1)) - 8 * factors  # q - 8, and half a step: the shift rounds
    weights = _WEIGHTS.take(rows * width).view(width // group, group, rows // BLOCK_ROWS, BLOCK_ROWS)
    step = max(BLOCK_ROWS, UNPACKED_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        codes = _unpacked(packed[start:end], factors[:, start:end], offsets[:, start:end], group, _CODES)
        codes.bitwise_right_shift_(FIXED_BITS)  # [n' / 64, G, group, 64]: the int8 weights, in int16
        weights[:, :, start // BLOCK_ROWS : end // BLOCK_ROWS].copy_(codes.permute(1, 2, 0, 3))
    return weights.view(width, rows), row_scales  # [G, group, n / 64, 64]: column k of the weight, row by row


def _unpacked(packed: torch.Tensor, factors: torch.Tensor, offsets: torch.Tensor, group: int,
              scratch: Scratch) -> torch.Tensor:
    """Rows of ``packed`` [n, K / 2] as ``q * factor + offset`` of their groups (factors and offsets [G, n]) in the
    scratch, in its dtype: [n / 64, G, group, 64]."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    blocks, groups = rows // BLOCK_ROWS, width // group
    nibbles = packed.view(blocks, groups, group, BLOCK_ROWS // 2)  # byte (k, j): row j's code low, row j + 32's high
    values = scratch.take(rows * width).view(blocks, groups, group, BLOCK_ROWS)
    values[..., : BLOCK_ROWS // 2].copy_(nibbles & 15)
    values[..., BLOCK_ROWS // 2 :].copy_(nibbles >> 4)
    return values.mul_(_per_block(factors, blocks, values.dtype)).add_(_per_block(offsets, blocks, values.dtype))


def fp32_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``prompt_matmul`` exactly, on MKL's sgemm: the weights dequantized ``FP32_SCRATCH_WEIGHTS`` at a time."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(x.shape[0], rows)  # [M, N]
    step = max(BLOCK_ROWS, FP32_SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        weights_t = _dequantized(packed[start:end], scales_of_rows(start, end), group)  # [n / 64, K, 64]
        product = torch.matmul(x, weights_t)  # [n / 64, M, 64]: each block's 64 columns of the result
        out[:, start:end].view(x.shape[0], -1, BLOCK_ROWS).copy_(product.transpose(0, 1))
    return out


def _dequantized(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The rows of ``packed`` [n, K / 2] as fp32 in the scratch, each block of 64 transposed, [n / 64, K, 64]."""
    scales = scales_and_zeros[..., 0].float()  # [G, n]
    offsets = scales_and_zeros[..., 1].float() - 8 * scales  # (q - 8) * scale + zero = q * scale + offset
    weights = _unpacked(packed, scales, offsets, group, _FP32_WEIGHTS)  # [n / 64, G, group, 64]
    return weights.view(weights.shape[0], -1, BLOCK_ROWS)


def _per_block(values: torch.Tensor, blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """[G, n] group values as [n / 64, G, 1, 64] in ``dtype``, to scale a block's [G, group, 64] codes."""
    groups = values.shape[0]
    return values.t().reshape(blocks, BLOCK_ROWS, groups).transpose(1, 2).unsqueeze(2).to(dtype)
